"""Update one replica of an endpoint in place: drain it, restart it, prove it serves.

Runs on the replica's host once the deploy took the replica out of its router (and before it
puts it back): waits until vLLM's ``vllm:num_requests_running`` and ``…_waiting``
(``/metrics``) are 0, bounded by the drain timeout; restarts the unit with
:mod:`hostside.restart_or_restore` (a failed start puts the previous configuration back and
starts it); checks readiness by a real completion (:mod:`hostside.check_ready`). Standard
library only.

``--abandon`` is the other path: the rollout stopped at an earlier replica, so this one keeps
what it runs: the saved previous unit and environment go back in place, unstarted.

Prints one timeline line (``rollout: HH:MM:SS.mmm …``) per step. Exit status: 0 updated and
serving; 1 failed, previous configuration restored and serving; 2 failed and not serving.

Example:
    python3 roll_replica.py --label tiny/e2e-vllm/a --unit vllm-a.service \\
        --url http://127.0.0.1:18401 \\
        --model tiny --env-file /etc/vllm-fleet/a.env --drain-timeout 60 \\
        --restore /etc/systemd/system/vllm-a.service=/var/lib/vllm-fleet/previous/vllm-a.service
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

if not __package__:  # run as a file: siblings import as the hostside package (see hostside)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostside import check_ready, restart_or_restore
from hostside.router_workers import stamp

#: What a replica still has to finish: requests running and requests waiting to run.
BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")
#: Seconds to wait after the router let the replica go before reading its load: a request the
#: router sent just before reaches vLLM's scheduler a moment later.
SETTLE = 1.0


def running(metrics: str) -> int:
    """The requests a vLLM server runs or has waiting, from its ``/metrics`` text (summed over
    engines).

    Example:
        >>> running('vllm:num_requests_running{engine="0",model_name="m"} 2.0\\n'
        ...         'vllm:num_requests_running{engine="1",model_name="m"} 1.0\\n'
        ...         'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\\n'
        ...         'vllm:num_requests_running_total 9\\n')
        4
    """
    total = 0.0
    for line in metrics.splitlines():
        if line.split("{", 1)[0].split(" ", 1)[0] in BUSY:
            total += float(line.rsplit(None, 1)[1])
    return int(total)


def in_flight(url: str) -> int | None:
    """The running requests of the server at base URL ``url``, None when /metrics does not
    answer."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=5) as reply:
            return running(reply.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError, ValueError):
        return None


def drain(url: str, timeout: float, label: str) -> None:
    """Wait until the server runs no request and has none waiting (or the timeout passed, or
    it does not answer), reading it :data:`SETTLE` seconds after the router let it go."""
    start = time.monotonic()
    time.sleep(SETTLE)
    count = in_flight(url)
    while count and time.monotonic() - start < timeout:
        time.sleep(0.2)
        count = in_flight(url)
    waited = time.monotonic() - start
    if count:
        print(f"rollout: {stamp()} {label}: still {count} running after the drain timeout "
              f"({timeout:.0f} s): restarting anyway")
    else:
        print(f"rollout: {stamp()} {label} drained in {waited:.1f} s")


def abandon(pairs: list[list[str]], label: str) -> None:
    """Put the saved previous files back, unstarted (the running service already uses them)."""
    restored = False
    for live, backup in pairs:
        if os.path.exists(backup):
            shutil.copy2(backup, live)
            os.remove(backup)
            restored = True
    if restored:
        subprocess.run(["systemctl", "daemon-reload"], check=False)
    print(f"rollout: {stamp()} {label} not updated: it keeps its previous configuration")


def main(argv: list[str] | None = None) -> int:
    """Drain, restart (or restore), check readiness; see the module's exit statuses."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--label", required=True)
    parser.add_argument("--unit", required=True)
    parser.add_argument("--url", required=True, help="the replica's base URL on this host")
    parser.add_argument("--model", required=True)
    parser.add_argument("--env-file", required=True)
    parser.add_argument("--drain-timeout", type=float, default=120)
    parser.add_argument("--restore", action="append", default=[], metavar="LIVE=SAVED")
    parser.add_argument("--abandon", action="store_true")
    args = parser.parse_args(argv)
    pairs = [item.split("=", 1) for item in args.restore]
    if args.abandon:
        abandon(pairs, args.label)
        return 0
    drain(args.url, args.drain_timeout, args.label)
    print(f"rollout: {stamp()} {args.label} restarting", flush=True)
    restore = [arg for pair in args.restore for arg in ("--restore", pair)]
    restarted = restart_or_restore.main(["--unit", args.unit, *restore]) == 0
    sys.stdout.flush()
    ready = check_ready.main([
        "--url", args.url, "--model", args.model, "--env-file", args.env_file,
        "--timeout", "300" if restarted else "30",
    ]) == 0  # fmt: skip
    if restarted and ready:
        print(f"rollout: {stamp()} {args.label} updated and serving")
        return 0
    if ready:
        print(f"rollout: {stamp()} {args.label} is back on its previous configuration",
              file=sys.stderr)
        return 1
    print(f"rollout: {stamp()} {args.label} is not serving", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
