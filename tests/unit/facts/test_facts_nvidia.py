"""Every GPU-stack fact parser, on output captured from real H200 machines (tests/fixtures/nvidia).

Each fact gets its command's real output, split into lines as pyinfra splits it.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
from pathlib import Path

import pytest

from facts.gpus import GpuProcesses, GpuTopology, NvidiaSmiGpus, PciGpus, strip_escapes
from facts.host import Container, CpuGovernor, FileDigests, UnitStates
from facts.nvidia import (
    OPENPGP_PY,
    CudaToolkits,
    DebPackageStates,
    FabricManager,
    HeldPackages,
    KeyringFingerprints,
    NvidiaDriverLoaded,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"
X1_UUID = "GPU-6fd24cb4-69aa-13b0-a98d-a0866c96739e"
X2_UUIDS = ["GPU-c91839b2-571c-2565-ceec-e9cd59b00357", "GPU-c39cba33-b336-2da3-0c59-8e64ffaff1c5"]


def lines(relative: str) -> list[str]:
    """A fixture's lines, as pyinfra hands command output to ``process``."""
    return (FIXTURES / relative).read_bytes().decode().split("\n")[:-1]


# --- GPUs on the PCI bus ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "slots"),
    [("h200x1-idle", ["0000:00:06.0"]), ("h200x2-idle", ["0000:00:06.0", "0000:00:07.0"])],
)
def test_lspci_finds_the_gpus(scenario: str, slots: list[str]) -> None:
    found = PciGpus().process(lines(f"{scenario}/lspci-Dnnmm.txt"))
    assert [gpu["slot"] for gpu in found["gpus"]] == slots


def test_lspci_reads_the_device_id() -> None:
    gpu = PciGpus().process(lines("h200x2-idle/lspci-Dnnmm.txt"))["gpus"][0]
    assert (gpu["class"], gpu["device_id"]) == ("0302", "2335")


def test_lspci_ignores_other_vendors() -> None:
    found = PciGpus().process(lines("h200x2-idle/lspci-Dnnmm.txt"))
    assert len(found["gpus"]) + len(found["nvswitches"]) == 2


def test_lspci_sees_no_nvswitch_on_a_pcie_pair() -> None:
    assert PciGpus().process(lines("h200x2-idle/lspci-Dnnmm.txt"))["nvswitches"] == []


def test_lspci_finds_nvswitches_on_an_hgx_board() -> None:
    found = PciGpus().process(lines("synthetic/hgx-h200x8-nvswitch.lspci-Dnnmm.txt"))
    assert (len(found["gpus"]), len(found["nvswitches"])) == (8, 4)


def test_sysfs_fallback_matches_lspci() -> None:
    """Without pciutils the fact prints sysfs IDs in lspci's shape; the parser reads both."""
    sysfs = []
    for line in lines("h200x2-idle/sys-pci.txt"):
        slot, vendor, device, cls = line.split()
        if vendor == "0x10de":
            sysfs.append(f'{slot} "[{cls[2:6]}]" "[10de]" "[{device[2:]}]"')
    from_sysfs = PciGpus().process(sysfs)["gpus"]
    from_lspci = PciGpus().process(lines("h200x2-idle/lspci-Dnnmm.txt"))["gpus"]
    assert [(g["slot"], g["device_id"]) for g in from_sysfs] == [
        (g["slot"], g["device_id"]) for g in from_lspci
    ]


def test_sysfs_fallback_command_runs_here() -> None:
    """The fallback's shell is valid and finds no NVIDIA device on this (GPU-less) machine."""
    script = PciGpus().command().replace("command -v lspci", "false")
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert PciGpus().process(result.stdout.splitlines()) == {"gpus": [], "nvswitches": []}


# --- GPUs through nvidia-smi ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "uuids"),
    [
        ("h200x1-idle", [X1_UUID]),
        ("h200x1-busy", [X1_UUID]),
        ("h200x2-idle", X2_UUIDS),
        ("h200x2-busy", X2_UUIDS),
    ],
)
def test_nvidia_smi_lists_the_gpus(scenario: str, uuids: list[str]) -> None:
    found = NvidiaSmiGpus().process(lines(f"{scenario}/query-gpu-noheader-nounits.csv"))
    assert [gpu["uuid"] for gpu in found["gpus"]] == uuids
    assert found["error"] is None


def test_nvidia_smi_reads_one_gpu_completely() -> None:
    gpu = NvidiaSmiGpus().process(lines("h200x1-idle/query-gpu-noheader-nounits.csv"))["gpus"][0]
    assert gpu == {
        "index": 0,
        "uuid": X1_UUID,
        "name": "NVIDIA H200",
        "memory_total_mib": 143771,
        "memory_used_mib": 0,
        "persistence": True,
        "driver_version": "580.159.04",
        "pci_bus_id": "00000000:00:06.0",
    }


def test_nvidia_smi_sees_memory_in_use() -> None:
    found = NvidiaSmiGpus().process(lines("h200x2-busy/query-gpu-noheader-nounits.csv"))
    assert [gpu["memory_used_mib"] for gpu in found["gpus"]] == [1551, 2575]


