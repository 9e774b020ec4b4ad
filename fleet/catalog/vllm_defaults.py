"""vLLM's defaults per release, as ``scripts/gen_vllm_defaults.py`` read them from each release's
own source (``fleet/catalog/vllm_defaults.json``): gpu-memory-utilization, the engine (V0/V1), V0's
max-num-seqs, the API server's max-num-batched-tokens and max-num-seqs by GPU class, what chunked
prefill defaults to, and how CUDA graph capture sizes are chosen.

A release between two listed ones takes the older one's defaults (defaults change at releases
that are listed); one older than every listed release gets None: not modelled.

Example:
    >>> release_defaults("0.32.0").gpu_memory_utilization
    0.92
    >>> d = release_defaults("0.6.5")
    >>> d.release, d.engine, d.max_num_seqs
    ('0.6.4.post1', 'V0', 256)
    >>> release_defaults("0.5.0") is None
    True
    >>> release_defaults("0.33.0").batch_for(139.8, "NVIDIA H200")
    (8192, 1024)
    >>> release_defaults("0.20.0").batch_for(178.4, "NVIDIA B200")
    (8192, 1024)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fleet.catalog.releases import release

DEFAULTS_FILE = Path(__file__).with_name("vllm_defaults.json")


@dataclass(frozen=True)
class BatchClass:
    """The API server's batch defaults for GPUs with at least ``min_memory_gib`` of CUDA total
    memory whose name contains none of ``not_named`` (vLLM's ``get_batch_defaults``)."""

    min_memory_gib: int
    not_named: tuple[str, ...]
    max_num_batched_tokens: int | None
    max_num_seqs: int | None


@dataclass(frozen=True)
class ReleaseDefaults:
    """The defaults of one listed release, and where the generator read them."""

    release: str
    gpu_memory_utilization: float
    engine: str
    max_num_seqs: int | None
    source: str
    #: Most memory first; the last one is every other GPU. Empty where not read.
    batch_classes: tuple[BatchClass, ...] = ()
    #: What enable-chunked-prefill becomes when not given (vLLM's expressions, as written).
    chunked_prefill: tuple[str, ...] = ()
    #: How the default CUDA graph capture sizes are chosen: {"from", "max_size", "sizes"}.
    cuda_graphs: dict | None = None
    #: The wheel it was read from.
    wheel: str | None = None

    def batch_for(self, cuda_total_gib: float, gpu_name: str) -> tuple[int, int] | None:
        """(max-num-batched-tokens, max-num-seqs) this release's API server takes on a GPU, or
        None where the release's classes were not read."""
        name = gpu_name.lower()
        for batch in self.batch_classes:
            if cuda_total_gib >= batch.min_memory_gib and not any(
                word in name for word in batch.not_named
            ):
                if batch.max_num_batched_tokens is None or batch.max_num_seqs is None:
                    return None
                return batch.max_num_batched_tokens, batch.max_num_seqs
        return None

    @property
    def v0(self) -> bool:
        """Whether the release runs the V0 engine by default."""
        return self.engine == "V0"


@cache
def _table() -> list[tuple[tuple[int, ...], ReleaseDefaults]]:
    data = json.loads(DEFAULTS_FILE.read_text())
    rows = []
    for name, entry in data["releases"].items():
        rows.append((release(name), ReleaseDefaults(
            release=name,
            gpu_memory_utilization=entry["gpu_memory_utilization"],
            engine=entry["engine"],
            max_num_seqs=entry.get("max_num_seqs"),
            source=f"vLLM {name} {entry['gpu_memory_utilization_from']}",
            batch_classes=tuple(
                BatchClass(c["min_memory_gib"], tuple(c.get("not_named", ())),
                           c.get("max_num_batched_tokens"), c.get("max_num_seqs"))
                for c in entry.get("batch_classes", ())
            ),
            chunked_prefill=tuple(entry.get("chunked_prefill", ())),
            cuda_graphs=entry.get("cuda_graphs"),
            wheel=entry.get("wheel"),
        )))
    return sorted(rows, key=lambda row: row[0])


@cache
def release_defaults(version: str) -> ReleaseDefaults | None:
    """The defaults that apply to ``version``: the newest listed release not newer than it."""
    wanted = release(version)
    found = None
    for key, defaults in _table():
        if key[:3] <= wanted[:3] or key <= wanted:
            found = defaults
    return found


def listed_releases() -> list[str]:
    """Every release the table was generated from, oldest first."""
    return [defaults.release for _, defaults in _table()]
