"""Endpoint routers: the pinned vllm-router in its own venv, one hardened unit per endpoint.

A router restarts only when its unit (worker list, policy, ports) or its release changed, and
the deploy finishes it only once a completion through it answers. Routers the fleet file no
longer declares on a host are stopped and removed. The replicas' rolling updates are part of
the servers' deploy (:mod:`deploys.services`, :func:`operations.endpoints.replica_rolled`).

Example:
    from deploys.endpoints import retired_routers, routers
    retired_routers()
    routers()
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from deploys.plan import current_plan, upload_programs
from facts.vllm import PythonVersion
from fleet.catalog.paths import ENV_DIR, ROUTER_VENV_DIR
from operations.endpoints import undeclared_routers_removed
from operations.python import venv_ready
from operations.services import server_answers, server_restarted
from operations.vllm import vllm_installed


@deploy("Routers no longer in the fleet file")
def retired_routers() -> None:
    """Stop and remove the router units of endpoints the fleet file no longer has here."""
    plan = current_plan()
    undeclared_routers_removed(
        name="Remove routers that are no longer in the fleet file",
        keep=[router.unit for router in plan.routers],
        unit_dir=plan.unit_dir,
    )


@deploy("Router tools")
def router_tools() -> None:
    """Upload the router's worker control to a router's host before any replica rolls (the
    rolling updates run it there, and the servers' deploy comes before the routers')."""
    if current_plan().routers:
        # Uploaded with the same roles as the servers' and the routers' deploys do, so that each
        # file has one mode on the host: check_ready and restart_or_restore are programs there
        # (755) and modules of roll_replica here; uploaded as modules first (644), they changed
        # mode twice on every deploy (the e2e run's second deploy: 4 changes, no restart).
        upload_programs({
            "check_ready": "the readiness check",
            "restart_or_restore": "the restart-or-restore helper",
            "roll_replica": "the replica updater (rolling updates of endpoints)",
            "canary": "the canary gate (measures an upgraded replica against an old one)",
        })


@deploy("Endpoint routers")
def routers() -> None:
    """Install the pinned vllm-router, write each router's unit, (re)start what changed and
    check a completion through each router that (re)started."""
    plan = current_plan()
    if not plan.routers:
        return
    distro = host.get_fact(PythonVersion)
    if distro is None:
        raise DeployError(f"{host.name}: python3 is missing; the router's venv needs it")
    version = ".".join(distro.split(".")[:2])
    venv_ready(
        name=f"Create the router venv (Python {version})",
        venv=ROUTER_VENV_DIR,
        version=version,
        interpreter="python3",
    )
    requirements = {router.requirement for router in plan.routers}
    if len(requirements) > 1:
        raise DeployError(
            f"{host.name}: its routers pin different vllm-router releases "
            f"({', '.join(sorted(requirements))}); one venv holds one: pin one release"
        )
    first = plan.routers[0]
    install_op = vllm_installed(
        name=f"Install {first.requirement}",
        venv=ROUTER_VENV_DIR,
        requirement=first.requirement,
        version=first.version,
    )
    uploaded = upload_programs({
        "check_ready": "the readiness check",
        "restart_or_restore": "the restart-or-restore helper",
        "roll_replica": "the replica updater (rolling updates of endpoints)",
        "request": "the request program (fleet verify, fleet complete)",
    })
    checker, restarter = (uploaded[name][0] for name in ("check_ready", "restart_or_restore"))
    files.directory(
        name="Create the environment file directory",
        path=ENV_DIR,
        user="root",
        group="root",
        mode="700",
    )
    for router in plan.routers:
        unit = router.unit
        env_op = files.put(
            name=f"Write the key file of endpoint {router.endpoint} (for checks)",
            src=StringIO(router.env_text or ""),
            dest=router.env_path,
            user="root",
            group="root",
            mode="600",
        )
        unit_op = files.put(
            name=f"Write {unit}",
            src=StringIO(router.unit_text),
            dest=router.unit_path,
            user="root",
            group="root",
            mode="644",
        )
        systemd.daemon_reload(name=f"Reload systemd for {unit}", _if=unit_op.did_change)
        restart_op = server_restarted(
            name=f"Restart {unit} (its unit or release changed)",
            unit=unit,
            restore={},
            script=restarter,
            _if=any_changed(unit_op, install_op),
        )
        start_op = systemd.service(
            name=f"Enable and start {unit}", service=unit, running=True, enabled=True
        )
        server_answers(
            name=f"Check that endpoint {router.endpoint} answers a completion through its router",
            url=router.url,
            served_name=router.served_name,
            env_file=router.env_path,
            script=checker,
            python="python3",
            _if=any_changed(restart_op, start_op, env_op),
        )
