#!/usr/bin/env python3
"""Planner accuracy: the KV cache capacity `fleet plan` predicts against what vLLM logs.

For each setting below, the CPU build of vLLM serves the tiny test model (extracted from
``testmodel/tiny-llama.tar.gz`` to a temporary folder) with a known KV space
(``VLLM_CPU_KVCACHE_SPACE``), and the benchmark reads the capacity the engine logs::

    CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: 4096.00x

(a GPU build says ``GPU KV cache size``). The same settings go into a fleet file whose model
``config`` points at the extracted folder, and :func:`fleet.planner.fit.plan_fleet` predicts the
capacity. The last line printed is the ratio predicted / measured furthest from 1 over all
settings; the goal is within 2% (exit status 1 otherwise).

The vLLM to run is ``$VLLM_PYTHON`` (default ``.venv-vllm/bin/python``): a Python ≥ 3.11
virtual environment with the CPU build, made once (~90 s, 3.5 GB)::

    scripts/install-vllm.sh     # vllm-cpu 0.32.0 into .venv-vllm (torch 2.13.0+cpu)
    sudo apt-get install -y libnuma1

Example::

    $ .venv/bin/python benchmarks/planner_accuracy.py
    ...
    planner accuracy (predicted / measured KV tokens, worst of 3): 1.0000

``--logs`` compares against the public GPU logs of ``tests/data/vllm-logs/`` instead (no vLLM
needed): the distribution of predicted / logged KV memory, KV tokens and max concurrency per release
family, the worst case last (the comparison is benchmarks/planner_logs.py's)::

    $ .venv/bin/python benchmarks/planner_accuracy.py --logs
    V0 0.6   KV memory        n=5  min 0.990  median 1.003  max 1.013
    ...
    worst KV memory / KV tokens / max concurrency: v0-rtx3090x16-deepseek-v3-awq-tp16 (V0 0.8.3):
    0.958
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "benchmarks"))

import planner_logs  # noqa: E402

from fleet.load import load_text  # noqa: E402
from fleet.planner.fit import plan_fleet  # noqa: E402

ARCHIVE = ROOT / "testmodel" / "tiny-llama.tar.gz"
VLLM_PYTHON = os.environ.get(
    "VLLM_PYTHON", str(Path(__file__).resolve().parent.parent / ".venv-vllm" / "bin" / "python")
)
GOAL = 0.02
START_TIMEOUT = 600
KV_LINE = re.compile(
    r"(?:CPU|GPU) KV cache size: ([\d,]+) tokens, "
    r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"
)


@dataclass(frozen=True)
class Setting:
    """One run: the KV space (GiB), max-model-len, and --dtype (None: the model's)."""

    space_gib: int
    max_model_len: int
    dtype: str | None = None

    @property
    def label(self) -> str:
        """How the run is named in the output."""
        return (
            f"space {self.space_gib} GiB, max-model-len {self.max_model_len}, "
            f"dtype {self.dtype or 'auto (bfloat16)'}"
        )


SETTINGS = [
    Setting(1, 512),
    Setting(1, 512, "float32"),
    # not a multiple of the 128-token block: capacity is counted in whole blocks per request
    Setting(2, 1000),
]

FLEET = """\
version: 1
models:
  tiny:
    url: "http://127.0.0.1:8765/tiny-llama.tar.gz"
    sha256: "7bba1c3a1056cbe482242a8d8e69c897ff9ce84035c28602bad26bfe0f76523a"
    config: {config}
hosts:
  bench:
    address: sandbox
    vllm: {{version: "0.32.0", variant: cpu, cpu_kvcache_space_gib: {space}}}
    servers:
      tiny:
        model: tiny
        port: 18000
        args: {args}
"""


def predicted(model_dir: Path, setting: Setting) -> int:
    """`fleet plan`'s KV cache tokens for one setting."""
    args = {"max-model-len": setting.max_model_len, "enforce-eager": True}
    if setting.dtype:
        args["dtype"] = setting.dtype
    text = FLEET.format(config=model_dir, space=setting.space_gib, args=args)
    plan = plan_fleet(load_text(text, str(ROOT / "bench.yaml"))).server("bench", "tiny")
    if plan.kv_cache_tokens is None:
        raise SystemExit(f"fleet plan cannot predict: {plan.reason}")
    return plan.kv_cache_tokens


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measured(model_dir: Path, setting: Setting, workdir: Path) -> tuple[int, float]:
    """Start vLLM with one setting; return the KV tokens and concurrency it logs, then stop it."""
    cache = workdir / "cache"
    (cache / "tmp").mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE=str(setting.space_gib),
        TMPDIR=str(cache / "tmp"),
        XDG_CACHE_HOME=str(cache),
        VLLM_CACHE_ROOT=str(cache / "vllm"),
        HF_HOME=str(cache / "hf"),
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    argv = [
        VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--host", "127.0.0.1", "--port", str(free_port()),
        "--max-model-len", str(setting.max_model_len), "--enforce-eager",
    ]
    if setting.dtype:
        argv += ["--dtype", setting.dtype]
    log = workdir / "vllm.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            match = KV_LINE.search(log.read_text(errors="replace"))
            if match:
                return int(match[1].replace(",", "")), float(match[3])
            if process.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                raise SystemExit(f"vLLM exited ({process.returncode}) before logging:\n{tail}")
            time.sleep(0.5)
        raise SystemExit(f"vLLM logged no KV cache size within {START_TIMEOUT} s (see {log})")
    finally:
        stop(process)


def stop(process: subprocess.Popen) -> None:
    """Stop the server we started and its engine process: SIGTERM, then SIGKILL."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def log_distribution() -> int:
    """The GPU-log corpus: KV memory, KV tokens and max concurrency ratios per release family
    (each where the log states it), worst last."""
    results = [planner_logs.compare(case) for case in planner_logs.cases()]
    held = [r for r in results if not planner_logs.warned(r)]
    families: dict[str, list] = {}
    for r in held:
        families.setdefault(f"{r.engine} {r.family}", []).append(r)
    pairs = []
    for family, members in sorted(families.items(), key=lambda kv: (
            kv[0][:2], tuple(int(x) for x in kv[0].split()[1].split(".")))):
        for key, label in (("KV memory", "KV memory"), ("tokens", "KV tokens"),
                           ("concurrency", "max concurrency")):
            values = [(m.ratios[key], m) for m in members if key in m.ratios]
            pairs += values
            if values:
                numbers = sorted(v for v, _ in values)
                print(f"{family:8} {label:16} n={len(numbers)}  min {numbers[0]:.3f}  "
                      f"median {numbers[len(numbers) // 2]:.3f}  max {numbers[-1]:.3f}")
    warned = [r.name for r in results if planner_logs.warned(r)]
    print(f"explicit warnings instead of a number: {len(warned)} ({', '.join(warned)})")
    ratio, worst = max(pairs, key=lambda pair: abs(pair[0] - 1))
    print(f"worst KV memory / KV tokens / max concurrency: {worst.name} ({worst.engine} "
          f"{worst.logged['release']}): {ratio:.3f}")
    failed = [r for r in results if not planner_logs.within_goal(r)]
    return 1 if failed else 0


def main() -> int:
    """Run every setting; print one line each, then the worst ratio last."""
    if "--logs" in sys.argv[1:]:
        return log_distribution()
    if not Path(VLLM_PYTHON).exists():
        print(
            f"no vLLM at {VLLM_PYTHON}: set VLLM_PYTHON to the python of a venv with vllm-cpu "
            "(see this file's docstring for how to make one)",
            file=sys.stderr,
        )
        return 2
    ratios = []
    with tempfile.TemporaryDirectory(prefix="planner-accuracy-") as tmp:
        with tarfile.open(ARCHIVE) as archive:
            archive.extractall(tmp, filter="data")
        model_dir = Path(tmp) / "tiny-llama"
        for setting in SETTINGS:
            want = predicted(model_dir, setting)
            got, concurrency = measured(model_dir, setting, Path(tmp))
            ratio = want / got
            ratios.append(ratio)
            print(
                f"{setting.label}: fleet plan {want:,} tokens, vLLM {got:,} tokens "
                f"({concurrency:.2f}x concurrency), ratio {ratio:.4f}",
                flush=True,
            )
    worst = max(ratios, key=lambda r: abs(r - 1))
    print(f"planner accuracy (predicted / measured KV tokens, worst of {len(ratios)}): {worst:.4f}")
    return 0 if abs(worst - 1) <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
