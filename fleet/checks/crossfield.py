"""Checks that span several fields of a fleet: each yields (path, message, hint).

The paths are the validated fleet's; :mod:`fleet.load` turns them into file:line.

Example:
    >>> from fleet.spec.models import Fleet
    >>> fleet = Fleet.model_validate({"version": 1, "hosts": {"a": {
    ...     "address": "sandbox", "vllm": {"version": "0.32.0", "variant": "cpu"},
    ...     "servers": {"s": {"model": "m", "port": 8000}}}}})
    >>> [message for _, message, _ in check_fleet(fleet)]
    ["model 'm' is not defined in models"]
"""

from __future__ import annotations

from collections.abc import Iterator

from fleet.catalog import gpus as gpu_table
from fleet.catalog import releases
from fleet.checks.endpoints import check_endpoints, endpoint_warnings
from fleet.checks.flags import flag_problems, flag_warnings
from fleet.checks.groups import check_group
from fleet.checks.ledger import ledger_problems
from fleet.checks.monitoring import check_monitoring
from fleet.checks.sysctl_names import sysctl_problems, sysctl_warnings
from fleet.planner.fit import chunked_prefill, plan_fleet
from fleet.planner.numa import numa_problems, numa_warnings
from fleet.read.problems import Finding, suggest
from fleet.spec.addresses import machine_key
from fleet.spec.models import Fleet, Host, Server, Variant

#: What :func:`check_fleet` says of a GPU server without gpus (``fleet plan --place`` fills them).
NO_GPUS = "a GPU server needs at least one GPU index"


def check_fleet(fleet: Fleet) -> Iterator[Finding]:
    """Every cross-field problem of ``fleet``, in file order of hosts and servers."""
    yield from _check_addresses(fleet)
    for name, host in fleet.hosts.items():
        yield from _check_gpu_table(name, host)
        yield from _check_stack(name, host)
        yield from _check_host(fleet, name, host)
    yield from check_endpoints(fleet)
    yield from numa_problems(fleet)
    yield from check_monitoring(fleet)
    yield from sysctl_problems(fleet)
    yield from ledger_problems(fleet)  # every unit, file, socket, port and GPU: one owner


