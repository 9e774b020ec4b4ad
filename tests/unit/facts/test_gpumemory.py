"""GpuMemory (``nvidia-smi -q -x``) on the real H200 captures, cross-checked against the same
machines' ``--query-gpu`` and ``--query-compute-apps`` output (two nvidia-smi formats, one
truth)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from cli.planplace import states_of
from facts.gpumemory import GpuMemory

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"
CAPTURES = ["h200x1-idle", "h200x1-busy", "h200x2-idle", "h200x2-busy"]


def _memory(capture: str) -> dict:
    return GpuMemory().process((FIXTURES / capture / "nvidia-smi-q.xml").read_text().splitlines())


@pytest.mark.parametrize("capture", CAPTURES)
def test_memory_matches_query_gpu(capture: str) -> None:
    rows = list(csv.reader((FIXTURES / capture / "query-gpu-extra.csv").open(),
                           skipinitialspace=True))
    gpus = _memory(capture)["gpus"]
    assert [(g["index"], g["uuid"], g["total_mib"], g["used_mib"], g["free_mib"]) for g in gpus] \
        == [(int(r[0]), r[1], int(r[3]), int(r[4]), int(r[5])) for r in rows]
    assert {g["reserved_mib"] for g in gpus} == {616}


@pytest.mark.parametrize("capture", CAPTURES)
def test_processes_match_query_compute_apps(capture: str) -> None:
    rows = list(csv.reader((FIXTURES / capture / "query-compute-apps-noheader-nounits.csv")
                           .open(), skipinitialspace=True))
    gpus = {g["uuid"]: g for g in _memory(capture)["gpus"]}
    found = [(p["pid"], p["name"], p["used_mib"], uuid)
             for uuid, g in gpus.items() for p in g["processes"]]
    assert sorted(found) == sorted((int(r[0]), r[1], int(r[2]), r[3]) for r in rows)


def test_cuda_total_is_total_less_reserved() -> None:
    """143771 − 616 MiB = 139.80 GiB: what CUDA reported on this H200 (gpu_memory_probe)."""
    (state,) = states_of(_memory("h200x1-busy"))
    assert state.cuda_total_mib == 143155
    assert round(state.cuda_total_mib / 1024, 2) == 139.80


@pytest.mark.parametrize("output", [
    ["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."],
    [],
])
def test_failure_is_an_error_not_gpus(output: list[str]) -> None:
    found = GpuMemory().process(output)
    assert found["gpus"] == [] and found["error"]
    with pytest.raises(ValueError, match="nvidia-smi"):
        states_of(found)


def test_broken_xml_is_an_error() -> None:
    found = GpuMemory().process(["<nvidia_smi_log><gpu id='x'>"])
    assert found["gpus"] == [] and "unreadable XML" in found["error"]
