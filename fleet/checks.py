"""Checks that span several fields of a fleet: each yields (path, message, hint).

The paths are the validated fleet's; :mod:`fleet.load` turns them into file:line.

Example:
    >>> from fleet.spec import Fleet
    >>> fleet = Fleet.model_validate({"version": 1, "hosts": {"a": {
    ...     "address": "sandbox", "vllm": {"version": "0.32.0", "variant": "cpu"},
    ...     "servers": {"s": {"model": "m", "port": 8000}}}}})
    >>> [message for _, message, _ in check_fleet(fleet)]
    ["model 'm' is not defined in models"]
"""

from __future__ import annotations

import ipaddress
import re
from collections import defaultdict
from collections.abc import Iterator

from fleet.load import suggest
from fleet.spec import MIN_DRIVER_FOR_VARIANT, Fleet, Host, Variant

Finding = tuple[tuple[str | int, ...], str, str | None]


def check_fleet(fleet: Fleet) -> Iterator[Finding]:
    """Every cross-field problem of ``fleet``, in file order of hosts and servers."""
    sandbox_ports: dict[int, tuple[str, str]] = {}
    for name, host in fleet.hosts.items():
        yield from _check_host(fleet, name, host)
        if host.is_sandbox:
            for server_name, server in host.servers.items():
                path = ("hosts", name, "servers", server_name, "port")
                if server.port in sandbox_ports:
                    other = "/".join(sandbox_ports[server.port])
                    yield (
                        path,
                        f"port {server.port} is already used by sandbox server {other}",
                        "sandbox hosts share this machine's network: give each a distinct port",
                    )
                else:
                    sandbox_ports[server.port] = (name, server_name)


def _check_host(fleet: Fleet, name: str, host: Host) -> Iterator[Finding]:
    base = ("hosts", name)
    variant = host.vllm.variant
    if variant is Variant.cpu and host.gpus.count > 0:
        yield (
            (*base, "vllm", "variant"),
            f"the cpu build on a host with {host.gpus.count} GPUs",
            "use cu129 (driver < 580) or cu130, or set gpus.count to 0",
        )
    if variant is not Variant.cpu:
        if host.gpus.count == 0:
            yield (
                (*base, "vllm", "variant"),
                f"the {variant.value} build needs GPUs, and this host declares none",
                "declare gpus: {count: N, model: ...}, or use variant: cpu",
            )
        if host.os.nvidia is None:
            yield (
                (*base, "os"),
                f"the {variant.value} build needs an NVIDIA driver",
                'declare os.nvidia.driver (e.g. "570")',
            )
        else:
            need = MIN_DRIVER_FOR_VARIANT[variant]
            if host.os.nvidia.branch < need:
                yield (
                    (*base, "os", "nvidia", "driver"),
                    f"driver {host.os.nvidia.driver} cannot run the {variant.value} vLLM build "
                    f"(needs driver ≥ {need})",
                    "use variant: cu129 for drivers 535/570, or a driver ≥ 580"
                    if variant is Variant.cu130
                    else f"pin a driver ≥ {need}",
                )
    if variant is Variant.cpu and host.os.nvidia is not None:
        yield (
            (*base, "os", "nvidia"),
            "an NVIDIA driver on a host that runs the cpu build",
            "remove os.nvidia, or use a GPU build",
        )

    ports: dict[int, str] = {}
    shares: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for server_name, server in host.servers.items():
        sbase = (*base, "servers", server_name)
        if server.model not in fleet.models:
            yield (
                (*sbase, "model"),
                f"model {server.model!r} is not defined in models",
                suggest(server.model, fleet.models) or "add it under models:",
            )
        if server.port in ports:
            yield (
                (*sbase, "port"),
                f"port {server.port} is already used by server {ports[server.port]!r}",
                "give each server of a host its own port",
            )
        else:
            ports[server.port] = server_name
        if host.ssh.port == server.port and not host.is_sandbox:
            yield ((*sbase, "port"), f"port {server.port} is the host's SSH port", None)
        yield from _check_bind(sbase, server.host)
        if variant is Variant.cpu:
            if server.gpus:
                yield (
                    (*sbase, "gpus"),
                    "a server of the cpu build cannot use GPUs",
                    "remove gpus: from this server",
                )
            continue
        if not server.gpus:
            yield ((*sbase, "gpus"), "a GPU server needs at least one GPU index", "e.g. gpus: [0]")
            continue
        if len(set(server.gpus)) != len(server.gpus):
            yield ((*sbase, "gpus"), "a GPU index is listed twice", None)
        for position, index in enumerate(server.gpus):
            if index >= host.gpus.count:
                yield (
                    (*sbase, "gpus", position),
                    f"GPU {index} does not exist: the host has {host.gpus.count} "
                    f"(indices 0–{host.gpus.count - 1})",
                    None,
                )
        if server.parallel_size != len(set(server.gpus)):
            tp = server.args.get("tensor-parallel-size", 1)
            pp = server.args.get("pipeline-parallel-size", 1)
            yield (
                (*sbase, "gpus"),
                f"tensor-parallel-size × pipeline-parallel-size = {tp} × {pp} = "
                f"{server.parallel_size}, but {len(set(server.gpus))} GPUs are given",
                "list as many GPUs as TP × PP, or set tensor-parallel-size",
            )
        for index in set(server.gpus):
            shares[index].append((server_name, server.gpu_memory_utilization))

    for index, users in sorted(shares.items()):
        if len(users) < 2:
            continue
        total = sum(fraction for _, fraction in users)
        if total >= 1:
            listing = " + ".join(f"{n} {f:g}" for n, f in users)
            last = users[-1][0]
            yield (
                (*base, "servers", last, "args"),
                f"servers sharing GPU {index} take {listing} = {total:.2f} of its memory "
                "(gpu-memory-utilization is a fraction of the GPU's total, per server)",
                "lower gpu-memory-utilization so that they sum below 1 with headroom",
            )


def _check_bind(path: tuple[str | int, ...], address: str) -> Iterator[Finding]:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        if not re.match(r"^[A-Za-z0-9.-]+$", address):
            yield ((*path, "host"), f"{address!r} is not an address to bind", "e.g. 127.0.0.1")
