"""Facts about the NVIDIA software stack: loaded driver, packages and holds, CUDA toolkits,
fabric manager, apt keyrings.

Example:
    >>> NvidiaDriverLoaded().process([
    ...     "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build"])
    {'version': '580.159.04', 'open': True}
"""

from __future__ import annotations

import re
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from hostside import program_source

_VERSION = re.compile(r"\b(\d{3}\.\d{1,3}(?:\.\d{1,3})?)\b")


class NvidiaDriverLoaded(FactBase):
    """The NVIDIA kernel module that is loaded now (``/proc/driver/nvidia/version``); None if none.

    After a driver upgrade and before the reboot, this is still the old version.

    .. code:: python

        {"version": "580.159.04", "open": True}
    """

    def command(self) -> str:
        return "cat /proc/driver/nvidia/version 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, Any] | None:
        for line in output:
            if line.startswith("NVRM version:"):
                match = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)", line)
                if match:
                    return {"version": match.group(1), "open": "Open Kernel Module" in line}
        return None


class DebPackageStates(FactBase):
    """Installed version and dpkg selection (install/hold) of the given packages.

    Packages that are not installed are left out.

    .. code:: python

        {"nvidia-driver": {"version": "535.216.03-1", "held": True},
         "libnccl2": {"version": "2.28.3-1+cuda13.0", "held": True}}
    """

    requires_command = "dpkg-query"
    default = dict

    def command(self, packages: list[str]) -> StringCommand:
        return StringCommand(
            "dpkg-query", "-W", "-f", QuoteString("${Package}\\t${Version}\\t${Status}\\n"),
            *[QuoteString(p) for p in packages], "2>/dev/null", "||", "true",
        )  # fmt: skip

    def process(self, output: list[str]) -> dict[str, dict[str, Any]]:
        result = {}
        for line in output:
            parts = line.split("\t")
            if len(parts) != 3:
                continue
            name, version, status = parts
            words = status.split()
            if len(words) == 3 and words[2] in ("installed", "half-configured", "unpacked"):
                result[name] = {"version": version, "held": words[0] == "hold"}
        return result


class HeldPackages(FactBase):
    """Packages held back from upgrades (``apt-mark showhold``), sorted.

    .. code:: python

        ["libnccl2", "nvidia-driver", "nvidia-fabricmanager-535"]
    """

    requires_command = "apt-mark"
    default = list

    def command(self) -> str:
        return "apt-mark showhold"

    def process(self, output: list[str]) -> list[str]:
        return sorted({line.strip() for line in output if line.strip()})


class CudaToolkits(FactBase):
    """CUDA toolkits under /usr/local, by ``nvcc --version``, and where /usr/local/cuda points.

    .. code:: python

        {"toolkits": {"13.0": "13.0.88"}, "default": "13.0"}
    """

    def command(self) -> str:
        return (
            "for d in /usr/local/cuda-*; do "
            '[ -x "$d/bin/nvcc" ] && [ ! -L "$d" ] && { echo "== $d"; "$d/bin/nvcc" --version; }; '
            "done; "
            'if [ -e /usr/local/cuda ]; then echo "== default $(readlink -f /usr/local/cuda)"; fi; '
            "true"
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        toolkits: dict[str, str] = {}
        default = None
        for line in output:
            match = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", line)
            if match:
                toolkits[match.group(1)] = match.group(2)
            match = re.fullmatch(r"== default /usr/local/cuda-([0-9]+\.[0-9]+)", line.strip())
            if match:
                default = match.group(1)
        return {"toolkits": toolkits, "default": default}


class FabricManager(FactBase):
    """The fabric manager's own version (``nv-fabricmanager --version``) and its unit's state.

    .. code:: python

        {"version": "535.216.03", "active": "active", "enabled": "enabled"}
    """

    def command(self) -> str:
        return (
            'echo "version: $(nv-fabricmanager --version 2>/dev/null | tr "\\n" " ")"; '
            'echo "active: $(systemctl is-active nvidia-fabricmanager.service 2>/dev/null)"; '
            'echo "enabled: $(systemctl is-enabled nvidia-fabricmanager.service 2>/dev/null)"'
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        result: dict[str, Any] = {"version": None, "active": None, "enabled": None}
        for line in output:
            key, _, value = line.partition(":")
            value = value.strip()
            if key == "version":
                match = _VERSION.search(value)
                result["version"] = match.group(1) if match else None
            elif key in ("active", "enabled"):
                result[key] = value or None
        return result


#: The host-side key program (hostside/openpgp.py) as text: the KeyringFingerprints fact runs it
#: with ``python3 -c`` before anything is uploaded (``show PATH``; ``install URL PATH FPR``).
OPENPGP_PY = program_source("openpgp")


class KeyringFingerprints(FactBase):
    """Fingerprints of the primary keys in an apt keyring file; None when the file is missing.

    .. code:: python

        ["EB693B3035CD5710E231E123A4B469963BF863CC"]
    """

    def command(self, path: str) -> StringCommand:
        return StringCommand(
            "test -f", QuoteString(path), "&&", "python3", "-c", QuoteString(OPENPGP_PY),
            "show", QuoteString(path), "||", "true",
        )  # fmt: skip

    def process(self, output: list[str]) -> list[str] | None:
        text = " ".join(output).strip()
        if not text:
            return None
        if text.startswith("error:"):
            return []
        return text.split()
