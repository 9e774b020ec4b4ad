"""Servers across hosts: write every member's unit, restart the group in order, wait for it.

A group (``ServerUnit.group``) is one replica spread over several hosts. Its members' units
all carry the group's revision, so a change to any member changes every member's unit and the
whole group restarts: workers first, then the head, none of them blocking
(``systemctl restart --no-block``), and only then the bounded waits — each worker until it has
joined (its failure names the worker), then the head until it serves and answers a real
completion. pyinfra runs each operation on every host before the next, which gives the order
across hosts. Before anything runs, a group whose member host is not part of this deploy
(unreachable, or left out by ``--limit``) is refused: the running group is left as it is.

Example:
    from deploys.multinode import groups_reachable, group_members
    groups_reachable()                       # before any operation
    group_members(entries, uploaded, changed)  # inside the services deploy
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from deploys.plan import current_plan
from fleet.hostplan import ServerUnit
from operations.multinode import member_restarted, member_up
from operations.services import server_answers, server_args_valid

#: Seconds the head may take, once every member has joined, to load and answer.
HEAD_EXTRA = 300


def groups_reachable() -> None:
    """Refuse the deploy when a member host of one of this host's groups is not in it.

    pyinfra drops a host it cannot connect to and goes on with the others; a group restarted
    without one of its members would never serve again, so this stops the deploy first.
    """
    plan = current_plan()
    present = {other.name for other in host.state.activated_hosts}
    failed = {other.name for other in host.state.failed_hosts}
    for entry in plan.servers:
        if entry.group is None:
            continue
        missing = [m for m in entry.group.members if m not in present or m in failed]
        if missing:
            raise DeployError(
                f"group {entry.group.server}: member host {', '.join(missing)} is not reachable "
                "(or not part of this deploy); nothing was restarted — the running group is "
                "left as it is. Bring the host back (or deploy every member), then deploy again."
            )


def _member(entry: ServerUnit) -> str:
    group = entry.group
    assert group is not None
    if group.is_head:
        return f"head {group.head}"
    return f"worker {host.name} (node rank {group.rank}, joins {group.head})"


def group_members(
    entries: list[ServerUnit],
    uploaded: dict[str, tuple[str, list[OperationMeta]]],
    changed: dict[str, list[OperationMeta]],
) -> None:
    """Write, restart in order and wait for this host's part of each group.

    + entries: this host's group members (``ServerUnit`` with a ``group``)
    + uploaded: the host programs (:func:`deploys.plan.upload_programs`)
    + changed: by server name, the operations whose change restarts it (venv, model, limits)
    """
    plan = current_plan()
    python = plan.python_bin
    validator = uploaded["validate_args"][0]
    waiter = uploaded["group_wait"][0]
    checker = uploaded["check_ready"][0]
    program_ops = [op for name in ("vllm_serve", "wait_joined", "wait_healthy")
                   for op in uploaded[name][1]]
    changes: dict[str, list[OperationMeta]] = {}
    restart: dict[str, OperationMeta] = {}
    started: dict[str, OperationMeta] = {}
    for entry in entries:
        server_args_valid(
            name=f"Check the flags of {entry.unit} ({_member(entry)}) with the installed vLLM",
            unit=entry.unit, unit_path=entry.unit_path, unit_text=entry.unit_text,
            python=python, script=validator,
        )
        env_op = files.put(
            name=f"Write the environment of {entry.unit}",
            src=StringIO(entry.env_text or ""), dest=entry.env_path,
            user="root", group="root", mode="600",
        )
        unit_op = files.put(
            name=f"Write {entry.unit} ({_member(entry)})",
            src=StringIO(entry.unit_text), dest=entry.unit_path,
            user="root", group="root", mode="644",
        )
        systemd.daemon_reload(name=f"Reload systemd for {entry.unit}", _if=unit_op.did_change)
        changes[entry.name] = [env_op, unit_op, *program_ops, *changed.get(entry.name, [])]
    for entry in entries:
        if entry.role == "worker":
            restart[entry.name] = member_restarted(
                name=f"Restart {entry.unit} ({_member(entry)}) without waiting",
                unit=entry.unit, _if=any_changed(*changes[entry.name]))
    for entry in entries:
        if entry.role == "head":
            restart[entry.name] = member_restarted(
                name=f"Restart {entry.unit} ({_member(entry)}) without waiting",
                unit=entry.unit, _if=any_changed(*changes[entry.name]))
    for entry in entries:
        started[entry.name] = systemd.service(
            name=f"Enable and start {entry.unit}", service=entry.unit, running=True,
            enabled=True,
        )
    for entry in entries:
        group = entry.group
        assert group is not None
        if entry.role == "worker":
            member_up(name=f"Wait until {_member(entry)} has joined", unit=entry.unit,
                      member=_member(entry), group=group.server, timeout=group.join_timeout,
                      script=waiter, _if=any_changed(restart[entry.name], started[entry.name]))
    for entry in entries:
        group = entry.group
        assert group is not None
        if entry.role == "head":
            head_changed = any_changed(restart[entry.name], started[entry.name])
            member_up(name=f"Wait until the head of {group.server} serves, every member joined",
                      unit=entry.unit, member=_member(entry), group=group.server,
                      timeout=group.join_timeout + HEAD_EXTRA, script=waiter, _if=head_changed)
            server_answers(
                name=f"Check that {group.server} answers a completion (the whole group)",
                port=entry.port, served_name=entry.served_name, env_file=entry.env_path,
                script=checker, python=python, _if=head_changed,
            )