def test_nvidia_smi_without_a_driver_is_an_error_not_a_gpu() -> None:
    found = NvidiaSmiGpus().process(lines("synthetic/nvidia-smi-no-driver.txt"))
    assert found["gpus"] == []
    assert "couldn't communicate with the NVIDIA driver" in found["error"]


def test_nvidia_smi_query_asks_for_the_captured_columns() -> None:
    header = lines("h200x2-idle/query-gpu.csv")[0]
    names = [column.split(" [")[0] for column in header.split(", ")]
    assert ",".join(names) in NvidiaSmiGpus().command()


# --- processes holding GPU memory ---------------------------------------------------------------


def test_no_processes_when_idle() -> None:
    assert (
        GpuProcesses().process(lines("h200x2-idle/query-compute-apps-noheader-nounits.csv")) == []
    )


def test_processes_per_gpu_when_busy() -> None:
    found = GpuProcesses().process(lines("h200x2-busy/query-compute-apps-noheader-nounits.csv"))
    assert [(p["pid"], p["name"], p["used_mib"], p["gpu_uuid"]) for p in found] == [
        (694, "python3", 1542, X2_UUIDS[0]),
        (695, "python3", 2566, X2_UUIDS[1]),
    ]


def test_one_process_on_one_gpu() -> None:
    found = GpuProcesses().process(lines("h200x1-busy/query-compute-apps-noheader-nounits.csv"))
    assert [(p["pid"], p["used_mib"]) for p in found] == [(543, 1542)]


# --- topology ---------------------------------------------------------------------------------


def test_topology_output_really_has_escape_codes() -> None:
    assert "\x1b[4m" in (FIXTURES / "h200x2-idle/topo-m.txt").read_text()


@pytest.mark.parametrize("name", ["topo-m.txt", "topo-m.pty.txt"])
def test_topology_of_an_nvlink_pair(name: str) -> None:
    topo = GpuTopology().process(lines(f"h200x2-idle/{name}"))
    assert topo["devices"] == ["GPU0", "GPU1"]
    assert topo["links"] == {"GPU0": {"GPU1": "NV18"}, "GPU1": {"GPU0": "NV18"}}


def test_topology_affinities() -> None:
    topo = GpuTopology().process(lines("h200x2-idle/topo-m.txt"))
    assert topo["affinity"]["GPU1"] == {
        "CPU Affinity": "0-31",
        "NUMA Affinity": "0",
        "GPU NUMA ID": "N/A",
    }


def test_topology_of_one_gpu() -> None:
    topo = GpuTopology().process(lines("h200x1-busy/topo-m.pty.txt"))
    assert topo["devices"] == ["GPU0"]
    assert topo["links"] == {"GPU0": {}}
    assert topo["affinity"]["GPU0"]["CPU Affinity"] == "0-15"


def test_topology_of_a_pcie_server() -> None:
    """Reference deployment 2's layout (4 × RTX 4090 D: GPU0–GPU1 PIX, the rest PXB)."""
    text = (FIXTURES / "h200x2-idle/topo-m.txt").read_text()
    legend = text[text.index("\n\nLegend") :]
    matrix = (
        "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \tPIX\tPXB\tPXB\t0-31\t0\t\tN/A\n"
        "GPU1\tPIX\t X \tPXB\tPXB\t0-31\t0\t\tN/A\n"
        "GPU2\tPXB\tPXB\t X \tPIX\t0-31\t0\t\tN/A\n"
        "GPU3\tPXB\tPXB\tPIX\t X \t0-31\t0\t\tN/A"
    )
    topo = GpuTopology().process((matrix + legend).split("\n"))
    assert topo["links"]["GPU0"] == {"GPU1": "PIX", "GPU2": "PXB", "GPU3": "PXB"}


def test_strip_escapes_leaves_plain_text() -> None:
    assert (
        strip_escapes(lines("h200x2-idle/topo-m.pty.txt")[1]) == "GPU0\t X \tNV18\t0-31\t0\t\tN/A"
    )


# --- driver, packages, CUDA, fabric manager -----------------------------------------------------


def test_loaded_driver_version() -> None:
    assert NvidiaDriverLoaded().process(lines("h200x2-idle/proc-driver-nvidia-version.txt")) == {
        "version": "580.159.04",
        "open": True,
    }


def test_proprietary_module_line() -> None:
    line = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.230.02  Fri Dec 20 2024"
    assert NvidiaDriverLoaded().process([line]) == {"version": "535.230.02", "open": False}


def test_no_driver_loaded() -> None:
    assert NvidiaDriverLoaded().process([]) is None


def test_package_states_with_holds() -> None:
    states = DebPackageStates().process(lines("h200x2-idle/dpkg-query-nvidia.txt"))
    assert states["libnccl2"] == {"version": "2.28.3-1+cuda13.0", "held": True}
    assert states["cuda-nvcc-13-0"] == {"version": "13.0.88-1", "held": False}


