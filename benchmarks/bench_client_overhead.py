"""Is the client the bottleneck? Requests/s of ``fleet bench`` vs ``vllm bench serve``.

Both load the same trivial local streaming server (:mod:`tests.support.fakeserver` in its own
process, writing each answer's SSE stream at once, with no delays), with the same prompts,
output length and concurrency, alternating, several rounds. The server does almost nothing, so
requests/s measures what each client can drive. Goal: fleet/vLLM ≥ 1.

The figure comes LAST: ``ratio requests_per_s=…``.

    .venv/bin/python benchmarks/bench_client_overhead.py [--concurrency 32] [--requests 3000]

The machine has 2 cores: the server takes one, the client the other, and anything else
running takes its share from both; alternating rounds and medians spread that.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_correctness import (  # noqa: E402
    VLLM_PYTHON,
    extract_model,
    run_fleet,
    run_vllm,
    wait_healthy,
)

DEFAULT_PORT = int(os.environ.get("BENCH_FAKE_PORT", "18390"))


def start_fake(port: int) -> subprocess.Popen:
    """The fake server in its own process (stopped by its PID)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.fakeserver", "--port", str(port), "--batch"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )


def main() -> int:
    """Run the comparison and print the ratio last."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp_name:
        tmp = Path(tmp_name)
        tokenizer = extract_model(tmp / "model")
        prompts = tmp / "prompts.jsonl"
        prompts.write_text("".join(
            json.dumps({"prompt": f"prompt number {i} about the river and the bridge",
                        "output_tokens": args.output_len}) + "\n"
            for i in range(args.requests)
        ))
        url = f"http://127.0.0.1:{args.port}"
        server = start_fake(args.port)
        rows: dict[str, list[dict[str, float]]] = {"fleet": [], "vllm": []}
        try:
            wait_healthy(url, server, timeout=30)
            for round_ in range(args.rounds):
                order = ("fleet", "vllm") if round_ % 2 == 0 else ("vllm", "fleet")
                for tool in order:
                    out = tmp / f"{tool}-{round_}"
                    if tool == "fleet":
                        figures = run_fleet(url, "fake", prompts, args.concurrency,
                                            args.requests, args.output_len, out)
                    else:
                        figures = run_vllm(url, "fake", tokenizer, prompts, args.concurrency,
                                           args.requests, args.output_len, out)
                    rows[tool].append(figures)
                    print(f"round {round_} {tool:5}: {figures['request_throughput']:.0f} req/s, "
                          f"{figures['output_throughput']:.0f} tok/s, "
                          f"{figures['completed']} ok / {figures['failed']} failed",
                          flush=True)
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                server.wait(timeout=10)

    fleet = statistics.median(r["request_throughput"] for r in rows["fleet"])
    vllm = statistics.median(r["request_throughput"] for r in rows["vllm"])
    print(f"setup: concurrency {args.concurrency}, {args.requests} requests of "
          f"{args.output_len} tokens, {args.rounds} rounds (medians), vllm from {VLLM_PYTHON}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"fleet bench {fleet:.0f} req/s, vllm bench serve {vllm:.0f} req/s; goal ratio ≥ 1 → "
          f"{'met' if fleet >= vllm else 'NOT met'}")
    print(f"ratio requests_per_s={fleet / vllm:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
