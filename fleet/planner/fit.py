"""Memory plan of a fleet: what each server's KV cache holds, and whether it fits at all.

vLLM gives each server a budget of ``gpu-memory-utilization × total`` on every GPU it uses
(total as CUDA reports it), takes the weights and the peak of a profiling pass out of it, and
fills the rest with KV cache. Per GPU (the numbers of one tensor-parallel rank and one
pipeline stage):

- **weights** = the checkpoint's size ÷ (TP × PP), adjusted for online quantization
  (``--quantization fp8`` on a 16-bit checkpoint halves everything but the embeddings);
- **overhead** = the profiling pass's peak, the larger of activations
  (``max-num-batched-tokens × (3·hidden + qkv/TP + 3·intermediate/TP) × dtype bytes``) and the
  sampler (V1: ``min(max-num-batched-tokens, max-num-seqs) × vocab × 24 bytes``: fp32 logits,
  a sorted copy with int64 indices, softmax and cumulative sum for top-k/top-p), the non-torch
  memory the release counts (cuBLAS workspaces, NCCL), and, from vLLM 0.21 on, 0.5 GiB of CUDA
  graphs;
- **KV budget** = utilization × total − weights − overhead;
- **KV bytes per token** = 2 × layers/PP × max(1, kv_heads/TP) × head_dim × dtype bytes, or
  with MLA (kv_lora_rank set) layers/PP × (kv_lora_rank + qk_rope_head_dim) × dtype bytes,
  not divided by TP (every rank caches the whole latent);
- **KV tokens** = KV budget ÷ bytes per token, in whole blocks (16 tokens; 128 on the cpu
  build), counted as vLLM logs it: blocks ÷ blocks per max-model-len request × max-model-len;
- **max concurrency** = KV tokens ÷ max-model-len.

Each term's number and source, per vLLM release family (V0 0.6.4, 0.6.5, 0.7; V1 0.8, 0.9 on),
come from :mod:`fleet.planner.memory`; a pipeline-parallel server is planned per stage (the first
stage
holds ⌈layers/PP⌉ layers, the last the sampler) and vLLM's smallest stage counts.

Outside every budget, each server's process also holds a CUDA context (0.51 GiB measured on
an H200), NCCL buffers when TP × PP > 1 (0.25 GiB, estimated), and before vLLM 0.21 its CUDA
graphs: they must fit in the ``1 − Σ utilization`` left on each GPU. The cpu build has no
such arithmetic: its KV budget is ``cpu_kvcache_space_gib``.

Example:
    >>> from fleet.load import load_fleet
    >>> plan = plan_fleet(load_fleet("inventory/sandbox.yaml"))
    >>> server = plan.servers[0]
    >>> server.kv_bytes_per_token, server.kv_cache_tokens, server.verdict
    (None, None, 'unknown')
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from fleet.catalog.gpus import DRIVER_RESERVED_GIB
from fleet.catalog.releases import release
from fleet.catalog.vllm_defaults import ReleaseDefaults, listed_releases, release_defaults
from fleet.planner import memory
from fleet.read.bulk import without_gc
from fleet.spec.models import DTYPE_BYTES, Fleet, Host, ModelConfig, Server, Variant

GiB = 2**30
#: Per process and GPU, taken before vLLM's memory snapshot (outside its budget).
CUDA_CONTEXT_GIB = 0.5
NCCL_GIB = 0.25
#: CUDA graphs of the default capture sizes (typical logs: 0.2–0.6 GiB), and the vLLM release
#: from which they are taken out of the budget (fleet.planner.memory holds the terms inside it).
CUDA_GRAPH_GIB = memory.CUDA_GRAPH_GIB
GRAPHS_IN_BUDGET_FROM = memory.GRAPHS_IN_BUDGET_FROM
#: vLLM's default KV block size (tokens) on GPUs and on the cpu build.
BLOCK_SIZE = 16
CPU_BLOCK_SIZE = 128
#: Below this many full-length sequences, a server that fits is called tight.
TIGHT_CONCURRENCY = 2.0
#: KV cache dtypes and their bytes per element ("auto": the model's dtype).
KV_DTYPE_BYTES = {
    "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1,
}
#: fp8_ds_mla stores per token and layer 512 fp8 values, 4 fp32 scales and 64 bf16 values.
FP8_DS_MLA_BYTES = 656
#: Online quantization methods that store linear weights in one byte.
ONE_BYTE_QUANT = {"fp8", "ptpc_fp8", "fbgemm_fp8", "experts_int8"}
#: vLLM's in-flight bitsandbytes quantization (``--quantization bitsandbytes`` on a 16-bit
#: checkpoint; its loader quantizes each linear weight as it loads, ``quantize_4bit`` NF4 with
#: compressed statistics): 4 bits a weight, an 8-bit absmax per block of 64 and an fp32 one per
#: 256 blocks, 0.516 bytes where the checkpoint has 2. Embedding and lm_head stay 16-bit.
BNB_4BIT_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)


class _Verdict:
    """What ServerPlan and GpuPlan share: a verdict, read as fits / does not fit / unknown."""

    verdict: str

    @property
    def fits(self) -> bool | None:
        """True for fits and tight, False for does not fit, None when it cannot be told."""
        return {"fits": True, "tight": True, "does not fit": False}.get(self.verdict)

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``fleet plan --json``."""
        return {**asdict(self), "fits": self.fits}  # type: ignore[call-overload]


