"""One systemd unit per vLLM server: rendered unit + 0600 environment file, started healthy.

A server is restarted only when its unit, environment, vLLM install or model changed, and the
deploy finishes it only once it answers a real completion.

Example:
    from deploys.services import retired_servers, services
    retired_servers()
    services(venv_changed=venv_op, models_changed={"tiny-llama": model_op})
"""

from __future__ import annotations

from io import StringIO

from pyinfra.api import deploy
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from deploys.multinode import group_members, groups_reachable
from deploys.plan import current_plan, slot, upload_programs
from deploys.tls import tls_saved, tls_written
from fleet.catalog.paths import PREVIOUS_DIR, SERVICE_HOME, SERVICE_SHELL, remote_program
from fleet.hostplan.types import ServerUnit
from operations.endpoints import replica_rolled
from operations.services import (
    previous_saved,
    server_answers,
    server_args_valid,
    server_restarted,
    undeclared_servers_removed,
)
from operations.startups import start_recorded


@deploy("Servers no longer in the fleet file")
def retired_servers() -> None:
    """Stop and remove the server units vllm-fleet wrote for servers the fleet file no longer
    has (renamed or deleted), before any declared server starts: their ports and GPU memory
    are free for the new ones. Units written by hand are never touched.
    """
    plan = current_plan()
    undeclared_servers_removed(
        name="Remove servers that are no longer in the fleet file",
        keep=[entry.unit for entry in plan.servers]
        + [entry.ray_head.unit for entry in plan.servers if entry.ray_head],
        unit_dir=plan.unit_dir,
    )


@deploy("vLLM services")
def services(
    venv_changed: OperationMeta,
    models_changed: dict[str, OperationMeta],
    limits_changed: OperationMeta | None = None,
) -> None:
    """Write units and environment files; (re)start only what changed; check readiness.

    ``limits_changed`` is the operation of the drop-in that every vLLM unit shares (open-file
    limits): when it changed, every server restarts to take it.
    """
    plan = current_plan()
    groups_reachable()
    user = plan.user
    server.group(name="Create the service group", group=user, system=True)
    server.user(
        name="Create the service user",
        user=user,
        group=user,
        system=True,
        home=SERVICE_HOME,
        shell=SERVICE_SHELL,
        create_home=False,
        ensure_home=False,
    )
    files.directory(
        name="Create the environment file directory",
        path=plan.env_dir,
        user="root",
        group="root",
        mode="700",
    )
    uploaded = upload_programs({program.name: program.description for program in plan.programs})
    files.directory(
        name="Create the folder for previous configurations",
        path=PREVIOUS_DIR,
        user="root",
        group="root",
        mode="700",
    )
    # what restarts a server beside its own files and programs: the venv, the shared limits,
    # its model
    shared = [venv_changed, *([limits_changed] if limits_changed is not None else [])]
    also = {entry.name: [*shared, *([models_changed[entry.model]]
                                    if entry.model in models_changed else [])]
            for entry in plan.servers}
    for entry in plan.servers:
        if entry.group is None:  # a server across hosts: deploys/multinode.py, below
            with slot(entry.slot):
                _single_server(entry, uploaded, also[entry.name])
    members = [entry for entry in plan.servers if entry.group is not None]
    if members:
        group_members(members, uploaded, also)

def _single_server(
    entry: ServerUnit,
    uploaded: dict[str, tuple[str, list[OperationMeta]]],
    restarts_too: list[OperationMeta],
) -> None:
    """Check, keep, write, (re)start and check one server on one host: restarted (or rolled
    through its endpoint) when its files, the programs it runs (``restarts_on``) or one of
    ``restarts_too`` (venv, limits, model) changed."""
    python = current_plan().python_bin
    validator, checker, restarter = (
        uploaded[name][0] for name in ("validate_args", "check_ready", "restart_or_restore")
    )
    unit = entry.unit
    server_args_valid(
        name=f"Check the flags of {unit} with the installed vLLM",
        unit=unit,
        unit_path=entry.unit_path,
        unit_text=entry.unit_text,
        python=python,
        script=validator,
    )
    saved_unit, saved_env = entry.previous
    previous_saved(
        name=f"Keep the current environment of {unit}",
        path=entry.env_path,
        text=entry.env_text,
        backup=saved_env,
    )
    previous_saved(
        name=f"Keep the current {unit}",
        path=entry.unit_path,
        text=entry.unit_text,
        backup=saved_unit,
    )
    restore = {entry.unit_path: saved_unit, entry.env_path: saved_env, **tls_saved(entry)}
    env_op = files.put(
        name=f"Write the environment of {unit}",
        src=StringIO(entry.env_text),
        dest=entry.env_path,
        user="root",
        group="root",
        mode="600",
    )
    unit_op = files.put(
        name=f"Write {unit}",
        src=StringIO(entry.unit_text),
        dest=entry.unit_path,
        user="root",
        group="root",
        mode="644",
    )
    tls_ops = tls_written(entry)
    systemd.daemon_reload(name=f"Reload systemd for {unit}", _if=unit_op.did_change)
    changed = [env_op, unit_op, *tls_ops, *restart_ops(entry, uploaded), *restarts_too]
    if entry.rollout is not None:
        # A replica of an endpoint: out of its router, drained, restarted, back; pyinfra
        # runs this on at most max_unavailable hosts at once.
        restart_op = replica_rolled(
            name=f"Roll {unit} through endpoint {entry.rollout.endpoint} "
            "(its configuration changed)",
            rollout=entry.rollout,
            unit=unit,
            url=entry.url,
            served_name=entry.served_name,
            env_file=entry.env_path,
            restore=restore,
            roll_script=uploaded["roll_replica"][0],
            # On the router's host: uploaded there by deploys.endpoints.router_tools.
            router_script=remote_program("router_workers"),
            _parallel=entry.rollout.max_unavailable,
            _if=any_changed(*changed),
        )
    else:
        restart_op = server_restarted(
            name=f"Restart {unit} (its configuration changed)",
            unit=unit,
            restore=restore,
            script=restarter,
            _if=any_changed(*changed),
        )
    start_op = systemd.service(
        name=f"Enable and start {unit}",
        service=unit,
        running=True,
        enabled=True,
    )
    server_answers(
        name=f"Check that {entry.name} answers a completion",
        url=entry.url,
        served_name=entry.served_name,
        env_file=entry.env_path,
        script=checker,
        python=python,
        tls=entry.reach.probe_args,
        _if=any_changed(restart_op, start_op),
    )
    start_recorded(
        name=f"Record {entry.name}'s start, in phases",
        unit=unit,
        server=entry.name,
        model=entry.model,
        script=uploaded["startup_phases"][0],
        _if=any_changed(restart_op, start_op),
    )


def restart_ops(
    entry: ServerUnit, uploaded: dict[str, tuple[str, list[OperationMeta]]]
) -> list[OperationMeta]:
    """The uploads whose change restarts ``entry``: those of the programs its plan names
    (``ServerUnit.restarts_on``), each file once."""
    ops = [op for name in entry.restarts_on for op in uploaded[name][1]]
    return list(dict.fromkeys(ops))
