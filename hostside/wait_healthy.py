"""Wait until a vLLM server's /health answers 200; fail at once if its process is gone.

Runs on the host as the unit's ``ExecStartPost=+``, so ``systemctl start`` returns only when the
server is up (and servers sharing a GPU start one after another). Standard library only.

``--url`` is the server's base URL as its plan reaches it (:class:`fleet.planner.reach.Reach`:
its bind address, loopback for every interface; its scheme). ``--port`` is the older form, the
server on ``http://127.0.0.1:PORT``: a unit written by an earlier release (one a failed deploy
puts back) still starts.

Example:
    python3 wait_healthy.py --url http://127.0.0.2:18000 --pid 1234 --timeout 900
    python3 wait_healthy.py --url https://127.0.0.1:8443 --cafile /etc/vllm-fleet/chat.tls-ca.pem \
        --tls-name gpu-1.example --pid 1234
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
from pathlib import Path

if not __package__:  # run as a file: siblings import as the hostside package (see hostside)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostside import tlsprobe


def alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (and is not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def base_url(url: str | None, port: int | None) -> str:
    """The server's base URL from the command line: ``--url``, or the older ``--port`` on
    IPv4 loopback (an https server's ``--cafile`` and ``--tls-name`` are :func:`healthy`'s).

    Example:
        >>> base_url("http://[::1]:8000/", None), base_url(None, 8000)
        ('http://[::1]:8000', 'http://127.0.0.1:8000')
    """
    return url.rstrip("/") if url else f"http://127.0.0.1:{port}"


def healthy(url: str, cafile: str | None = None, tls_name: str | None = None) -> bool:
    """Whether ``URL/health`` answers 200 (https with ``cafile``: trusting it alone, for
    ``tls_name``)."""
    try:
        with tlsprobe.urlopen(f"{url}/health", 5, cafile, tls_name) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    """Poll until healthy (0), the process died (1) or the time ran out (2)."""
    parser = argparse.ArgumentParser(description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="the server's base URL (scheme, address, port)")
    where.add_argument("--port", type=int, help="older form: http://127.0.0.1:PORT")
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=900)
    tlsprobe.add_arguments(parser)
    args = parser.parse_args(argv)
    url = base_url(args.url, args.port)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if healthy(url, args.cafile, args.tls_name):
            return 0
        if not alive(args.pid):
            print(f"vLLM server (pid {args.pid}) exited before /health answered", file=sys.stderr)
            return 1
        time.sleep(1)
    print(f"{url}/health did not answer within {args.timeout:g}s", file=sys.stderr)
    return 2


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
