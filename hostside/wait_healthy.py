"""Wait until a vLLM server's /health answers 200; fail at once if its process is gone.

Runs on the host as the unit's ``ExecStartPost=+``, so ``systemctl start`` returns only when the
server is up (and servers sharing a GPU start one after another). Standard library only.

Example:
    python3 wait_healthy.py --port 18000 --pid 1234 --timeout 900
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request


def alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (and is not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def healthy(port: int) -> bool:
    """Whether ``/health`` on loopback answers 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    """Poll until healthy (0), the process died (1) or the time ran out (2)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if healthy(args.port):
            return 0
        if not alive(args.pid):
            print(f"vLLM server (pid {args.pid}) exited before /health answered", file=sys.stderr)
            return 1
        time.sleep(1)
    print(f"/health on port {args.port} did not answer within {args.timeout:g}s", file=sys.stderr)
    return 2


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
