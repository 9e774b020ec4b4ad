"""benchmarks/gpu_memory_probe.py, the device machine's probe of the planner's GPU constants:
it imports the constants it is held against from the planner (the names it used to name were
removed), and its ``--dry-run`` path runs the sampler operations on CPU tensors under a Python
with torch (the vLLM cpu build's), printing the planner's figures."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleet.planner.memory import V1_SAMPLER_BYTES
from tests.unit.fleet.test_flags import vllm_python

PROBE = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_memory_probe.py"


def test_the_probe_dry_run_runs_on_the_cpu() -> None:
    python = vllm_python()
    if python is None:
        pytest.skip("no python with torch (set FLEET_VLLM_PYTHON to the vLLM cpu build's)")
    run = subprocess.run([python, str(PROBE), "--dry-run"], capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert sum(line.startswith("dry run (cpu): sampler") for line in lines) == 2
    assert lines[-1] == f"planner: V1 sampler {V1_SAMPLER_BYTES} bytes per (seq × vocab)"


def test_the_probe_refuses_without_a_gpu_unless_dry() -> None:
    python = vllm_python()
    if python is None:
        pytest.skip("no python with torch (set FLEET_VLLM_PYTHON to the vLLM cpu build's)")
    run = subprocess.run([python, str(PROBE)], capture_output=True, text=True, timeout=300,
                         check=False)
    assert run.returncode == 2
    assert "--dry-run" in run.stderr
