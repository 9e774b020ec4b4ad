"""Restart a vLLM unit; if it fails, put the previous unit and environment back and start them.

Runs on the host (standard library only) after the deploy wrote a new configuration. A failed
restart never leaves the host without its previous service: the files saved before the write
are restored, systemd reloaded, the old service started, and the command still exits 1 so the
deploy reports the failure with the unit's last log lines.

The saved copies belong to one change only: once it has started (or been rolled back) they are
removed, so that a later failure never brings back a copy older than the working file (a key
rotated two deploys ago must not come back when an unrelated flag fails).

Example:
    python3 restart_or_restore.py --unit vllm-chat.service --restore \\
        /etc/systemd/system/vllm-chat.service=/var/lib/vllm-fleet/previous/vllm-chat.service
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable


def systemctl(*args: str) -> subprocess.CompletedProcess:
    """Run systemctl, capturing its output."""
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False)


def journal(unit: str, lines: int = 25) -> str:
    """The unit's last log lines since its latest start attempt."""
    result = subprocess.run(
        ["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip()


def forget(backups: Iterable[str]) -> None:
    """Remove saved copies whose change is over (started, or rolled back)."""
    for backup in backups:
        with contextlib.suppress(FileNotFoundError):
            os.remove(backup)


def main(argv: list[str] | None = None) -> int:
    """Exit 0 restarted; 1 failed (previous configuration restored when there was one)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--unit", required=True)
    parser.add_argument("--restore", action="append", default=[], metavar="LIVE=SAVED")
    args = parser.parse_args(argv)
    result = systemctl("restart", args.unit)
    pairs = [item.split("=", 1) for item in args.restore]
    if result.returncode == 0:
        forget(backup for _, backup in pairs)
        print(f"{args.unit} restarted and healthy")
        return 0
    log = journal(args.unit)
    print(f"{args.unit} failed to start with the new configuration:\n{log}", file=sys.stderr)
    saved = [(live, backup) for live, backup in pairs if os.path.exists(backup)]
    if not saved:
        print("no previous configuration to restore (first deploy of this server)", file=sys.stderr)
        return 1
    for live, backup in saved:
        shutil.copy2(backup, live)
    forget(backup for _, backup in saved)
    systemctl("daemon-reload")
    again = systemctl("restart", args.unit)
    if again.returncode == 0:
        print(
            f"restored the previous configuration of {args.unit}; it is running again. "
            "Fix the fleet file and deploy again.",
            file=sys.stderr,
        )
    else:
        print(f"the previous configuration of {args.unit} failed too:\n{journal(args.unit)}",
              file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
