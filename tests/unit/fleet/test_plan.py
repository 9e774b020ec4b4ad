"""The memory planner: its formulas against hand-computed numbers, the examples' verdicts, the
``fleet plan`` command, topology warnings, and what it says when it cannot check.

Hand computations use real published configs: Qwen3-8B (GQA: 36 layers, 8 KV heads of 128),
Llama-3.1-70B (GQA: 80 layers, 8 KV heads of 128), DeepSeek-V3 (MLA: 61 layers, latent 512 +
rope 64), Qwen2.5-VL-7B (28 layers, 4 KV heads, head_dim = 3584 / 28 = 128).
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import pytest
from rich.console import Console

from cli import main as cli
from cli.main import main
from fleet.catalog.gpus import lookup
from fleet.load import FleetError, load_fleet, load_text
from fleet.planner import memory
from fleet.planner.fit import kv_bytes_per_token, plan_fleet, weights_in_memory
from fleet.planner.sizing import safetensors_bytes
from fleet.spec.models import ModelConfig, Server

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data"
EXAMPLES = ROOT / "inventory" / "examples"
GiB = 2**30

QWEN3_8B = ModelConfig(
    num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    hidden_size=4096, intermediate_size=12288, vocab_size=151936, max_position_embeddings=40960,
)
LLAMA_31_70B = ModelConfig(
    num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, hidden_size=8192,
    intermediate_size=28672, vocab_size=128256, max_position_embeddings=131072,
    rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"},
)
DEEPSEEK_V3 = ModelConfig(
    num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, hidden_size=7168,
    kv_lora_rank=512, qk_rope_head_dim=64, vocab_size=129280, max_position_embeddings=163840,
    rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
)
QWEN25_VL_7B = ModelConfig(
    num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, hidden_size=3584,
    max_position_embeddings=128000, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
)
TINY_LLAMA = ModelConfig(
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    hidden_size=64, max_position_embeddings=2048,
)


@pytest.fixture(autouse=True)
def wide_consoles(monkeypatch):
    """In-process runs print as on a wide terminal."""
    monkeypatch.setattr(cli, "out", Console(highlight=False, width=1000))
    monkeypatch.setattr(cli, "err", Console(stderr=True, highlight=False, width=1000))


# --- KV cache bytes per token ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "tp", "pp", "kv_dtype", "dtype_bytes", "expected"),
    [
        # 2 (K and V) × 36 layers × 8 KV heads × 128 × 2 bytes
        (QWEN3_8B, 1, 1, "auto", 2, 147_456),
        # TP 2 splits the 8 KV heads: 4 per GPU
        (QWEN3_8B, 2, 1, "auto", 2, 73_728),
        # fp8 KV cache: one byte per element
        (QWEN3_8B, 1, 1, "fp8", 1, 73_728),
        # 2 × 80 × (8 / 4) × 128 × 2
        (LLAMA_31_70B, 4, 1, "auto", 2, 81_920),
        # 2 × 80 × (8 / 8) × 128 × 1
        (LLAMA_31_70B, 8, 1, "fp8", 1, 20_480),
        # TP 16 > 8 KV heads: each GPU keeps one (replicated) head: 2 × 80 × 1 × 128 × 2
        (LLAMA_31_70B, 16, 1, "auto", 2, 40_960),
        # PP 2: each stage holds 40 of the 80 layers: 2 × 40 × 8 × 128 × 2
        (LLAMA_31_70B, 1, 2, "auto", 2, 163_840),
        # MLA: 61 layers × (512 + 64) × 2 bytes, not divided by TP
        (DEEPSEEK_V3, 8, 1, "auto", 2, 70_272),
        (DEEPSEEK_V3, 1, 1, "auto", 2, 70_272),
        # MLA with fp8: 61 × 576 × 1
        (DEEPSEEK_V3, 8, 1, "fp8", 1, 35_136),
        # fp8_ds_mla: 656 bytes per token and layer: 61 × 656
        (DEEPSEEK_V3, 8, 1, "fp8_ds_mla", 1, 40_016),
        # MLA, PP 2: ceil(61 / 2) = 31 layers on the larger stage: 31 × 576 × 2
        (DEEPSEEK_V3, 8, 2, "auto", 2, 35_712),
        # head_dim from hidden_size / heads = 3584 / 28 = 128: 2 × 28 × 4 × 128 × 2
        (QWEN25_VL_7B, 1, 1, "auto", 2, 57_344),
        # the test model: 2 × 2 × 2 × 32 × 2
        (TINY_LLAMA, 1, 1, "auto", 2, 512),
    ],
    ids=[
        "qwen3-8b", "qwen3-8b-tp2", "qwen3-8b-fp8", "llama70b-tp4", "llama70b-tp8-fp8",
        "llama70b-tp16-replicated", "llama70b-pp2", "deepseek-mla-tp8", "deepseek-mla-tp1",
        "deepseek-mla-fp8", "deepseek-fp8-ds-mla", "deepseek-mla-pp2", "qwen25vl-head-dim",
        "tiny-llama",
    ],
)
def test_kv_bytes_per_token(config, tp, pp, kv_dtype, dtype_bytes, expected):
    assert kv_bytes_per_token(config, tp, pp, kv_dtype, dtype_bytes) == expected


# --- model limits ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "limit"),
    [
        (QWEN3_8B, 40_960),  # no RoPE scaling
        (LLAMA_31_70B, 131_072),  # llama3 scaling: max_position_embeddings already counts it
        (DEEPSEEK_V3, 163_840),  # yarn: likewise
        (QWEN25_VL_7B, 128_000),  # mrope has no factor
        (QWEN3_8B.model_copy(update={"rope_scaling": {"rope_type": "linear", "factor": 2}}),
         81_920),
    ],
    ids=["none", "llama3", "yarn", "mrope", "linear-x2"],
)
def test_max_len_limit(config, limit):
    assert config.max_len_limit == limit


# --- weights -----------------------------------------------------------------------------------


def test_online_fp8_halves_linear_layers_but_not_embeddings():
    # Qwen3-4B: 4,022,468,096 parameters in bf16 = 8,044,936,192 bytes; embedding 151936 × 2560
    # (tied, 777,912,320 bytes): (8,044,936,192 − 777,912,320) / 2 + 777,912,320
    config = ModelConfig(num_hidden_layers=36, num_attention_heads=32, hidden_size=2560,
                         vocab_size=151936, tie_word_embeddings=True)
    server = Server(model="m", port=1, args={"quantization": "fp8"})
    assert weights_in_memory(server, config, 8_044_936_192)[0] == 4_411_424_256


def test_prequantized_checkpoint_is_not_halved_again():
    config = DEEPSEEK_V3.model_copy(update={"quantization_config": {"quant_method": "fp8"}})
    server = Server(model="m", port=1, args={"quantization": "fp8"})
    assert weights_in_memory(server, config, 1000)[0] == 1000


def test_safetensors_index_gives_the_weights():
    assert safetensors_bytes(DATA / "models" / "qwen3-8b") == 16_381_470_720


def test_safetensors_headers_give_the_weights(tmp_path):
    header = json.dumps({
        "a": {"dtype": "BF16", "shape": [4, 8], "data_offsets": [0, 64]},
        "b": {"dtype": "F32", "shape": [10], "data_offsets": [64, 104]},
        "__metadata__": {"format": "pt"},
    }).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    assert safetensors_bytes(tmp_path) == 104


# --- one server, by hand (the workstation example) ---------------------------------------------


@pytest.fixture(scope="module")
def workstation():
    return plan_fleet(load_fleet(EXAMPLES / "workstation-4090.yaml")).server("ws-4090", "chat")


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        # RTX 4090: CUDA reports 23.55 GiB (vLLM's own log of one, vllm#13061;
        # fleet/planner/memory.py):
        # int(23.55 × 2^30 × 0.92)
        ("budget_bytes", 23_263_690_358),
        # weights_gib 15.26 × 2^30
        ("weights_per_gpu_bytes", 16_385_300_234),
        # the profiling peak is the larger of (they run one after the other):
        # activations 2048 tokens × (3 × 4096 + max(3 × 12288, 48 × 128 + 32 × 128)) × 2
        # = 201,326,592 and the sampler (0.11's PyTorch sort) 256 rows × 151,936 vocab × 38
        # = 1,478,033,408 + the 2048 × 4096 bf16 hidden states it holds = 1,494,810,624;
        # + workspaces 0.15 GiB = 161,061,273 (CUDA graphs are outside the budget in 0.11)
        ("overhead_bytes", 1_655_871_897),
        # 23,263,690,358 − 16,385,300,234 − 1,655,871,897
        ("kv_budget_bytes", 5_222_518_227),
        ("kv_bytes_per_token", 147_456),
        # 5,222,518,227 // (147,456 × 16) = 2213 blocks of 16; 2213 / 128 blocks per 2048
        # tokens = 17.2890625 sequences = 35,408 tokens
        ("kv_cache_tokens", 35_408),
        ("max_concurrency", 17.2890625),
        ("verdict", "fits"),
    ],
)
def test_workstation_number(workstation, field, expected):
    assert getattr(workstation, field) == expected


def test_tensor_parallel_divides_weights_per_gpu():
    fleet = load_fleet(DATA / "valid" / "config-path.yaml")
    chat = plan_fleet(fleet).server("l40s-01", "chat")
    assert chat.weights_per_gpu_bytes == 16_381_470_720 // 2


# --- the examples ------------------------------------------------------------------------------

EXAMPLE_SERVERS = [
    ("workstation-4090.yaml", "ws-4090", "chat"),
    ("quad-4090d.yaml", "quad-4090d", "vlm"),
    ("quad-4090d.yaml", "quad-4090d", "llm"),
    ("quad-4090d.yaml", "quad-4090d", "guard"),
    ("quad-4090d.yaml", "quad-4090d", "router"),
    ("quad-4090d.yaml", "quad-4090d", "summarize"),
    ("quad-4090d.yaml", "quad-4090d", "tagger"),
    ("h200-pair.yaml", "hgx-h200-01", "deepseek"),
]


@pytest.mark.parametrize(("file", "host", "server"), EXAMPLE_SERVERS,
                         ids=lambda v: str(v).removesuffix(".yaml"))
def test_example_server_fits(file, host, server):
    assert plan_fleet(load_fleet(EXAMPLES / file)).server(host, server).verdict == "fits"


@pytest.mark.parametrize("file", ["workstation-4090.yaml", "quad-4090d.yaml", "h200-pair.yaml"])
def test_example_gpus_fit(file):
    assert {gpu.verdict for gpu in plan_fleet(load_fleet(EXAMPLES / file)).gpus} == {"fits"}


def test_pipeline_across_hosts_counts_the_worker_hosts_gpus():
    plan = plan_fleet(load_fleet(EXAMPLES / "h200-pair.yaml"))
    assert {(g.host, g.index) for g in plan.gpus} == {
        (host, index) for host in ("hgx-h200-01", "hgx-h200-02") for index in range(8)
    }


def test_gpu0_sharers_sum_in_the_plan():
    plan = plan_fleet(load_fleet(EXAMPLES / "quad-4090d.yaml"))
    gpu0 = next(g for g in plan.gpus if g.index == 0)
    assert gpu0.utilization_sum == 0.85


# --- cpu build: the benchmark's settings ---------------------------------------------------------

CPU_FLEET = """\
version: 1
models:
  tiny:
    url: "http://127.0.0.1:8765/tiny-llama.tar.gz"
    sha256: "7bba1c3a1056cbe482242a8d8e69c897ff9ce84035c28602bad26bfe0f76523a"
    config: {num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
             head_dim: 32, hidden_size: 64, max_position_embeddings: 2048,
             torch_dtype: bfloat16}
