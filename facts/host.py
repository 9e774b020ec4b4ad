"""Facts about the host under the GPUs: CPU governor, virtualization, files and units.

Kernel parameters come from pyinfra's own ``Sysctl`` fact, and whether they can be changed
from :class:`facts.sysctl.SysctlWritable`.

Example:
    >>> CpuGovernor().process(["     32 performance"])
    {'performance': 32}
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand


class CpuGovernor(FactBase):
    """How many CPUs run each cpufreq governor now; empty where there is no cpufreq (VMs,
    containers without it).

    .. code:: python

        {"performance": 30, "powersave": 2}
    """

    default = dict

    def command(self) -> str:
        return (
            "cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor 2>/dev/null "
            "| sort | uniq -c || true"
        )

    def process(self, output: list[str]) -> dict[str, int]:
        result = {}
        for line in output:
            words = line.split()
            if len(words) == 2 and words[0].isdigit():
                result[words[1]] = int(words[0])
        return result


class Container(FactBase):
    """The container technology this host runs in (``systemd-detect-virt --container``), or None.

    .. code:: python

        "systemd-nspawn"
    """

    requires_command = "systemd-detect-virt"

    def command(self) -> str:
        return "systemd-detect-virt --container || true"

    def process(self, output: list[str]) -> str | None:
        value = output[0].strip() if output else ""
        return None if value in ("", "none") else value


class FileDigests(FactBase):
    """SHA256 of each given file; None for a file that does not exist.

    .. code:: python

        {"/etc/sysctl.d/90-vllm-fleet.conf": "9f2c…", "/etc/profile.d/cuda.sh": None}
    """

    default = dict

    def command(self, paths: list[str]) -> StringCommand:
        parts: list[Any] = []
        for path in paths:
            parts += [
                "if test -f", QuoteString(path), "; then sha256sum", QuoteString(path),
                "; else echo -", QuoteString(path), "; fi;",
            ]  # fmt: skip
        return StringCommand(*parts) if parts else StringCommand("true")

    def process(self, output: list[str]) -> dict[str, str | None]:
        result: dict[str, str | None] = {}
        for line in output:
            digest, _, path = line.partition(" ")
            path = path.lstrip(" *")
            if path:
                result[path] = None if digest == "-" else digest
        return result


class SystemctlShow(FactBase):
    """Properties of systemd units (``systemctl show -p Id,…``), by unit; a subclass names
    the properties it reads in :attr:`properties`.

    .. code:: python

        {"vllm-chat.service": {"ActiveState": "active", …}}

    Example:
        >>> SystemctlShow().process(["Id=a.service", "ActiveState=active", "",
        ...                          "Id=b.service", "ActiveState=failed"])
        {'a.service': {'ActiveState': 'active'}, 'b.service': {'ActiveState': 'failed'}}
    """

    requires_command = "systemctl"
    default = dict
    #: The properties read (``Id`` is always read: it keys the result).
    properties: tuple[str, ...] = ()

    def command(self, units: list[str]) -> StringCommand:
        if not units:
            return StringCommand("true")
        return StringCommand(
            "systemctl", "show", "--no-pager",
            "-p", ",".join(("Id", *self.properties)),
            *[QuoteString(unit) for unit in units], "||", "true",
        )  # fmt: skip

    def process(self, output: list[str]) -> dict[str, dict[str, str]]:
        result: dict[str, dict[str, str]] = {}
        current: dict[str, str] = {}
        for line in [*output, ""]:
            if not line.strip():
                if current.get("Id"):
                    result[current.pop("Id")] = current
                current = {}
                continue
            key, _, value = line.partition("=")
            current[key] = value
        return result


#: The unit properties :class:`UnitStates` reads.
UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "UnitFileState", "LimitNOFILE")


class UnitStates(SystemctlShow):
    """Load, active and enablement state (and open-file limit) of systemd units.

    .. code:: python

        {"nvidia-persistenced.service": {"LoadState": "loaded", "ActiveState": "active",
                                         "SubState": "running", "UnitFileState": "enabled",
                                         "LimitNOFILE": "65536"}}
    """

    properties = UNIT_PROPERTIES


#: The first line of every vLLM server unit vllm-fleet writes, exactly
#: (templates/vllm-server.service.j2). vllm-fleet's other units (the CPU governor's) begin
#: with other lines, and a hand-written unit with none of them.
FLEET_UNIT_MARKER = "# Managed by vllm-fleet — edit the fleet file, not this unit."


class FleetServerUnits(FactBase):
    """The vLLM server units in /etc/systemd/system that vllm-fleet wrote (their first line is
    exactly :data:`FLEET_UNIT_MARKER`), sorted; a ``vllm-*.service`` written by hand, and
    vllm-fleet's own ``vllm-fleet-cpu-governor.service``, are not listed.

    .. code:: python

        ["vllm-chat.service", "vllm-embed.service"]

    Example:
        >>> FleetServerUnits().process(["vllm-embed.service", "vllm-chat.service"])
        ['vllm-chat.service', 'vllm-embed.service']
    """

    default = list

    def command(self, unit_dir: str) -> StringCommand:
        return StringCommand(
            "for f in", f"{unit_dir.rstrip('/')}/vllm-*.service", "; do",
            "test -f \"$f\" && head -n 1 \"$f\" | grep -qxF", QuoteString(FLEET_UNIT_MARKER),
            "&& basename \"$f\"; done; true",
        )  # fmt: skip

    def process(self, output: list[str]) -> list[str]:
        return sorted(line.strip() for line in output if line.strip().endswith(".service"))
