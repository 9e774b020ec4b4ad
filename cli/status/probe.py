"""One ssh round trip per host: each server's unit state and restarts, its ``/health`` and
``/metrics`` (asked on the host, servers bind to loopback), the GPUs' health, and on demand the
servers' journals.

The host runs one shell script of sections; each section starts with a marker line
``@@ KIND NAME`` and holds one command's output. Every command ends in ``|| true``: a server
that does not answer is an empty section, never the end of the probe. The HTTP requests go
through the request program the services deploy uploads (:data:`cli.remote.REQUEST_COMMAND`),
which reads an API key on the host from the server's environment file — no key travels.

Example:
    >>> split_sections(["@@ unit vllm-a.service", "ActiveState=active", "@@ health", "x"])
    {('unit', 'vllm-a.service'): ['ActiveState=active'], ('health', ''): ['x']}
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from cli import remote
from facts.gpuhealth import HEALTH_COMMAND
from fleet.catalog.paths import startup_record
from fleet.hostplan.types import HostPlan, ServerUnit

#: The systemd properties read per server unit.
UNIT_PROPERTIES = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "NRestarts",
    "ActiveEnterTimestamp",
    "ExecMainPID",
)
#: Journal lines read per server for ``--startup`` (the last starts, newest last).
JOURNAL_LINES = 20000
MARKER = "@@ "


@dataclass
class HostProbe:
    """What one host answered.

    + host: inventory name
    + sections: output lines per ``(kind, name)`` section
    + error: why the host could not be probed (None: it answered)
    + taken_at: ``time.time()`` when the answer came
    + seconds: how long the round trip took
    """

    host: str
    sections: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    error: str | None = None
    taken_at: float = 0.0
    seconds: float = 0.0


def _request(server: ServerUnit, path: str) -> str:
    """The shell line that asks ``path`` of a server where its plan reaches it (no key)."""
    payload = {"url": server.url, "port": server.port, "path": path, "body": None,
               "auth": False, "env_file": server.env_path, **server.reach.trust}
    return f"printf %s {shlex.quote(json.dumps(payload))} | {remote.REQUEST_COMMAND}"


def probe_script(plan: HostPlan, startup: bool = False, gpus: bool = True) -> str:
    """The shell script that answers every section of one host.

    + plan: the host's plan (its servers, whether it has the NVIDIA stack)
    + startup: also each server's journal (``--startup``)
    + gpus: ask nvidia-smi (only where the NVIDIA stack is declared)

    Example:
        >>> from fleet.load import load_text
        >>> from fleet.hostplan.render import host_plan
        >>> fleet = load_text("version: 1\\nmodels: {m: {url: 'https://x/m.tar.gz', sha256: "
        ...     "'" + "0" * 64 + "'}}\\nhosts:\\n  a:\\n    address: sandbox\\n    vllm: "
        ...     "{version: 0.32.0, variant: cpu}\\n    servers: {s: {model: m, port: 18000}}\\n",
        ...     "f.yaml")
        >>> script = probe_script(host_plan(fleet, "a", secrets=lambda ref: ""))
        >>> [line for line in script.splitlines() if line.startswith("echo")]
        ["echo '@@ unit s'", "echo '@@ http-health s'", "echo '@@ metrics s'"]
    """
    q = shlex.quote
    lines = []
    for server in plan.servers:
        if server.worker_hosts:  # a server across hosts: not probed (yet)
            continue
        lines += [
            f"echo {q(MARKER + 'unit ' + server.name)}",
            f"systemctl show --no-pager -p {','.join(UNIT_PROPERTIES)} {q(server.unit)} "
            "2>&1 || true",
            f"echo {q(MARKER + 'http-health ' + server.name)}",
            f"{_request(server, '/health')} 2>&1 || true",
            f"echo {q(MARKER + 'metrics ' + server.name)}",
            f"{_request(server, '/metrics')} 2>&1 || true",
        ]
        if startup:
            lines += [
                f"echo {q(MARKER + 'journal ' + server.name)}",
                f"journalctl -u {q(server.unit)} -o short-iso-precise --no-pager "
                f"-n {JOURNAL_LINES} 2>&1 || true",
                f"echo {q(MARKER + 'startups ' + server.name)}",
                f"cat {q(startup_record(server.name))} 2>/dev/null || true",
            ]
    for part, unit in monitoring_units(plan):
        lines += [
            f"echo {q(MARKER + 'monitoring ' + part)}",
            f"systemctl show --no-pager -p {','.join(UNIT_PROPERTIES)} {q(unit)} 2>&1 || true",
        ]
    if gpus and plan.stack.nvidia is not None:
        lines += [f"echo {q(MARKER + 'health')}", HEALTH_COMMAND]
    return "\n".join(lines) + "\n"


def monitoring_units(plan: HostPlan) -> list[tuple[str, str]]:
    """``(part, unit)`` of the monitoring services the fleet gives this host (none without a
    ``monitoring`` section): the node exporter, the GPU feeder, Prometheus, Alertmanager.

    Example:
        >>> from fleet.load import load_text
        >>> from fleet.hostplan.render import host_plan
        >>> fleet = load_text("version: 1\\nmonitoring: {host: a}\\nhosts:\\n  a:\\n    address: "
        ...     "sandbox\\n    vllm: {version: 0.32.0, variant: cpu}\\n", "f.yaml")
        >>> monitoring_units(host_plan(fleet, "a", secrets=lambda ref: ""))
        [('node', 'prometheus-node-exporter.service'), ('prometheus', 'prometheus.service')]
    """
    mon = plan.monitoring
    if mon is None:
        return []
    units = [("node", mon.node_exporter.unit)]
    if mon.gpu_metrics is not None:
        units.append(("gpu-metrics", mon.gpu_metrics.unit))
    if mon.prometheus is not None:
        units.append(("prometheus", mon.prometheus.service.unit))
        if mon.prometheus.alertmanager is not None:
            units.append(("alertmanager", mon.prometheus.alertmanager.unit))
    return units


def split_sections(lines: list[str]) -> dict[tuple[str, str], list[str]]:
    """The probe's output, cut at its marker lines (lines before the first are dropped)."""
    sections: dict[tuple[str, str], list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith(MARKER):
            kind, _, name = line[len(MARKER) :].strip().partition(" ")
            current = sections.setdefault((kind, name), [])
        elif current is not None:
            current.append(line)
    return sections


def probe(
    name: str, data: dict[str, Any], plan: HostPlan, startup: bool = False, timeout: float = 30.0
) -> HostProbe:
    """Run the probe on one host over ssh; an unreachable host is a probe with ``error``.

    + name: the host's inventory name
    + data: its connection data (:func:`cli.remote.ssh_command`)
    + plan: its plan
    + startup: also read the servers' journals
    + timeout: seconds for the whole round trip
    """
    began = time.monotonic()
    try:
        result = remote.run(data, "sh -s", probe_script(plan, startup=startup), timeout=timeout)
    except subprocess.TimeoutExpired:
        return HostProbe(
            name,
            error=f"no answer within {timeout:.0f} s",
            taken_at=time.time(),
            seconds=time.monotonic() - began,
        )
    except OSError as error:
        return HostProbe(name, error=str(error), taken_at=time.time())
    seconds = time.monotonic() - began
    sections = split_sections(result.stdout.splitlines())
    if result.returncode != 0 and not sections:
        why = " ".join(result.stderr.split()) or f"ssh exited {result.returncode}"
        return HostProbe(name, error=why, taken_at=time.time(), seconds=seconds)
    return HostProbe(name, sections, None, time.time(), seconds)