hosts:
  box:
    address: sandbox
    vllm: {version: "0.32.0", variant: cpu, cpu_kvcache_space_gib: 1}
    servers:
      tiny: {model: tiny, port: 18000, args: {max-model-len: 512}}
"""


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("kv_budget_bytes", GiB),  # cpu_kvcache_space_gib, nothing taken out
        ("kv_cache_tokens", 2_097_152),  # 2^30 / 512 bytes per token
        ("max_concurrency", 4096.0),  # 2,097,152 / 512
    ],
)
def test_cpu_kv_budget_is_the_kvcache_space(field, expected):
    plan = plan_fleet(load_text(CPU_FLEET)).server("box", "tiny")
    assert getattr(plan, field) == expected


# --- what cannot be checked --------------------------------------------------------------------


def test_cpu_server_without_config_cannot_be_checked():
    text = CPU_FLEET[: CPU_FLEET.index("    config:")] + CPU_FLEET[CPU_FLEET.index("hosts:") :]
    plan = plan_fleet(load_text(text)).server("box", "tiny")
    assert plan.verdict == "unknown" and "has no config" in plan.reason, plan.reason


GPU_FLEET = """\
version: 1
models:
  m:
    hf: "org/m"
    revision: "0123456789abcdef0123456789abcdef01234567"
{config}
hosts:
  box:
    address: 10.0.0.1
    gpus: {gpus}
    os: {{nvidia: {{driver: "570"}}}}
    vllm: {{version: "0.11.0", variant: cu129}}
    servers:
      chat: {{model: m, gpus: [0], port: 8000, args: {args}}}
