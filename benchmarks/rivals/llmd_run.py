"""Run llm-d-planner (0.3.3) on cases given as JSON on stdin; print its figures as JSON.

Runs inside llm-d-planner's own virtual environment (benchmarks/planner_rivals.py starts it).
Its public API (``planner.capacity_planner``) reads the weights from the Hub's safetensors
metadata, which the benchmark does not reach: ``model_memory_req`` is given the same weights
``fleet plan`` gets (the log's ``Model loading took``); everything else is llm-d-planner's own
(``total_kv_cache_blocks``, ``allocatable_kv_cache_memory``, its activation and non-torch
constants calibrated on vLLM 0.19).

Example::

    $ echo '[{...}]' | .rivals/llmd/bin/python benchmarks/rivals/llmd_run.py
"""

import json
import sys
from types import SimpleNamespace

from planner import capacity_planner as cp


def namespace(config: dict) -> SimpleNamespace:
    """The config.json as the attribute object llm-d-planner reads (transformers-like)."""
    ns = SimpleNamespace(**config)
    ns.to_dict = lambda: dict(config)
    for key in ("num_key_value_heads", "head_dim", "quantization_config",
                "kv_lora_rank", "qk_rope_head_dim", "rope_scaling", "vision_config"):
        if not hasattr(ns, key):
            setattr(ns, key, None)
    if ns.num_key_value_heads is None:
        ns.num_key_value_heads = config["num_attention_heads"]
    return ns


results = []
for case in json.load(sys.stdin):
    weights_gib = case["weights_total"] / 2**30
    cp.model_memory_req = lambda *args, _w=weights_gib, **kwargs: _w
    try:
        config = namespace(case["config"])
        args = dict(context_len=case["max_model_len"], gpu_memory=case["memory_gib"],
                    gpu_mem_util=case["utilization"], tp=case["tp"], pp=case["pp"])
        blocks = cp.total_kv_cache_blocks("case/model", config, **args)
        kv = cp.allocatable_kv_cache_memory(
            "case/model", config, case["memory_gib"], case["utilization"], case["tp"],
            case["pp"], 1, max_model_len=case["max_model_len"])
        results.append({"name": case["name"], "kv_gib": kv / (case["tp"] * case["pp"]),
                        "kv_tokens": blocks * 16})
    except Exception as err:  # a rival's refusal is a result too
        results.append({"name": case["name"], "error": f"{type(err).__name__}: {err}"})
json.dump(results, sys.stdout)
