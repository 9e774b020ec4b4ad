"""Give a sandbox host STAND-IN NVIDIA hardware: what lspci lists and what nvidia-smi reports.

A real GPU host shows its GPUs on the PCI bus before any driver exists; a sandbox host has no
such devices, so this writes ``/etc/nvidia-standin/gpus.json`` (read by the stand-in lspci and,
once the stand-in driver is installed, by its nvidia-smi) and installs the stand-in ``lspci``
(pciutils is not in the sandbox image). Nothing else: the deploy installs the rest.

Example:
    from tests.support.standin_nvidia.hardware import hgx_h200, install
    install(lambda cmd, stdin: on_host(cmd, stdin), hgx_h200(gpus=8))
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

LSPCI = Path(__file__).resolve().parent / "files" / "lspci"
HGX_GPU_BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]


def hgx_h200(gpus: int = 8, nvswitches: int = 4) -> dict[str, Any]:
    """An HGX H200 board: ``gpus`` H200s linked by 18 NVLinks each, through ``nvswitches``.

    Example:
        >>> board = hgx_h200(gpus=2)
        >>> board["slots"], len(board["nvswitches"])
        (['0000:18:00.0', '0000:2a:00.0'], 4)
    """
    return {
        "name": "NVIDIA H200",
        "memory_mib": 143771,
        "device_id": "2335",
        "nvlinks": 18,
        "cpus": "0-1",
        "slots": [f"0000:{bus}:00.0" for bus in HGX_GPU_BUSES[:gpus]],
        "nvswitches": [f"0000:0{5 + i}:00.0" for i in range(nvswitches)],
    }


def install(run: Callable[[str, str], Any], hardware: dict[str, Any]) -> None:
    """Write the hardware description and the stand-in lspci through ``run(command, stdin)``."""
    run("mkdir -p /etc/nvidia-standin && cat > /etc/nvidia-standin/gpus.json",
        json.dumps(hardware, indent=2))  # fmt: skip
    run("cat > /usr/local/bin/lspci && chmod 755 /usr/local/bin/lspci", LSPCI.read_text())