"""
QWEN3_8B_INLINE = """\
    config: {num_hidden_layers: 36, num_attention_heads: 32, num_key_value_heads: 8,
             head_dim: 128, hidden_size: 4096, intermediate_size: 12288,
             vocab_size: 151936, max_position_embeddings: 40960}"""


@pytest.mark.parametrize(
    ("config", "gpus", "words"),
    [
        (QWEN3_8B_INLINE, "{count: 1, model: H100}", "has no weights_gib and no local"),
        (QWEN3_8B_INLINE + "\n    weights_gib: 15.26", "{count: 1}", "GPU memory: set"),
        ("", "{count: 1, model: H100}", "has no config"),
        ("    config: {num_hidden_layers: 2, num_attention_heads: 4, head_dim: 32}\n"
         "    weights_gib: 1", "{count: 1, model: H100}", "max-model-len: not given"),
    ],
    ids=["no-weights", "no-gpu-memory", "no-config", "no-max-model-len"],
)
def test_cannot_check_names_what_is_missing(config, gpus, words):
    args = "{}" if "max-model-len" in words else "{max-model-len: 4096}"
    fleet = load_text(GPU_FLEET.format(config=config, gpus=gpus, args=args))
    plan = plan_fleet(fleet).server("box", "chat")
    assert plan.verdict == "unknown" and words in plan.reason, plan.reason


def test_cannot_check_is_not_an_error():
    fleet = GPU_FLEET.format(config="", gpus="{count: 1}", args="{}")
    assert load_text(fleet).hosts["box"].servers["chat"].model == "m"


# --- verdicts ----------------------------------------------------------------------------------


def plan_of(args: str, gpus: str = "{count: 1, model: \"RTX 4090\"}"):
    config = QWEN3_8B_INLINE + "\n    weights_gib: 15.26"
    fleet = load_text(GPU_FLEET.format(config=config, gpus=gpus, args=args), capacity=False)
    return plan_fleet(fleet)


@pytest.mark.parametrize(
    ("args", "verdict"),
    [
        ("{max-model-len: 2048, gpu-memory-utilization: 0.92}", "fits"),
        # 35,152 tokens hold 1.07 sequences of 32,768
        ("{max-model-len: 32768, gpu-memory-utilization: 0.92}", "tight"),
        # 35,152 tokens hold no sequence of 40,960
        ("{max-model-len: 40960, gpu-memory-utilization: 0.92}", "does not fit"),
        # 0.7 × 23.49 GiB = 16.44 GiB < 15.26 GiB weights + 1.52 GiB overhead
        ("{max-model-len: 2048, gpu-memory-utilization: 0.7}", "does not fit"),
    ],
    ids=["fits", "tight-concurrency", "kv-below-one-sequence", "weights-over-budget"],
)
def test_server_verdict(args, verdict):
    assert plan_of(args).server("box", "chat").verdict == verdict


def test_little_left_outside_the_budget_is_tight():
    # 0.98 of 23.49 GiB leaves 0.47 GiB for a CUDA context and CUDA graphs (~1 GiB)
    plan = plan_of("{max-model-len: 2048, gpu-memory-utilization: 0.98}")
    assert plan.gpus[0].verdict == "tight"


def test_server_on_a_tight_gpu_is_tight():
    plan = plan_of("{max-model-len: 2048, gpu-memory-utilization: 0.98}")
    assert plan.server("box", "chat").verdict == "tight"


# --- check and plan commands -------------------------------------------------------------------

NOT_FITTING = DATA / "invalid" / "fit-kv-below-one-sequence.yaml"


def test_check_fails_on_a_server_that_does_not_fit(capsys):
    assert main(["check", str(NOT_FITTING)]) == 1


def test_load_without_capacity_accepts_a_server_that_does_not_fit():
    assert load_fleet(NOT_FITTING, capacity=False).hosts["box"].servers["chat"].model == "m"


def test_load_with_capacity_raises_for_a_server_that_does_not_fit():
    with pytest.raises(FleetError):
        load_fleet(NOT_FITTING)


def test_plan_exits_1_when_a_server_does_not_fit(capsys):
    assert main(["plan", str(NOT_FITTING)]) == 1


def test_plan_shows_the_numbers_of_a_server_that_does_not_fit(capsys):
    main(["plan", str(NOT_FITTING)])
    assert "box/chat: does not fit — the KV cache holds 14,832 tokens" in capsys.readouterr().out


@pytest.mark.parametrize("file", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_plan_exits_0_on_example(file, capsys):
    assert main(["plan", str(file)]) == 0


def test_plan_exits_1_on_invalid_file(capsys):
    assert main(["plan", str(DATA / "invalid" / "unknown-key-host.yaml")]) == 1


@pytest.fixture(scope="module")
def plan_json():
    """``fleet plan --json`` of the 4×4090D example, parsed."""
    import contextlib
    import io

    buffer = io.StringIO()
    saved = cli.out
    cli.out = Console(file=buffer, highlight=False, width=1000)
    try:
        with contextlib.redirect_stdout(buffer):
            main(["plan", "--json", str(EXAMPLES / "quad-4090d.yaml")])
    finally:
        cli.out = saved
    return json.loads(buffer.getvalue())


@pytest.mark.parametrize(
    "key",
    ["host", "server", "gpus", "weights_bytes", "kv_bytes_per_token", "kv_cache_tokens",
     "max_concurrency", "fits", "verdict", "reason", "overhead_bytes", "kv_budget_bytes"],
)
def test_json_server_entries_have_key(plan_json, key):
    assert all(key in server for server in plan_json["servers"])


@pytest.mark.parametrize("key", ["host", "index", "memory_bytes", "utilization_sum", "fits"])
def test_json_gpu_entries_have_key(plan_json, key):
    assert all(key in gpu for gpu in plan_json["gpus"])


def test_json_lists_every_server(plan_json):
    assert [s["server"] for s in plan_json["servers"]] == [
        "vlm", "llm", "guard", "router", "summarize", "tagger"
    ]


def test_json_fits_is_a_boolean(plan_json):
    assert {s["fits"] for s in plan_json["servers"]} == {True}


# --- GPU table ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 4090 D", "RTX 4090 D"),
        ("nvidia h100 80gb hbm3", "H100 SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA H200", "H200"),
        ("l40s", "L40S"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
    ],
)
def test_gpu_lookup_is_tolerant(name, canonical):
    entry = lookup(name)
    assert entry is not None and entry.name == canonical


@pytest.mark.parametrize(
    ("name", "gib"),
    [("RTX 4090", 23.99), ("L4", 22.49), ("L40S", 44.99), ("H100 SXM", 79.65), ("H200", 140.4),
     ("A100 80GB", 80.0), ("B200", 179.06)],
)
def test_gpu_memory_is_what_nvidia_smi_reports(name, gib):
    assert round(lookup(name).memory_gib, 2) == gib


# --- topology warnings -------------------------------------------------------------------------

QUAD_TOPOLOGY = """\
version: 1
models:
  m: {hf: "org/m", revision: "0123456789abcdef0123456789abcdef01234567"}
