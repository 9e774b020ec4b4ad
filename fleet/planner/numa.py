"""NUMA-local serving, decided from the fleet file (render stays pure: no host is asked).

GPU hosts: the ``gpus.topology`` text (``nvidia-smi topo -m``, pasted into the fleet file) has
a "CPU Affinity" and a "NUMA Affinity" column per GPU. A server whose GPUs all sit on one NUMA
node gets that node's CPUs and memory in its unit (``CPUAffinity=``, ``NUMAPolicy=bind``,
``NUMAMask=``), as the field report does by hand with ``numactl --cpunodebind``; a server whose
GPUs span nodes gets a warning and no binding (binding it to one node would starve the other
GPUs' host threads). Without the text form of the topology (or with ``NUMA Affinity`` N/A: a
single-node machine) nothing is bound.

CPU hosts: the CPU build binds its OpenMP threads itself (``VLLM_CPU_OMP_THREADS_BIND``,
``auto`` by default: the cores of one NUMA node). Two servers on one host that both leave it at
``auto`` bind the same cores; explicit lists that overlap do the same; a list per rank must
match the server's ranks (TP × PP) or vLLM refuses to start. Those are checked here.

Example:
    >>> text = ("\\tGPU0\\tGPU1\\tCPU Affinity\\tNUMA Affinity\\tGPU NUMA ID\\n"
    ...         "GPU0\\t X \\tSYS\\t0-31\\t0\\t\\tN/A\\nGPU1\\tSYS\\t X \\t32-63\\t1\\t\\tN/A\\n")
    >>> gpu_affinity(text)
    {0: Affinity(cpus='0-31', node=0), 1: Affinity(cpus='32-63', node=1)}
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from fleet.read.problems import Finding
from fleet.spec.models import Fleet, Host, Server, Variant

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
#: A CPU list as systemd's CPUAffinity= and the kernel write it: ``0-31,64-95``.
CPU_LIST = r"[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*"
THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True)
class Affinity:
    """Where one GPU attaches: the CPUs near it, and its NUMA node (None: not known)."""

    cpus: str
    node: int | None


@dataclass(frozen=True)
class NumaBinding:
    """The unit's binding of one server: its GPUs' node, that node's CPUs.

    Example:
        >>> NumaBinding(node=1, cpus="56-111,168-223", gpus=(4, 5)).directives()
        ['CPUAffinity=56-111,168-223', 'NUMAPolicy=bind', 'NUMAMask=1']
    """

    node: int
    cpus: str
    gpus: tuple[int, ...]

    def directives(self) -> list[str]:
        """The ``[Service]`` lines of the binding."""
        return [f"CPUAffinity={self.cpus}", "NUMAPolicy=bind", f"NUMAMask={self.node}"]


def gpu_affinity(text: str) -> dict[int, Affinity]:
    """Each GPU's CPU and NUMA affinity from the text of ``nvidia-smi topo -m``.

    Works with tabs (as nvidia-smi prints) or spaces (as pasted), with NIC columns, and with
    nvidia-smi's underline escapes. GPUs without a CPU list are left out.
    """
    lines = [_ESCAPES.sub("", line) for line in text.splitlines()]
    header = next((line for line in lines if re.match(r"^\s*GPU0\b", line)), None)
    if header is None:
        return {}
    words = (
        header.replace("CPU Affinity", "CPU_Affinity")
        .replace("NUMA Affinity", "NUMA_Affinity")
        .replace("GPU NUMA ID", "GPU_NUMA_ID")
        .split()
    )
    devices = [w for w in words if re.fullmatch(r"(?:GPU|NIC)[0-9]+", w)]
    if "CPU_Affinity" not in words:
        return {}
    result = {}
    for line in lines:
        cells = line.split()
        match = re.fullmatch(r"GPU([0-9]+)", cells[0]) if cells else None
        if not match or len(cells) < 1 + len(devices) + 1:
            continue
        rest = cells[1 + len(devices) :]
        if not re.fullmatch(CPU_LIST, rest[0]):
            continue
        node = rest[1] if len(rest) > 1 and "NUMA_Affinity" in words else None
        result[int(match.group(1))] = Affinity(
            rest[0], int(node) if node is not None and node.isdigit() else None
        )
    return result


def server_binding(host: Host, server: Server) -> tuple[NumaBinding | None, str | None]:
    """(binding, why not) of one server: a binding when all its GPUs share a known node.

    ``why not`` is a sentence only when the GPUs span nodes (worth a warning); None when the
    fleet file says nothing about NUMA (no warning: nothing is known).

    Example:
        >>> from fleet.spec.models import Host
        >>> text = ("GPU0 GPU1 CPU Affinity NUMA Affinity\\nGPU0 X SYS 0-31 0\\n"
        ...         "GPU1 SYS X 32-63 1\\n")
        >>> host = Host.model_validate({"address": "x", "vllm": {"version": "0.32.0",
        ...     "variant": "cu130"}, "gpus": {"count": 2, "topology": text},
        ...     "servers": {"a": {"model": "m", "port": 1, "gpus": [1]},
        ...                 "b": {"model": "m", "port": 2, "gpus": [0, 1],
        ...                       "args": {"tensor-parallel-size": 2}}}})
        >>> server_binding(host, host.servers["a"])[0].directives()
        ['CPUAffinity=32-63', 'NUMAPolicy=bind', 'NUMAMask=1']
        >>> server_binding(host, host.servers["b"])
        (None, 'GPUs 0, 1 span NUMA nodes 0, 1: no CPU or memory binding')
    """
    topology = host.gpus.topology
    if host.vllm.variant is Variant.cpu or not isinstance(topology, str) or not server.gpus:
        return None, None
    affinity = gpu_affinity(topology)
    gpus = tuple(sorted(set(server.gpus)))
    known = [affinity[i] for i in gpus if i in affinity]
    if len(known) != len(gpus) or any(a.node is None for a in known):
        return None, None
    nodes = sorted({a.node for a in known if a.node is not None})
    if len(nodes) > 1:
        listed = ", ".join(str(i) for i in gpus)
        return None, (f"GPUs {listed} span NUMA nodes {', '.join(map(str, nodes))}: no CPU or "
                      "memory binding")  # fmt: skip
    cpus = sorted({a.cpus for a in known})
    if len(cpus) != 1:
        return None, None
    return NumaBinding(node=nodes[0], cpus=cpus[0], gpus=gpus), None


def _cpus(text: str) -> set[int]:
    """The CPU numbers of a list.

    Example:
        >>> sorted(_cpus("0-2,7"))
        [0, 1, 2, 7]
    """
    found: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        found.update(range(int(low), int(high or low) + 1))
    return found


def threads_bind_findings(name: str, host: Host) -> Iterator[tuple[bool, Finding]]:
    """``(is_error, finding)`` for the CPU build's thread binding of one CPU host's servers."""
    if host.vllm.variant is not Variant.cpu:
        return
    taken: dict[int, str] = {}
    auto: list[str] = []
    for server_name, server in host.servers.items():
        path = ("hosts", name, "servers", server_name, "env", THREADS_BIND)
        value = server.env.get(THREADS_BIND)
        if not isinstance(value, str) or value == "auto":
            auto.append(server_name)
            continue
        if value == "nobind":
            continue
        lists = value.split("|")
        if not all(re.fullmatch(CPU_LIST, item) for item in lists):
            yield True, (path, f"{value!r} is not auto, nobind or CPU lists per rank",
                         'write e.g. "0-7" or, for two ranks, "0-7|8-15"')  # fmt: skip
            continue
        ranks = server.tp * server.pp
        if len(lists) != ranks:
            lists_text = f"{len(lists)} CPU list{'' if len(lists) == 1 else 's'}"
            yield True, (path, f"{lists_text} for {ranks} ranks (TP × PP): vLLM refuses to "
                         "start", "give one list per rank, separated by |")  # fmt: skip
        for cpu in sorted(set().union(*(_cpus(item) for item in lists))):
            if cpu in taken:
                yield False, (path, f"CPU {cpu} is also bound by server {taken[cpu]}",
                              "give each server on the host its own CPUs")  # fmt: skip
                break
            taken[cpu] = server_name
    if len(auto) > 1:
        listed = ", ".join(auto)
        yield False, (("hosts", name, "servers", auto[1], "env", THREADS_BIND),
                      f"servers {listed} all bind their threads with {THREADS_BIND}=auto, to "
                      "the same cores", "set a distinct CPU list per server, e.g. 0-7 and "
                      "8-15")  # fmt: skip


def numa_problems(fleet: Fleet) -> Iterator[Finding]:
    """Thread bindings vLLM would refuse (a malformed list, a list count that is not TP × PP)."""
    for name, host in fleet.hosts.items():
        for error, finding in threads_bind_findings(name, host):
            if error:
                yield finding


def numa_warnings(fleet: Fleet) -> Iterator[Finding]:
    """Servers whose GPUs span NUMA nodes (not bound), and CPU servers sharing cores."""
    for name, host in fleet.hosts.items():
        for server_name, server in host.servers.items():
            _, why = server_binding(host, server)
            if why:
                yield (("hosts", name, "servers", server_name, "gpus"), why,
                       "keep a server's GPUs on one NUMA node where it can be done")  # fmt: skip
        for error, finding in threads_bind_findings(name, host):
            if not error:
                yield finding
