"""Wait until a group member's unit is active (its start finished: joined, or serving); fail
with a message naming the member, and its last log lines, when it does not come up in time.

Runs on the member's host during a deploy, after the group was restarted without blocking
(``systemctl restart --no-block``). A worker's unit is active once its ``ExecStartPost``
(``wait_joined.py``) saw it join the head; the head's once ``/health`` answers, which vLLM
gives only when every member has joined. Standard library only.

Example:
    python3 group_wait.py --unit vllm-big.service --member "worker box-2 (rank 1)" \\
        --group big --timeout 600
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time


def state(unit: str) -> tuple[str, str]:
    """The unit's ActiveState and SubState."""
    result = subprocess.run(
        ["systemctl", "show", "-p", "ActiveState", "-p", "SubState", unit],
        capture_output=True, text=True, check=False,
    )
    values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return values.get("ActiveState", ""), values.get("SubState", "")


def journal(unit: str, lines: int = 15) -> str:
    """The unit's last log lines."""
    result = subprocess.run(
        ["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"],
        capture_output=True, text=True, check=False,
    )
    return result.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    """Poll until active (0), failed (1) or out of time (2)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unit", required=True)
    parser.add_argument("--member", required=True, help="who this is, for messages")
    parser.add_argument("--group", required=True, help="the group's server name")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    seen = ("", "")
    while time.monotonic() < deadline:
        seen = state(args.unit)
        if seen == ("active", "running"):
            print(f"{args.member} of group {args.group} is up")
            return 0
        if seen[0] == "failed":
            break
        time.sleep(2)
    else:
        print(f"{args.member} of group {args.group} did not come up within "
              f"{args.timeout:g}s ({args.unit} is {seen[0]}/{seen[1]}); its last log lines:\n"
              f"{journal(args.unit)}", file=sys.stderr)
        return 2
    print(f"{args.member} of group {args.group} failed to start ({args.unit}); its last log "
          f"lines:\n{journal(args.unit)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
