"""What does the router cost? TTFT and requests/s through vllm-router vs the same server directly.

One trivial local streaming server (:mod:`tests.support.fakeserver` in its own process) and
the real vllm-router (0.1.17, the release the fleet pins) in front of it, loaded by ``fleet
bench --url`` with the same prompts, alternating direct and routed rounds:

- TTFT at concurrency 1 against a server with a fixed 20 ms time to first token: the router's
  added latency per request. Goal: routed/direct ≤ 1.05.
- requests/s at concurrency 32 against the server writing each stream at once (no delays):
  what the router can forward when the server is not the bottleneck. Goal: routed/direct ≥ 0.95.

The router runs with the fleet's default policy, ``cache_aware``, which posts each request to
the worker's ``/v1/*/render`` first (the prompt's token ids for its prefix tree): the fake
server answers it as vLLM does with ``--enable-scale-out`` (every replica of an endpoint has
it), or with vLLM's 403 without it (``--refuse-render``, how replicas answered before);
``--policy round_robin`` makes no such call.

The figures come LAST: ``ratio ttft=… requests_per_s=…``.

    .venv/bin/python benchmarks/router_overhead.py [--router PATH/TO/vllm-router] [--rounds 3]
        [--policy cache_aware] [--refuse-render]

Without ``--router`` (or ``$FLEET_VLLM_ROUTER``), vllm-router is installed once into
``~/.cache/vllm-fleet/router-venv`` with pip from the configured index. The machine has 2
cores: server, router and client share them, so the requests/s ratio is a floor.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASE = "vllm-router==0.1.17"
CACHE_VENV = Path.home() / ".cache" / "vllm-fleet" / "router-venv"
FLEET = Path(sys.executable).parent / "fleet"


def router_binary(given: str | None) -> Path:
    """The vllm-router to run: given, or installed once into the cache venv."""
    if given:
        return Path(given)
    binary = CACHE_VENV / "bin" / "vllm-router"
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(CACHE_VENV)], check=True)
        subprocess.run([str(CACHE_VENV / "bin" / "pip"), "install", "-q", RELEASE], check=True)
    return binary


def wait_up(url: str, timeout: float = 60) -> None:
    """Wait until ``url`` answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen) -> None:
    """Stop a process this script started, by its PID."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def bench(url: str, concurrency: int, requests: int, out: Path) -> dict:
    """One ``fleet bench --url`` step; its JSON step report."""
    subprocess.run(
        [str(FLEET), "bench", "--url", url, "--model", "fake", "--concurrency", str(concurrency),
         "--requests", str(requests), "--output-len", "16", "--input-len", "32", "--no-progress",
         "--no-metrics", "--out", str(out)],
        cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return json.loads((out / "bench.json").read_text())["steps"][0]


def measure(server_args: list[str], router: Path, ports: tuple[int, int, int], concurrency: int,
            requests: int, rounds: int, key: str,
            policy: str = "cache_aware") -> tuple[list[float], list[float]]:
    """(direct, routed) figures of ``key`` per round, with a server started with its args."""
    server_port, router_port, metrics_port = ports
    server = start([sys.executable, "-m", "tests.support.fakeserver", "--port",
                    str(server_port), *server_args])  # fmt: skip
    direct_url = f"http://127.0.0.1:{server_port}"
    routed = start([str(router), "--host", "127.0.0.1", "--port", str(router_port),
                    "--worker-urls", direct_url, "--policy", policy,
                    "--prometheus-port", str(metrics_port), "--log-level", "warning"])  # fmt: skip
    try:
        wait_up(f"{direct_url}/health")
        wait_up(f"http://127.0.0.1:{router_port}/health")
        direct, through = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for n in range(rounds):
                for name, url, into in (("direct", direct_url, direct),
                                        ("routed", f"http://127.0.0.1:{router_port}", through)):
                    step = bench(url, concurrency, requests, Path(tmp) / f"{name}{n}")
                    assert step["failed"] == 0, step["errors"]
                    value = step["ttft_ms"]["mean"] if key == "ttft" else step["requests_per_s"]
                    into.append(value)
                    print(f"round {n + 1} {name:6} {key}: {value:.2f}", flush=True)
        return direct, through
    finally:
        stop(routed)
        stop(server)


def main() -> int:
    """Run both comparisons and print the ratios last."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--router", default=os.environ.get("FLEET_VLLM_ROUTER"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ports", default="18410,18411,18412")
    parser.add_argument("--policy", default="cache_aware",
                        help="the router's policy (the fleet's default: cache_aware)")
    parser.add_argument("--refuse-render", action="store_true",
                        help="the worker refuses render calls: 403, vLLM without the flag")
    args = parser.parse_args()
    router = router_binary(args.router)
    ports = tuple(int(p) for p in args.ports.split(","))
    assert len(ports) == 3
    render = ["--refuse-render"] if args.refuse_render else []
    print(f"policy {args.policy}, render calls {'refused' if render else 'served'}", flush=True)
    ttft_direct, ttft_routed = measure(["--ttft", "0.02", *render], router, ports, 1, 40,
                                       args.rounds, "ttft", args.policy)  # fmt: skip
    rps_direct, rps_routed = measure(["--batch", *render], router, ports, 32, 1500, args.rounds,
                                     "rps", args.policy)  # fmt: skip
    ttft = statistics.median(ttft_routed) / statistics.median(ttft_direct)
    rps = statistics.median(rps_routed) / statistics.median(rps_direct)
    print(f"median TTFT direct {statistics.median(ttft_direct):.2f} ms, routed "
          f"{statistics.median(ttft_routed):.2f} ms; requests/s direct "
          f"{statistics.median(rps_direct):.0f}, routed {statistics.median(rps_routed):.0f}")
    print(f"ratio ttft={ttft:.3f} (goal ≤ 1.05) requests_per_s={rps:.3f} (goal ≥ 0.95)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
