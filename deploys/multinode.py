"""Servers across hosts: write every member's unit, restart the group in order, wait for it.

A group (``ServerUnit.group``) is one replica spread over several hosts. Its members' units
all carry the group's revision, so a change to any member changes every member's unit and the
whole group restarts: workers first, then the head, none of them blocking
(``systemctl restart --no-block``), and only then the bounded waits — each worker until it has
joined (its failure names the worker), then the head until it serves and answers a real
completion. pyinfra runs each operation on every host before the next, which gives the order
across hosts. Before anything runs, a group whose member host is not part of this deploy
(unreachable, or left out by ``--limit``) is refused: the running group is left as it is.

A group that does not come up with its new configuration is put back as a single server is
(restart-or-restore): every member kept its previous unit and environment before the new ones
were written; the waits do not stop the deploy on the failing host, they are gathered per group
(:data:`WAITS`), and when one of them failed, every member gets its previous files back and is
restarted, workers first, then the head, and the deploy fails on every member, saying so.

Example:
    from deploys.multinode import groups_reachable, group_members
    groups_reachable()                       # before any operation
    group_members(entries, uploaded, changed)  # inside the services deploy
"""

from __future__ import annotations

from collections.abc import Callable
from io import StringIO

from pyinfra import host
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from deploys.plan import current_plan, slot
from deploys.tls import tls_restore, tls_saved, tls_written
from fleet.hostplan.types import ServerUnit
from operations.multinode import (
    group_refused,
    member_restarted,
    member_restored,
    member_up,
    previous_forgotten,
)
from operations.services import previous_saved, server_answers, server_args_valid

#: Seconds the head may take, once every member has joined, to load and answer.
HEAD_EXTRA = 300

#: Every member's readiness operations (the waits, the head's completion), by group (head host,
#: server name), gathered as each host's deploy is prepared: pyinfra runs each operation on
#: every host before the next, so when the restore runs, every member's waits are over.
WAITS: dict[tuple[str, str], list[OperationMeta]] = {}


def group_failed(key: tuple[str, str]) -> Callable[[], bool]:
    """Whether one of the group's readiness operations failed, on any member (at execution).

    Example:
        >>> group_failed(("box", "big"))()
        False
    """
    return lambda: any(meta.is_complete() and meta.did_error() for meta in WAITS.get(key, []))


