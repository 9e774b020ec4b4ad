#!/usr/bin/env python3
"""Measure the GPU constants of the planner (fleet/planner/memory.py, fleet/catalog/gpus.py) on a
real GPU, and
print each beside the planner's own figure.

Needs PyTorch (with CUDA for the measurements). Prints, for GPU 0:

- nvidia-smi's ``memory.total`` against CUDA's total (``cudaMemGetInfo``): the memory the
  driver keeps (``fleet.catalog.gpus.DRIVER_RESERVED_GIB``);
- the memory a fresh CUDA context takes (``fleet.planner.memory.CUDA_CONTEXT_GIB``), and after the
  first bf16 matrix product, the cuBLAS workspace (``fleet.planner.memory.WORKSPACE_GIB``);
- the peak of a sort-based top-k/top-p sampler over fp32 logits like vLLM's profiling run (the
  PyTorch path of ``vllm/v1/sample/ops/topk_topp_sampler.py``), per (sequence × vocabulary
  entry), against the planner's V1 figure (``fleet.planner.memory.V1_SAMPLER_BYTES``).

Measured on an H200 (driver 580.159.04, torch 2.11.0+cu130): nvidia-smi 143771 MiB, CUDA total
139.80 GiB; context 0.51 GiB; after cuBLAS 0.67 GiB; sampler 41.0 bytes per (seq × vocab).

``--dry-run`` needs no GPU: it runs the same sampler operations on small CPU tensors (so the
code path is checked where there is no CUDA) and prints the planner's constants it would be
held against; the last line is the planner's sampler figure.

Example::

    $ python3 benchmarks/gpu_memory_probe.py             # on the GPU machine
    $ python3 benchmarks/gpu_memory_probe.py --dry-run   # anywhere with torch
    ...
    planner: V1 sampler 24 bytes per (seq × vocab)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet.catalog.gpus import DRIVER_RESERVED_GIB
from fleet.planner.memory import CUDA_CONTEXT_GIB, V1_SAMPLER_BYTES, WORKSPACE_GIB

GiB = 2**30
#: (sequences, vocabulary) of the sampler runs: Qwen's and DeepSeek-V3's vocabularies.
SAMPLER_SHAPES = [(256, 151936), (1024, 129280)]
#: The dry run's small shapes (CPU).
DRY_SHAPES = [(4, 1024), (8, 2048)]


def sample_like_vllm(hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """The sort-based top-k/top-p sampling of vLLM's dummy sampler run: fp32 logits, sorted
    with their indices, top-p masked on the cumulative softmax, scattered back, then sampled
    with exponential noise. Returns the sampled token ids.

    Example:
        >>> ids = sample_like_vllm(torch.randn(2, 8), torch.randn(16, 8))
        >>> tuple(ids.shape), bool(((ids >= 0) & (ids < 16)).all())
        ((2,), True)
    """
    logits = (hidden @ head.t()).float()
    ordered, index = logits.sort(dim=-1)
    cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
    ordered.masked_fill_(cumulative <= 0.1, -float("inf"))
    probs = ordered.scatter(-1, index, ordered).softmax(-1)
    noise = torch.empty_like(probs).exponential_()
    return probs.div(noise).argmax(-1)


def planner_constants() -> list[str]:
    """The planner's figures the measurements are held against, one line each."""
    return [
        f"planner: driver reserve {DRIVER_RESERVED_GIB} GiB (where no log or host reading says)",
        f"planner: CUDA context {CUDA_CONTEXT_GIB} GiB",
        f"planner: cuBLAS workspaces {WORKSPACE_GIB} GiB",
        f"planner: V1 sampler {V1_SAMPLER_BYTES} bytes per (seq × vocab)",
    ]


def dry_run() -> None:
    """Run the sampler path on CPU tensors and print the planner's constants."""
    for seqs, vocab in DRY_SHAPES:
        ids = sample_like_vllm(torch.randn(seqs, 64), torch.randn(vocab, 64))
        print(f"dry run (cpu): sampler {seqs} seqs × {vocab} vocab → {ids.numel()} tokens")
    print("\n".join(planner_constants()))


def measure() -> None:
    """Print the measurements on GPU 0, then the planner's constants."""
    smi = subprocess.run(
        ["nvidia-smi", "--id=0", "--query-gpu=name,memory.total,driver_version",
         "--format=csv,noheader"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    print(f"nvidia-smi: {smi}")
    free, total = torch.cuda.mem_get_info(0)
    print(f"CUDA total {total / GiB:.2f} GiB; used by the fresh context {(total - free) / GiB:.2f}")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    free, _ = torch.cuda.mem_get_info(0)
    torch_bytes = torch.cuda.memory_reserved()
    print(f"after a bf16 matmul: used {(total - free) / GiB:.2f} GiB "
          f"({torch_bytes / GiB:.2f} of it PyTorch's tensors)")
    del a
    torch.cuda.empty_cache()
    for seqs, vocab in SAMPLER_SHAPES:
        hidden = torch.randn(seqs, 4096, device="cuda", dtype=torch.bfloat16)
        head = torch.randn(vocab, 4096, device="cuda", dtype=torch.bfloat16)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        sample_like_vllm(hidden, head).sum().item()
        peak = torch.cuda.max_memory_allocated() - base
        print(f"sampler {seqs} seqs × {vocab} vocab: peak {peak / GiB:.3f} GiB = "
              f"{peak / (seqs * vocab):.1f} bytes per (seq × vocab)")
        del hidden, head
        torch.cuda.empty_cache()
    print("\n".join(planner_constants()))


def main(argv: list[str] | None = None) -> int:
    """Measure on the GPU, or with ``--dry-run`` check the path on the CPU."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: run the sampler path on CPU tensors, print the constants")
    args = parser.parse_args(argv)
    if args.dry_run:
        dry_run()
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: run on the GPU machine, or pass --dry-run", file=sys.stderr)
        return 2
    measure()
    return 0


if __name__ == "__main__":
    sys.exit(main())
