#!/usr/bin/env python3
"""Measure the GPU constants of the planner (fleet/plan.py, fleet/gpus.py) on a real GPU.

Needs PyTorch with CUDA. Prints, for GPU 0:

- nvidia-smi's ``memory.total`` against CUDA's total (``cudaMemGetInfo``): the memory the
  driver keeps (``DRIVER_RESERVED_GIB``);
- the memory a fresh CUDA context takes (``CUDA_CONTEXT_GIB``), and after the first bf16
  matrix product, the cuBLAS workspace (``WORKSPACE_GIB``);
- the peak of a top-k/top-p sampler over fp32 logits like vLLM's profiling run, per
  (sequence × vocabulary entry) (``SAMPLER_BYTES``).

Measured on an H200 (driver 580.159.04, torch 2.11.0+cu130): nvidia-smi 143771 MiB, CUDA total
139.80 GiB; context 0.51 GiB; after cuBLAS 0.67 GiB; sampler 41.0 bytes per (seq × vocab).

Example::

    $ python3 benchmarks/gpu_memory_probe.py
"""

from __future__ import annotations

import subprocess

import torch

GiB = 2**30


def main() -> None:
    """Print the measurements."""
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
    for seqs, vocab in [(256, 151936), (1024, 129280)]:
        hidden = torch.randn(seqs, 4096, device="cuda", dtype=torch.bfloat16)
        head = torch.randn(vocab, 4096, device="cuda", dtype=torch.bfloat16)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        logits = (hidden @ head.t()).float()
        ordered, index = logits.sort(dim=-1)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        ordered.masked_fill_(cumulative <= 0.1, -float("inf"))
        probs = ordered.scatter(-1, index, ordered).softmax(-1)
        noise = torch.empty_like(probs).exponential_()
        probs.div(noise).argmax(-1).sum().item()
        peak = torch.cuda.max_memory_allocated() - base
        print(f"sampler {seqs} seqs × {vocab} vocab: peak {peak / GiB:.3f} GiB = "
              f"{peak / (seqs * vocab):.1f} bytes per (seq × vocab)")
        del hidden, head, logits, ordered, index, cumulative, probs, noise
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
