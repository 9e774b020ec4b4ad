"""vLLM's defaults per release, as ``scripts/gen_vllm_defaults.py`` read them from each release's
own source (``fleet/vllm_defaults.json``): gpu-memory-utilization, the engine (V0/V1) and V0's
max-num-seqs.

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
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fleet.releases import release

DEFAULTS_FILE = Path(__file__).with_name("vllm_defaults.json")


@dataclass(frozen=True)
class ReleaseDefaults:
    """The defaults of one listed release, and where the generator read them."""

    release: str
    gpu_memory_utilization: float
    engine: str
    max_num_seqs: int | None
    source: str

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
        )))
    return sorted(rows, key=lambda row: row[0])


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
