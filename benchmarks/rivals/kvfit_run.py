"""Run kvfit (0.3.0) on cases given as JSON on stdin; print its figures as JSON (one per case).

Runs inside kvfit's own virtual environment (benchmarks/planner_rivals.py starts it). kvfit reads
its model metadata from the Hugging Face Hub, which the planner benchmark does not reach; its
public library API takes the same inputs directly: ``kvfit.architectures.estimate_cache`` on the
model's config.json and ``kvfit.planner.plan_topologies`` with the weights, a ``custom:<GiB>``
accelerator and the utilization.

Example::

    $ echo '[{...}]' | .rivals/kvfit/bin/python benchmarks/rivals/kvfit_run.py
"""

import json
import sys

from kvfit.architectures import estimate_cache
from kvfit.hardware import parse_hardware
from kvfit.planner import plan_topologies

results = []
for case in json.load(sys.stdin):
    try:
        if case["pp"] > 1:
            raise ValueError("kvfit plans no pipeline parallel ('No PP/CP/offload is inferred')")
        cache = estimate_cache(case["config"], context_tokens=case["max_model_len"],
                               kv_bytes=case["kv_bytes"])
        [layout] = plan_topologies(
            cache, weight_bytes=case["weights_total"],
            hardware=parse_hardware(f"custom:{case['memory_gib']}"), gpus=case["tp"],
            utilization=case["utilization"], tensor_parallel=case["tp"])
        free = (layout.budget_per_rank_bytes - layout.weights_per_rank_bytes
                - layout.fixed_cache_per_rank_bytes - layout.runtime_reserve_per_rank_bytes)
        per_token = layout.kv_per_sequence_per_rank_bytes / case["max_model_len"]
        results.append({"name": case["name"], "kv_gib": free / 2**30,
                        "kv_tokens": int(free / per_token) if per_token else None,
                        "verdict": layout.verdict})
    except Exception as err:  # a rival's refusal is a result too
        results.append({"name": case["name"], "error": f"{type(err).__name__}: {err}"})
json.dump(results, sys.stdout)
