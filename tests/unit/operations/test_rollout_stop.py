"""The rollout's decisions across replicas (:func:`operations.endpoints.roll`): what runs where,
and how the first failure stops the endpoint's rollout. The hosts here answer from a script,
standing in for their SSH connections; tests/e2e/test_endpoints_e2e.py runs the same for real."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pyinfra.api import StringCommand
from pyinfra.connectors.util import CommandOutput, OutputLine

from fleet.hostplan.types import ReplicaRollout
from operations import endpoints as ops


class ScriptedHost:
    """A host whose commands answer from a script: (substring → ok, stdout, stderr)."""

    def __init__(self, name: str, script: dict[str, tuple[bool, str, str]]) -> None:
        self.name, self.script, self.data = name, script, {}
        self.ran: list[str] = []
        self.logged: list[str] = []

    def run_shell_command(self, command: StringCommand, **kwargs: Any):
        text = command.get_raw_value()
        self.ran.append(text)
        for part, (ok, out, err) in self.script.items():
            if part in text:
                lines = [OutputLine("stdout", x) for x in out.splitlines()]
                lines += [OutputLine("stderr", x) for x in err.splitlines()]
                return ok, CommandOutput(lines)
        raise AssertionError(f"{self.name}: unexpected command {text}")

    def log_styled(self, message: str, **kwargs: Any) -> None:
        self.logged.append(message)


class State:
    def __init__(self, hosts: list[ScriptedHost]) -> None:
        self.inventory = self
        self.hosts = {h.name: h for h in hosts}

    def get_host(self, name: str, default: Any = None) -> Any:
        return self.hosts.get(name, default)


def rollout(replica: str) -> ReplicaRollout:
    return ReplicaRollout("tiny", replica, "a", "http://127.0.0.1:1", f"http://{replica}", 1, 5)


def commands(replica: str) -> tuple[StringCommand, ...]:
    return tuple(StringCommand(step, replica) for step in ("remove", "update", "abandon", "add"))


@pytest.fixture(autouse=True)
def fresh_run() -> Iterator[None]:
    ops.STOPPED.clear()
    yield
    ops.STOPPED.clear()


ROUTER_OK = {"remove": (True, "out", ""), "add": (True, "back", "")}


def test_a_good_update_goes_out_updates_and_comes_back() -> None:
    router = ScriptedHost("a", ROUTER_OK | {"update": (True, "updated", "")})
    assert ops.roll(State([router]), router, rollout("a/x"), *commands("a/x"))
    assert router.ran == ["remove a/x", "update a/x", "add a/x"]


def test_the_first_failure_stops_the_rollout_and_the_next_replica_keeps_its_old_files() -> None:
    router = ScriptedHost(
        "a", ROUTER_OK | {"update": (False, "", "x is back on its previous configuration")}
    )
    other = ScriptedHost("b", {"abandon": (True, "not updated", "")})
    state = State([router, other])
    assert not ops.roll(state, router, rollout("a/x"), *commands("a/x"))
    # restored and serving again: back into the router
    assert router.ran == ["remove a/x", "update a/x", "add a/x"]
    assert "stopped at replica a/x" in router.logged[-1]
    assert not ops.roll(state, other, rollout("b/y"), *commands("b/y"))
    assert other.ran == ["abandon b/y"]  # never taken out, never restarted
    assert "b/y not updated: the rollout of endpoint tiny stopped at a/x" in other.logged[-1]


def test_a_replica_that_did_not_come_back_at_all_stays_out_of_the_router() -> None:
    router = ScriptedHost("a", ROUTER_OK | {"update": (False, "", "x is not serving")})
    assert not ops.roll(State([router]), router, rollout("a/x"), *commands("a/x"))
    assert router.ran == ["remove a/x", "update a/x"]
    assert "did not start either" in router.logged[-1]


def test_a_router_that_refuses_stops_before_any_restart() -> None:
    router = ScriptedHost("a", {"remove": (False, "", "HTTP 500")})
    assert not ops.roll(State([router]), router, rollout("a/x"), *commands("a/x"))
    assert router.ran == ["remove a/x"]
    assert "the router did not take it out" in router.logged[-1]
