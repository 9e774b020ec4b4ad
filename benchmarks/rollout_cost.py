"""What does a rolling upgrade cost? Its time against restarting both replicas at once, and the
requests each drops, under the same steady load through the real vllm-router.

Two replicas (``tests.support.fakeserver`` processes: a restart is a stop, ``--startup``
seconds standing in for vLLM loading its model, a start) behind the real vllm-router 0.1.17,
a steady load of ``--clients`` clients through it. Two strategies in the same run, alternating
rounds:

- *restart both*: both replicas restarted at once (what a plain ``systemctl restart`` of every
  server does); the router has no replica for the startup's length, so requests fail;
- *rolling*: the deploy's own steps, with its host-side programs: out of the router
  (``hostside/router_workers.py``), drained (``hostside/roll_replica.drain``: vLLM's
  ``num_requests_running`` is 0), restarted, ready (a completion), back in; one at a time.

Each strategy's time runs until the endpoint serves again through the router. The figure
printed last: the time ratio rolling / restart-both with each strategy's failed requests
(restart-both > 0, rolling 0). Restarting both is not the quicker one: once every replica
failed requests, vllm-router's circuit breakers stay open for their timeout (60 s by default)
after the replicas are back, while a rolling upgrade never sends a request to a replica that
is out. One run here (startup 3 s, 4 clients): restart both 60.5 s and 520 failed requests,
rolling 7.3 s and 0 failed.
The real thing on two sandbox hosts (CPU vLLM, systemd, the deploy) is
tests/e2e/test_endpoints_e2e.py, which counts the failed requests of a rollout too.

Example:
    .venv/bin/python benchmarks/rollout_cost.py [--router PATH/TO/vllm-router] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.router_overhead import router_binary, start, stop, wait_up
from hostside import roll_replica, router_workers


class Replica:
    """A fake vLLM server process on a port; restarted with a startup delay."""

    def __init__(self, port: int, startup: float) -> None:
        self.port, self.startup = port, startup
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        time.sleep(self.startup)  # what vLLM spends loading the model before it listens
        self.process = start([sys.executable, "-m", "tests.support.fakeserver", "--port",
                              str(self.port), "--itl", "0.02"])  # fmt: skip
        wait_up(f"{self.url}/health")

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


class Load:
    """``clients`` clients sending completions (8 tokens) through the router back to back."""

    def __init__(self, url: str, clients: int) -> None:
        self.url, self.results = url, Counter()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        body = json.dumps({"model": "fake", "prompt": "hello", "max_tokens": 8}).encode()
        while not self._stop.is_set():
            request = urllib.request.Request(f"{self.url}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    reply.read()
                self.results["ok"] += 1
            except urllib.error.HTTPError as error:
                self.results[f"HTTP {error.code}"] += 1
                time.sleep(0.05)
            except OSError as error:
                self.results[type(error).__name__] += 1
                time.sleep(0.05)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    @property
    def failed(self) -> int:
        return sum(n for kind, n in self.results.items() if kind != "ok")


def routed_ok(url: str) -> bool:
    """One completion through the router answers."""
    body = json.dumps({"model": "fake", "prompt": "x", "max_tokens": 1}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status == 200
    except OSError:
        return False


def restart_both(replicas: list[Replica], router: str) -> None:
    """Every replica restarted at once; over when the router serves again."""
    threads = [threading.Thread(target=r.restart) for r in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    while not routed_ok(router):
        time.sleep(0.1)


def rolling(replicas: list[Replica], router: str) -> None:
    """The deploy's steps, one replica at a time, with its host-side programs."""
    for replica in replicas:
        label = f"replica {replica.port}"
        args = ["--router", router, "--label", label]
        assert router_workers.main([*args, "remove", "--worker", replica.url]) == 0
        roll_replica.drain(replica.port, timeout=30, label=label)
        replica.restart()
        assert router_workers.main([*args, "add", "--worker", replica.url]) == 0


def main() -> int:
    """Alternate the two strategies ``--rounds`` times; print the ratio last."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--router", default=os.environ.get("FLEET_VLLM_ROUTER"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--startup", type=float, default=3.0, help="seconds a replica loads")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--ports", default="28413,28414,28415,28416",
                        help="the router, its metrics, the two replicas (outside the e2e "
                        "port blocks: sandbox.up refuses a host while they are taken)")
    args = parser.parse_args()
    binary = router_binary(args.router)
    router_port, metrics_port, *ports = (int(p) for p in args.ports.split(","))
    replicas = [Replica(port, args.startup) for port in ports]
    router_url = f"http://127.0.0.1:{router_port}"
    router = None
    times: dict[str, list[float]] = {"restart both": [], "rolling": []}
    failed: dict[str, int] = {"restart both": 0, "rolling": 0}
    try:
        for replica in replicas:
            replica.process = start([sys.executable, "-m", "tests.support.fakeserver",
                                     "--port", str(replica.port), "--itl", "0.02"])  # fmt: skip
            wait_up(f"{replica.url}/health")
        router = start([
            str(binary), "--host", "127.0.0.1", "--port", str(router_port),
            "--worker-urls", *[r.url for r in replicas], "--policy", "round_robin",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--health-check-interval-secs", "1", "--worker-startup-check-interval", "1",
            "--worker-startup-timeout-secs", "60", "--log-level", "warning",
        ])  # fmt: skip
        wait_up(f"{router_url}/health")
        for n in range(args.rounds):
            for name, strategy in (("restart both", restart_both), ("rolling", rolling)):
                with Load(router_url, args.clients) as load:
                    time.sleep(1)
                    begun = time.monotonic()
                    strategy(replicas, router_url)
                    took = time.monotonic() - begun
                    time.sleep(1)
                times[name].append(took)
                failed[name] += load.failed
                print(f"round {n + 1} {name:12}: {took:5.1f} s, requests {dict(load.results)}",
                      flush=True)
                time.sleep(3)  # the router's health checks see both replicas again
    finally:
        if router is not None:
            stop(router)
        for replica in replicas:
            replica.stop()
    ratio = statistics.median(times["rolling"]) / statistics.median(times["restart both"])
    print(f"failed requests: restart both {failed['restart both']}, rolling {failed['rolling']}")
    print(f"ratio rolling/restart-both time={ratio:.2f} (failed: restart both "
          f"{failed['restart both']}, rolling {failed['rolling']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
