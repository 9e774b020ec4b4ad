"""Keep a canary replica's previous configuration until its canary passed; roll it back if not.

Runs on the replica's host. The previous unit and environment the deploy saved before writing
the new ones (``LIVE=SAVED`` pairs, as for :mod:`hostside.restart_or_restore`) belong to one
restart: once the new configuration started, restart-or-restore removes them. A canary replica
needs them longer, until its canary decided, so:

- ``keep`` (before the restart): copies each saved file to ``SAVED.canary``;
- ``forget`` (the canary passed, or the restart failed and restored on its own): removes them;
- ``rollback`` (the canary failed): puts them back, restarts the unit and checks readiness by a
  real completion (:mod:`hostside.check_ready`). Exit 0 back on the previous configuration and
  serving; 1 not serving; 2 nothing was kept (the unit and environment had not changed).

Standard library only. Prints a timeline line (``rollout: HH:MM:SS.mmm …``) for the rollback.

Example:
    python3 canary_saved.py keep \\
        --restore /etc/systemd/system/vllm-a.service=/var/lib/vllm-fleet/previous/vllm-a.service
    python3 canary_saved.py rollback --label tiny/e2e-vllm/a --unit vllm-a.service \\
        --url http://127.0.0.1:18401 --model tiny --env-file /etc/vllm-fleet/a.env --restore …
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

if not __package__:  # run as a file: siblings import as the hostside package (see hostside)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostside import check_ready
from hostside.router_workers import stamp

#: What a kept copy's name adds to its saved file's.
SUFFIX = ".canary"


def keep(pairs: list[list[str]]) -> int:
    """Copy every saved file that exists to its kept copy; the number kept."""
    kept = 0
    for _, saved in pairs:
        if os.path.exists(saved):
            shutil.copy2(saved, saved + SUFFIX)
            kept += 1
    return kept


def forget(pairs: list[list[str]]) -> None:
    """Remove the kept copies."""
    for _, saved in pairs:
        with contextlib.suppress(FileNotFoundError):
            os.remove(saved + SUFFIX)


def put_back(pairs: list[list[str]]) -> int:
    """Put every kept copy back in its live place (and remove it); the number put back."""
    back = 0
    for live, saved in pairs:
        if os.path.exists(saved + SUFFIX):
            shutil.copy2(saved + SUFFIX, live)
            os.remove(saved + SUFFIX)
            back += 1
    return back


def rollback(args: argparse.Namespace, pairs: list[list[str]]) -> int:
    """Previous files back, restart, readiness; see the module's exit statuses."""
    if not put_back(pairs):
        print(
            f"rollout: {stamp()} {args.label}: nothing kept to roll back to (its unit and "
            "environment had not changed): it stays on the new configuration"
        )
        return 2
    print(f"rollout: {stamp()} {args.label} rolling back to its previous configuration", flush=True)
    subprocess.run(["systemctl", "daemon-reload"], check=False)
    restarted = subprocess.run(
        ["systemctl", "restart", args.unit], capture_output=True, text=True, check=False
    )
    ready = restarted.returncode == 0 and check_ready.main([
        "--url", args.url, "--model", args.model, "--env-file", args.env_file,
        "--timeout", "120",
    ]) == 0  # fmt: skip
    sys.stdout.flush()
    if ready:
        print(f"rollout: {stamp()} {args.label} back on its previous configuration and serving")
        return 0
    print(
        f"rollout: {stamp()} {args.label} is not serving after the rollback: "
        f"{restarted.stderr.strip()[-300:]}"
    )
    return 1


def main(argv: list[str] | None = None) -> int:
    """keep | forget | rollback; see the module's docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("action", choices=("keep", "forget", "rollback"))
    parser.add_argument("--restore", action="append", default=[], metavar="LIVE=SAVED")
    parser.add_argument("--label", default="")
    parser.add_argument("--unit", default="")
    parser.add_argument("--url", default="", help="the replica's base URL on this host")
    parser.add_argument("--model", default="")
    parser.add_argument("--env-file", default="")
    args = parser.parse_args(argv)
    pairs = [item.split("=", 1) for item in args.restore]
    if args.action == "keep":
        keep(pairs)
        return 0
    if args.action == "forget":
        forget(pairs)
        return 0
    if not (args.unit and args.url and args.model):
        parser.error("rollback needs --unit, --url and --model")
    return rollback(args, pairs)


if __name__ == "__main__":
    sys.exit(main())
