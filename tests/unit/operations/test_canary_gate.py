"""The canary gate inside the rollout (:func:`operations.endpoints.roll`): what runs where, in
which order, and what a failed canary does. The hosts answer from a script (as in
test_rollout_stop.py); tests/e2e/test_endpoints_e2e.py runs the same for real."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyinfra.api import StringCommand

from fleet.hostplan.types import ReplicaCanary, ReplicaRollout
from operations import canary as gate
from operations import endpoints as ops
from operations.canary import CanaryCommands, canary_commands
from tests.unit.operations.test_rollout_stop import ROUTER_OK, ScriptedHost, State

CANARY = ReplicaCanary((("b/y", "http://127.0.0.1:2"),), "/etc/vllm-fleet/router-tiny.env",
                       8, 128, 32, 0, 0.25, 0.25, 2.0)  # fmt: skip


def rollout(replica: str) -> ReplicaRollout:
    return ReplicaRollout(
        "tiny", replica, "a", "http://127.0.0.1:1", f"http://{replica}", 1, 5, CANARY
    )


def commands(replica: str) -> tuple[object, ...]:
    steps = tuple(StringCommand(step, replica) for step in ("remove", "update", "abandon", "add"))
    return (*steps, CanaryCommands(*(StringCommand(s, replica)
                                     for s in ("keep", "forget", "rollback", "measure"))))


@pytest.fixture(autouse=True)
def fresh_run() -> Iterator[None]:
    ops.STOPPED.clear()
    gate.DONE.clear()
    yield
    ops.STOPPED.clear()
    gate.DONE.clear()


PASSED = "canary: 10:00:00.000 tiny/a/x: passed: TTFT +1 % (margin 25 %), TPOT +0 % (margin 25 %)"
FAILED = "canary: 10:00:00.000 tiny/a/x: failed: TTFT P50 40.0 ms against 10.0 ms (+300 %, margin 25 %)"  # noqa: E501


def test_a_passed_canary_goes_back_and_the_next_replica_rolls_without_one() -> None:
    router = ScriptedHost("a", ROUTER_OK | {
        "keep": (True, "", ""), "update": (True, "updated", ""), "forget": (True, "", ""),
        "measure": (True, PASSED, ""),
    })  # fmt: skip
    state = State([router])
    assert ops.roll(state, router, rollout("a/x"), *commands("a/x"))
    # measured after the update, before it goes back into the router
    assert router.ran == ["remove a/x", "keep a/x", "update a/x", "measure a/x", "forget a/x",
                          "add a/x"]  # fmt: skip
    router.ran.clear()
    assert ops.roll(state, router, rollout("a/z"), *commands("a/z"))
    assert router.ran == ["remove a/z", "update a/z", "add a/z"]


def test_a_failed_canary_rolls_the_replica_back_and_stops_the_rollout() -> None:
    router = ScriptedHost("a", ROUTER_OK | {
        "keep": (True, "", ""), "update": (True, "updated", ""),
        "measure": (False, FAILED, ""), "rollback": (True, "back on its previous", ""),
    })  # fmt: skip
    other = ScriptedHost("b", {"abandon": (True, "not updated", "")})
    state = State([router, other])
    assert not ops.roll(state, router, rollout("a/x"), *commands("a/x"))
    assert router.ran == ["remove a/x", "keep a/x", "update a/x", "measure a/x", "rollback a/x",
                          "add a/x"]  # fmt: skip
    assert router.logged[-1] == (
        "rollout of endpoint tiny stopped at replica a/x: its canary failed: TTFT P50 40.0 ms "
        "against 10.0 ms (+300 %, margin 25 %) (rolled back to its previous configuration, "
        "serving again)"
    )
    assert not ops.roll(state, other, rollout("b/y"), *commands("b/y"))
    assert other.ran == ["abandon b/y"]


def test_a_rollback_that_did_not_serve_leaves_the_replica_out_of_the_router() -> None:
    router = ScriptedHost("a", ROUTER_OK | {
        "keep": (True, "", ""), "update": (True, "updated", ""),
        "measure": (False, FAILED, ""), "rollback": (False, "not serving", ""),
    })  # fmt: skip
    assert not ops.roll(State([router]), router, rollout("a/x"), *commands("a/x"))
    assert router.ran[-1] == "rollback a/x"  # stays out of the router
    assert router.logged[-1].endswith("(not serving after the rollback: see above)")


def test_nothing_kept_to_roll_back_to_goes_back_into_the_router_on_the_new_one() -> None:
    router = ScriptedHost("a", ROUTER_OK | {
        "keep": (True, "", ""), "update": (True, "updated", ""),
        "measure": (False, FAILED, ""),
        "rollback": (False, "rollout: 10:00:00.000 t/a/x: nothing kept to roll back to", ""),
    })  # fmt: skip
    assert not ops.roll(State([router]), router, rollout("a/x"), *commands("a/x"))
    assert router.ran[-2:] == ["rollback a/x", "add a/x"]
    assert router.logged[-1].endswith("(nothing kept to roll back to: it serves the new "
                                      "configuration)")


def test_a_failed_start_forgets_the_kept_copies_and_never_measures() -> None:
    router = ScriptedHost("a", ROUTER_OK | {
        "keep": (True, "", ""), "forget": (True, "", ""),
        "update": (False, "", "x is back on its previous configuration"),
    })  # fmt: skip
    assert not ops.roll(State([router]), router, rollout("a/x"), *commands("a/x"))
    assert router.ran == ["remove a/x", "keep a/x", "update a/x", "forget a/x", "add a/x"]


def test_the_measure_command_names_both_replicas_and_the_gate() -> None:
    pairs = ["--restore", "/etc/u=/var/p/u"]
    built = canary_commands(rollout("a/x"), "tiny/a/x", "vllm-x.service",
                            "http://127.0.0.2:18401", "tiny",
                            "/etc/vllm-fleet/x.env", pairs)  # fmt: skip
    assert built is not None
    measure = built.measure.get_raw_value()
    assert measure.startswith("python3 /usr/local/lib/vllm-fleet/hostside/canary.py ")
    for part in ("--new http://a/x", "--old tiny/b/y=http://127.0.0.1:2", "--model tiny",
                 "--key-file /etc/vllm-fleet/router-tiny.env", "--requests 8",
                 "--input-len 128", "--output-len 32", "--ttft-margin 0.25",
                 "--floor-ms 2.0"):  # fmt: skip
        assert part in measure
    assert built.rollback.get_raw_value().endswith(
        "canary_saved.py rollback --label tiny/a/x --unit vllm-x.service "
        "--url http://127.0.0.2:18401 "
        "--model tiny --env-file /etc/vllm-fleet/x.env --restore /etc/u=/var/p/u"
    )
    no_canary = ReplicaRollout("tiny", "a/x", "a", "u", "w", 1, 5)
    assert canary_commands(no_canary, "t", "u", "http://127.0.0.1:1", "m", "e", pairs) is None
