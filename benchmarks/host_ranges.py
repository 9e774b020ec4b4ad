#!/usr/bin/env python3
"""Host ranges: loading a fleet written as one range block against the same fleet host by host.

Each size N is one fleet twice: ``gpu-[00001:N]`` as one block (an 8 × H100 host serving two
models, addresses counted up from 10.0.0.1/8), and the same N hosts written out one block each
with its own address — what a site writes without ranges. Both are loaded in this process with
:func:`fleet.load.load_text` (validation, replicas, every check and the capacity plan: what
``fleet check`` does after reading the file), CPU time (``time.process_time``), best of
``--repeat`` runs after a warm-up load (flag lists and the GPU table are read once per process).
Printed per size: bytes, load seconds, milliseconds per host and per KiB of each file.

The cap on hosts (:data:`fleet.spec.hostranges.MAX_HOSTS`) follows from these figures: a fleet
of ranges may cost no more to load than the largest file the byte limit (the parse budget's,
:data:`fleet.read.source.MAX_FLEET_BYTES`) lets through, written out: that file's KiB times the
written-out cost per KiB, over the cost of a range's host at the largest size. The last line
is the ratio of the range file's load time to the written-out file's at 1,000 hosts (below 1:
the range is cheaper to load; the block's YAML is read once).

Example::

    $ .venv/bin/python benchmarks/host_ranges.py              # 1,000 and 10,000 hosts
    $ .venv/bin/python benchmarks/host_ranges.py 1000 --repeat 5
     hosts  form          bytes    load s  ms/host  ms/KiB
    ...
    range / written out, load CPU time at 1000 hosts: 0.63
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleet.load import load_text  # noqa: E402
from fleet.read.source import MAX_FLEET_BYTES  # noqa: E402
from fleet.spec.hostranges import HOSTS_IN_BYTE_LIMIT, MAX_HOSTS  # noqa: E402

SIZES = (1000, 10000)
#: The size the last line compares at (the issue's "a thousand hosts").
REFERENCE = 1000

_HEADER = """\
version: 1
defaults:
  ssh: {user: ops}
  vllm: {version: "0.32.0", variant: cu130}
models:
  qwen3-8b:
    hf: "Qwen/Qwen3-8B"
    revision: "b968826d9c46dd6066d109eabc6255188de91218"
    weights_gib: 15.26
    config: {architectures: [Qwen3ForCausalLM], num_hidden_layers: 36, num_attention_heads: 32, \
num_key_value_heads: 8, head_dim: 128, hidden_size: 4096, intermediate_size: 12288, \
vocab_size: 151936, max_position_embeddings: 40960, torch_dtype: bfloat16}
  llama-70b:
    hf: "meta-llama/Llama-3.1-70B-Instruct"
    revision: "1605565b47bb9346c5515c34102e054115b4f98b"
    weights_gib: 131.4
    config: {architectures: [LlamaForCausalLM], num_hidden_layers: 80, num_attention_heads: 64, \
num_key_value_heads: 8, head_dim: 128, hidden_size: 8192, intermediate_size: 28672, \
vocab_size: 128256, max_position_embeddings: 131072, torch_dtype: bfloat16}
hosts:
"""

_BODY = """\
    gpus: {count: 8, model: "H100"}
    os: {nvidia: {driver: "580"}}
    servers:
      big:
        model: llama-70b
        gpus: [0, 1, 2, 3]
        port: 8000
        host: 0.0.0.0
        args: {tensor-parallel-size: 4, max-model-len: 16384}
      small:
        model: qwen3-8b
        gpus: [4]
        port: 8001
        host: 0.0.0.0
        served_model_name: small
        args: {max-model-len: 8192}
"""


def as_range(hosts: int) -> str:
    """The fleet of ``hosts`` hosts as one range block.

    Example:
        >>> as_range(3).count("gpu-[00001:00003]:"), as_range(3).count("address:")
        (1, 1)
    """
    return f"{_HEADER}  gpu-[00001:{hosts:05d}]:\n    address: 10.0.0.1/8\n{_BODY}"


def written_out(hosts: int) -> str:
    """The same fleet, one block per host with its own address (the ones the range gives).

    Example:
        >>> written_out(300).count("address: 10.0.1.44\\n")
        1
    """
    blocks = [f"  gpu-{index + 1:05d}:\n    address: 10.{(index + 1) >> 16}."
              f"{((index + 1) >> 8) & 255}.{(index + 1) & 255}\n{_BODY}"
              for index in range(hosts)]
    return _HEADER + "".join(blocks)


def load_seconds(text: str, repeat: int) -> float:
    """The least CPU time of ``repeat`` loads of ``text``."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fleet = load_text(text, str(ROOT / "bench-ranges.yaml"))
        best = min(best, time.process_time() - start)
        del fleet
    return best


def main(argv: list[str]) -> int:
    """Time each size in both forms; the derived cap, then the ratio last."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="*", type=int, default=list(SIZES))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    load_seconds(as_range(20), 1)  # warm-up: flag lists, GPU table, pydantic's first use
    print(f"{'hosts':>6}  {'form':<12} {'bytes':>9} {'load s':>8} {'ms/host':>8} {'ms/KiB':>7}",
          flush=True)
    seconds: dict[tuple[int, str], float] = {}
    for size in args.sizes:
        for form, text in (("range", as_range(size)), ("written out", written_out(size))):
            spent = load_seconds(text, args.repeat)
            seconds[(size, form)] = spent
            size_bytes = len(text.encode())
            print(f"{size:>6}  {form:<12} {size_bytes:>9} {spent:>8.2f} "
                  f"{spent / size * 1000:>8.3f} {spent / (size_bytes / 1024) * 1000:>7.2f}",
                  flush=True)
    largest = max(args.sizes)
    per_host = seconds[(largest, "range")] / largest
    per_kib = seconds[(largest, "written out")] / (len(written_out(largest).encode()) / 1024)
    budget = MAX_FLEET_BYTES / 1024 * per_kib
    print(f"cap: the byte limit's file loads in {MAX_FLEET_BYTES // 1024:,} KiB x "
          f"{per_kib * 1000:.2f} ms = {budget:.1f} s, the time of {budget / per_host:,.0f} range "
          f"hosts at {per_host * 1000:.3f} ms; held to the {HOSTS_IN_BYTE_LIMIT:,} hosts it holds "
          f"written out: MAX_HOSTS = {MAX_HOSTS:,}")
    reference = REFERENCE if REFERENCE in args.sizes else args.sizes[0]
    ratio = seconds[(reference, "range")] / seconds[(reference, "written out")]
    print(f"range / written out, load CPU time at {reference} hosts: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
