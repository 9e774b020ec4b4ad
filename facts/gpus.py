"""Facts about a host's NVIDIA GPUs: on the PCI bus (before any driver), and through nvidia-smi.

Every parser here is tested on output captured from real H200 machines
(``tests/fixtures/nvidia/``). Detection goes by ``lspci`` (or sysfs where pciutils is missing),
never by ``nvidia-smi``, which needs the very driver that the deploy installs.

Example:
    >>> line = ('0000:00:06.0 "3D controller [0302]" "NVIDIA Corporation [10de]" '
    ...         '"Device [2335]" -ra1 -p00 "NVIDIA Corporation [10de]" "Device [18bf]"')
    >>> PciGpus().process([line])["gpus"][0]["device_id"]
    '2335'
"""

from __future__ import annotations

import csv
import re
import shlex
from typing import Any

from pyinfra.api import FactBase

#: PCI class codes: VGA and 3D controllers are GPUs; an NVIDIA "other bridge" is an NVSwitch.
GPU_CLASSES = {"0300", "0302"}
NVSWITCH_CLASS = "0680"
NVIDIA_VENDOR = "10de"

_BRACKET_ID = re.compile(r"\[([0-9a-fA-F]{4})\]\s*$")
#: Terminal escape sequences (nvidia-smi underlines the header of ``topo -m``) and carriage
#: returns (a pseudo-terminal turns "\n" into "\r\n").
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")

_LSPCI_OR_SYSFS = (
    "if command -v lspci >/dev/null 2>&1; then lspci -Dnnmm -d 10de:; "
    "else for d in /sys/bus/pci/devices/*; do "
    '[ "$(cat "$d/vendor")" = 0x10de ] || continue; '
    'echo "${d##*/} \\"[$(cut -c3-6 "$d/class")]\\" \\"[10de]\\" '
    '\\"[$(cut -c3-6 "$d/device")]\\""; done; fi'
)


def strip_escapes(text: str) -> str:
    """Remove terminal escape sequences and carriage returns.

    Example:
        >>> strip_escapes("\\t\\x1b[4mGPU0\\tCPU Affinity\\x1b[0m\\r")
        '\\tGPU0\\tCPU Affinity'
    """
    return _ESCAPES.sub("", text)


def _pci_id(field: str) -> str:
    match = _BRACKET_ID.search(field)
    return match.group(1).lower() if match else ""


def _pci_name(field: str) -> str:
    return _BRACKET_ID.sub("", field).strip()


class PciGpus(FactBase):
    """NVIDIA GPUs and NVSwitches on the PCI bus, from ``lspci -Dnnmm`` (sysfs without pciutils).

    Works before any NVIDIA driver is installed.

    .. code:: python

        {"gpus": [{"slot": "0000:00:06.0", "class": "0302", "device_id": "2335",
                   "name": "GH100 [H200 SXM 141GB]"}],
         "nvswitches": [{"slot": "0000:05:00.0", "class": "0680", "device_id": "22a3",
                         "name": "Device"}]}
    """

    def command(self) -> str:
        return _LSPCI_OR_SYSFS

    def process(self, output: list[str]) -> dict[str, list[dict[str, str]]]:
        result: dict[str, list[dict[str, str]]] = {"gpus": [], "nvswitches": []}
        for line in output:
            try:
                words = shlex.split(line)
            except ValueError:
                continue
            if len(words) < 4 or _pci_id(words[2]) != NVIDIA_VENDOR:
                continue
            device = {
                "slot": words[0],
                "class": _pci_id(words[1]),
                "device_id": _pci_id(words[3]),
                "name": _pci_name(words[3]) or "Device",
            }
            if device["class"] in GPU_CLASSES:
                result["gpus"].append(device)
            elif device["class"] == NVSWITCH_CLASS:
                result["nvswitches"].append(device)
        return result

    @staticmethod
    def default() -> dict[str, list[dict[str, str]]]:
        return {"gpus": [], "nvswitches": []}


#: The fields :class:`NvidiaSmiGpus` asks for, in order.
GPU_QUERY = (
    "index,uuid,name,memory.total,memory.used,persistence_mode,driver_version,pci.bus_id"
)


