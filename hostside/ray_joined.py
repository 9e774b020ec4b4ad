"""Wait until a Ray cluster holds every member of a group, each with its GPUs; fail, naming
the member whose node did not join. Runs on the head host before its vLLM unit starts
(``ExecStartPre=+``), so vLLM never starts on a cluster without all its nodes (it would wait
for a placement group forever).

"Joined" is what ``ray status`` shows: each member's Ray node carries the custom resource
``fleet_member_HOST`` (``fleet/hostplan/ray.py``), and the cluster's ``GPU`` total is at least the
GPUs the
group needs. Standard library; ``ray`` is the venv's Ray command.

Example:
    python3 ray_joined.py --ray /opt/vllm-fleet/venv/bin/ray --address 10.0.0.1:6379 \\
        --member hgx-01 --member hgx-02 --gpus 16 --timeout 600
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run by its file on the host
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostside.groupnet import alive

#: A resource line of ``ray status``'s usage: `` 0.0/16.0 GPU``, `` 0B/1.5GiB memory``.
_USAGE = re.compile(r"\s*([0-9.]+)[A-Za-z]*/([0-9.]+)[A-Za-z]*\s+(\S+)\s*")
#: The custom resource naming a member's node (fleet.hostplan.ray.MEMBER_RESOURCE).
MEMBER_RESOURCE = "fleet_member_"


def totals(status: str) -> dict[str, float]:
    """The cluster's resource totals from ``ray status`` output.

    Example:
        >>> totals(" 0.0/16.0 GPU\\n 0.0/1.0 fleet_member_b\\n 0B/2.0GiB memory\\n")
        {'GPU': 16.0, 'fleet_member_b': 1.0, 'memory': 2.0}
    """
    found = {}
    for line in status.splitlines():
        match = _USAGE.fullmatch(line)
        if match:
            found[match.group(3)] = float(match.group(2))
    return found


def missing(status: str, members: list[str], gpus: int) -> list[str]:
    """What the cluster lacks: the members whose node is not in it, then the GPUs.

    Example:
        >>> missing(" 0.0/8.0 GPU\\n 0.0/1.0 fleet_member_a\\n", ["a", "b"], 16)
        ['b', '16 GPUs (the cluster has 8)']
    """
    have = totals(status)
    lacking = [m for m in members if have.get(MEMBER_RESOURCE + m, 0) < 1]
    if have.get("GPU", 0) < gpus:
        lacking.append(f"{gpus} GPUs (the cluster has {have.get('GPU', 0):g})")
    return lacking


def status(ray: str, address: str) -> str:
    """``ray status`` of the cluster at ``address`` ("" when it does not answer)."""
    try:
        done = subprocess.run([ray, "status", "--address", address], capture_output=True,
                              text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def main(argv: list[str] | None = None) -> int:
    """Poll ``ray status`` until every member has joined (0), Ray's process (``--pid``) is
    gone (1) or the time ran out (2)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ray", required=True, help="the venv's ray command")
    parser.add_argument("--address", required=True, help="ADDRESS:PORT of the Ray head")
    parser.add_argument("--member", action="append", default=[], help="a member host")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs the group needs in all")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--interval", type=float, default=2)
    parser.add_argument("--pid", type=int, help="fail at once when this process (Ray) is gone")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    lacking = list(args.member)
    while True:
        lacking = missing(status(args.ray, args.address), args.member, args.gpus)
        if not lacking:
            print(f"every member's Ray node has joined {args.address}: "
                  + ", ".join(args.member))
            return 0
        if args.pid is not None and not alive(args.pid):
            print(f"Ray (pid {args.pid}) exited before every member's node had joined "
                  f"{args.address}: see this unit's log above", file=sys.stderr)
            return 1
        if time.monotonic() >= deadline:
            break
        time.sleep(args.interval)
    nodes = [m for m in lacking if m in args.member]
    what = ("the Ray node of " + ", ".join(nodes) + " did not join") if nodes else (
        "the Ray cluster lacks " + ", ".join(lacking))
    print(f"{what} the Ray head at {args.address} within {args.timeout:g}s: is its Ray unit "
          "running there, and are the Ray ports reachable between the members?",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
