"""Wait until a group worker has joined its head; fail, naming the head, when it does not.

Runs on a worker host as its unit's ``ExecStartPost=+``. "Joined" is what the group's head
sees: a process of the worker's unit (the main PID or one of its descendants) holds an
established TCP connection to the head's rendezvous port (torch.distributed's store for the
native launcher, or the data-parallel RPC port). Read from ``/proc`` only; standard library.

Example:
    python3 wait_joined.py --head hgx-01 --connect 10.0.0.1:29500 --pid 1234 --timeout 600
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run by its file on the host
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostside.groupnet import alive, joined


def main(argv: list[str] | None = None) -> int:
    """Poll until joined (0), the worker died (1) or the time ran out (2)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", required=True, help="the head host's name, for messages")
    parser.add_argument("--connect", required=True, help="ADDRESS:PORT of the head")
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    address, _, port = args.connect.rpartition(":")
    address = address.strip("[]")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if joined(args.pid, address, int(port)):
            print(f"joined the head {args.head} at {args.connect}")
            return 0
        if not alive(args.pid):
            print(f"the worker (pid {args.pid}) exited before it joined the head {args.head} "
                  f"at {args.connect}", file=sys.stderr)
            return 1
        time.sleep(1)
    print(f"this member did not join the head {args.head} at {args.connect} within "
          f"{args.timeout:g}s: is its unit running there, and is port {port} reachable from "
          "this host?", file=sys.stderr)
    return 2


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
