"""A group's operations and its refusal, with fake facts: restarts that do not block, bounded
waits that name the member, and a deploy refused before any operation when a member host is
not part of it (unreachable)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api.exceptions import DeployError
from pyinfra.context import ctx_host

from deploys.multinode import groups_reachable
from fleet.load import load_fleet
from fleet.render import host_plan
from operations.multinode import member_restarted, member_up
from tests.support.opharness import FakeHost, run_op

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "inventory" / "examples" / "h200-pair.yaml"


def test_a_member_restarts_without_waiting_for_the_others() -> None:
    commands, _ = run_op(member_restarted, {}, unit="vllm-big.service")
    assert commands == ["systemctl restart --no-block vllm-big.service"]


def test_the_wait_names_the_member_and_is_bounded() -> None:
    commands, _ = run_op(member_up, {}, unit="vllm-big.service",
                         member="worker box-2 (node rank 1, joins box)", group="big",
                         timeout=600, script="/h/group_wait.py")
    assert commands == [
        "python3 /h/group_wait.py --unit vllm-big.service --member "
        "'worker box-2 (node rank 1, joins box)' --group big --timeout 600"
    ]


def fake_head(active: list[str], failed: list[str]) -> FakeHost:
    fleet = load_fleet(EXAMPLE)
    fake = FakeHost({})
    fake.name = "hgx-h200-01"
    fake.data = {"fleet": host_plan(fleet, "hgx-h200-01", secrets=lambda ref: "k")}
    fake.state = SimpleNamespace(
        activated_hosts=[SimpleNamespace(name=n) for n in active],
        failed_hosts=[SimpleNamespace(name=n) for n in failed],
    )
    return fake


def test_an_unreachable_worker_host_refuses_the_deploy_naming_it() -> None:
    with ctx_host.use(fake_head(["hgx-h200-01"], ["hgx-h200-02"])), pytest.raises(
        DeployError, match=r"member host hgx-h200-02 is not reachable.*nothing was restarted"
    ):
        groups_reachable()


def test_every_member_present_goes_ahead() -> None:
    with ctx_host.use(fake_head(["hgx-h200-01", "hgx-h200-02"], [])):
        groups_reachable()
