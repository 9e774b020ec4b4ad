"""Deploy tests without hosts: a @deploy's operations for several hosts at once, fake facts in,
each host's commands out in the order pyinfra runs them (its CLI's order: each operation on
every host before the next, operations matched across hosts by where they are called).

Example:
    from tests.support.deployharness import prepared
    steps = prepared({"a": plan_a, "b": plan_b}, lambda: group_members(...))
    [(host, name, commands), ...] = steps
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyinfra
from pyinfra.api import Config, Inventory, State
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state

from fleet.hostplan.types import PLAN_KEY, HostPlan

#: Facts a fresh host answers (nothing installed, no unit known); any other fact: None.
FRESH_FACTS: dict[str, Any] = {"SystemdStatus": {}, "SystemdEnabled": {}}


@dataclass(frozen=True)
class Step:
    """One operation on one host: its names (pyinfra keeps one set per operation, across the
    hosts that run it) and the commands it would run there.

    Example:
        >>> Step("a", ("Reload systemd",), ("systemctl daemon-reload",)).host
        'a'
    """

    host: str
    names: tuple[str, ...]
    commands: tuple[str, ...]


@contextmanager
def _cli_order() -> Iterator[None]:
    """pyinfra's CLI order (operations matched across hosts by their call site), not its API
    order (each host's operations counted on their own)."""
    before = pyinfra.is_cli
    pyinfra.is_cli = True
    try:
        yield
    finally:
        pyinfra.is_cli = before


def prepared(plans: dict[str, HostPlan], deploy: Callable[[], Any],
             facts: dict[str, Any] | None = None) -> list[Step]:
    """Run ``deploy`` for every host (its plan as ``host.data``, as inventory.py sets it) with
    fake facts, and return every host's operations in pyinfra's execution order."""
    answers = {**FRESH_FACTS, **(facts or {})}
    inventory = Inventory(([(name, {PLAN_KEY: plan}) for name, plan in plans.items()], {}))
    state = State(inventory, Config())
    state.set_stage(StateStage.Prepare)
    hosts = list(inventory)
    for host in hosts:
        state.activate_host(host)
        host.get_fact = _fake_facts(answers)  # type: ignore[method-assign]
    with _cli_order():
        for host in hosts:
            with ctx_state.use(state), ctx_host.use(host):
                deploy()
        steps = []
        for op_hash in state.get_op_order():
            for host in hosts:
                if op_hash not in state.ops[host]:
                    continue
                data = state.get_op_data_for_host(host, op_hash)
                with ctx_state.use(state), ctx_host.use(host):
                    commands = tuple(_text(c) for c in data.command_generator())
                steps.append(Step(host.name, tuple(sorted(state.get_op_meta(op_hash).names)),
                                  commands))
    return steps


def _fake_facts(answers: dict[str, Any]) -> Callable[..., Any]:
    def get_fact(cls: type, *args: Any, **kwargs: Any) -> Any:
        return answers.get(cls.__name__)
    return get_fact


def _text(command: Any) -> str:
    return command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)