hosts:
  box:
    address: 10.0.0.1
    gpus:
      count: 4
      model: RTX 4090 D
      topology: {"0-1": PIX, "0-2": PXB, "0-3": PXB, "1-2": PXB, "1-3": PXB, "2-3": %s}
    os: {nvidia: {driver: "570"}}
    vllm: {version: "0.11.0", variant: cu129}
    servers:
      big: {model: m, gpus: [2, 3], port: 8000, args: {tensor-parallel-size: 2}}
"""


def link_warnings(link: str) -> list:
    """The warnings about the server's GPUs (others, such as flag lists, are left out)."""
    warnings: list = []
    load_text(QUAD_TOPOLOGY % link, "q.yaml", warnings=warnings)
    return [w for w in warnings if w.path == ("hosts", "box", "servers", "big", "gpus")]


def test_tp_over_pcie_bridges_warns():
    assert [w.line for w in link_warnings("PXB")] == [14]


def test_tp_warning_names_the_better_pair():
    [warning] = link_warnings("PXB")
    assert "GPUs 0, 1 have a faster link (PIX: one PCIe switch)" in warning.hint


def test_tp_warning_is_a_warning():
    [warning] = link_warnings("PXB")
    assert warning.severity == "warning"


def test_tp_over_nvlink_does_not_warn():
    assert link_warnings("NV4") == []


