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
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, server, systemd
from pyinfra.operations.util import any_changed

from deploys.multinode import group_members, groups_reachable
from deploys.plan import current_plan, upload_programs
from fleet.paths import (
    PREVIOUS_DIR,
    SERVICE_HOME,
    SERVICE_SHELL,
    previous_paths,
    remote_program,
)
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
        env_dir=plan.env_dir,
        previous_dir=PREVIOUS_DIR,
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
    refused = [f"{entry.name}: {entry.refusal}" for entry in plan.servers if entry.refusal]
    if refused:
        raise DeployError("; ".join(refused))
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
    uploaded = upload_programs({
        "wait_healthy": "the health waiter",
        "validate_args": "the vLLM flag check",
        "check_ready": "the readiness check",
        "restart_or_restore": "the restart-or-restore helper",
        "request": "the request program (fleet verify, fleet complete)",
        "startup_phases": "the start recorder (time to ready, in phases)",
        "roll_replica": "the replica updater (rolling updates of endpoints)",
        **({"vllm_serve": "the group member program (vllm serve, headless workers)",
            "wait_joined": "the group join waiter",
            "group_wait": "the group member waiter"}
           if any(entry.group for entry in plan.servers) else {}),
        **({"ray_node": "the Ray node starter", "ray_joined": "the Ray cluster waiter"}
           if any(entry.ray_head or (entry.group and entry.group.launcher == "ray")
                  for entry in plan.servers) else {}),
        **({"canary_saved": "the canary's keeper of previous configurations"}
           if any(entry.rollout and entry.rollout.canary for entry in plan.servers) else {}),
    })
    # The units run the health waiter (ExecStartPost): only its own files restart servers.
    _, wait_ops = uploaded["wait_healthy"]
    validator, checker, restarter = (
        uploaded[name][0] for name in ("validate_args", "check_ready", "restart_or_restore")
    )
    files.directory(
        name="Create the folder for previous configurations",
        path=PREVIOUS_DIR,
        user="root",
        group="root",
        mode="700",
    )
    python = plan.python_bin
    members = [entry for entry in plan.servers if entry.group is not None]
    for entry in plan.servers:
        if entry.group is not None:  # a server across hosts: deploys/multinode.py
            continue
        unit = entry.unit
        server_args_valid(
            name=f"Check the flags of {unit} with the installed vLLM",
            unit=unit,
            unit_path=entry.unit_path,
            unit_text=entry.unit_text,
            python=python,
            script=validator,
        )
        saved_unit, saved_env = previous_paths(entry.name)
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
        systemd.daemon_reload(name=f"Reload systemd for {unit}", _if=unit_op.did_change)
        changed = [env_op, unit_op, *wait_ops, venv_changed]
        if limits_changed is not None:
            changed.append(limits_changed)
        if entry.model in models_changed:
            changed.append(models_changed[entry.model])
        if entry.rollout is not None:
            # A replica of an endpoint: out of its router, drained, restarted, back; pyinfra
            # runs this on at most max_unavailable hosts at once.
            restart_op = replica_rolled(
                name=f"Roll {unit} through endpoint {entry.rollout.endpoint} "
                "(its configuration changed)",
                rollout=entry.rollout,
                unit=unit,
                port=entry.port,
                served_name=entry.served_name,
                env_file=entry.env_path,
                restore={entry.unit_path: saved_unit, entry.env_path: saved_env},
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
                restore={entry.unit_path: saved_unit, entry.env_path: saved_env},
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
            port=entry.port,
            served_name=entry.served_name,
            env_file=entry.env_path,
            script=checker,
            python=python,
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
    if members:
        changed = [*uploaded["wait_healthy"][1], venv_changed]
        if limits_changed is not None:
            changed.append(limits_changed)
        group_members(members, uploaded, {
            entry.name: [*changed, *([models_changed[entry.model]]
                                     if entry.model in models_changed else [])]
            for entry in members
        })
