"""The memory model's answers to configurations vLLM starts (issue 16, item 0): CPU offload,
sliding-window attention, YaRN from the model's own config, expert parallel; and its per-release
terms (fleet/planner/memory.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.load import load_fleet, load_text
from fleet.planner import memory
from fleet.planner.fit import ServerPlan, plan_fleet
from fleet.spec.models import ModelConfig, Server

GiB = 2**30
ROOT = Path(__file__).resolve().parents[3]
FLEET = """
version: 1
models:
  m:
    hf: "x/y"
    revision: "0000000000000000000000000000000000000000"
    weights_gib: {weights}
    config: {config}
hosts:
  h:
    address: 10.0.0.1
    gpus: {{count: {count}, model: "{gpu}"}}
    os: {{nvidia: {{driver: "570"}}}}
    vllm: {{version: "{version}", variant: cu129}}
    servers:
      s:
        model: m
        gpus: {gpus}
        port: 8000
        args: {args}
"""
#: Published config.json values (meta-llama/Llama-2-13b-chat-hf, google/gemma-3-27b-it's
#: text_config, Qwen/Qwen3-8B with the YaRN block its model card gives, Qwen/Qwen3-30B-A3B).
LLAMA2_13B = {"num_hidden_layers": 40, "num_attention_heads": 40, "hidden_size": 5120,
              "intermediate_size": 13824, "vocab_size": 32000, "max_position_embeddings": 4096,
              "torch_dtype": "float16"}
GEMMA3_27B = {"model_type": "gemma3_text", "num_hidden_layers": 62, "num_attention_heads": 32,
              "num_key_value_heads": 16, "head_dim": 128, "hidden_size": 5376,
              "intermediate_size": 21504, "vocab_size": 262208,
              "max_position_embeddings": 131072, "sliding_window": 1024,
              "sliding_window_pattern": 6, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
              "torch_dtype": "bfloat16"}
QWEN3_8B_YARN = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "head_dim": 128, "hidden_size": 4096, "intermediate_size": 12288,
                 "vocab_size": 151936, "max_position_embeddings": 40960,
                 "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                  "original_max_position_embeddings": 32768},
                 "torch_dtype": "bfloat16"}
QWEN3_30B_A3B = {"num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
                 "head_dim": 128, "hidden_size": 2048, "intermediate_size": 6144,
                 "moe_intermediate_size": 768, "num_experts_per_tok": 8, "num_experts": 128,
                 "vocab_size": 151936, "max_position_embeddings": 262144,
                 "torch_dtype": "bfloat16"}


def plan(weights: float, config: dict, gpu: str, args: dict, count: int = 1,
         version: str = "0.32.0") -> ServerPlan:
    text = FLEET.format(weights=weights, config=json.dumps(config), gpu=gpu, count=count,
                        version=version, gpus=json.dumps(list(range(count))),
                        args=json.dumps(args))
    return plan_fleet(load_text(text, "/tmp/memory-test.yaml", capacity=False)).servers[0]


def test_cpu_offload_fits_the_documented_13b_on_a_24gb_card():
    """vLLM's docs: one 24 GB GPU with cpu_offload_gb=10 'can be seen as a 34 GB GPU' and loads
    Llama-2-13b in 16 bits (examples/offline_inference/cpu_offload.py); without it, it cannot."""
    without = plan(24.24, LLAMA2_13B, "RTX 4090", {})
    offloaded = plan(24.24, LLAMA2_13B, "RTX 4090", {"cpu-offload-gb": 10})
    assert without.fits is False
    assert offloaded.fits is True, offloaded.reason
    offload = next(t for t in offloaded.weights_terms if t["name"] == "CPU offload")
    assert offload["bytes"] == -10 * GiB
    assert offloaded.weights_per_gpu_bytes == without.weights_per_gpu_bytes - 10 * GiB


def test_sliding_window_fits_gemma3_27b_at_32k_on_one_h100():
    """Gemma-3-27B at 32k on one H100: 10 full-attention layers hold the whole request, 52
    sliding-window layers ~9k tokens, so the same KV memory holds 2.5 times the requests of
    full attention; on 0.16 (whose sort-based sampler peaks higher on Gemma's 262k vocabulary)
    full attention would not fit at all."""
    swa = plan(51.1, GEMMA3_27B, "H100 SXM", {"max-model-len": "32k"})
    assert swa.verdict == "fits", swa.reason
    assert any(t["name"] == "sliding window" for t in swa.overhead_terms)
    full = dict(GEMMA3_27B)
    del full["sliding_window"], full["sliding_window_pattern"]
    counted_full = plan(51.1, full, "H100 SXM", {"max-model-len": "32k"})
    assert 2.4 < swa.max_concurrency / counted_full.max_concurrency < 2.6
    assert plan(51.1, GEMMA3_27B, "H100 SXM", {"max-model-len": "32k"}, version="0.16.0").fits
    assert plan(51.1, full, "H100 SXM", {"max-model-len": "32k"}, version="0.16.0").fits is False


def test_gemma3_limit_is_not_scaled_again():
    """vLLM skips the RoPE factor for Gemma 3: its 131,072 is already scaled."""
    assert ModelConfig.model_validate(GEMMA3_27B).max_len_limit == 131072


def test_yarn_from_the_model_config_allows_131072():
    """32,768 × 4 = 131,072 from the model's own config.json (not max_position_embeddings)."""
    assert ModelConfig.model_validate(QWEN3_8B_YARN).max_len_limit == 131072
    served = plan(15.26, QWEN3_8B_YARN, "H100 SXM", {"max-model-len": 131072})
    assert served.fits is True, served.reason


def test_expert_parallel_splits_the_experts_over_the_dp_ranks():
    """DP 4 + EP on 4 GPUs: each GPU holds a quarter of the experts and all of the rest."""
    replicas = plan(56.9, QWEN3_30B_A3B, "H100 PCIe", {"data-parallel-size": 4}, count=4)
    split = plan(56.9, QWEN3_30B_A3B, "H100 PCIe",
                 {"data-parallel-size": 4, "enable-expert-parallel": True}, count=4)
    fraction = memory.expert_fraction(ModelConfig.model_validate(QWEN3_30B_A3B))
    assert fraction is not None
    expected = (1 - fraction) + fraction / 4
    assert split.weights_per_gpu_bytes / replicas.weights_per_gpu_bytes == pytest.approx(
        expected, rel=1e-6)
    assert split.kv_budget_bytes > replicas.kv_budget_bytes


def test_cuda_total_uses_nvidia_smi_reserved_when_known():
    """The H200 capture: 143771 MiB total, 616 MiB reserved: CUDA sees 139.80 GiB."""
    total, source = memory.cuda_total_bytes(143771 / 1024, "H200")
    assert total == (143771 - 616) * 2**20
    assert "memory.reserved 616 MiB" in source
    given, _ = memory.cuda_total_bytes(24564 / 1024, "RTX 4090", reserved_mib=449)
    assert given == (24564 - 449) * 2**20


@pytest.mark.parametrize(("version", "engine", "family", "non_torch"), [
    ("0.6.4.post1", "V0", "V0 0.6.4", 0.35), ("0.6.5", "V0", "V0 0.6.5", 1.79),
    ("0.7.3", "V0", "V0 0.7", 0.1), ("0.8.5", "V1", "V1 0.8", 0.65), ("0.11.0", "V1", "V1", 0.15),
])
def test_each_release_family_counts_its_own_non_torch(version, engine, family, non_torch):
    assert memory.family(version, engine) == family
    [term] = [t for t in memory.profile_terms(family, version, Server(model="m", port=1), None,
                                              memory.Batch(2048, 256, "test"), 2)
              if t.name == "non-torch"]
    assert term.bytes == int(non_torch * GiB)
    assert term.source


def test_v1_samples_only_on_the_last_pipeline_stage():
    config = ModelConfig.model_validate(QWEN3_8B_YARN)
    first = memory.profile_terms("V1", "0.11.0", Server(model="m", port=1), config,
                                 memory.Batch(2048, 256, "test"), 2, last_stage=False)
    assert {t.name: t.bytes for t in first}["sampler"] == 0


@pytest.mark.parametrize("name", ["v032-cpu-offload-llama2-13b-rtx4090",
                                  "v032-swa-gemma3-27b-h100", "v032-yarn-qwen3-8b-131k-h100"])
def test_corpus_files_of_these_gaps_plan_fits(name):
    """The correct-configuration corpus's files for these gaps: vLLM starts them, the plan fits."""
    path = ROOT / "tests" / "data" / "valid" / f"{name}.yaml"
    [server] = plan_fleet(load_fleet(path)).servers
    assert server.verdict == "fits", server.reason


def test_h200_cuda_total_is_what_torch_reported_on_the_captured_h200():
    """tests/fixtures/nvidia/h200x1-health: nvidia-smi's memory.total − memory.reserved is the
    total torch.cuda.mem_get_info reported on the same GPU, within nvidia-smi's 1 MiB rounding."""
    health = ROOT / "tests" / "fixtures" / "nvidia" / "h200x1-health"
    row = (health / "query-health.csv").read_text().splitlines()[1].split(", ")
    total_mib, reserved_mib = (float(row[i].split()[0]) for i in (11, 12))
    torch_total = json.loads((health / "torch-context.json").read_text())["total_bytes"]
    for total in (memory.cuda_total_bytes(total_mib / 1024, reserved_mib=reserved_mib)[0],
                  memory.cuda_total_bytes(total_mib / 1024, "H200")[0]):
        assert abs(total - torch_total) <= 2**20


def test_batch_defaults_follow_the_pinned_release():
    """The profiling batch is the pinned release's own default: a B200 batches 8192 tokens on
    0.24 (no class above 70 GiB yet) and 16384 on 0.28 (its ≥ 160 GiB class), so 0.28's
    activation term is twice 0.24's and its KV cache smaller; an A100 stays at 2048 on both."""
    old = plan(24.24, LLAMA2_13B, "B200", {}, version="0.24.0")
    new = plan(24.24, LLAMA2_13B, "B200", {}, version="0.28.0")
    before, after = ({t["name"]: t for t in p.overhead_terms}["activation"] for p in (old, new))
    assert "8,192 tokens" in before["source"]
    assert "vLLM 0.24.0's default" in before["source"]
    assert "16,384 tokens" in after["source"]
    assert after["bytes"] == 2 * before["bytes"]
    assert new.kv_budget_bytes < old.kv_budget_bytes
    for version in ("0.24.0", "0.28.0"):
        a100 = plan(24.24, LLAMA2_13B, "A100 80GB", {}, version=version)
        assert "2,048 tokens" in {t["name"]: t for t in a100.overhead_terms}["activation"]["source"]


def test_hybrid_models_are_said_not_modelled():
    """A model with linear-attention layers (Qwen3-Next's layer_types) gets the explicit warning
    instead of an unqualified number; a plain dense model does not."""
    layers = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 12
    hybrid = dict(QWEN3_30B_A3B, model_type="qwen3_next", layer_types=layers)
    warned = plan(16.0, hybrid, "H100 SXM", {"max-model-len": 32768})
    assert any(w.startswith("hybrid model not modelled") for w in warned.warnings)
    plain = plan(16.0, QWEN3_30B_A3B, "H100 SXM", {"max-model-len": 32768})
    assert not any(w.startswith("hybrid") for w in plain.warnings)


def test_sampler_path_follows_the_release():
    """The profiling sampler's bytes per (row × vocabulary entry): the PyTorch sort up to 0.16,
    the in-place Triton kernel from 0.17 (a smaller peak, so a larger KV cache), FlashInfer where
    the server opts in."""
    args = {"max-model-len": 16000}
    terms = {}
    for version in ("0.11.0", "0.16.0", "0.17.0"):
        p = plan(14.99, QWEN3_8B_YARN, "H100 SXM", args, version=version)
        terms[version] = {t["name"]: t for t in p.overhead_terms}["sampler"]
    assert "PyTorch sort" in terms["0.11.0"]["source"]
    assert terms["0.11.0"]["bytes"] == terms["0.16.0"]["bytes"]
    assert "Triton kernel" in terms["0.17.0"]["source"]
    assert terms["0.17.0"]["bytes"] < terms["0.16.0"]["bytes"] / 2
    # 1024 rows × 151,936 × 38 B + the held hidden states: the H100 logs' 5.56-5.64 GiB peaks.
    assert 5.5 < terms["0.11.0"]["bytes"] / GiB < 5.7
