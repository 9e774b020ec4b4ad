"""What each GPU's memory holds now: ``nvidia-smi -q -x`` (total, reserved, used, free, and the
processes using it), for ``fleet plan --from-host``.

The XML report is the one nvidia-smi output that carries the driver's reserve
(``fb_memory_usage/reserved``: 616 MiB on an H200 with driver 580) beside total, used and free
and each process's memory, in one snapshot. GPUs come in nvidia-smi's index order (the order
``CUDA_VISIBLE_DEVICES`` numbers them by, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``). Tested on the
real captures in ``tests/fixtures/nvidia/*/nvidia-smi-q.xml``.

Example:
    >>> xml = open("tests/fixtures/nvidia/h200x1-busy/nvidia-smi-q.xml").read().splitlines()
    >>> gpu = GpuMemory().process(xml)["gpus"][0]
    >>> gpu["total_mib"], gpu["reserved_mib"], gpu["used_mib"], gpu["free_mib"]
    (143771, 616, 1551, 141606)
    >>> gpu["processes"]
    [{'pid': 543, 'name': 'python3', 'used_mib': 1542}]
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from typing import Any

from pyinfra.api import FactBase

_MIB = re.compile(r"([0-9]+) MiB")


def _mib(node: ElementTree.Element | None, path: str) -> int | None:
    """``"616 MiB"`` at ``path`` below ``node`` → 616 (None if absent or "N/A")."""
    text = node.findtext(path) if node is not None else None
    match = _MIB.fullmatch((text or "").strip())
    return int(match[1]) if match else None


class GpuMemory(FactBase):
    """Memory per GPU and the processes holding it, from ``nvidia-smi -q -x``; ``error`` when
    nvidia-smi fails or prints no report.

    .. code:: python

        {"gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-6fd2…",
                   "pci_bus_id": "00000000:00:06.0", "total_mib": 143771,
                   "reserved_mib": 616, "used_mib": 1551, "free_mib": 141606,
                   "processes": [{"pid": 543, "name": "python3", "used_mib": 1542}]}],
         "error": None}
    """

    requires_command = "nvidia-smi"

    def command(self) -> str:
        return "nvidia-smi -q -x 2>&1 || true"

    def process(self, output: list[str]) -> dict[str, Any]:
        text = "\n".join(output)
        start = text.find("<nvidia_smi_log")
        if start < 0:
            return {"gpus": [], "error": " ".join(text.split()) or "no output"}
        # The DOCTYPE names a DTD that is not there: parse from the root element on.
        try:
            root = ElementTree.fromstring(text[start:])
        except ElementTree.ParseError as err:
            return {"gpus": [], "error": f"nvidia-smi -q -x: unreadable XML ({err})"}
        gpus = []
        for index, gpu in enumerate(root.findall("gpu")):
            memory = gpu.find("fb_memory_usage")
            processes = []
            for info in gpu.findall("processes/process_info"):
                pid = (info.findtext("pid") or "").strip()
                processes.append({
                    "pid": int(pid) if pid.isdigit() else None,
                    "name": (info.findtext("process_name") or "").strip(),
                    "used_mib": _mib(info, "used_memory"),
                })
            gpus.append({
                "index": index,
                "name": (gpu.findtext("product_name") or "").strip(),
                "uuid": (gpu.findtext("uuid") or "").strip(),
                "pci_bus_id": gpu.get("id", ""),
                "total_mib": _mib(memory, "total"),
                "reserved_mib": _mib(memory, "reserved"),
                "used_mib": _mib(memory, "used"),
                "free_mib": _mib(memory, "free"),
                "processes": processes,
            })
        return {"gpus": gpus, "error": None}

    @staticmethod
    def default() -> dict[str, Any]:
        return {"gpus": [], "error": "nvidia-smi is not installed"}