@dataclass
class ServerPlan(_Verdict):
    """The memory plan of one server (per GPU unless a name says otherwise)."""

    host: str
    server: str
    model: str
    gpus: list[int]
    worker_hosts: list[str]
    tp: int
    pp: int
    gpu_memory_bytes: int | None = None
    utilization: float | None = None
    budget_bytes: int | None = None
    weights_bytes: int | None = None
    weights_per_gpu_bytes: int | None = None
    overhead_bytes: int | None = None
    overhead: dict[str, int] = field(default_factory=dict)
    #: Each term of the overhead: {"name", "bytes", "source"}.
    overhead_terms: list[dict[str, Any]] = field(default_factory=list)
    #: Which vLLM release's defaults and memory model were applied, and the engine.
    release_model: str = ""
    kv_budget_bytes: int | None = None
    kv_cache_dtype: str = "auto"
    kv_bytes_per_token: int | None = None
    kv_cache_tokens: int | None = None
    max_model_len: int | None = None
    max_concurrency: float | None = None
    #: The model's limit that vLLM's auto-fit (max-model-len auto) lowered max_model_len from.
    auto_fit_from: int | None = None
    verdict: str = "unknown"
    reason: str = ""
    cannot_check: list[str] = field(default_factory=list)
    #: What the plan does not model for this server, said instead of silently guessed.
    warnings: list[str] = field(default_factory=list)
    #: Where the CUDA total comes from, and the release family of the memory accounting.
    cuda_total_source: str = ""
    memory_family: str = ""
    #: How the weights per GPU were split (expert parallel, CPU offload): {"name", "bytes",
    #: "source"}.
    weights_terms: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class GpuPlan(_Verdict):
    """One GPU: its memory, the servers on it and what is left outside their budgets."""

    host: str
    index: int
    model: str | None
    memory_bytes: int | None
    servers: list[str]
    utilization_sum: float
    headroom_bytes: int | None = None
    outside_bytes: int = 0
    verdict: str = "unknown"
    reason: str = ""


@dataclass
class FleetPlan:
    """Every server and every used GPU of a fleet."""

    servers: list[ServerPlan]
    gpus: list[GpuPlan]

    def to_json(self) -> dict[str, Any]:
        """``{"servers": [...], "gpus": [...]}`` for ``fleet plan --json``."""
        return {
            "servers": [s.to_json() for s in self.servers],
            "gpus": [g.to_json() for g in self.gpus],
        }

    def server(self, host: str, name: str) -> ServerPlan:
        """The plan of one server."""
        return next(s for s in self.servers if (s.host, s.server) == (host, name))


def gib(value: float | None) -> str:
    """Bytes as GiB with two decimals, or "?".

    Example:
        >>> gib(3 * 2**29), gib(None)
        ('1.50 GiB', '?')
    """
    return "?" if value is None else f"{value / GiB:.2f} GiB"


def version_tuple(version: str) -> tuple[int, ...]:
    """ "0.11.0" → (0, 11, 0).

    Example:
        >>> version_tuple("0.10.1.post1")
        (0, 10, 1)
    """
    return release(version)[:3]


def cuda_total_bytes(memory_gib: float) -> int:
    """What CUDA reports as total for a GPU that nvidia-smi says has ``memory_gib``.

    Example:
        >>> round(cuda_total_bytes(140.4) / 2**30, 2)
        139.9
    """
    return int((memory_gib - DRIVER_RESERVED_GIB) * GiB)


def model_dtype_bytes(server: Server) -> int:
    """Bytes per element of the weights and activations vLLM computes in.

    ``--dtype`` if given; else 2: checkpoints are 16-bit, and vLLM runs float32 ones in 16 bits.

    Example:
        >>> model_dtype_bytes(Server(model="m", port=1, args={"dtype": "float32"}))
        4
    """
    dtype = str(server.args.get("dtype", "auto"))
    if dtype != "auto":
        return DTYPE_BYTES.get(dtype, 2)
    return 2


def kv_dtype_bytes(server: Server) -> int | None:
    """Bytes per KV cache element for ``--kv-cache-dtype`` (None if not modelled).

    Example:
        >>> kv_dtype_bytes(Server(model="m", port=1, args={"kv-cache-dtype": "fp8"}))
        1
    """
    dtype = server.kv_cache_dtype
    if dtype == "auto":
        return model_dtype_bytes(server)
    return KV_DTYPE_BYTES.get(dtype)


