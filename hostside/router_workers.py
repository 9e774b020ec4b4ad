"""Take a replica out of its vllm-router, or put it back. Standard library only.

Runs on the router's host (the router may listen on loopback only), through vllm-router's own
worker API: ``POST /remove_worker?url=…`` takes a worker out at once (requests it is serving
go on); ``POST /add_worker?url=…`` puts it back and answers once the router found it healthy.
A router that does not answer (not started yet: the first deploy) has nothing to take out.

Prints one timeline line (``rollout: HH:MM:SS.mmm …``) per step, for the deploy's output.

Example:
    python3 router_workers.py --router http://127.0.0.1:18400 remove --worker http://127.0.0.1:18401
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def stamp() -> str:
    """The wall-clock time to the millisecond, for timeline lines.

    Example:
        >>> len(stamp())
        12
    """
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


#: :func:`call`'s status when the router took the connection but did not answer in time.
TIMED_OUT = -1


def call(router: str, action: str, worker: str, timeout: float) -> tuple[int, str]:
    """``POST {router}/{action}_worker?url={worker}``: (HTTP status, body); status 0 when the
    router does not answer at all (not listening), :data:`TIMED_OUT` when it did not answer in
    ``timeout`` seconds."""
    url = f"{router}/{action}_worker?{urllib.parse.urlencode({'url': worker})}"
    request = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read(500).decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read(500).decode(errors="replace")
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, TimeoutError):
            return TIMED_OUT, f"no answer in {timeout:.0f} s"
        return 0, str(reason)


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when the worker is out (remove) or back and healthy (add); 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--router", required=True, help="the router's URL on this host")
    parser.add_argument("--label", default="", help="the replica's name, for the timeline")
    parser.add_argument("action", choices=["remove", "add"])
    parser.add_argument("--worker", required=True, help="the replica as the router reaches it")
    # Above the router's own bound for an added worker's health (fleet.endpoints): the router
    # answers first.
    parser.add_argument("--timeout", type=float, default=150)
    args = parser.parse_args(argv)
    label = args.label or args.worker
    status, body = call(args.router, args.action, args.worker, args.timeout)
    if status == TIMED_OUT:
        print(f"{label}: the router at {args.router} did not answer the {args.action} in "
              f"{args.timeout:.0f} s", file=sys.stderr)
        return 1
    if status == 0:
        print(f"rollout: {stamp()} {label}: the router at {args.router} does not answer "
              f"({body}): nothing to {args.action}")
        return 0
    if args.action == "remove":
        if status == 200:
            print(f"rollout: {stamp()} {label} out of the router")
            return 0
    elif status == 200 or "already exists" in body:
        print(f"rollout: {stamp()} {label} back in the router (healthy)")
        return 0
    print(f"{label}: the router refused to {args.action} it: HTTP {status}: {body}",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
