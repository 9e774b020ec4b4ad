#!/usr/bin/env python3
"""`fleet plan` against public vLLM startup logs (the corpus in ``tests/data/vllm-logs/``).

Each case is a folder with ``fleet.yaml`` (the logged setting, written as a user would) and
``logged.json`` (the source URL, the release, the model's published config, the flags and the
numbers vLLM logged; a number the log does not show is ``null``, with a note). For each case
this prints the predicted / logged ratio of the KV cache memory (vLLM's ``Available KV cache
memory`` or V0's ``kv_cache_size``), of the KV tokens (``GPU KV cache size``, or V0's
``# GPU blocks`` × 16) and of the maximum concurrency, then the distribution per release
family, worst case last. No GPU and no vLLM are needed.

Example::

    $ .venv/bin/python benchmarks/planner_logs.py
    v0-rtx3090-llama31-8b-20k  0.6.4.post1  KV memory 1.012  tokens 1.012  concurrency 1.013
    ...
    worst: ... (KV memory 0.981)
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleet.load import load_fleet  # noqa: E402
from fleet.planner.fit import GiB, ServerPlan, plan_fleet, version_tuple  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "vllm-logs"
#: The goals of issue 16: V1 releases within 2 %, V0 within 5 % (or a located warning).
GOALS = {"V1": 0.02, "V0": 0.05}


@dataclass
class Result:
    """One case: the logged numbers, the plan, and the ratios where both sides have a number."""

    name: str
    logged: dict
    plan: ServerPlan
    ratios: dict[str, float]

    @property
    def engine(self) -> str:
        """V0 or V1, as the case file says."""
        return self.logged["engine"]

    @property
    def family(self) -> str:
        """The release family: 0.6, 0.19, …"""
        return ".".join(str(p) for p in version_tuple(self.logged["release"])[:2])

    @property
    def split(self) -> str:
        """``held-out`` (kept out of every calibration) or ``calibration``."""
        return self.logged.get("split", "calibration")

    @property
    def worst(self) -> float:
        """The ratio furthest from 1 (1.0 when nothing could be compared)."""
        return max(self.ratios.values(), key=lambda r: abs(r - 1), default=1.0)


def cases() -> list[Path]:
    """Every case folder of the corpus, by name."""
    return sorted(p for p in CORPUS.iterdir() if (p / "logged.json").is_file())


def compare(case: Path) -> Result:
    """Plan one case and compare it with what vLLM logged."""
    logged = json.loads((case / "logged.json").read_text())
    plan = plan_fleet(load_fleet(case / "fleet.yaml", capacity=False)).servers[0]
    numbers = logged["logged"]
    ratios: dict[str, float] = {}
    # A ratio only where the log has a positive number (a refusal with no KV memory left is
    # compared by its verdict alone).
    if (numbers.get("available_kv_gib") or 0) > 0 and plan.kv_budget_bytes is not None:
        ratios["KV memory"] = plan.kv_budget_bytes / GiB / numbers["available_kv_gib"]
    if (numbers.get("kv_tokens") or 0) > 0 and plan.kv_cache_tokens is not None:
        ratios["tokens"] = plan.kv_cache_tokens / numbers["kv_tokens"]
    if (numbers.get("max_concurrency") or 0) > 0 and plan.max_concurrency is not None:
        ratios["concurrency"] = plan.max_concurrency / numbers["max_concurrency"]
    return Result(case.name, logged, plan, ratios)


def warned(result: Result) -> bool:
    """Whether the plan says, in its warnings or what it cannot check, what the case expects
    it to say (``expect_warning`` in logged.json) instead of a number within the goal."""
    expected = result.logged.get("expect_warning")
    said = " ".join(result.plan.warnings + result.plan.cannot_check)
    return bool(expected) and expected in said


def within_goal(result: Result) -> bool:
    """Every ratio within the family's goal, or the explicit warning the case expects."""
    if warned(result):
        return True
    if not result.ratios:
        return refused_without_memory(result)
    return abs(result.worst - 1) <= GOALS[result.engine]


def refused_without_memory(result: Result) -> bool:
    """A log of a refusal with no KV memory left (negative or zero): held to its verdict."""
    numbers = result.logged["logged"]
    return (numbers.get("available_kv_gib") or 0) <= 0 and numbers.get("started") is False


def arithmetic_gap(result: Result) -> float | None:
    """Logged KV memory less what vLLM's own arithmetic (V0 and V1) makes of the logged terms
    (budget − weights − peak activation − non-torch; from 0.21 the logged peak includes the CUDA
    graph estimate), in GiB; None where the log does not give every term."""
    numbers = result.logged["logged"]
    terms = ("budget_gib", "weights_gib", "activation_peak_gib", "non_torch_memory_gib",
             "available_kv_gib")
    if any(numbers.get(k) is None for k in terms):
        return None
    return numbers["available_kv_gib"] - (numbers["budget_gib"] - numbers["weights_gib"]
                                          - numbers["activation_peak_gib"]
                                          - numbers["non_torch_memory_gib"])