def kv_bytes_per_token(
    config: ModelConfig, tp: int, pp: int, kv_dtype: str, dtype_bytes: int
) -> int:
    """KV cache bytes per token on one GPU (one TP rank of the largest PP stage).

    Example (Qwen3-8B: 36 layers, 8 KV heads of 128, bf16):
        >>> c = ModelConfig(num_hidden_layers=36, num_attention_heads=32,
        ...                 num_key_value_heads=8, head_dim=128)
        >>> kv_bytes_per_token(c, tp=1, pp=1, kv_dtype="auto", dtype_bytes=2)
        147456
        >>> kv_bytes_per_token(c, tp=2, pp=1, kv_dtype="fp8", dtype_bytes=1)
        36864
    """
    layers = math.ceil(config.num_hidden_layers / pp)
    if config.is_mla:
        rope = config.qk_rope_head_dim or 0
        if kv_dtype == "fp8_ds_mla":
            return layers * FP8_DS_MLA_BYTES
        return layers * (int(config.kv_lora_rank or 0) + rope) * dtype_bytes
    heads = max(1, config.kv_heads // tp)
    head = config.head_size
    if head is None:
        raise ValueError("the config gives neither head_dim nor hidden_size")
    return 2 * layers * heads * head * dtype_bytes


def batch_defaults(
    memory_gib: float | None, gpu_model: str | None, variant: Variant
) -> tuple[int, int]:
    """vLLM's (0.32) default max-num-batched-tokens and max-num-seqs for the API server.

    Example:
        >>> batch_defaults(140.4, "H200", Variant.cu129)
        (8192, 1024)
        >>> batch_defaults(24, "RTX 4090", Variant.cu129)
        (2048, 256)
    """
    if variant is Variant.cpu:
        return 2048, 128
    total = (memory_gib or 0) - DRIVER_RESERVED_GIB
    if total >= 160:
        return 16384, 1024
    if total >= 70 and "a100" not in (gpu_model or "").lower():
        return 8192, 1024
    return 2048, 256


def release_batch_defaults(
    defaults: ReleaseDefaults | None, memory_gib: float | None, gpu_model: str | None,
    variant: Variant, cuda_total_gib: float | None = None,
) -> tuple[int, int, str]:
    """The API server's default (max-num-batched-tokens, max-num-seqs) of the host's release on
    its GPU, and where they come from: the release's own batch classes
    (``ReleaseDefaults.batch_for``, read from its ``get_batch_defaults``) where they were read,
    else 0.32's (:func:`batch_defaults`).

    Example (a B200: 0.24 has no class above 70 GiB, 0.28 added one from 160 GiB):
        >>> from fleet.catalog.vllm_defaults import release_defaults
        >>> release_batch_defaults(release_defaults("0.24.0"), 180, "B200", Variant.cu129)[:2]
        (8192, 1024)
        >>> release_batch_defaults(release_defaults("0.28.0"), 180, "B200", Variant.cu129)[:2]
        (16384, 1024)
    """
    if variant is Variant.cpu:
        tokens, seqs = batch_defaults(memory_gib, gpu_model, variant)
        return tokens, seqs, "vLLM's default max-num-batched-tokens on the cpu build"
    total = cuda_total_gib
    if total is None:
        total = (memory_gib or 0) - DRIVER_RESERVED_GIB
    found = defaults.batch_for(total, f"NVIDIA {gpu_model or ''}") if defaults else None
    if found is not None:
        return found[0], found[1], (f"vLLM {defaults.release}'s default max-num-batched-tokens "
                                    "for this GPU (its get_batch_defaults)")
    tokens, seqs = batch_defaults(memory_gib, gpu_model, variant)
    return tokens, seqs, "vLLM's default max-num-batched-tokens for this GPU (0.32's classes)"


def chunked_prefill(server: Server) -> bool:
    """Whether chunked prefill is on: vLLM's V1 default, unless turned off.

    Example:
        >>> chunked_prefill(Server(model="m", port=1, args={"no-enable-chunked-prefill": True}))
        False
        >>> chunked_prefill(Server(model="m", port=1, args={"disable-chunked-prefill": True}))
        False
    """
    if True in (server.args.get("no-enable-chunked-prefill"),
                server.args.get("disable-chunked-prefill")):  # up to 0.32 / from 0.33
        return False
    return server.args.get("enable-chunked-prefill", True) is not False


def max_model_len(server: Server, config: ModelConfig | None) -> int | None:
    """--max-model-len, or the model's own limit (vLLM's default, and what ``auto`` and ``-1``
    start from), or None."""
    if server.max_model_len_auto:
        return config.max_len_limit if config else None
    given = server.int_arg("max-model-len")
    if given is not None:
        return given
    return config.max_len_limit if config else None


def weights_in_memory(server: Server, config: ModelConfig | None, weights: int) -> tuple[int, str]:
    """The weights' size once loaded, and how it was adjusted (empty: as on disk).

    Online quantization to one byte (``--quantization fp8`` on a checkpoint without a
    quantization_config) halves the linear layers; the embedding and lm_head stay 16-bit.

    Example (Qwen3-4B, 8,044,936,192 bytes in bf16, tied 151936 × 2560 embedding):
        >>> c = ModelConfig(num_hidden_layers=36, num_attention_heads=32, hidden_size=2560,
        ...                 vocab_size=151936, tie_word_embeddings=True)
        >>> weights_in_memory(Server(model="m", port=1, args={"quantization": "fp8"}), c,
        ...                   8044936192)[0]
        4411424256

    In-flight bitsandbytes (Qwen2.5-14B, 27.51 GiB in bf16, untied 152064 × 5120 embedding):
        >>> q = ModelConfig(num_hidden_layers=48, num_attention_heads=40, hidden_size=5120,
        ...                 vocab_size=152064, tie_word_embeddings=False)
        >>> bnb = Server(model="m", port=1, args={"quantization": "bitsandbytes",
        ...                                       "load-format": "bitsandbytes"})
        >>> round(weights_in_memory(bnb, q, int(27.51 * 2**30))[0] / 2**30, 2)
        9.25
    """
    method = server.args.get("quantization")
    prequantized = config is not None and config.quantization_config is not None
    if isinstance(method, str) and method in ONE_BYTE_QUANT and not prequantized:
        embedding = _embedding_bytes(config, weights)
        return (weights - embedding) // 2 + embedding, f"online {method}: linear layers halved"
    if method == "bitsandbytes" and not prequantized:
        embedding = _embedding_bytes(config, weights)
        linear = int((weights - embedding) * BNB_4BIT_BYTES / 2)
        return linear + embedding, (
            "in-flight bitsandbytes: linear layers quantized to 4-bit NF4 as they load "
            f"({BNB_4BIT_BYTES:.3f} of the checkpoint's 2 bytes a weight)")
    dtype = server.args.get("dtype")
    if dtype in ("float32", "float") and not prequantized:
        return weights * 2, "--dtype float32: twice the 16-bit checkpoint"
    return weights, ""


def _embedding_bytes(config: ModelConfig | None, weights: int) -> int:
    """The 16-bit embedding and lm_head (once if tied), which online quantization keeps."""
    embedding = 0
    if config and config.vocab_size and config.hidden_size:
        copies = 1 if config.tie_word_embeddings else 2
        embedding = config.vocab_size * config.hidden_size * 2 * copies
    return min(embedding, weights)


activation_bytes = memory.activation_bytes


def utilization(host: Host, server: Server) -> float:
    """--gpu-memory-utilization, or the default of the host's vLLM release (0.92 from 0.32 on,
    0.9 before: read from each release's source by scripts/gen_vllm_defaults.py).

    Example:
        >>> h = Host.model_validate({"address": "x", "vllm": {"version": "0.32.0",
        ...     "variant": "cu129"}})
        >>> utilization(h, Server(model="m", port=1)), utilization(h, Server(model="m",
        ...     port=1, args={"gpu-memory-utilization": 0.5}))
        (0.92, 0.5)
    """
    given = server.args.get("gpu-memory-utilization")
    if given is not None:
        return float(given)
    defaults = release_defaults(host.vllm.version)
    return defaults.gpu_memory_utilization if defaults else 0.9



def _stage_layers(config: ModelConfig, pp: int) -> list[tuple[int, bool]]:
    """(layers, runs the sampler) per distinct pipeline stage: the first holds ⌈layers/PP⌉
    (vLLM's get_pp_indices), the last the rest's share and the sampler."""
    if pp <= 1:
        return [(config.num_hidden_layers, True)]
    first = math.ceil(config.num_hidden_layers / pp)
    last = max(1, config.num_hidden_layers - first * (pp - 1))
    return [(first, False), (last, True)]


def _batch(plan: ServerPlan, host: Host, server: Server, fam: str,
           defaults: ReleaseDefaults, memory_gib: float | None,
           cuda_total_gib: float | None = None) -> memory.Batch:
    """The profiling pass's tokens and sampler rows for the server's release family."""
    if fam.startswith("V0"):
        return memory.v0_batch(server, plan.max_model_len, host.vllm.version, defaults.max_num_seqs)
    tokens, seqs, source = release_batch_defaults(defaults, memory_gib, host.gpus.model,
                                                  host.vllm.variant, cuda_total_gib)
    given = server.int_arg("max-num-batched-tokens")
    if given is not None:
        tokens, source = given, "max-num-batched-tokens"
    elif not chunked_prefill(server) and plan.max_model_len:
        tokens = max(tokens, plan.max_model_len)
        source = "chunked prefill off: at least max-model-len"
    return memory.Batch(tokens, server.int_arg("max-num-seqs") or seqs, source)


#: Model types and architecture words of hybrid models (attention with Mamba, linear attention or
#: short convolutions), whose state vLLM's KV cache manager sizes apart from attention.
HYBRID_WORDS = ("mamba", "jamba", "bamba", "zamba", "nemotron_h", "nemotronh", "qwen3_next",
                "qwen3next", "qwen3_5", "falcon_h1", "falconh1", "granitemoehybrid", "plamo2",
                "lfm2", "minimax", "kimi_linear", "kimilinear")


def hybrid(config: ModelConfig) -> bool:
    """Whether a model mixes attention with state-space / linear-attention layers: a layer type
    other than full or sliding attention, or a hybrid family's model type or class.

    Example:
        >>> hybrid(ModelConfig(num_hidden_layers=2, num_attention_heads=1,
        ...     layer_types=["linear_attention", "full_attention"]))
        True
        >>> hybrid(ModelConfig(num_hidden_layers=2, num_attention_heads=1, model_type="llama"))
        False
    """
    kinds = set(config.layer_types or ()) - {"full_attention", "sliding_attention"}
    names = " ".join((config.architectures or []) + [config.model_type or ""]).lower()
    return bool(kinds) or any(word in names for word in HYBRID_WORDS)


def _warnings(plan: ServerPlan, server: Server, config: ModelConfig | None, fam: str) -> None:
    """Say what the memory model does not cover for this server."""
    arch = " ".join((config.architectures or []) + [config.model_type or ""]) if config else ""
    if any(word in arch for word in ("ConditionalGeneration", "Vision", "VL", "mllama", "llava")):
        plan.warnings.append(
            "multimodal encoder profiling not modelled: vLLM also profiles the vision encoder "
            "with its largest inputs, and its profiling peak differs from a text model's by "
            "GiBs either way (vllm#12126: 36.63 GiB for Llama-3.2-11B-Vision at 65,536 tokens; "
            "llm-d-benchmark's Mistral-Small-3.2-24B on an H100: 2.12 GiB where a text model of "
            "its vocabulary peaks at 4.7); the KV cache may differ from the plan by GiBs"
        )
    if config is not None and hybrid(config):
        plan.warnings.append(
            "hybrid model not modelled: its Mamba / linear-attention layers keep a fixed-size "
            "state per sequence, and vLLM pads the attention blocks to that state's page size "
            "(vllm#40691: for such models the logged KV tokens are not concurrency × length); "
            "the KV cache planned here counts every layer as attention"
        )
    if fam.startswith("V0") and server.tp > 1:
        plan.warnings.append(
            "V0 with tensor parallel: vLLM takes the KV blocks of the worker with the fewest, "
            "and the driver worker (rank 0) holds memory the planner does not model "
            "(vllm#13061: 1.2 GiB less KV cache on rank 0 than rank 1 logs)"
        )


def plan_server(fleet: Fleet, host_name: str, name: str, server: Server | None = None,
                measured: dict[str, str] | None = None) -> ServerPlan:
    """The plan of server ``name`` of ``host_name`` (``server``: one to plan there that the
    fleet does not hold yet, as the replica placer asks).

    A server across hosts (``worker_hosts``) is planned on every member's own GPUs (vLLM gives
    each worker ``gpu-memory-utilization`` of its own cards, and the group's KV cache is the
    smallest member's): the plan is the member that fits worst, said in its reason.

    Example (TP 8 × PP 2 over two 8 × H200 hosts, 78 GiB of weights per GPU; then the
    worker's cards are H100s, whose 0.9 × 79.65 GiB cannot hold them):
        >>> from fleet.load import load_text
        >>> fleet = load_text(open("inventory/examples/h200-pair.yaml").read(), capacity=False)
        >>> fleet.models["deepseek-v3"].weights_gib = 78 * 16
        >>> plan_server(fleet, "hgx-h200-01", "deepseek").verdict
        'fits'
        >>> fleet.hosts["hgx-h200-02"].gpus.model = "H100"
        >>> small = plan_server(fleet, "hgx-h200-01", "deepseek")
        >>> small.verdict, small.reason.split(":")[0]
        ('does not fit', 'on worker hgx-h200-02 (8 × H100)')
    """
    host = fleet.hosts[host_name]
    server = server or host.servers[name]
    measured = measured or {}
    plan = _plan_server(fleet, host_name, host, name, server, measured.get(host_name))
    if host.vllm.variant is Variant.cpu:
        return plan
    worst = plan
    for worker in dict.fromkeys(server.worker_hosts):
        member = fleet.hosts.get(worker)
        if member is None or worker == host_name or (
            _same_gpus(member, host) and worker not in measured
        ):
            continue
        other = _plan_server(fleet, worker, member, name, server, measured.get(worker))
        if _binding(other) < _binding(worst):
            gpus = f"{member.gpus.count or '?'} × {member.gpus.model or 'GPU'}"
            other.reason = f"on worker {worker} ({gpus}): {other.reason}"
            worst = other
    if worst is not plan:
        worst.host, worst.gpus, worst.worker_hosts = plan.host, plan.gpus, plan.worker_hosts
    return worst


def _same_gpus(one: Host, other: Host) -> bool:
    """Whether two hosts plan a server alike: the same GPUs and the same vLLM."""
    return (one.gpus.total_gib, one.gpus.model, one.vllm.version) == (
        other.gpus.total_gib, other.gpus.model, other.vllm.version)


def _binding(plan: ServerPlan) -> tuple[int, float]:
    """Orders members' plans, the one that binds a group first: does not fit, cannot be told,
    then the fewest sequences of max-model-len."""
    rank = {False: 0, None: 1, True: 2}[plan.fits]
    return rank, plan.max_concurrency if plan.max_concurrency is not None else math.inf


def _release_warnings(
    plan: ServerPlan, host: Host, server: Server, config: ModelConfig | None, fam: str,
    batch: memory.Batch, measured_source: str | None,
) -> None:
    """Say where the plan cannot be within ±5 % of vLLM for this release and setting, and why."""
    if fam.startswith("V1") and config is not None and plan.kv_budget_bytes:
        _sampler_warning(plan, host, server, config, batch)
        _mla_quantized_moe_warning(plan, host, config)
    _wsl2_warning(plan, host, measured_source)


def _sampler_warning(plan: ServerPlan, host: Host, server: Server, config: ModelConfig,
                     batch: memory.Batch) -> None:
    """Before 0.11.1 the sampler path follows whether flashinfer is installed: say what the
    other path gives where it moves the KV cache by more than 2 %."""
    version = host.vllm.version
    if not memory.sampler_undecided(version, server):
        return
    rows = min(batch.tokens, batch.seqs)
    saved = rows * (config.vocab_size or 0) * (
        memory.V1_NATIVE_SAMPLER_BYTES - memory.V1_FLASHINFER_SAMPLER_BYTES)
    activation = plan.overhead.get("activation_bytes", 0)
    peak = plan.overhead.get("profile_peak_bytes", 0)
    gain = peak - max(activation, plan.overhead.get("sampler_bytes", 0) - saved)
    if plan.kv_budget_bytes and gain > 0.02 * plan.kv_budget_bytes:
        plan.warnings.append(
            f"sampler path not known: vLLM {version} takes FlashInfer's sampler where the "
            "flashinfer package is installed (vLLM's Docker image, the [flashinfer] extra), "
            f"else PyTorch's sort; planned with the sort, FlashInfer's leaves {gib(gain)} more "
            "KV cache per GPU (set VLLM_USE_FLASHINFER_SAMPLER to 0 or 1 to say which)"
        )


def _mla_quantized_moe_warning(plan: ServerPlan, host: Host, config: ModelConfig) -> None:
    """MLA with a quantized MoE from 0.21: the workspaces of its kernels are not modelled, and
    the public logs of one setting disagree with each other."""
    quantized = config.quantization_config is not None
    if not (config.kv_lora_rank and quantized and memory.experts(config)):
        return
    if memory.version(host.vllm.version) < memory.GRAPHS_IN_BUDGET_FROM:
        return
    plan.warnings.append(
        "MLA with a quantized MoE not modelled on this release: the MLA prefill and the "
        "quantized MoE kernels' (Marlin) workspaces are not counted, and vLLM's own runs "
        "disagree (kvcache-lab, DeepSeek-V2-Lite AWQ on an RTX 4080, 0.26.0: 3.46 and 5.07 GiB "
        "of KV cache for budgets 0.80 GiB apart; the larger failed capturing CUDA graphs): "
        "leave 1–2 GiB of headroom"
    )


def _wsl2_warning(plan: ServerPlan, host: Host, measured_source: str | None) -> None:
    """A workstation card's CUDA total is assumed; under WSL2 CUDA reports the whole card."""
    if measured_source or plan.gpu_memory_bytes is None or plan.budget_bytes is None:
        return
    entry = host.gpus.table_model
    consumer = entry is None or (entry.name.startswith("RTX ") and "PRO" not in entry.name)
    if not consumer or not plan.utilization:
        return
    total = plan.budget_bytes / plan.utilization
    more = plan.gpu_memory_bytes - total
    if more <= 0:
        return
    plan.warnings.append(
        f"CUDA total assumed {gib(int(total))}: under WSL2 CUDA reports the whole card "
        f"({gib(plan.gpu_memory_bytes)}, {gib(int(more * plan.utilization))} more budget), "
        "while the Windows desktop's memory on the same card is invisible to WSL2's nvidia-smi "
        "(kvcache-lab's RTX 4080: 13.88 of 15.99 GiB free at vLLM's start); on a WSL2 "
        "workstation read the host (fleet plan --from-host) and keep the room outside the "
        "budgets for the desktop"
    )


def _plan_server(fleet: Fleet, host_name: str, host: Host, name: str, server: Server,
                 measured_source: str | None = None) -> ServerPlan:
    """Compute one server's plan on ``host``'s GPUs."""
    plan = ServerPlan(
        host=host_name, server=name, model=server.model, gpus=list(server.gpus),
        worker_hosts=list(server.worker_hosts), tp=server.tp, pp=server.pp,
        kv_cache_dtype=server.kv_cache_dtype,
    )
    model = fleet.models.get(server.model)
    config = model.sizing if model else None
    cpu = host.vllm.variant is Variant.cpu
    dtype_bytes = model_dtype_bytes(server)
    missing = plan.cannot_check

    plan.max_model_len = max_model_len(server, config)
    if plan.max_model_len is None:
        given = "auto" if server.max_model_len_auto else "not given"
        missing.append(f"max-model-len: {given}, and no config with max_position_embeddings")

    kv_bytes = kv_dtype_bytes(server)
    if config is None:
        missing.append(f"KV bytes per token: model {server.model!r} has no config")
    elif kv_bytes is None and server.kv_cache_dtype != "fp8_ds_mla":
        missing.append(
            f"KV bytes per token: kv-cache-dtype {server.kv_cache_dtype} is not modelled"
        )
    else:
        try:
            plan.kv_bytes_per_token = kv_bytes_per_token(
                config, plan.tp, plan.pp, server.kv_cache_dtype, kv_bytes or 1
            )
        except ValueError as err:
            missing.append(f"KV bytes per token: {err}")

    block = server.int_arg("block-size") or BLOCK_SIZE
    if cpu:
        plan.budget_bytes = host.vllm.cpu_kvcache_space_gib * GiB
        plan.kv_budget_bytes = plan.budget_bytes
        block = server.int_arg("block-size") or CPU_BLOCK_SIZE
        _kv_tokens(plan, server, block)
        _verdict(plan)
        return plan
    return _plan_gpu_server(plan, host, server, model, config, dtype_bytes, block,
                            measured_source)


def _plan_gpu_server(
    plan: ServerPlan, host: Host, server: Server, model: Any, config: ModelConfig | None,
    dtype_bytes: int, block: int, measured_source: str | None = None,
) -> ServerPlan:
    """The GPU part of a server's plan: budget, weights, profiling peak per stage, KV cache."""
    missing = plan.cannot_check
    memory_gib = host.gpus.total_gib
    if memory_gib is None:
        missing.append("GPU memory: set gpus.memory_gib, or a gpus.model from the built-in table")
    else:
        plan.gpu_memory_bytes = int(memory_gib * GiB)
        plan.utilization = utilization(host, server)
        entry = host.gpus.table_model
        named = entry.name if entry and host.gpus.memory_gib is None else None
        total, plan.cuda_total_source = memory.cuda_total_bytes(memory_gib, named)
        if measured_source:
            plan.cuda_total_source = measured_source
        plan.budget_bytes = int(plan.utilization * total)
    weights = model.weights_bytes if model else None
    if weights is None:
        missing.append(
            f"weights: model {server.model!r} has no weights_gib and no local safetensors"
        )
    else:
        loaded, _ = weights_in_memory(server, config, weights)
        plan.weights_bytes = loaded
        per_gpu, terms = memory.weights_per_gpu(loaded, config, server)
        plan.weights_per_gpu_bytes = per_gpu
        plan.weights_terms = [t.as_dict() for t in terms]
    defaults = release_defaults(host.vllm.version)
    if defaults is None:
        missing.append(
            f"release not modelled: vLLM {host.vllm.version} is older than every release the "
            f"planner read ({', '.join(listed_releases())})"
        )
        _verdict(plan)
        return plan
    engine = memory.engine_of(host.vllm.version, defaults.engine, server)
    fam = memory.family(host.vllm.version, engine)
    plan.memory_family = fam
    plan.release_model = f"vLLM {defaults.release} defaults, {engine} engine ({fam} accounting)"
    _warnings(plan, server, config, fam)
    cuda_total_gib = None
    if plan.budget_bytes is not None and plan.utilization:
        cuda_total_gib = plan.budget_bytes / plan.utilization / GiB
    batch = _batch(plan, host, server, fam, defaults, memory_gib, cuda_total_gib)
    stages = _stage_layers(config, plan.pp) if config else [(0, True)]
    best: tuple[float, list[memory.Term], int, int | None, int] | None = None
    for layers, last in stages:
        terms = memory.profile_terms(fam, host.vllm.version, server, config, batch,
                                     dtype_bytes, last_stage=last or fam.startswith("V0"))
        overhead = sum(t.bytes for t in terms if t.name not in ("activation", "sampler"))
        kv_budget = None
        if None not in (plan.budget_bytes, plan.weights_per_gpu_bytes):
            kv_budget = plan.budget_bytes - plan.weights_per_gpu_bytes - overhead
        per_token = _stage_bytes_per_token(plan, config, layers)
        capacity = kv_budget / per_token if kv_budget is not None and per_token else math.inf
        if best is None or capacity < best[0]:
            best = (capacity, terms, overhead, kv_budget, per_token)
    assert best is not None
    _, terms, overhead, kv_budget, stage_per_token = best
    plan.overhead_terms = [t.as_dict() for t in terms]
    by_name = {t.name: t.bytes for t in terms}
    plan.overhead = {
        "activation_bytes": by_name["activation"],
        "sampler_bytes": by_name["sampler"],
        "profile_peak_bytes": by_name["profiling peak"],
        "workspace_bytes": by_name["non-torch"],
        "cuda_graph_bytes": by_name["CUDA graphs"],
    }
    plan.overhead_bytes = overhead if config else None
    if plan.overhead_bytes is not None and kv_budget is not None:
        plan.kv_budget_bytes = kv_budget
    if plan.pp > 1 and config is not None:
        plan.overhead_terms.append({
            "name": "pipeline stage", "bytes": 0,
            "source": "the stage with the smallest KV cache counts (vLLM sizes every stage's "
                      "cache by the fewest blocks): " + ", ".join(
                          f"{'last' if last else 'first'} stage {layers} layers"
                          for layers, last in stages)})
    _kv_tokens(plan, server, block, config, batch.tokens, fam, stage_per_token,
               host.vllm.version)
    _release_warnings(plan, host, server, config, fam, batch, measured_source)
    _verdict(plan)
    return plan


def _stage_bytes_per_token(plan: ServerPlan, config: ModelConfig | None, layers: int) -> int:
    """KV bytes per token of a stage of ``layers`` layers (the plan's figure is the first's)."""
    if not plan.kv_bytes_per_token or config is None:
        return 0
    first = math.ceil(config.num_hidden_layers / plan.pp)
    return plan.kv_bytes_per_token * layers // first


def _kv_tokens(
    plan: ServerPlan, server: Server, block: int, config: ModelConfig | None = None,
    batched: int = 0, fam: str = "", per_token: int = 0, vllm_version: str = "",
) -> None:
    """KV tokens and max concurrency from the KV budget, as vLLM counts them (whole blocks of
    the binding pipeline stage; V1 with sliding-window layers: what one request holds in its
    hybrid cache)."""
    if plan.kv_budget_bytes is None or not plan.kv_bytes_per_token:
        return
    per_layer = per_token or plan.kv_bytes_per_token
    blocks = max(0, plan.kv_budget_bytes) // (per_layer * block)
    swa = config is not None and fam.startswith("V1") and memory.layer_kinds(config)[1] > 0
    if swa and plan.max_model_len and config is not None:
        held, note = memory.request_tokens(config, plan.max_model_len, batched, block, plan.pp)
        plan.max_concurrency = max(0, plan.kv_budget_bytes) / (held * per_layer)
        plan.kv_cache_tokens = int(plan.max_concurrency * plan.max_model_len)
        logged = ""
        if vllm_version and memory.logged_tokens_by_blocks(vllm_version):
            # As this release logs them: the blocks over all layers, not concurrency × length.
            plan.kv_cache_tokens = blocks * block
            logged = ("; KV tokens as vLLM before 0.20 logs them: KV memory ÷ bytes per token "
                      "of all layers, in blocks (the concurrency counts what a request holds)")
        plan.overhead_terms.append({"name": "sliding window", "bytes": 0, "source": (
            note + ": vLLM's hybrid KV cache (SlidingWindowSpec.max_memory_usage_bytes)"
            + logged)})
        return
    plan.kv_cache_tokens = blocks * block
    if server.max_model_len_auto and plan.max_model_len and blocks:
        # vLLM's auto-fit (max-model-len auto or -1): the model's limit, lowered to the
        # longest request the KV cache holds (v1/core/kv_cache_utils.py).
        fitted = min(plan.max_model_len, blocks * block)
        if fitted < plan.max_model_len:
            plan.auto_fit_from = plan.max_model_len
            plan.max_model_len = fitted
    if plan.max_model_len:
        # As vLLM counts it: whole blocks per request, then back to tokens.
        plan.max_concurrency = blocks / math.ceil(plan.max_model_len / block)
        plan.kv_cache_tokens = int(plan.max_concurrency * plan.max_model_len)


def _verdict(plan: ServerPlan) -> None:
    """Set a server's verdict and its reason from its numbers."""
    if plan.kv_budget_bytes is not None and plan.kv_budget_bytes <= 0:
        plan.verdict = "does not fit"
        plan.reason = (
            f"weights {gib(plan.weights_per_gpu_bytes)} + overhead {gib(plan.overhead_bytes)} "
            f"per GPU exceed the budget of {gib(plan.budget_bytes)} "
            f"({plan.utilization:g} of the GPU)"
        )
        return
    if plan.cannot_check:
        plan.verdict = "unknown"
        plan.reason = "cannot check: " + "; ".join(plan.cannot_check)
        return
    assert plan.kv_cache_tokens is not None and plan.max_model_len is not None
    assert plan.max_concurrency is not None
    # One request of max-model-len must fit, as vLLM checks it (what a request holds: with
    # sliding-window layers the logged tokens of releases before 0.20 count other blocks).
    if plan.max_concurrency < 1:
        plan.verdict = "does not fit"
        plan.reason = (
            f"the KV cache holds {plan.kv_cache_tokens:,} tokens, fewer than one "
            f"max-model-len sequence ({plan.max_model_len:,}: {plan.max_concurrency:.2f} of one)"
        )
    elif plan.max_concurrency < TIGHT_CONCURRENCY:
        plan.verdict = "tight"
        plan.reason = (
            f"the KV cache holds only {plan.max_concurrency:.2f} sequences of "
            f"{plan.max_model_len:,} tokens"
        )
    else:
        plan.verdict = "fits"
        plan.reason = (
            f"the KV cache holds {plan.kv_cache_tokens:,} tokens: "
            f"{plan.max_concurrency:.1f} sequences of {plan.max_model_len:,}"
        )
    if plan.auto_fit_from is not None:
        plan.reason += (
            f" (max-model-len auto: vLLM lowers it from the model's {plan.auto_fit_from:,} "
            "to what fits)"
        )


def outside_budget(host: Host, server: Server) -> dict[str, float]:
    """GiB one server's process holds on each of its GPUs outside its budget, by cause.

    Example:
        >>> h = Host.model_validate({"address": "x", "vllm": {"version": "0.11.0",
        ...     "variant": "cu129"}})
        >>> outside_budget(h, Server(model="m", port=1, gpus=[0]))
        {'CUDA context': 0.5, 'CUDA graphs': 0.5}
    """
    parts = {"CUDA context": CUDA_CONTEXT_GIB}
    if server.parallel_size > 1:
        parts["NCCL"] = NCCL_GIB
    graphs_inside = version_tuple(host.vllm.version) >= GRAPHS_IN_BUDGET_FROM
    if not graphs_inside and server.args.get("enforce-eager") is not True:
        parts["CUDA graphs"] = CUDA_GRAPH_GIB
    return parts


def _plan_gpus(fleet: Fleet) -> list[GpuPlan]:
    """Every GPU that a server uses, with its utilization sum and headroom."""
    users: dict[tuple[str, int], list[tuple[str, Host, Server]]] = defaultdict(list)
    for host_name, host in fleet.hosts.items():
        if host.vllm.variant is Variant.cpu:
            continue
        for name, server in host.servers.items():
            for target in [host_name, *server.worker_hosts]:
                for index in sorted(set(server.gpus)):
                    users[(target, index)].append((f"{host_name}/{name}", host, server))
    plans = []
    for (host_name, index), on_gpu in sorted(users.items()):
        host = fleet.hosts.get(host_name)
        gpu_gib = host.gpus.total_gib if host else None
        total = sum(utilization(user, server) for _, user, server in on_gpu)
        gpu = GpuPlan(
            host=host_name, index=index, model=host.gpus.model if host else None,
            memory_bytes=int(gpu_gib * GiB) if gpu_gib else None,
            servers=[label for label, _, _ in on_gpu], utilization_sum=round(total, 4),
        )
        causes: dict[str, float] = defaultdict(float)
        for _, user_host, server in on_gpu:
            for cause, size in outside_budget(user_host, server).items():
                causes[cause] += size
        gpu.outside_bytes = int(sum(causes.values()) * GiB)
        needs = " + ".join(f"{cause} {size:.2f}" for cause, size in causes.items())
        process = "its server needs" if len(on_gpu) == 1 else f"its {len(on_gpu)} servers need"
        if total >= 1:
            gpu.verdict = "does not fit"
            gpu.reason = f"the servers' gpu-memory-utilization sums to {total:.2f}, not below 1"
        elif gpu_gib is None:
            gpu.reason = "cannot check: GPU memory unknown"
        else:
            entry = host.gpus.table_model if host else None
            named = entry.name if entry and host and host.gpus.memory_gib is None else None
            gpu.headroom_bytes = int((1 - total) * memory.cuda_total_bytes(gpu_gib, named)[0])
            left = f"{gib(gpu.headroom_bytes)} left outside the budgets"
            if gpu.headroom_bytes < gpu.outside_bytes:
                gpu.verdict = "tight"
                gpu.reason = (
                    f"{left}, less than the ~{gib(gpu.outside_bytes)} ({needs} GiB) "
                    f"{process} there: the last to start may fail on free memory"
                )
            else:
                gpu.verdict = "fits"
                gpu.reason = (
                    f"{left} for the ~{gib(gpu.outside_bytes)} ({needs} GiB) {process} there"
                )
        plans.append(gpu)
    return plans


def plan_fleet(fleet: Fleet, measured: dict[str, str] | None = None) -> FleetPlan:
    """The plan of every server and every used GPU of a validated fleet.

    ``measured``: for hosts whose GPUs were read from the host (``fleet plan --from-host``,
    :func:`fleet.planner.placement.measured`), where their CUDA total comes from, said in each plan.
    It runs without the cyclic collector (:mod:`fleet.read.bulk`).
    """
    with without_gc():
        return _plan_fleet(fleet, measured)


def _plan_fleet(fleet: Fleet, measured: dict[str, str] | None) -> FleetPlan:
    """:func:`plan_fleet`'s work."""
    servers = [
        plan_server(fleet, host_name, name, server, measured)
        for host_name, host in fleet.hosts.items()
        for name, server in host.servers.items()
    ]
    gpus = _plan_gpus(fleet)
    tight = {(g.host, g.index): g for g in gpus if g.verdict == "tight"}
    for plan in servers:
        for target in [plan.host, *plan.worker_hosts]:
            for index in plan.gpus:
                gpu = tight.get((target, index))
                if gpu and plan.verdict == "fits":
                    plan.verdict = "tight"
                    plan.reason += f"; but GPU {index} of {target}: {gpu.reason}"
    return FleetPlan(servers, gpus)