def test_package_states_leave_out_removed_packages() -> None:
    states = DebPackageStates().process(["nvidia-driver\t535.216.03-1\tdeinstall ok config-files"])
    assert states == {}


def test_held_packages() -> None:
    assert HeldPackages().process(lines("h200x2-idle/apt-mark-showhold.txt")) == [
        "libcublas-13-0",
        "libcublas-dev-13-0",
        "libcudnn9-cuda-13",
        "libnccl-dev",
        "libnccl2",
    ]


def test_cuda_toolkit_from_nvcc() -> None:
    output = ["== /usr/local/cuda-13.0", *lines("h200x2-idle/nvcc-version.txt")]
    output.append("== default /usr/local/cuda-13.0")
    assert CudaToolkits().process(output) == {"toolkits": {"13.0": "13.0.88"}, "default": "13.0"}


def test_no_cuda_toolkit() -> None:
    assert CudaToolkits().process([]) == {"toolkits": {}, "default": None}


def test_fabric_manager_running() -> None:
    output = [
        "version: Fabric Manager version is : 535.216.03 ",
        "active: active",
        "enabled: enabled",
    ]
    assert FabricManager().process(output) == {
        "version": "535.216.03",
        "active": "active",
        "enabled": "enabled",
    }


def test_fabric_manager_absent() -> None:
    output = ["version: ", "active: inactive", "enabled: "]
    assert FabricManager().process(output) == {
        "version": None,
        "active": "inactive",
        "enabled": None,
    }


# --- host: governor, container, files, units ----------------------------------------------------


def test_governor_counts() -> None:
    assert CpuGovernor().process(["     30 performance", "      2 powersave"]) == {
        "performance": 30,
        "powersave": 2,
    }


def test_no_cpufreq_on_the_captured_vm() -> None:
    """The H200 VMs have no cpufreq (cpu0 has no cpufreq folder): the fact is empty."""
    assert "cpufreq" not in lines("h200x2-idle/cpufreq-ls.txt")
    assert CpuGovernor().process([]) == {}


@pytest.mark.parametrize(
    ("output", "expected"), [(["none"], None), (["systemd-nspawn"], "systemd-nspawn")]
)
def test_container(output: list[str], expected: str | None) -> None:
    assert Container().process(output) == expected


def test_file_digests() -> None:
    output = [f"{'a' * 64}  /etc/x.conf", "- /etc/missing.conf"]
    assert FileDigests().process(output) == {"/etc/x.conf": "a" * 64, "/etc/missing.conf": None}


def test_unit_states_of_two_units() -> None:
    output = [
        "LimitNOFILE=65536", "Id=vllm-chat.service", "LoadState=loaded", "ActiveState=active",
        "SubState=running", "UnitFileState=enabled", "",
        "LimitNOFILE=524288", "Id=nope.service", "LoadState=not-found", "ActiveState=inactive",
        "SubState=dead", "UnitFileState=",
    ]  # fmt: skip
    states = UnitStates().process(output)
    assert states["vllm-chat.service"]["ActiveState"] == "active"
    assert states["vllm-chat.service"]["LimitNOFILE"] == "65536"
    assert states["nope.service"]["LoadState"] == "not-found"


# --- keyring fingerprints (no gpg on the host) ----------------------------------------------------


@pytest.fixture(scope="module")
def throwaway_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes, bytes]:
    """A throwaway ed25519 key: (fingerprint, binary export, armoured export)."""
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    gpg = ["gpg", "--batch", "--homedir", str(home), "--passphrase", ""]
    subprocess.run(
        [*gpg, "--quick-gen-key", "fleet test key <test@invalid>", "ed25519", "sign", "never"],
        check=True, capture_output=True,
    )  # fmt: skip
    listing = subprocess.run(
        [*gpg, "--with-colons", "--list-keys"], check=True, capture_output=True, text=True
    ).stdout
    fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line[:4] == "fpr:")
    binary = subprocess.run([*gpg, "--export"], check=True, capture_output=True).stdout
    armoured = subprocess.run([*gpg, "--export", "--armor"], check=True, capture_output=True).stdout
    return fingerprint, binary, armoured


@pytest.mark.parametrize("form", ["binary", "armoured"])
def test_keyring_fingerprint_matches_gpg(throwaway_key, form: str, tmp_path: Path) -> None:
    fingerprint, binary, armoured = throwaway_key
    path = tmp_path / "key.gpg"
    path.write_bytes(binary if form == "binary" else armoured)
    command = KeyringFingerprints().command(path=str(path)).get_raw_value()
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    assert KeyringFingerprints().process(out.splitlines()) == [fingerprint]


def test_keyring_missing_is_none(tmp_path: Path) -> None:
    command = KeyringFingerprints().command(path=str(tmp_path / "nope")).get_raw_value()
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    assert KeyringFingerprints().process(out.splitlines()) is None


def test_keyring_garbage_has_no_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "bad.gpg"
    path.write_bytes(base64.b64encode(hashlib.sha256(b"x").digest()))
    out = subprocess.run(
        ["python3", "-c", OPENPGP_PY, "show", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert KeyringFingerprints().process(out.splitlines()) == []
