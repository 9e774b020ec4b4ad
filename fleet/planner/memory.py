"""How vLLM sizes a server's GPU memory, release by release: the total CUDA reports, the terms of
the profiling peak, the weights a GPU holds, and the KV cache one request needs.

:mod:`fleet.planner.fit` asks this module for numbers; each comes as a :class:`Term` with where it
comes
from (vLLM's code of that release, a public log of the corpus in ``tests/data/vllm-logs/``, or a
measurement), so that ``fleet plan`` can print every term with its source.

The release families (``family()``), as each release's own ``determine_available_memory`` computes
the KV cache memory (``budget = gpu-memory-utilization × CUDA total``):

- ``V0 0.6.4`` (``vllm/worker/worker.py``): budget − torch peak (weights included) − non-torch
  memory, where non-torch memory is everything else the GPU holds;
- ``V0 0.6.5`` (vllm#10511 ``memory_profiling``): budget − weights − activation peak − the
  non-torch increase since the worker's snapshot, which 0.6.5 and 0.6.6 over-count (1.79 GiB per
  rank on an H100, vllm#10511's own logs; vllm#12126 fixed it in 0.7.0);
- ``V0 0.7`` (0.7.0 up to the V0 engine's removal): as 0.6.5, non-torch increase 0.03–0.16 GiB on
  one GPU, 0.20–0.30 GiB with tensor parallel (NCCL), in the corpus's logs;
- ``V1 0.8`` (``vllm/v1/worker/gpu_worker.py`` before vllm#18974): budget − torch peak − every
  non-torch allocation on the GPU, the CUDA context included;
- ``V1`` (0.9 on): budget − weights − torch peak increase − non-torch increase since the
  snapshot taken after the CUDA context, before NCCL; from 0.21 on also an estimate of the CUDA
  graphs (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``).

Example:
    >>> family("0.6.4.post1", "V0"), family("0.7.3", "V0"), family("0.11.0", "V1")
    ('V0 0.6.4', 'V0 0.7', 'V1')
    >>> total, source = cuda_total_bytes(140.4, "H200")
    >>> round(total / GiB, 2), source.split(":")[0]
    (139.8, 'nvidia-smi memory.total 143771 MiB − memory.reserved 616 MiB')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleet.catalog.gpus import DRIVER_RESERVED_GIB, lookup
from fleet.catalog.releases import release
from fleet.spec.models import ModelConfig, Server

GiB = 2**30
MiB = 2**20

#: V1: the sampler's peak per (row × vocabulary entry) in the profiling pass, which runs top-k
#: and top-p on dummy requests (``_dummy_sampler_run``: top_k = vocab − 1, top_p = 0.9). Three
#: paths, by release (``sampler_path``):
#:
#: - the PyTorch sort (``apply_top_k_top_p`` of vllm/v1/sample/ops/topk_topp_sampler.py), the
#:   default of every pip-installed release before 0.17 (FlashInfer is only the ``[flashinfer]``
#:   extra up to 0.11.0, and opt-in from 0.11.1): at ``logits.sort`` the bf16 logits (2) the
#:   caller holds, their fp32 copy (4), the sorted values (4) and int64 indices (8), the int64
#:   index input torch builds for CUB (8) and CUB's segmented radix sort buffers for keys and
#:   values (12): 38 bytes. Logs: 38.2–38.9 (H100: Qwen3-0.6B, Llama-3.1-8B, Qwen3-32B,
#:   gpt-oss-20b, llm-d-benchmark's measurements; L40S: Qwen3-235B, 0.10.2); the probe
#:   (benchmarks/gpu_memory_probe.py) measured 41.0 on an H200 for a sequence that keeps a
#:   few more tensors alive;
#: - the Triton top-k/top-p kernel (``apply_top_k_top_p_triton``, from 0.17, for 8 rows or
#:   more): in place, so the bf16 (2) and fp32 (4) logits, then the softmax (4) and the
#:   exponential noise of ``random_sample`` (4): 14 bytes, plus the kernel's per-program buffer
#:   (``min(SMs, rows) × vocab`` fp32);
#: - FlashInfer's sampler (``flashinfer_sample`` with top-k and top-p: the fp32 softmax of the
#:   fp32 logits, then ``top_k_top_p_sampling_from_probs``) where it is on: the bf16 (2) and
#:   fp32 (4) logits and the fp32 probabilities (4), 10 bytes. Set on the logs that say 'Using
#:   FlashInfer for top-p & top-k sampling' of the calibration split: dennislee22/vLLM-
#:   benchmarking's Qwen2-7B on A100s at utilization 0.25 (TP 1 and 2, 0.10.1.1) and
#:   vllm#24577's Qwen3-0.6B (0.10.2), 14 B left them 1-3 % short; the held-out runs at 0.5
#:   come within 0.5 % with 10.
V1_NATIVE_SAMPLER_BYTES = 38
V1_TRITON_SAMPLER_BYTES = 14
V1_FLASHINFER_SAMPLER_BYTES = 10
#: The figure the probe's measurement is held against (the sort path it reproduces).
V1_SAMPLER_BYTES = V1_NATIVE_SAMPLER_BYTES
#: From this release, 8 rows or more go through the Triton kernel (vllm#33538).
TRITON_SAMPLER_FROM = (0, 17)
TRITON_MIN_ROWS = 8
#: The Triton kernel's programs: one per SM, at most (132 on an H100/H200, 108 on an A100).
TRITON_PROGRAMS = 132
#: FlashInfer's sampler is on by default where flashinfer is installed up to this release;
#: from it, only with VLLM_USE_FLASHINFER_SAMPLER=1.
FLASHINFER_OPT_IN_FROM = (0, 11, 1)
#: V0: the profiling pass computes fp32 logits of one token per sequence.
V0_LOGITS_BYTES = 4
#: Non-torch memory the profiling pass adds (cuBLAS workspaces: 0.16 GiB measured on an H200).
WORKSPACE_GIB = 0.15
#: With tensor or pipeline parallel, NCCL and custom all-reduce buffers come on top: V0 0.7–0.8
#: logs show 0.25 (2 × RTX 4090), 0.30 (2 × L40S) and 0.20 GiB (16 × RTX 3090) of non-torch.
PARALLEL_NON_TORCH_GIB = 0.25
#: V0 0.7–0.8 on one GPU: 0.03 (RTX 4060, vllm#13882) and 0.16 GiB (H100, vllm#12126) logged.
V0_SINGLE_NON_TORCH_GIB = 0.1
#: V0 0.6.4: non_torch_memory of an RTX 3090 log (vllm#10517).
V0_064_NON_TORCH_GIB = 0.35
#: V0 0.6.5–0.6.6: non_torch_memory per TP rank as vllm#10511 logs it on H100s (1.79 at TP 1, 3.58
#: at TP 2), before vllm#12126 (0.7.0) counted only the profiling pass's own increase.
V0_065_NON_TORCH_GIB = 1.79
#: The CUDA context, which V1 before 0.9 counts into its budget (all non-torch memory on the GPU).
CUDA_CONTEXT_GIB = 0.5
#: CUDA graphs of the default capture sizes (typical logs: 0.2–0.6 GiB), in the budget from 0.21.
CUDA_GRAPH_GIB = 0.5
GRAPHS_IN_BUDGET_FROM = (0, 21)
#: How V1 logs ``GPU KV cache size`` for a model with sliding-window layers: up to 0.19 (at
#: least: vllm#40691 shows 0.19.0) as ``num_blocks // len(kv_cache_groups) × block_size``, which
#: is the KV memory over the bytes per token of all layers (0.10.1.1's gpt-oss-120b: 45.32 GiB /
#: 18,432 B = 2,640,144 tokens while its concurrency is 284.25 × 16,384); later code logs
#: concurrency × max-model-len (vllm#38364, vllm#40694). The first release with the new formula
#: is not dated here: from 0.20 the plan logs concurrency × length and says so.
KV_TOKENS_BY_CONCURRENCY_FROM = (0, 20)
#: V0 chunked prefill's tokens per step: 512 in 0.6 (SchedulerConfig), 2048 from 0.7.
V0_CHUNKED_TOKENS_06 = 512
V0_CHUNKED_TOKENS = 2048
V0_LONG_CONTEXT = 32768


@dataclass(frozen=True)
class Term:
    """One named number of the plan and where it comes from."""

    name: str
    bytes: int
    source: str

    def as_dict(self) -> dict[str, object]:
        """{"name", "bytes", "source"} for the JSON plan."""
        return {"name": self.name, "bytes": self.bytes, "source": self.source}


def version(text: str) -> tuple[int, ...]:
    """ "0.10.1.post1" → (0, 10, 1).

    Example:
        >>> version("0.6.4.post1")
        (0, 6, 4)
    """
    return release(text)[:3]


def family(vllm_version: str, engine: str) -> str:
    """The release family whose memory accounting applies (see the module docstring).

    Example:
        >>> family("0.6.6", "V0"), family("0.8.5", "V1"), family("0.9.2", "V1")
        ('V0 0.6.5', 'V1 0.8', 'V1')
    """
    v = version(vllm_version)
    if engine == "V0":
        if v < (0, 6, 5):
            return "V0 0.6.4"
        return "V0 0.6.5" if v < (0, 7, 0) else "V0 0.7"
    return "V1 0.8" if v < (0, 9, 0) else "V1"


def engine_of(vllm_version: str, default_engine: str, server: Server) -> str:
    """V0 or V1: the release's default, unless the server's VLLM_USE_V1 says otherwise (which
    releases before 0.11 honour).

    Example:
        >>> s = Server(model="m", port=1, env={"VLLM_USE_V1": "0"})
        >>> engine_of("0.8.3", "V1", s), engine_of("0.11.0", "V1", s)
        ('V0', 'V1')
    """
    flag = str(server.env.get("VLLM_USE_V1", "")).strip()
    if version(vllm_version) < (0, 11, 0) and flag in ("0", "1"):
        return "V1" if flag == "1" else "V0"
    return default_engine


def cuda_total_bytes(
    memory_gib: float, gpu_model: str | None = None, reserved_mib: float | None = None
) -> tuple[int, str]:
    """What CUDA reports as the GPU's total, and where the figure comes from.

    ``reserved_mib`` is nvidia-smi's memory.reserved where it is known (a host's reading); else
    the GPU table's figure for ``gpu_model`` (a public log's, or this project's capture:
    :class:`fleet.catalog.gpus.GpuModel`); else nvidia-smi's total less 0.5 GiB.

    Example:
        >>> round(cuda_total_bytes(23.99, "RTX 4090")[0] / GiB, 2)
        23.55
        >>> round(cuda_total_bytes(24.0, "RTX 4090", reserved_mib=449)[0] / GiB, 2)
        23.56
        >>> round(cuda_total_bytes(22.49, "L4")[0] / GiB, 2)
        21.99
    """
    if reserved_mib is not None:
        total_mib = memory_gib * 1024 - reserved_mib
        return int(total_mib * MiB), (
            f"nvidia-smi memory.total {memory_gib * 1024:.0f} MiB − memory.reserved "
            f"{reserved_mib:.0f} MiB"
        )
    entry = lookup(gpu_model) if gpu_model else None
    if entry is not None and entry.reserved_mib is not None:
        return (entry.memory_mib - entry.reserved_mib) * MiB, (
            f"nvidia-smi memory.total {entry.memory_mib} MiB − memory.reserved "
            f"{entry.reserved_mib} MiB: {entry.cuda_source}"
        )
    if entry is not None and entry.cuda_total_gib is not None:
        return int(entry.cuda_total_gib * GiB), entry.cuda_source
    return int((memory_gib - DRIVER_RESERVED_GIB) * GiB), (
        f"nvidia-smi's {memory_gib:.2f} GiB less {DRIVER_RESERVED_GIB} GiB the driver keeps "
        "(no log of this GPU model shows CUDA's figure)"
    )


def experts(config: ModelConfig) -> int | None:
    """The routed experts of a MoE model (n_routed_experts, num_experts or num_local_experts).

    Example:
        >>> experts(ModelConfig(num_hidden_layers=1, num_attention_heads=1, n_routed_experts=64))
        64
    """
    return config.n_routed_experts or config.num_experts or config.num_local_experts


def expert_fraction(config: ModelConfig) -> float | None:
    """The share of the parameters that are routed experts (None if the config cannot say).

    Counted from the config: embedding and lm_head, and per layer attention (q, k, v, o) and the
    MLP (3 matrices: the experts' and, on dense layers, the dense one).

    Example (Qwen3-30B-A3B: 128 experts of 768, 48 layers):
        >>> c = ModelConfig(num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
        ...     head_dim=128, hidden_size=2048, moe_intermediate_size=768, num_experts=128,
        ...     num_experts_per_tok=8, vocab_size=151936)
        >>> round(expert_fraction(c), 2)
        0.95
    """
    count = experts(config)
    hidden, inner = config.hidden_size, config.moe_intermediate_size
    if not count or not hidden or not inner:
        return None
    head = config.head_size or 0
    attention = hidden * head * (2 * config.num_attention_heads + 2 * config.kv_heads)
    dense_layers = min(config.first_k_dense_replace or 0, config.num_hidden_layers)
    moe_layers = config.num_hidden_layers - dense_layers
    expert_params = moe_layers * count * 3 * hidden * inner
    dense_params = dense_layers * 3 * hidden * (config.intermediate_size or inner)
    embed = (config.vocab_size or 0) * hidden * (1 if config.tie_word_embeddings else 2)
    total = expert_params + dense_params + config.num_hidden_layers * attention + embed
    return expert_params / total if total else None


def weights_per_gpu(
    weights: int, config: ModelConfig | None, server: Server
) -> tuple[int, list[Term]]:
    """Bytes of weights one GPU holds, and the terms that say how they were split.

    ``weights ÷ (TP × PP)``; with ``enable-expert-parallel`` the routed experts are split over
    TP × DP ranks instead (vLLM's expert parallel group), the rest over TP; ``cpu-offload-gb``
    (per GPU) stays in CPU memory.

    Example (a 10 GiB MoE checkpoint, experts 80 %: 2 × DP 2 with expert parallel):
        >>> s = Server(model="m", port=1, args={"tensor-parallel-size": 2,
        ...     "data-parallel-size": 2, "enable-expert-parallel": True, "cpu-offload-gb": 1})
        >>> c = ModelConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
        ...     moe_intermediate_size=256, num_experts=8, vocab_size=16)
        >>> size, terms = weights_per_gpu(10 * GiB, c, s)
        >>> [t.name for t in terms]
        ['weights per GPU', 'expert parallel', 'CPU offload']
    """
    tp, pp, dp = server.tp, server.pp, server.dp
    per_gpu = weights // (tp * pp)
    terms = [Term("weights per GPU", per_gpu, f"weights ÷ (TP {tp} × PP {pp})")]
    fraction = expert_fraction(config) if config else None
    if server.args.get("enable-expert-parallel") is True and dp > 1:
        if fraction is None:
            terms.append(Term("expert parallel", 0, "not modelled: the config gives no expert "
                              "count (n_routed_experts, num_experts or num_local_experts)"))
        else:
            expert_bytes = int(weights * fraction)
            split = (weights - expert_bytes) // (tp * pp) + expert_bytes // (tp * dp * pp)
            terms.append(Term("expert parallel", split - per_gpu,
                              f"the experts ({fraction:.0%} of the weights by the config) split "
                              f"over TP {tp} × DP {dp} ranks instead of TP {tp}"))
            per_gpu = split
    offload = server.args.get("cpu-offload-gb")
    if isinstance(offload, int | float) and not isinstance(offload, bool) and offload > 0:
        moved = min(per_gpu, int(float(offload) * GiB))
        terms.append(Term("CPU offload", -moved,
                          f"cpu-offload-gb {offload:g}: that much of each GPU's weights stays in "
                          "CPU memory and streams in every forward pass"))
        per_gpu -= moved
    return per_gpu, terms


def activation_bytes(config: ModelConfig | None, tokens: int, tp: int, dtype_bytes: int) -> int:
    """Estimated activation peak of the profiling forward pass over ``tokens`` tokens:
    ``tokens × (3·hidden + max(3·intermediate, qkv + q)/TP) × dtype bytes`` (within 1 % of the
    torch peaks of the V0 RTX 3090 logs: 2.07 GiB logged at 20,000 tokens, 2.06 estimated).

    Example (Qwen3-8B, 2048 tokens, bf16):
        >>> c = ModelConfig(num_hidden_layers=36, num_attention_heads=32,
        ...     num_key_value_heads=8, head_dim=128, hidden_size=4096, intermediate_size=12288)
        >>> activation_bytes(c, 2048, 1, 2)
        201326592
    """
    if config is None:
        return 0
    hidden = config.hidden_size or 0
    head = config.head_size or 0
    qkv = (config.num_attention_heads + 2 * config.kv_heads) * head
    inner = config.intermediate_size or 0
    if config.moe_intermediate_size and config.num_experts_per_tok:
        inner = max(inner, config.moe_intermediate_size * config.num_experts_per_tok)
    attention = (qkv + config.num_attention_heads * head) // tp
    return tokens * (3 * hidden + max(3 * inner // tp, attention)) * dtype_bytes


@dataclass(frozen=True)
class Batch:
    """The profiling pass's shape: tokens in one forward pass, sampler rows, and why."""

    tokens: int
    seqs: int
    source: str


def profile_terms(
    fam: str, vllm_version: str, server: Server, config: ModelConfig | None, batch: Batch,
    dtype_bytes: int, last_stage: bool = True,
) -> list[Term]:
    """The terms of the profiling peak that the release family takes out of the budget.

    ``last_stage``: the pipeline stage that runs the sampler (V1 samples on the last stage only).

    Example (V1, one GPU, Qwen3-0.6B, 8192 tokens, 256 rows):
        >>> c = ModelConfig(num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        ...     head_dim=128, hidden_size=1024, intermediate_size=3072, vocab_size=151936)
        >>> terms = profile_terms("V1", "0.10.2", Server(model="m", port=1), c,
        ...                       Batch(8192, 256, "given"), 2)
        >>> [(t.name, round(t.bytes / GiB, 2)) for t in terms]  # doctest: +NORMALIZE_WHITESPACE
        [('activation', 0.19), ('sampler', 1.39), ('profiling peak', 1.39),
         ('non-torch', 0.15), ('CUDA graphs', 0.0)]
    """
    vocab = config.vocab_size if config and config.vocab_size else 0
    tp = server.tp
    parallel = server.tp * server.pp > 1
    activation = activation_bytes(config, batch.tokens, tp, dtype_bytes)
    terms = [Term("activation", activation,
                  f"forward pass over {batch.tokens:,} tokens ({batch.source}); 3·hidden + "
                  "max(3·intermediate, attention)/TP values per token")]
    if fam.startswith("V0"):
        sampler = batch.seqs * vocab * V0_LOGITS_BYTES
        terms.append(Term("sampler", sampler,
                          f"{batch.seqs} sequences × vocab {vocab:,} × 4 B (V0: fp32 logits)"))
    elif last_stage:
        rows = min(batch.tokens, batch.seqs)
        path, per_entry, extra, why = sampler_path(vllm_version, server, rows, vocab)
        held = batch.tokens * (config.hidden_size or 0) * dtype_bytes if config else 0
        sampler = rows * vocab * per_entry + extra + held
        terms.append(Term("sampler", sampler,
                          f"{rows} rows × vocab {vocab:,} × {per_entry} B ({path}: {why})"
                          + (f" + its buffer {extra / GiB:.2f} GiB" if extra else "")
                          + f" + the dummy run's hidden states it holds ({batch.tokens:,} × "
                          f"{(config.hidden_size or 0) if config else 0:,})"))
    else:
        sampler = 0
        terms.append(Term("sampler", 0, "not on this pipeline stage (V1 samples on the last)"))
    terms.append(Term("profiling peak", max(activation, sampler),
                      "the larger of activation and sampler: they run one after the other "
                      "(profile_run: _dummy_run, then _dummy_sampler_run), torch's peak"))
    terms.append(_non_torch(fam, tp, parallel))
    terms.append(_graphs(fam, vllm_version, server))
    return terms


def sampler_path(vllm_version: str, server: Server, rows: int, vocab: int
                 ) -> tuple[str, int, int, str]:
    """Which top-k/top-p implementation vLLM V1's dummy sampler run takes, its bytes per (row ×
    vocabulary entry), any fixed buffer, and why (see ``V1_NATIVE_SAMPLER_BYTES``).

    Example:
        >>> s = Server(model="m", port=1)
        >>> [sampler_path(v, s, 256, 1000)[:2] for v in ("0.11.0", "0.16.0", "0.17.0")]
        [('PyTorch sort', 38), ('PyTorch sort', 38), ('Triton kernel', 14)]
        >>> sampler_path("0.17.0", s, 4, 1000)[:2]
        ('PyTorch sort', 38)
        >>> opt_in = Server(model="m", port=1, env={"VLLM_USE_FLASHINFER_SAMPLER": "1"})
        >>> sampler_path("0.14.1", opt_in, 256, 1000)[:2]
        ('FlashInfer', 10)
    """
    v = version(vllm_version)
    flag = str(server.env.get("VLLM_USE_FLASHINFER_SAMPLER", "")).strip()
    # Up to 0.11.0 flashinfer is the [flashinfer] extra: the sampler takes it when it is
    # installed, which VLLM_ATTENTION_BACKEND=FLASHINFER (it needs the package) shows.
    installed = str(server.env.get("VLLM_ATTENTION_BACKEND", "")).strip() == "FLASHINFER"
    if flag == "1" or (v < FLASHINFER_OPT_IN_FROM and installed and flag != "0"):
        why = ("VLLM_USE_FLASHINFER_SAMPLER=1" if flag == "1" else
               "flashinfer installed (VLLM_ATTENTION_BACKEND=FLASHINFER), on by default "
               "before 0.11.1")
        return "FlashInfer", V1_FLASHINFER_SAMPLER_BYTES, 0, why
    if v >= TRITON_SAMPLER_FROM and rows >= TRITON_MIN_ROWS:
        buffer = min(TRITON_PROGRAMS, rows) * vocab * 4
        return "Triton kernel", V1_TRITON_SAMPLER_BYTES, buffer, (
            "in place: bf16 and fp32 logits, softmax, exponential noise; from 0.17, 8 rows "
            "or more")
    return "PyTorch sort", V1_NATIVE_SAMPLER_BYTES, 0, (
        "bf16 and fp32 logits, sorted values and int64 indices, the sort's index input and "
        "CUB's radix-sort buffers")


def sampler_undecided(vllm_version: str, server: Server) -> bool:
    """Whether the release's sampler path depends on something the fleet file does not say:
    before 0.11.1 vLLM takes FlashInfer's sampler wherever the flashinfer package is installed
    (vLLM's Docker image, the ``[flashinfer]`` extra), which neither ``VLLM_USE_FLASHINFER_SAMPLER``
    nor ``VLLM_ATTENTION_BACKEND=FLASHINFER`` settles here.

    Example:
        >>> sampler_undecided("0.10.1", Server(model="m", port=1))
        True
        >>> sampler_undecided("0.10.1", Server(model="m", port=1,
        ...     env={"VLLM_USE_FLASHINFER_SAMPLER": "0"}))
        False
        >>> sampler_undecided("0.11.1", Server(model="m", port=1))
        False
    """
    if version(vllm_version) >= FLASHINFER_OPT_IN_FROM:
        return False
    said = str(server.env.get("VLLM_USE_FLASHINFER_SAMPLER", "")).strip() in ("0", "1")
    backend = str(server.env.get("VLLM_ATTENTION_BACKEND", "")).strip() == "FLASHINFER"
    return not (said or backend)


def logged_tokens_by_blocks(vllm_version: str) -> bool:
    """Whether the release logs a sliding-window model's ``GPU KV cache size`` as its KV blocks
    over all layers (see ``KV_TOKENS_BY_CONCURRENCY_FROM``).

    Example:
        >>> logged_tokens_by_blocks("0.10.1.1"), logged_tokens_by_blocks("0.26.0")
        (True, False)
    """
    return version(vllm_version) < KV_TOKENS_BY_CONCURRENCY_FROM


def _non_torch(fam: str, tp: int, parallel: bool) -> Term:
    """The non-torch memory a release family counts into the budget."""
    if fam == "V0 0.6.4":
        return Term("non-torch", int(V0_064_NON_TORCH_GIB * GiB),
                    "non_torch_memory of a 0.6.4 log (RTX 3090, vllm#10517)")
    if fam == "V0 0.6.5":
        return Term("non-torch", int(V0_065_NON_TORCH_GIB * tp * GiB),
                    f"{V0_065_NON_TORCH_GIB} GiB per TP rank: 0.6.5/0.6.6 count every byte "
                    "outside torch since the snapshot (vllm#10511's logs; fixed in 0.7.0)")
    nccl = PARALLEL_NON_TORCH_GIB if parallel else 0.0
    if fam == "V0 0.7":
        size = nccl or V0_SINGLE_NON_TORCH_GIB
        return Term("non-torch", int(size * GiB),
                    "non-torch increase of the profiling pass as V0 0.7–0.8 logs show it: "
                    + ("0.20–0.30 GiB with tensor parallel (NCCL)" if parallel
                       else "0.03–0.16 GiB on one GPU"))
    size = WORKSPACE_GIB + nccl
    source = ("cuBLAS workspaces (0.16 GiB measured on an H200)"
              + (" + NCCL and custom all-reduce buffers (0.25 GiB, as parallel logs show)"
                 if parallel else ""))
    if fam == "V1 0.8":
        size += CUDA_CONTEXT_GIB
        source += (" + the CUDA context: V1 before 0.9 counts every non-torch allocation on "
                   "the GPU (gpu_worker.determine_available_memory)")
    return Term("non-torch", int(size * GiB), source)


def _graphs(fam: str, vllm_version: str, server: Server) -> Term:
    """CUDA graph memory inside the budget (from 0.21), or why there is none."""
    if server.args.get("enforce-eager") is True:
        return Term("CUDA graphs", 0, "--enforce-eager: no CUDA graphs")
    if fam.startswith("V1") and version(vllm_version) >= GRAPHS_IN_BUDGET_FROM:
        return Term("CUDA graphs", int(CUDA_GRAPH_GIB * GiB),
                    "CUDA graph estimate, in the budget from 0.21 "
                    "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)")
    return Term("CUDA graphs", 0, "captured after the KV cache is sized (outside the budget)")


def v0_batch(server: Server, max_len: int | None, vllm_version: str,
             default_seqs: int | None) -> Batch:
    """V0's profiling batch, as its SchedulerConfig computes it: max-num-batched-tokens is
    max(max-model-len, 2048), or with chunked prefill (given, or turned on by itself above
    32,768 tokens) 512 (0.6) / 2048 (0.7 on).

    Example:
        >>> s = Server(model="m", port=1)
        >>> v0_batch(s, 20000, "0.6.4", 256).tokens, v0_batch(s, 35000, "0.6.4", 256).tokens
        (20000, 512)
        >>> v0_batch(s, 131072, "0.7.2", None).tokens
        2048
    """
    seqs = server.int_arg("max-num-seqs") or default_seqs or 256
    given = server.int_arg("max-num-batched-tokens")
    if given is not None:
        return Batch(given, seqs, "max-num-batched-tokens")
    explicit = server.args.get("enable-chunked-prefill")
    off = True in (server.args.get("no-enable-chunked-prefill"),
                   server.args.get("disable-chunked-prefill"))
    long_context = (max_len or 0) > V0_LONG_CONTEXT
    chunked = not off and (explicit is True or (explicit is None and long_context))
    if chunked:
        tokens = V0_CHUNKED_TOKENS_06 if version(vllm_version) < (0, 7, 0) else V0_CHUNKED_TOKENS
        return Batch(tokens, seqs, f"V0 chunked prefill: {tokens} tokens a step")
    return Batch(max(max_len or 0, 2048), seqs,
                 "V0 without chunked prefill: max(max-model-len, 2048)")


def layer_kinds(config: ModelConfig) -> tuple[int, int, int | None]:
    """(full-attention layers, sliding-window layers, window) from the config's layer_types,
    sliding_window_pattern (every N-th layer full, as Gemma 3) or sliding_window.

    Example (Gemma-3-27B: 62 layers, every 6th global, window 1024):
        >>> layer_kinds(ModelConfig(num_hidden_layers=62, num_attention_heads=32,
        ...     sliding_window=1024, sliding_window_pattern=6))
        (10, 52, 1024)
        >>> layer_kinds(ModelConfig(num_hidden_layers=4, num_attention_heads=1))
        (4, 0, None)
    """
    layers = config.num_hidden_layers
    window = config.sliding_window
    if config.layer_types:
        sliding = sum(1 for kind in config.layer_types if kind == "sliding_attention")
        if window:
            return layers - sliding, sliding, window
    if window and config.sliding_window_pattern:
        full = layers // config.sliding_window_pattern
        return full, layers - full, window
    if window and config.use_sliding_window:
        return 0, layers, window
    return layers, 0, None


def request_tokens(
    config: ModelConfig, max_len: int, batched_tokens: int, block: int, pp: int
) -> tuple[float, str]:
    """Layer-tokens one max-model-len request holds, per layer of a full stage, in vLLM V1's
    hybrid KV cache: a full-attention layer ⌈L/block⌉ blocks, a sliding-window layer
    ⌈min(window − 1 + max-num-batched-tokens, L)/block⌉ + 1 blocks (SlidingWindowSpec
    .max_memory_usage_bytes). Returns tokens averaged over the stage's layers, and a note.

    Example (Gemma-3-27B at 32k, 8192 batched tokens):
        >>> c = ModelConfig(num_hidden_layers=62, num_attention_heads=32,
        ...     sliding_window=1024, sliding_window_pattern=6)
        >>> round(request_tokens(c, 32768, 8192, 16, 1)[0])
        13028
    """
    full, sliding, window = layer_kinds(config)
    layers = full + sliding
    if not sliding or window is None:
        return math.ceil(max_len / block) * block, ""
    full_tokens = math.ceil(max_len / block) * block
    span = min(window - 1 + batched_tokens, max_len)
    sliding_tokens = (math.ceil(span / block) + 1) * block
    average = (full * full_tokens + sliding * sliding_tokens) / layers
    note = (f"{full} full-attention layers hold {full_tokens:,} tokens a request, {sliding} "
            f"sliding-window layers (window {window:,}) {sliding_tokens:,}")
    return average, note
