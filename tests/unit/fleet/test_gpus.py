"""The one GPU table (fleet/catalog/gpus.py): every GPU fact the planner uses, CUDA's total
included,
is a field of its model's record and agrees with the captures it cites."""

from __future__ import annotations

from pathlib import Path

import pytest

from facts.gpumemory import GpuMemory
from fleet.catalog.gpus import GPU_MODELS, lookup
from fleet.planner import memory

CAPTURE = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia" / "h200x1-idle"


@pytest.mark.parametrize("model", GPU_MODELS, ids=lambda model: model.name)
def test_each_model_is_found_by_its_name_and_aliases(model) -> None:
    assert all(lookup(name) is model for name in (model.name, *model.aliases))


@pytest.mark.parametrize(
    "model", [m for m in GPU_MODELS if m.cuda_total_gib or m.reserved_mib], ids=lambda m: m.name
)
def test_cudas_total_is_below_nvidia_smis_and_says_where_it_is_from(model) -> None:
    total, source = memory.cuda_total_bytes(model.memory_gib, model.name)
    assert 0.9 * model.memory_mib * 2**20 < total < model.memory_mib * 2**20
    assert source.endswith(model.cuda_source) and model.cuda_source


def test_the_h200s_reserve_is_the_captured_one() -> None:
    lines = (CAPTURE / "nvidia-smi-q.xml").read_text().splitlines()
    (gpu,) = GpuMemory().process(lines)["gpus"]
    h200 = lookup(gpu["name"])
    assert h200 is not None and h200.name == "H200"
    assert (gpu["total_mib"], gpu["reserved_mib"]) == (h200.memory_mib, h200.reserved_mib)
