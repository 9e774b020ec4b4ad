"""GpuMemory (``nvidia-smi -q -x``) on the real H200 captures, cross-checked against the same
machines' ``--query-gpu`` and ``--query-compute-apps`` output (two nvidia-smi formats, one
truth)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.planplace import read_targets, states_of
from facts.gpumemory import GpuMemory
from tests.unit.facts.test_facts_standin import machine

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


# --- the stand-in nvidia-smi, read through pyinfra on this machine (@local) -------------------

STANDIN = Path(__file__).resolve().parents[2] / "support" / "standin_nvidia" / "files" / \
    "nvidia-smi"


def _standin_machine(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The captured busy 2 × H200 machine as stand-in state, and a PATH whose nvidia-smi is the
    stand-in (driver 580.159.04)."""
    root = machine(tmp_path / "root", busy=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = STANDIN.read_text().replace("@DRIVER@", "580.159.04").replace("@CUDA@", "13.0")
    script = script.replace("#!/usr/bin/python3", f"#!{sys.executable}", 1)
    (bin_dir / "nvidia-smi").write_text(script)
    (bin_dir / "nvidia-smi").chmod(0o755)
    return root, {"PATH": f"{bin_dir}:{os.environ['PATH']}", "NVIDIA_STANDIN_ROOT": str(root)}


def test_standin_report_reads_as_the_capture(tmp_path: Path) -> None:
    """The stand-in's ``-q -x`` gives the facts what the real busy 2 × H200 report gave (free
    within the 2 MiB that nvidia-smi's own rounding leaves)."""
    _, env = _standin_machine(tmp_path)
    output = subprocess.run(["nvidia-smi", "-q", "-x"], env=dict(os.environ, **env),
                            capture_output=True, text=True, check=True).stdout
    ours = GpuMemory().process(output.splitlines())["gpus"]
    real = _memory("h200x2-busy")["gpus"]
    for mine, theirs in zip(ours, real, strict=True):
        assert abs(mine.pop("free_mib") - theirs.pop("free_mib")) <= 2
        assert mine == theirs


def test_from_host_reads_gpus_through_pyinfra(tmp_path: Path, monkeypatch) -> None:
    """read_targets connects (pyinfra's @local connector), runs the facts' commands and plans:
    the stand-in's busy GPUs, their processes, and its NV18 links."""
    _, env = _standin_machine(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    states, links, errors = read_targets([("@local", {})])
    assert errors == []
    assert [(s.index, s.used_mib, s.reserved_mib, [p.pid for p in s.processes])
            for s in states["@local"]] == [(0, 1551, 616, [694]), (1, 2575, 616, [695])]
    assert links == {"@local": {(0, 1): "NV18"}}
