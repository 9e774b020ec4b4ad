"""A group's operations and its refusal, with fake facts: restarts that do not block, bounded
waits that name the member, and a deploy refused before any operation when a member host is
not part of it (unreachable)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import ctx_host

from deploys.multinode import WAITS, group_failed, groups_reachable
from fleet.hostplan.render import host_plan
from fleet.load import load_fleet
from operations.multinode import (
    group_refused,
    member_restarted,
    member_restored,
    member_up,
    previous_forgotten,
)
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


def test_a_failed_group_puts_each_members_saved_files_back_and_restarts_it() -> None:
    commands, _ = run_op(member_restored, {}, unit="vllm-big.service", restore={
        "/etc/systemd/system/vllm-big.service": "/p/vllm-big.service",
        "/etc/vllm-fleet/big.env": "/p/big.env"})
    assert commands == [
        "if test -e /p/vllm-big.service ; then cp -p /p/vllm-big.service "
        "/etc/systemd/system/vllm-big.service && rm -f /p/vllm-big.service ; fi",
        "if test -e /p/big.env ; then cp -p /p/big.env /etc/vllm-fleet/big.env && "
        "rm -f /p/big.env ; fi",
        "systemctl daemon-reload",
        "systemctl restart --no-block vllm-big.service",
    ]


def test_the_restore_runs_as_the_shell_means_it(tmp_path: Path) -> None:
    live, saved, fresh = tmp_path / "unit", tmp_path / "saved", tmp_path / "fresh"
    live.write_text("new"), saved.write_text("old")
    commands, _ = run_op(member_restored, {}, unit="u", restore={
        str(live): str(saved), str(fresh): str(tmp_path / "never-saved")})
    for command in commands[:2]:
        subprocess.run(command, shell=True, check=True)
    assert live.read_text() == "old" and not saved.exists()  # the saved copy is used once
    assert not fresh.exists()  # nothing saved: the file is left as it is


def test_the_deploy_fails_on_every_member_saying_what_was_done() -> None:
    (command,), _ = run_op(group_refused, {}, group="big", member="head box")
    result = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert "group big did not come up with its new configuration" in result.stderr
    assert "previous unit and environment, where one was saved, are back" in result.stderr


def test_saved_copies_are_forgotten_once_the_group_serves() -> None:
    commands, _ = run_op(previous_forgotten, {}, saved=["/p/b.env", "/p/a.service"])
    assert commands == ["rm -f /p/a.service /p/b.env"]


def done(success: bool | None) -> OperationMeta:
    """An operation's result, as pyinfra leaves it (None: never executed)."""
    meta = OperationMeta("h", is_change=None)
    if success is not None:
        meta.set_complete(success, [], CommandOutput([]))
    return meta


def test_one_failed_wait_on_any_member_fails_the_whole_group() -> None:
    key = ("box", "grp-test")
    WAITS[key] = [done(True), done(None)]
    assert not group_failed(key)()  # a skipped wait (no restart) or one not run: no failure
    WAITS[key].append(done(False))
    assert group_failed(key)()
    assert not group_failed(("box", "other"))()
    del WAITS[key]