def _rows(output: list[str], width: int) -> tuple[list[list[str]], list[str]]:
    """CSV rows of exactly ``width`` fields, and the lines that are not such rows."""
    rows, other = [], []
    for line in output:
        if not line.strip():
            continue
        fields = next(csv.reader([line], skipinitialspace=True))
        if len(fields) == width:
            rows.append([field.strip() for field in fields])
        else:
            other.append(line.strip())
    return rows, other


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


class NvidiaSmiGpus(FactBase):
    """The GPUs the loaded driver sees (``nvidia-smi --query-gpu``); ``error`` when it fails.

    .. code:: python

        {"gpus": [{"index": 0, "uuid": "GPU-c918…", "name": "NVIDIA H200",
                   "memory_total_mib": 143771, "memory_used_mib": 0, "persistence": True,
                   "driver_version": "580.159.04", "pci_bus_id": "00000000:00:06.0"}],
         "error": None}
    """

    requires_command = "nvidia-smi"

    def command(self) -> str:
        return f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits 2>&1 || true"

    def process(self, output: list[str]) -> dict[str, Any]:
        rows, other = _rows(output, 8)
        gpus = [
            {
                "index": int(index),
                "uuid": uuid,
                "name": name,
                "memory_total_mib": _int(total),
                "memory_used_mib": _int(used),
                "persistence": persistence == "Enabled",
                "driver_version": driver,
                "pci_bus_id": bus_id,
            }
            for index, uuid, name, total, used, persistence, driver, bus_id in rows
        ]
        return {"gpus": gpus, "error": " ".join(other) or None}

    @staticmethod
    def default() -> dict[str, Any]:
        return {"gpus": [], "error": "nvidia-smi is not installed"}


class GpuProcesses(FactBase):
    """Processes holding GPU memory (``nvidia-smi --query-compute-apps``).

    .. code:: python

        [{"pid": 694, "name": "python3", "used_mib": 1542,
          "gpu_uuid": "GPU-c918…", "pci_bus_id": "00000000:00:06.0"}]
    """

    requires_command = "nvidia-smi"
    default = list

    def command(self) -> str:
        return (
            "nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id "
            "--format=csv,noheader,nounits"
        )

    def process(self, output: list[str]) -> list[dict[str, Any]]:
        rows, _ = _rows(output, 5)
        return [
            {
                "pid": int(pid),
                "name": name,
                "used_mib": _int(used),
                "gpu_uuid": uuid,
                "pci_bus_id": bus_id,
            }
            for pid, name, used, uuid, bus_id in rows
        ]


class GpuTopology(FactBase):
    """The matrix of ``nvidia-smi topo -m``: how each pair of devices is linked, and affinities.

    Terminal escape codes (nvidia-smi underlines the header even into a pipe) are stripped.

    .. code:: python

        {"devices": ["GPU0", "GPU1"],
         "links": {"GPU0": {"GPU1": "NV18"}, "GPU1": {"GPU0": "NV18"}},
         "affinity": {"GPU0": {"CPU Affinity": "0-31", "NUMA Affinity": "0",
                               "GPU NUMA ID": "N/A"}, …}}
    """

    requires_command = "nvidia-smi"

    def command(self) -> str:
        return "nvidia-smi topo -m"

    def process(self, output: list[str]) -> dict[str, Any]:
        lines = [strip_escapes(line) for line in output]
        header_at = next(
            (i for i, line in enumerate(lines) if re.match(r"^\s*\t?(GPU|NIC)\d+\t", line)), None
        )
        result: dict[str, Any] = {"devices": [], "links": {}, "affinity": {}}
        if header_at is None:
            return result
        columns = [c.strip() for c in lines[header_at].split("\t")]
        devices = [c for c in columns if re.fullmatch(r"(GPU|NIC)[0-9]+", c)]
        extra = [c for c in columns if c and c not in devices]
        result["devices"] = devices
        for line in lines[header_at + 1 :]:
            if not line.strip():
                break
            fields = line.split("\t")
            name, values = fields[0].strip(), [f.strip() for f in fields[1:]]
            if name not in devices:
                continue
            links = values[: len(devices)]
            result["links"][name] = {
                other: link for other, link in zip(devices, links, strict=False) if other != name
            }
            rest = [v for v in values[len(devices) :] if v]
            result["affinity"][name] = dict(zip(extra, rest, strict=False))
        return result

    @staticmethod
    def default() -> dict[str, Any]:
        return {"devices": [], "links": {}, "affinity": {}}