def test_tp_on_the_best_pcie_pair_says_there_is_no_better_one():
    [warning] = link_warnings("PIX")
    assert "no better set of GPUs" in warning.hint


def test_check_exits_0_with_only_warnings(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    path.write_text(QUAD_TOPOLOGY % "PXB")
    assert main(["check", str(path)]) == 0


def test_check_prints_warnings(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    path.write_text(QUAD_TOPOLOGY % "PXB")
    main(["check", str(path)])
    assert f"{path}:14:23: warning: hosts.box.servers.big.gpus:" in capsys.readouterr().err


# --- fuzz: mutated examples never crash `fleet plan` ---------------------------------------------

PLAN_MUTANTS = [(path, n) for path in sorted(EXAMPLES.glob("*.yaml")) for n in range(40)]


@pytest.mark.parametrize(
    ("path", "number"), PLAN_MUTANTS, ids=[f"{p.stem}-{n:02d}" for p, n in PLAN_MUTANTS]
)
def test_plan_survives_mutated_example(path, number, tmp_path, capsys):
    from tests.unit.fleet.test_load import mutate

    rng = random.Random(f"plan:{path.name}:{number}")
    mutant = tmp_path / path.name
    mutant.write_text(mutate(path.read_text(encoding="utf-8"), rng), encoding="utf-8")
    assert main(["plan", "--json", str(mutant)]) in (0, 1)


# --- issue 21: every member of a group planned on its own GPUs --------------------------------


def _pair(worker_model: str, weights_gib: float = 78 * 16) -> str:
    """h200-pair.yaml (TP 8 × PP 2 over two hosts) with the worker's GPUs and the weights given
    (78 GiB per GPU by default: within 0.9 × an H200's 139.8 GiB, beyond an H100's 79.65)."""
    text = (EXAMPLES / "h200-pair.yaml").read_text()
    text = text.replace("weights_gib: 641.3", f"weights_gib: {weights_gib}")
    return text.replace("  hgx-h200-02:\n", "  hgx-h200-02:\n"
                        f'    gpus: {{count: 8, model: "{worker_model}"}}\n')


def test_a_worker_with_smaller_gpus_binds_the_group() -> None:
    """Before, the worker was planned with the head's H200 budget and called "fits"."""
    fleet = load_text(_pair("H100"), capacity=False)
    (server,) = plan_fleet(fleet).servers
    assert (server.host, server.verdict) == ("hgx-h200-01", "does not fit")
    assert server.reason.startswith("on worker hgx-h200-02 (8 × H100): weights 78.00 GiB")
    assert server.budget_bytes == int(0.9 * cuda_total_of("H100"))
    with pytest.raises(FleetError) as err:
        load_text(_pair("H100"))
    assert "does not fit: on worker hgx-h200-02 (8 × H100)" in str(err.value)


def test_a_group_of_like_hosts_plans_as_the_head() -> None:
    fleet = load_text(_pair("H200"))
    (server,) = plan_fleet(fleet).servers
    assert server.verdict == "fits" and "worker" not in server.reason
    assert server.budget_bytes == int(0.9 * cuda_total_of("H200"))


def test_a_worker_with_larger_gpus_leaves_the_head_binding() -> None:
    text = _pair("B200", weights_gib=641.3)
    (server,) = plan_fleet(load_text(text)).servers
    assert server.budget_bytes == int(0.9 * cuda_total_of("H200"))
    assert not server.reason.startswith("on worker")


def cuda_total_of(model: str) -> int:
    """What the planner takes as an 8-GPU host's CUDA total for a GPU model of the table."""
    entry = lookup(model)
    return memory.cuda_total_bytes(entry.memory_gib, entry.name)[0]
