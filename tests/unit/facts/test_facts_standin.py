"""The stand-in nvidia-smi prints, byte for byte, what real H200 machines printed.

Given the captured machine's hardware (2 × H200, their UUIDs and bus IDs), its driver and its
GPU processes, the stand-in's output must equal the captures in tests/fixtures/nvidia; the
GPU-stack end-to-end tests then parse the stand-in with the very facts tested on the captures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from facts.gpus import GpuTopology, NvidiaSmiGpus

HERE = Path(__file__).resolve().parents[2]
FIXTURES = HERE / "fixtures" / "nvidia"
STANDIN = HERE / "support" / "standin_nvidia" / "files" / "nvidia-smi"
QUERY = "index,uuid,name,memory.total,memory.used,persistence_mode,driver_version,pci.bus_id"
APPS_QUERY = "pid,process_name,used_memory,gpu_uuid,gpu_bus_id"


def machine(root: Path, busy: bool) -> Path:
    """The captured 2 × H200 machine, as the stand-in's hardware and state files."""
    hardware = {
        "name": "NVIDIA H200",
        "memory_mib": 143771,
        "cpus": "0-31",
        "nvlinks": 18,
        "slots": ["0000:00:06.0", "0000:00:07.0"],
        "uuids": {
            "0000:00:06.0": "GPU-c91839b2-571c-2565-ceec-e9cd59b00357",
            "0000:00:07.0": "GPU-c39cba33-b336-2da3-0c59-8e64ffaff1c5",
        },
    }
    (root / "etc/nvidia-standin").mkdir(parents=True)
    (root / "etc/nvidia-standin/gpus.json").write_text(json.dumps(hardware))
    (root / "run/nvidia-persistenced").mkdir(parents=True)
    (root / "run/nvidia-persistenced/persistence-mode").write_text("Enabled\n")
    if busy:
        (root / "run/nvidia-standin").mkdir(parents=True)
        apps = [
            {"pid": 694, "process_name": "python3", "used_memory": 1542,
             "gpu_uuid": hardware["uuids"]["0000:00:06.0"]},
            {"pid": 695, "process_name": "python3", "used_memory": 2566,
             "gpu_uuid": hardware["uuids"]["0000:00:07.0"]},
        ]  # fmt: skip
        (root / "run/nvidia-standin/compute-apps.json").write_text(json.dumps(apps))
    return root


def standin(root: Path, *args: str, driver: str = "580.159.04", cuda: str = "13.0") -> str:
    script = STANDIN.read_text().replace("@DRIVER@", driver).replace("@CUDA@", cuda)
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=dict(os.environ, NVIDIA_STANDIN_ROOT=str(root)),
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return result.stdout


@pytest.mark.parametrize(
    ("args", "fixture"),
    [
        (["-L"], "nvidia-smi-L.txt"),
        (["--version"], "nvidia-smi-version.txt"),
        ([f"--query-gpu={QUERY}", "--format=csv"], "query-gpu.csv"),
        ([f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
         "query-gpu-noheader-nounits.csv"),
        (["--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv"],
         "query-compute-apps.csv"),
        ([f"--query-compute-apps={APPS_QUERY}", "--format=csv,noheader,nounits"],
         "query-compute-apps-noheader-nounits.csv"),
        (["topo", "-m"], "topo-m.txt"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("state", ["idle", "busy"])
def test_standin_prints_the_captured_bytes(tmp_path: Path, args, fixture, state) -> None:
    root = machine(tmp_path, busy=state == "busy")
    assert standin(root, *args) == (FIXTURES / f"h200x2-{state}" / fixture).read_text()


def test_standin_without_hardware_fails_like_a_missing_driver(tmp_path: Path) -> None:
    out = standin(tmp_path, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits")
    assert NvidiaSmiGpus().process(out.splitlines())["error"].startswith("NVIDIA-SMI has failed")


def test_facts_parse_the_standin(tmp_path: Path) -> None:
    root = machine(tmp_path, busy=False)
    gpus = NvidiaSmiGpus().process(standin(root, *NvidiaSmiGpus().command().split()[1:3])
                                   .splitlines())  # fmt: skip
    topo = GpuTopology().process(standin(root, "topo", "-m").splitlines())
    assert [g["driver_version"] for g in gpus["gpus"]] == ["580.159.04", "580.159.04"]
    assert topo["links"]["GPU0"] == {"GPU1": "NV18"}