def _check_host(fleet: Fleet, name: str, host: Host) -> Iterator[Finding]:
    base = ("hosts", name)
    variant = host.vllm.variant
    if variant is Variant.cpu and host.gpus.count > 0:
        yield (
            (*base, "vllm", "variant"),
            f"the cpu build on a host with {host.gpus.count} GPUs",
            f"use cu129 (driver < {releases.MIN_DRIVER_FOR_VARIANT['cu130']}) or cu130, or set "
            "gpus.count to 0",
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
            need = releases.MIN_DRIVER_FOR_VARIANT[variant.value]
            if host.os.nvidia.branch < need:
                yield (
                    (*base, "os", "nvidia", "driver"),
                    f"driver {host.os.nvidia.driver} cannot run the {variant.value} vLLM build "
                    f"(needs driver ≥ {need})",
                    f"use variant: cu129 for drivers 535/570, or a driver ≥ {need}"
                    if variant is Variant.cu130
                    else f"pin a driver ≥ {need}",
                )
    if variant is Variant.cpu and host.os.nvidia is not None:
        yield (
            (*base, "os", "nvidia"),
            "an NVIDIA driver on a host that runs the cpu build",
            "remove os.nvidia, or use a GPU build",
        )
    yield from _check_cuda(base, host)

    for server_name, server in host.servers.items():
        sbase = (*base, "servers", server_name)
        if server.model not in fleet.models:
            yield (
                (*sbase, "model"),
                f"model {server.model!r} is not defined in models",
                _model_hint(server.model, fleet),
            )
        yield from _check_unit_limits(sbase, server, host)
        yield from flag_problems(sbase, server, host.vllm.version)
        # These hold for every build, the cpu one included.
        yield from _check_workers(fleet, name, host, sbase, server)
        yield from check_group(fleet, name, host, sbase, server)
        yield from _check_model_limits(fleet, sbase, server)
        if variant is Variant.cpu:
            if server.gpus:
                yield (
                    (*sbase, "gpus"),
                    "a server of the cpu build cannot use GPUs",
                    "remove gpus: from this server",
                )
            continue
        if not server.gpus:
            yield ((*sbase, "gpus"), NO_GPUS, "e.g. gpus: [0], or let `fleet plan --place` choose")
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
        nodes = 1 + len(set(server.worker_hosts))
        if server.gpus_needed != len(set(server.gpus)) * nodes:
            tp = server.args.get("tensor-parallel-size", 1)
            pp = server.args.get("pipeline-parallel-size", 1)
            given = f"{len(set(server.gpus))} GPUs are given"
            if nodes > 1:
                given = f"{len(set(server.gpus))} GPUs on each of {nodes} hosts are given"
            if server.dp > 1:
                product = (f"tensor-parallel-size × pipeline-parallel-size × data-parallel-size = "
                           f"{tp} × {pp} × {server.dp}")
                hint = "list as many GPUs as TP × PP × DP (each data-parallel rank has its own)"
            else:
                product = f"tensor-parallel-size × pipeline-parallel-size = {tp} × {pp}"
                hint = "list as many GPUs as TP × PP, or set tensor-parallel-size"
            yield ((*sbase, "gpus"), f"{product} = {server.gpus_needed}, but {given}", hint)


def _check_cuda(base: tuple[str | int, ...], host: Host) -> Iterator[Finding]:
    """The CUDA toolkit comes from NVIDIA's repository: it needs an NVIDIA-sourced driver.

    (A GPU build without os.nvidia is already refused as "needs an NVIDIA driver".)
    """
    cuda, nvidia = host.os.cuda, host.os.nvidia
    if cuda is None:
        return
    if nvidia is None and host.vllm.variant is Variant.cpu:
        yield (
            (*base, "os", "cuda"),
            f"CUDA {cuda} on a host without an NVIDIA driver (the cpu build needs no toolkit)",
            "remove os.cuda",
        )
    elif nvidia is not None and nvidia.source != "nvidia":
        yield (
            (*base, "os", "nvidia", "source"),
            f"CUDA {cuda} comes from NVIDIA's CUDA repository, which source: "
            f"{nvidia.source} does not configure",
            "use source: nvidia (the default), or remove os.cuda",
        )


def _check_gpu_table(name: str, host: Host) -> Iterator[Finding]:
    """A GPU model the table does not know needs memory_gib; a topology must fit the count."""
    gpus = host.gpus
    path = ("hosts", name, "gpus")
    if gpus.model and gpus.memory_gib is None and gpus.table_model is None:
        choices = gpu_table.ambiguous(gpus.model)
        if choices:
            hint = "name one of " + ", ".join(choices) + ", or set memory_gib"
            yield ((*path, "model"), f"{gpus.model!r} is ambiguous in memory", hint)
        else:
            close = suggest(gpus.model, gpu_table.known_models())
            known = ", ".join(gpu_table.known_models())
            yield (
                (*path, "model"),
                f"GPU model {gpus.model!r} is not in the built-in table and memory_gib is unset",
                (close + " " if close else "") + f"known models: {known}; or set memory_gib",
            )
    links = gpus.links
    if links:
        highest = max(index for pair in links for index in pair)
        if highest >= gpus.count:
            yield (
                (*path, "topology"),
                f"the topology names GPU {highest}, but the host has {gpus.count} GPUs",
                "paste `nvidia-smi topo -m` of this host, or fix gpus.count",
            )
        elif isinstance(gpus.topology, str) and highest + 1 != gpus.count:
            yield (
                (*path, "topology"),
                f"the topology matrix has {highest + 1} GPUs, but the host has {gpus.count}",
                "paste `nvidia-smi topo -m` of this host, or fix gpus.count",
            )


def _check_workers(
    fleet: Fleet, name: str, host: Host, sbase: tuple[str | int, ...], server: Server
) -> Iterator[Finding]:
    """Hosts that lend GPUs to a server through Ray must exist and run the same build."""
    seen: set[str] = set()
    for position, worker in enumerate(server.worker_hosts):
        path = (*sbase, "worker_hosts", position)
        other = fleet.hosts.get(worker)
        if worker == name:
            yield (path, f"{worker!r} is this server's own host", "list only the other hosts")
        elif worker in seen:
            yield (path, f"host {worker!r} is listed twice", None)
        elif other is None:
            yield (
                path,
                f"host {worker!r} is not defined in hosts",
                suggest(worker, fleet.hosts) or "add it under hosts:",
            )
        elif (other.vllm.version, other.vllm.variant) != (host.vllm.version, host.vllm.variant):
            yield (
                path,
                f"host {worker!r} runs vLLM {other.vllm.version} {other.vllm.variant.value}, "
                f"this host {host.vllm.version} {host.vllm.variant.value}",
                "a group across hosts needs one vLLM build on every member",
            )
        elif server.gpus and max(server.gpus) >= other.gpus.count:
            yield (
                path,
                f"host {worker!r} has {other.gpus.count} GPUs, fewer than this server's "
                f"GPU {max(server.gpus)}",
                None,
            )
        seen.add(worker)


def _check_model_limits(
    fleet: Fleet, sbase: tuple[str | int, ...], server: Server
) -> Iterator[Finding]:
    """Limits that come from the model's config: context length, heads, batch size."""
    model = fleet.models.get(server.model)
    config = model.sizing if model else None
    length = server.int_arg("max-model-len")
    if config is not None:
        limit = config.max_len_limit
        declared = any(key in server.args for key in ("rope-scaling", "hf-overrides")) or (
            server.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1"
        )
        if length is not None and limit is not None and length > limit and not declared:
            yield (
                (*sbase, "args", "max-model-len"),
                f"max-model-len {length:,} is longer than the model's {limit:,} "
                "(max_position_embeddings"
                + (" × RoPE scaling factor)" if limit != config.max_position_embeddings else ")"),
                f"use at most {limit}, or declare RoPE scaling (hf-overrides)",
            )
        if server.tp > 1 and config.num_attention_heads % server.tp:
            yield (
                (*sbase, "args", "tensor-parallel-size"),
                f"tensor-parallel-size {server.tp} does not divide the model's "
                f"{config.num_attention_heads} attention heads",
                "use a TP size that divides " + str(config.num_attention_heads),
            )
        elif server.tp > 1 and not config.is_mla:
            kv = config.kv_heads
            if (kv >= server.tp and kv % server.tp) or (kv < server.tp and server.tp % kv):
                yield (
                    (*sbase, "args", "tensor-parallel-size"),
                    f"tensor-parallel-size {server.tp} does not divide the model's "
                    f"{kv} KV heads (nor is it a multiple of them)",
                    f"use a TP size that divides {kv} or is a multiple of it",
                )
        if server.kv_cache_dtype == "fp8_ds_mla" and not config.is_mla:
            yield (
                (*sbase, "args", "kv-cache-dtype"),
                "kv-cache-dtype fp8_ds_mla is for MLA models; this config has no kv_lora_rank",
                "use fp8 (or auto)",
            )
    if length is None and config is not None:
        length = config.max_len_limit
    batched = server.int_arg("max-num-batched-tokens")
    off = not chunked_prefill(server)
    if batched is not None and length is not None and batched < length and off:
        yield (
            (*sbase, "args", "max-num-batched-tokens"),
            f"max-num-batched-tokens {batched:,} is below max-model-len {length:,}, and "
            "chunked prefill is off: a long prompt could never be scheduled",
            f"raise it to at least {length}, or turn chunked prefill on",
        )


def _model_hint(wanted: str, fleet: Fleet) -> str:
    """What to write for a server's model that is no key of ``models`` (a Hub id, a typo).

    Example:
        >>> from fleet.spec.models import Fleet
        >>> f = Fleet.model_validate({"version": 1, "hosts": {}, "models": {"q": {"hf": "Org/Q",
        ...     "revision": "0123456789abcdef0123456789abcdef01234567"}}})
        >>> _model_hint("Org/Q", f)
        "that is the hf of model 'q'; write model: q"
    """
    for name, model in fleet.models.items():
        if model.hf is not None and model.hf.lower() == wanted.lower():
            return f"that is the hf of model {name!r}; write model: {name}"
    if "/" in wanted:
        return ("a server names a key of models, not a Hub id: add models: {name: {hf: "
                f"{wanted}, revision: …}} and write model: name")
    return suggest(wanted, fleet.models) or "add it under models:"


def check_warnings(fleet: Fleet) -> Iterator[Finding]:
    """Things that work but are slower than they need be (parallelism over slow GPU links).

    Example:
        >>> from fleet.load import load_fleet
        >>> list(check_warnings(load_fleet("inventory/sandbox.yaml")))
        []
    """
    for name, host in fleet.hosts.items():
        for server_name, server in host.servers.items():
            sbase = ("hosts", name, "servers", server_name)
            yield from flag_warnings(sbase, server, host.vllm.version)
        links = host.gpus.links
        if not links:
            continue
        for server_name, server in host.servers.items():
            gpus = sorted(set(server.gpus))
            if len(gpus) < 2 or any(index >= host.gpus.count for index in gpus):
                continue
            worst = gpu_table.worst_link(links, gpus)
            if worst is None or gpu_table.is_nvlink(worst):
                continue
            # What crosses the links: tensor parallel all-reduces every layer, expert parallel
            # sends tokens all-to-all every MoE layer; pipeline stages pass only activations to
            # the next stage, and data parallel ranks without EP share nothing per step.
            expert = server.args.get("enable-expert-parallel") is True
            if server.tp > 1:
                kind, traffic = "tensor", "all-reduce in every layer"
            elif expert:
                kind, traffic = "expert", "all-to-all in every MoE layer"
            elif server.pp > 1:
                kind, traffic = "pipeline", None
            else:
                continue
            listed = ", ".join(str(index) for index in gpus)
            message = (
                f"{kind} parallel over GPUs {listed} without NVLink: the slowest link is "
                f"{gpu_table.describe(worst)}"
            )
            best = gpu_table.best_set(links, host.gpus.count, len(gpus))
            if best and gpu_table.link_rank(best[1]) < gpu_table.link_rank(worst):
                better = ", ".join(str(index) for index in best[0])
                link = gpu_table.describe(best[1])
                hint = f"GPUs {better} have a faster link ({link}): use gpus: [{better}]"
            elif traffic is None:
                continue  # activations between stages: PCIe carries them well
            else:
                hint = f"no better set of GPUs on this host: expect {traffic} over PCIe"
            yield (("hosts", name, "servers", server_name, "gpus"), message, hint)
    yield from numa_warnings(fleet)
    yield from endpoint_warnings(fleet)
    yield from sysctl_warnings(fleet)


def check_capacity(fleet: Fleet) -> Iterator[Finding]:
    """Servers that :mod:`fleet.planner.fit` finds do not fit, located at the flag to change.

    Example:
        >>> from fleet.load import load_fleet
        >>> list(check_capacity(load_fleet("inventory/sandbox.yaml")))
        []
    """
    plan = plan_fleet(fleet)
    for server in plan.servers:
        if server.verdict != "does not fit":
            continue
        args = fleet.hosts[server.host].servers[server.server].args
        base = ("hosts", server.host, "servers", server.server)
        for flag in ("max-model-len", "gpu-memory-utilization", "tensor-parallel-size"):
            if flag in args:
                path = (*base, "args", flag)
                break
        else:
            path = base
        if server.reason.startswith("weights"):
            hint = "raise gpu-memory-utilization, spread the model over more GPUs (TP), or use "
            hint += "a smaller or quantized model"
        else:
            hint = "lower max-model-len, raise gpu-memory-utilization, use kv-cache-dtype: fp8, "
            hint += "or spread the model over more GPUs (TP)"
        yield (path, f"does not fit: {server.reason}", hint)
    for gpu in plan.gpus:
        remote = [label for label in gpu.servers if not label.startswith(f"{gpu.host}/")]
        if gpu.verdict == "does not fit" and remote:
            yield (
                ("hosts", gpu.host, "gpus"),
                f"GPU {gpu.index} is shared by {', '.join(gpu.servers)}: {gpu.reason}",
                "lower gpu-memory-utilization so that they sum below 1 with headroom",
            )


def _check_addresses(fleet: Fleet) -> Iterator[Finding]:
    """Two hosts of a fleet cannot be one machine (their units and ports would collide),
    however the address is spelt (``::ffff:10.0.1.21`` and ``10.0.1.21``, case, a trailing
    dot, any two loopback addresses): :func:`fleet.spec.addresses.machine_key`."""
    seen: dict[tuple[str, int], str] = {}
    for name, host in fleet.hosts.items():
        if host.is_sandbox:
            continue
        key = (machine_key(host.address), host.ssh.port)
        if key not in seen:
            seen[key] = name
            continue
        other = fleet.hosts[seen[key]].address
        same = (
            f"the same address {host.address}"
            if other == host.address
            else f"the same address, spelt {other} there and {host.address} here"
        )
        yield (
            ("hosts", name, "address"),
            f"host {seen[key]!r} has {same} (and SSH port): hosts {seen[key]!r} and {name!r} "
            "are one machine",
            "give each machine one entry; several servers go under one host's servers:",
        )


def _check_stack(name: str, host: Host) -> Iterator[Finding]:
    """The declared stack exists and fits together: driver branch, CUDA, Python, fabric manager."""
    base = ("hosts", name, "os")
    nvidia = host.os.nvidia
    if nvidia is not None and not releases.driver_branch_known(nvidia.branch):
        plausible = nvidia.branch % 5 == 0 and nvidia.branch <= releases.NEWEST_BRANCH + 30
        if not plausible or nvidia.branch < releases.NEWEST_BRANCH:
            shown = ", ".join(str(b) for b in sorted(releases.DRIVER_BRANCHES)[-6:])
            yield (
                (*base, "nvidia", "driver"),
                f"NVIDIA has no Linux driver branch {nvidia.branch}",
                f"use one of its branches ({shown}, …) or an exact version of one",
            )
    if host.os.cuda is not None:
        major = int(host.os.cuda.split(".")[0])
        need = releases.MIN_DRIVER_FOR_CUDA.get(major)
        if need is None:
            yield ((*base, "cuda"), f"CUDA {host.os.cuda} is not a CUDA release vllm-fleet "
                   "knows", f"use {', '.join(f'{m}.x' for m in releases.MIN_DRIVER_FOR_CUDA)}")
        elif nvidia is not None and nvidia.branch < need:
            yield (
                (*base, "cuda"),
                f"CUDA {host.os.cuda} needs driver ≥ {need}; the host declares driver "
                f"{nvidia.driver}",
                f"declare a {major - 1}.x toolkit, or a driver ≥ {need}"
                if major - 1 in releases.MIN_DRIVER_FOR_CUDA
                else f"declare a driver ≥ {need}",
            )
    if host.os.python is not None:
        wanted = tuple(int(part) for part in host.os.python.split("."))
        limits = releases.python_range(host.vllm.version)
        if limits is not None and not limits[0] <= wanted < limits[1]:
            (lo_major, lo_minor), (hi_major, hi_minor) = limits
            yield (
                (*base, "python"),
                f"vLLM {host.vllm.version} installs on Python {lo_major}.{lo_minor} to "
                f"{hi_major}.{hi_minor - 1}, not {host.os.python}",
                f'declare python: "{lo_major}.{lo_minor}" or newer (quoted)',
            )
    model = host.gpus.table_model
    if nvidia is not None and nvidia.fabric_manager is True and model and not model.nvswitch:
        yield (
            (*base, "nvidia", "fabric_manager"),
            f"the {model.name} does not come on NVSwitch boards: the fabric manager would not "
            "start there",
            "leave fabric_manager: auto (it is installed where lspci shows NVSwitches)",
        )


#: Folders the unit's hardening hides from the server: ProtectHome=yes, PrivateTmp=yes.
HIDDEN_BY_HARDENING = {
    "/home/": "ProtectHome=yes hides /home",
    "/root/": "ProtectHome=yes hides /root",
    "/run/user/": "ProtectHome=yes hides /run/user",
    "/tmp/": "PrivateTmp=yes gives the server its own empty /tmp",
    "/var/tmp/": "PrivateTmp=yes gives the server its own empty /var/tmp",
}


def _check_unit_limits(
    sbase: tuple[str | int, ...], server: Server, host: Host
) -> Iterator[Finding]:
    """What the hardened unit allows: hidden folders, the GPUs' dtypes (its ports below 1024:
    :mod:`fleet.checks.ledger`)."""
    for key, value in server.args.items():
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, str):
                continue
            for prefix, why in HIDDEN_BY_HARDENING.items():
                if item.startswith(prefix) or item == prefix.rstrip("/"):
                    yield (
                        (*sbase, "args", key),
                        f"{item}: the server cannot see it ({why})",
                        "put the file under /srv or /opt, readable by the vllm user",
                    )
    model = host.gpus.table_model
    dtype = str(server.args.get("dtype", ""))
    if model is not None and dtype in ("bfloat16", "bf16") and not model.bf16:
        major, minor = model.capability
        yield (
            (*sbase, "args", "dtype"),
            f"the {model.name} (compute capability {major}.{minor}) has no bfloat16",
            "use dtype: float16 (or leave dtype out: vLLM casts bf16 checkpoints there)",
        )
