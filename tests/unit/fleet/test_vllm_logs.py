"""The planner against public vLLM startup logs (tests/data/vllm-logs, see its cases' logged.json).

Each case must come within its release family's goal (V1 ±2 %, V0 ±5 %) of every number the log
states (KV cache memory, KV tokens, max concurrency), and its verdict must match whether vLLM
started. The comparison is benchmarks/planner_logs.py's, which prints the distribution.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location(
    "planner_logs", ROOT / "benchmarks" / "planner_logs.py"
)
assert _spec and _spec.loader
planner_logs = importlib.util.module_from_spec(_spec)
sys.modules["planner_logs"] = planner_logs  # dataclasses look their module up
_spec.loader.exec_module(planner_logs)
CASES = planner_logs.cases()


def test_corpus_is_documented() -> None:
    """Every case names its source, release, GPU and model, and says why a number is missing."""
    assert CASES
    for case in CASES:
        logged = json.loads((case / "logged.json").read_text())
        for key in ("source", "release", "engine", "gpu", "model", "config", "flags"):
            assert logged.get(key) is not None, f"{case.name}: no {key}"
        numbers = logged["logged"]
        for key in ("kv_tokens", "max_concurrency"):
            if numbers.get(key) is None:
                assert numbers.get(f"{key}_note") or numbers.get("kv_tokens_note"), case.name


def test_corpus_spans_the_issue():
    """At least 15 logs: consumer and datacenter GPUs, TP and PP, MoE and MLA, quantized,
    V0 and V1 releases."""
    logged = [json.loads((case / "logged.json").read_text()) for case in CASES]
    assert len(logged) >= 15
    gpus = {entry["gpu"].split(" (")[0] for entry in logged}
    assert {"RTX 3090", "RTX 4090", "L4", "L40S", "A100 80GB", "H100 SXM"} <= gpus
    assert {"V0", "V1"} == {entry["engine"] for entry in logged}
    flags = [entry["flags"] for entry in logged]
    assert any(f.get("tensor-parallel-size", 1) > 1 for f in flags)
    assert any(f.get("pipeline-parallel-size", 1) > 1 for f in flags)
    configs = [entry["config"] for entry in logged]
    assert any("kv_lora_rank" in c for c in configs)  # MLA
    assert any("moe_intermediate_size" in c for c in configs)  # MoE
    assert any("quantization_config" in c for c in configs)  # AWQ, fp8


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_planner_within_goal(case: Path) -> None:
    """Predicted / logged stays within the release family's goal (or the plan says the
    explicit warning the case expects instead), and the verdict matches."""
    result = planner_logs.compare(case)
    goal = planner_logs.GOALS[result.engine]
    if planner_logs.warned(result):
        return
    assert not result.logged.get("expect_warning"), (
        f"{case.name}: expected the warning {result.logged['expect_warning']!r}: "
        f"{result.plan.warnings + result.plan.cannot_check}")
    assert result.ratios or planner_logs.refused_without_memory(result), (
        f"{case.name}: nothing to compare")
    for key, ratio in result.ratios.items():
        assert abs(ratio - 1) <= goal, f"{case.name}: {key} ratio {ratio:.3f} beyond ±{goal:.0%}"
    assert result.plan.fits == result.logged["logged"]["started"], result.plan.reason


def test_terms_are_named_with_their_source() -> None:
    """Every overhead term of a GPU plan carries a name and where its number comes from."""
    for name in ("v0-rtx3090-llama31-8b-20k", "v1-a100-qwen3-06b-4k"):
        result = planner_logs.compare(planner_logs.CORPUS / name)
        names = [t["name"] for t in result.plan.overhead_terms]
        assert names == ["activation", "sampler", "profiling peak", "non-torch", "CUDA graphs"]
        assert all(t["source"] for t in result.plan.overhead_terms)
        assert result.plan.release_model.startswith("vLLM ")
        assert "logged by vLLM" in result.plan.cuda_total_source


def test_pipeline_stages_and_their_sampler() -> None:
    """PP 2: the first stage (14 of 27 layers, no sampler) binds, as vLLM's log shows."""
    result = planner_logs.compare(planner_logs.CORPUS / "v1-l4x4-deepseek-v2-lite-tp2-pp2")
    terms = {t["name"]: t for t in result.plan.overhead_terms}
    assert terms["sampler"]["bytes"] == 0
    assert "first stage 14 layers" in terms["pipeline stage"]["source"]