def group_served(key: tuple[str, str]) -> Callable[[], bool]:
    """The opposite of :func:`group_failed`."""
    failed = group_failed(key)
    return lambda: not failed()


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
    + changed: by server name, the operations whose change restarts it (venv, model, limits);
      the programs' uploads that restart it come from its plan (``restarts_on``)
    """
    plan = current_plan()
    python = plan.python_bin
    validator = uploaded["validate_args"][0]
    waiter = uploaded["group_wait"][0]
    checker = uploaded["check_ready"][0]
    changes: dict[str, list[OperationMeta]] = {}
    restart: dict[str, OperationMeta] = {}
    started: dict[str, OperationMeta] = {}
    for entry in entries:
        with slot(entry.slot):
            server_args_valid(
                name=f"Check the flags of {entry.unit} ({_member(entry)}) with the installed vLLM",
                unit=entry.unit, unit_path=entry.unit_path, unit_text=entry.unit_text,
                python=python, script=validator,
            )
            saved_unit, saved_env = entry.previous
            previous_saved(name=f"Keep the current environment of {entry.unit}",
                           path=entry.env_path, text=entry.env_text or "", backup=saved_env)
            previous_saved(name=f"Keep the current {entry.unit}", path=entry.unit_path,
                           text=entry.unit_text, backup=saved_unit)
            tls_saved(entry)
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
            tls_ops = tls_written(entry)
            systemd.daemon_reload(name=f"Reload systemd for {entry.unit}", _if=unit_op.did_change)
            programs = [op for name in entry.restarts_on for op in uploaded[name][1]]
            changes[entry.name] = [env_op, unit_op, *tls_ops, *dict.fromkeys(programs),
                                   *changed.get(entry.name, []), *_ray_head_written(entry)]
    for entry in entries:
        with slot(entry.slot):
            if entry.role == "worker":
                restart[entry.name] = member_restarted(
                    name=f"Restart {entry.unit} ({_member(entry)}) without waiting",
                    unit=entry.unit, _if=any_changed(*changes[entry.name]))
    for entry in entries:
        with slot(entry.slot):
            if entry.role == "head":
                if entry.ray_head is not None:  # its restart restarts the head's vLLM (Requires=)
                    member_restarted(
                        name=f"Restart {entry.ray_head.unit} (the Ray head) without waiting",
                        unit=entry.ray_head.unit, _if=any_changed(*changes[entry.name]))
                restart[entry.name] = member_restarted(
                    name=f"Restart {entry.unit} ({_member(entry)}) without waiting",
                    unit=entry.unit, _if=any_changed(*changes[entry.name]))
    for entry in entries:
        with slot(entry.slot):
            group = entry.group
            assert group is not None
            # `systemctl start` waits for the member's start (a worker's join): a failure there is
            # the group's, restored below, not the end of this host's deploy
            if entry.ray_head is not None:
                systemd.service(name=f"Enable {entry.ray_head.unit} (the Ray head)",
                                service=entry.ray_head.unit, enabled=True)
            started[entry.name] = systemd.service(
                name=f"Enable and start {entry.unit}", service=entry.unit, running=True,
                enabled=True, _ignore_errors=True,
            )
            WAITS.setdefault((group.head, group.server), []).append(started[entry.name])
    for entry in entries:
        with slot(entry.slot):
            group = entry.group
            assert group is not None
            if entry.role == "worker":
                WAITS.setdefault((group.head, group.server), []).append(member_up(
                    name=f"Wait until {_member(entry)} has joined", unit=entry.unit,
                    member=_member(entry), group=group.server, timeout=group.join_timeout,
                    script=waiter, _if=any_changed(restart[entry.name], started[entry.name]),
                    _ignore_errors=True))
    for entry in entries:
        with slot(entry.slot):
            group = entry.group
            assert group is not None
            if entry.role == "head":
                key = (group.head, group.server)
                # a worker that did not join fails the group: the head is not waited for then
                head_changed = [any_changed(restart[entry.name], started[entry.name]),
                                group_served(key)]
                waits = WAITS.setdefault(key, [])
                waits.append(member_up(
                    name=f"Wait until the head of {group.server} serves, every member joined",
                    unit=entry.unit, member=_member(entry), group=group.server,
                    timeout=group.join_timeout + HEAD_EXTRA, script=waiter, _if=head_changed,
                    _ignore_errors=True))
                waits.append(server_answers(
                    name=f"Check that {group.server} answers a completion (the whole group)",
                    url=entry.url, served_name=entry.served_name, env_file=entry.env_path,
                    script=checker, python=python, tls=entry.reach.probe_args, _if=head_changed,
                    _ignore_errors=True))
    _restore_or_forget(entries, restart, started)


def _restore_or_forget(
    entries: list[ServerUnit],
    restart: dict[str, OperationMeta],
    started: dict[str, OperationMeta],
) -> None:
    """Put the previous configuration back on every member of a group that failed (workers,
    then the head) and fail the deploy there; or, once it serves, forget the saved copies."""
    # two call sites, not one loop: pyinfra orders operations by where they are called, so
    # the workers' restore runs on every host before the head's
    for entry in entries:
        with slot(entry.slot):
            if entry.role == "worker":
                _restored(entry)
    for entry in entries:
        with slot(entry.slot):
            if entry.role == "head" and entry.ray_head is not None:
                member_restored(
                    name=f"Put the previous {entry.ray_head.unit} back: the group did not come up",
                    unit=entry.ray_head.unit,
                    restore={entry.ray_head.unit_path: entry.ray_head.previous},
                    _if=group_failed((entry.group.head, entry.group.server)))
    for entry in entries:
        with slot(entry.slot):
            if entry.role == "head":
                _restored(entry)
    for entry in entries:
        with slot(entry.slot):
            group = entry.group
            assert group is not None
            key = (group.head, group.server)
            group_refused(name=f"Fail the deploy of group {group.server} ({_member(entry)})",
                          group=group.server, member=_member(entry), _if=group_failed(key))
            previous_forgotten(
                name=f"Forget the previous configuration of {entry.unit} (the group serves)",
                saved=[*entry.previous, *([entry.ray_head.previous] if entry.ray_head else []),
                       *tls_restore(entry).values()],
                _if=[any_changed(restart[entry.name], started[entry.name]), group_served(key)])


def _restored(entry: ServerUnit) -> None:
    group = entry.group
    assert group is not None
    saved_unit, saved_env = entry.previous
    member_restored(
        name=f"Put the previous {entry.unit} back ({_member(entry)}): the group did not come up",
        unit=entry.unit, restore={entry.unit_path: saved_unit, entry.env_path: saved_env,
                                  **tls_restore(entry)},
        _if=group_failed((group.head, group.server)))


def _ray_head_written(entry: ServerUnit) -> list[OperationMeta]:
    """Keep and write the Ray head unit of a head over Ray; the operation whose change
    restarts the group (none for any other member; the programs it runs are in the plan's
    ``restarts_on``)."""
    ray = entry.ray_head
    if ray is None:
        return []
    previous_saved(name=f"Keep the current {ray.unit}", path=ray.unit_path,
                   text=ray.unit_text, backup=ray.previous)
    unit_op = files.put(
        name=f"Write {ray.unit} (the Ray head of {entry.name})",
        src=StringIO(ray.unit_text), dest=ray.unit_path, user="root", group="root", mode="644",
    )
    systemd.daemon_reload(name=f"Reload systemd for {ray.unit}", _if=unit_op.did_change)
    return [unit_op]
