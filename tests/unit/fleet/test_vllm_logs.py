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


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_planner_within_goal(case: Path) -> None:
    """Predicted / logged stays within the release family's goal, and the verdict matches."""
    result = planner_logs.compare(case)
    goal = planner_logs.GOALS[result.engine]
    assert result.ratios, f"{case.name}: nothing to compare"
    for key, ratio in result.ratios.items():
        assert abs(ratio - 1) <= goal, f"{case.name}: {key} ratio {ratio:.3f} beyond ±{goal:.0%}"
    assert result.plan.fits == result.logged["logged"]["started"], result.plan.reason


def test_terms_are_named_with_their_source() -> None:
    """Every overhead term of a GPU plan carries a name and where its number comes from."""
    result = planner_logs.compare(CASES[0])
    names = [t["name"] for t in result.plan.overhead_terms]
    assert names == ["activation", "sampler", "profiling peak", "non-torch", "CUDA graphs"]
    assert all(t["source"] for t in result.plan.overhead_terms)
    assert result.plan.release_model.startswith("vLLM ")