def contradicts_itself(result: Result) -> bool:
    """Whether the case's logged terms break vLLM's own arithmetic by more than 0.05 GiB and
    logged.json's ``inconsistent_note`` says why. Such a case stays in every count as a miss;
    it is only named."""
    gap = arithmetic_gap(result)
    return bool(result.logged["logged"].get("inconsistent_note")) and gap is not None \
        and abs(gap) > 0.05


def distribution(results: list[Result]) -> list[str]:
    """Per release family and number: min / median / max of predicted ÷ logged, then the
    cases the goal is not held to (explicit warnings)."""
    lines = []
    families: dict[str, list[Result]] = {}
    for r in results:
        families.setdefault(f"{r.engine} {r.family}", []).append(r)
    for family, members in sorted(families.items(), key=lambda kv: (kv[0][:2],
                                  version_tuple(kv[0].split()[1] + ".0"))):
        for key in ("KV memory", "tokens", "concurrency"):
            values = [m.ratios[key] for m in members if key in m.ratios and not warned(m)]
            if values:
                lines.append(f"{family:8} {key:12} n={len(values)}  min {min(values):.3f}  "
                             f"median {statistics.median(values):.3f}  max {max(values):.3f}")
        said = [m.name for m in members if warned(m)]
        if said:
            lines.append(f"{family:8} {'warned':12} n={len(said)}  ({', '.join(said)})")
    return lines


def goal_summary(results: list[Result], label: str) -> list[str]:
    """Issue 24's goal on a set of cases: V1 cases within ±2 % (every ratio), every case within
    ±5 % or warned, verdicts against vLLM's, and min / median / max of the worst ratios."""
    v1 = [r for r in results if r.engine == "V1" and r.ratios and not warned(r)]
    within2 = [r for r in v1 if abs(r.worst - 1) <= 0.02]
    compared = [r for r in results if r.ratios]
    within5 = [r for r in compared if abs(r.worst - 1) <= 0.05 or warned(r)]
    optimistic = [r for r in results if r.plan.verdict == "fits"
                  and r.logged["logged"].get("started") is False]
    worst = sorted(r.worst for r in compared)
    spread = (f"min {worst[0]:.3f}  median {statistics.median(worst):.3f}  max {worst[-1]:.3f}"
              if worst else "nothing compared")
    v1_all = [r for r in results if r.engine == "V1" and r.ratios]
    return [
        f"{label}: {len(results)} cases, {len(compared)} with a number to compare "
        f"({len(v1_all)} V1, {sum(warned(r) for r in v1_all)} of them warned)",
        f"  V1 within ±2 %: {len(within2)} of {len(v1)} held to a number"
        + (f" ({len(within2) / len(v1):.0%})" if v1 else "")
        + f"; {len(within2)} of all {len(v1_all)} V1 cases with a number, warned ones counted "
        + "as misses" + (f" ({len(within2) / len(v1_all):.0%})" if v1_all else ""),
        f"  within ±5 % or warned: {len(within5)} of {len(compared)}",
        f"  worst ratio per case: {spread}",
        f"  \"fits\" where vLLM failed: {len(optimistic)}"
        + (f" ({', '.join(r.name for r in optimistic)})" if optimistic else ""),
    ] + [f"  counted as a miss, the log contradicting itself: {r.name}"
         for r in results if contradicts_itself(r)]


def main() -> int:
    """Print one line per case, the distribution per release family, the worst case last."""
    results = [compare(case) for case in cases()]
    for r in results:
        shown = "  ".join(f"{k} {v:.3f}" for k, v in r.ratios.items()) or "nothing to compare"
        started = "started" if r.logged["logged"].get("started") else "refused"
        verdict = f"plan: {r.plan.verdict}, vLLM {started}"
        note = f"; warned: {r.logged['expect_warning']}" if warned(r) else ""
        print(f"{r.name:36} {r.logged['release']:12} {shown}  ({verdict}{note})")
    print()
    print("\n".join(distribution(results)))
    print()
    print("\n".join(goal_summary([r for r in results if r.split == "held-out"], "held-out")))
    print("\n".join(goal_summary(results, "whole corpus")))
    failed = [r for r in results if not within_goal(r) and not contradicts_itself(r)]
    wrong = [r for r in results if not contradicts_itself(r)
             and r.plan.fits is not None and r.plan.fits != r.logged["logged"].get("started")]
    held = [r for r in results if not warned(r) and r.ratios and not contradicts_itself(r)]
    worst = max(held, key=lambda r: abs(r.worst - 1))
    print(f"\ncases {len(results)}, outside their goal {len(failed)}, wrong verdict {len(wrong)}, "
          f"explicit warnings {sum(warned(r) for r in results)}, logs contradicting themselves "
          f"{sum(contradicts_itself(r) for r in results)} (misses in the counts above)")
    print(f"worst: {worst.name} ({worst.engine} {worst.logged['release']}): {worst.worst:.3f}")
    return 0 if not failed and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
