#!/usr/bin/env python3
"""`fleet plan` side by side with rival planners on the public vLLM logs of tests/data/vllm-logs.

For each case the planner models (no "release not modelled" or other explicit warning), this
prints vLLM's logged KV tokens (or, where the log shows none, its KV cache memory per GPU) and
what each planner predicts from the same inputs (the model's config.json, the weights the log
shows, the GPU's memory as nvidia-smi reports it, TP/PP, max-model-len, gpu-memory-utilization):

- ``fleet plan`` (fleet/planner/fit.py, fleet/planner/memory.py);
- ``kvfit`` 0.3.0 and ``llm-d-planner`` 0.3.3, each installed in its own virtual environment
  (``.rivals/kvfit``, ``.rivals/llmd``) and run there through its public API
  (benchmarks/rivals/*_run.py: neither reaches the Hub from here, so each is handed the config
  and the weights instead of a model id);
- the ``weights × 1.2 + 2 GiB`` heuristic (GPUStack's estimate of the memory a model needs):
  the KV memory it implies is utilization × memory − (weights per GPU × 1.2 + 2 GiB), in tokens
  at the KV bytes per token ``fleet plan`` computes (the heuristic has none of its own).

Make the rivals' environments once (PyPI)::

    python3 -m venv .rivals/kvfit && .rivals/kvfit/bin/pip install kvfit==0.3.0
    python3 -m venv .rivals/llmd && .rivals/llmd/bin/pip install llm-d-planner==0.3.3

Example::

    $ .venv/bin/python benchmarks/planner_rivals.py
    case                              logged      fleet plan   kvfit   llm-d   heuristic
    ...
    closest to vLLM: fleet plan on 11 of 11 cases; worst fleet plan ratio ...
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import planner_logs  # noqa: E402

from fleet.planner.fit import GiB, ServerPlan  # noqa: E402

RIVALS = {
    "kvfit": (ROOT / ".rivals" / "kvfit" / "bin" / "python", ROOT / "benchmarks" / "rivals"
              / "kvfit_run.py"),
    "llm-d": (ROOT / ".rivals" / "llmd" / "bin" / "python", ROOT / "benchmarks" / "rivals"
              / "llmd_run.py"),
}
HEURISTIC_FACTOR, HEURISTIC_GIB = 1.2, 2.0


def inputs(result: planner_logs.Result) -> dict:
    """The same inputs for every planner: config, weights, GPU, parallelism, length, budget."""
    plan = result.plan
    kv_bytes = 1 if plan.kv_cache_dtype.startswith("fp8") else 2
    return {
        "name": result.name, "config": result.logged["config"], "tp": plan.tp, "pp": plan.pp,
        "weights_total": plan.weights_bytes, "memory_gib": plan.gpu_memory_bytes / GiB,
        "utilization": plan.utilization, "max_model_len": plan.max_model_len,
        "kv_bytes": kv_bytes,
    }


def heuristic(plan: ServerPlan) -> dict:
    """KV memory and tokens the weights × 1.2 + 2 GiB estimate leaves in the budget."""
    needed = plan.weights_per_gpu_bytes * HEURISTIC_FACTOR + HEURISTIC_GIB * GiB
    free = plan.utilization * plan.gpu_memory_bytes - needed
    tokens = int(free / plan.kv_bytes_per_token) if plan.kv_bytes_per_token else None
    return {"kv_gib": free / GiB, "kv_tokens": tokens}


def run_rival(name: str, cases: list[dict]) -> dict[str, dict]:
    """A rival's figures per case name, or {} with a note when it is not installed."""
    python, script = RIVALS[name]
    if not python.exists():
        print(f"{name}: not installed at {python} (see this file's docstring)", file=sys.stderr)
        return {}
    done = subprocess.run([str(python), str(script)], input=json.dumps(cases), text=True,
                          capture_output=True, check=True, timeout=600)
    return {row["name"]: row for row in json.loads(done.stdout)}


def figure(result: planner_logs.Result, row: dict | None) -> tuple[float | None, str]:
    """A planner's ratio to vLLM's log (tokens where logged, else KV memory) and its cell."""
    numbers = result.logged["logged"]
    if row is None:
        return None, "—"
    if "error" in row:
        return None, "refused"
    if numbers.get("kv_tokens"):
        value = row.get("kv_tokens")
        return (value / numbers["kv_tokens"], f"{value:,}") if value else (None, "—")
    value = row.get("kv_gib")
    return (value / numbers["available_kv_gib"], f"{value:.2f}") if value else (None, "—")


def main() -> int:
    """Print one row per case with a number to compare (warned ones marked), the ratio of each
    planner to vLLM, closest marked; then fleet plan's wins on the held-out third and on all."""
    results = [r for r in map(planner_logs.compare, planner_logs.cases()) if r.ratios]
    cases = [inputs(r) for r in results]
    rivals = {name: run_rival(name, cases) for name in RIVALS}
    header = f"{'case':46} {'vLLM log':>12} {'fleet plan':>20} {'kvfit':>20} {'llm-d':>20} " \
             f"{'heuristic':>20}"
    print(header)
    wins, worst, won = 0, 1.0, set()
    for r in results:
        numbers = r.logged["logged"]
        unit = "tokens" if numbers.get("kv_tokens") else "GiB"
        logged = (f"{numbers['kv_tokens']:,}" if unit == "tokens"
                  else f"{numbers['available_kv_gib']:.2f} GiB")
        rows = {
            "fleet plan": {"kv_tokens": r.plan.kv_cache_tokens,
                           "kv_gib": r.plan.kv_budget_bytes / GiB},
            "kvfit": rivals["kvfit"].get(r.name), "llm-d": rivals["llm-d"].get(r.name),
            "heuristic": heuristic(r.plan),
        }
        cells, ratios = [], {}
        for name, row in rows.items():
            ratio, cell = figure(r, row)
            if ratio is not None:
                ratios[name] = ratio
                cell += f" ({ratio:.3f})"
            cells.append(cell)
        best = min(ratios, key=lambda n: abs(ratios[n] - 1))
        wins += best == "fleet plan"
        if best == "fleet plan":
            won.add(r.name)
        if not planner_logs.warned(r):
            worst = max(worst, ratios["fleet plan"], key=lambda x: abs(x - 1))
        marks = ("" if best == "fleet plan" else f"  closest: {best}") + (
            "  (warned)" if planner_logs.warned(r) else "") + (
            "  [held out]" if r.split == "held-out" else "")
        print(f"{r.name:46} {logged:>12} " + " ".join(f"{c:>20}" for c in cells) + marks)
    held = [r for r in results if r.split == "held-out"]
    print(f"\nclosest to vLLM: fleet plan on {wins} of {len(results)} cases "
          f"({sum(r.name in won for r in held)} of the {len(held)} held out); worst fleet plan "
          f"ratio where not warned {worst:.3f}")
    return 0 if 2 * wins > len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
