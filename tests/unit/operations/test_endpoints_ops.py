"""Endpoint operations: routers taken out of the fleet file are retired; a replica's rollout is
one callback carrying the exact host-side commands (tests/e2e/test_endpoints_e2e.py runs it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pyinfra.context import ctx_host

from facts.router import ROUTER_UNIT_MARKER, FleetRouterUnits
from fleet.hostplan.render import host_plan
from fleet.hostplan.types import ReplicaRollout
from fleet.load import load_fleet
from operations import endpoints as ops
from tests.support.opharness import FakeHost, run_op

ROOT = Path(__file__).resolve().parents[3]
VALID = ROOT / "tests" / "data" / "valid" / "endpoint-two-replicas.yaml"
ROLLOUT = ReplicaRollout("tiny", "b/tiny-b", "a", "http://127.0.0.1:18400",
                         "http://127.0.0.1:18402", 1, 30)  # fmt: skip


def test_nothing_to_retire_when_only_declared_routers_are_there() -> None:
    commands, noops = run_op(
        ops.undeclared_routers_removed,
        {"FleetRouterUnits": ["vllm-fleet-router-chat.service"]},
        keep=["vllm-fleet-router-chat.service"],
        unit_dir="/etc/systemd/system",
    )
    assert commands == []
    assert noops == ["no router units beyond those the fleet file declares"]


def test_an_undeclared_router_is_stopped_and_removed() -> None:
    commands, _ = run_op(
        ops.undeclared_routers_removed,
        {"FleetRouterUnits": ["vllm-fleet-router-chat.service", "vllm-fleet-router-old.service"]},
        keep=["vllm-fleet-router-chat.service"],
        unit_dir="/etc/systemd/system",
    )
    assert commands[:3] == [
        "systemctl disable --now vllm-fleet-router-old.service || true",
        "rm -f /etc/systemd/system/vllm-fleet-router-old.service",
        "systemctl daemon-reload",
    ]
    assert "router-chat" not in " ".join(commands)


def test_the_fact_lists_only_router_units_with_the_marker(tmp_path: Path) -> None:
    (tmp_path / "vllm-fleet-router-a.service").write_text(f"{ROUTER_UNIT_MARKER}\n[Unit]\n")
    (tmp_path / "vllm-fleet-router-mine.service").write_text("# by hand\n")
    (tmp_path / "vllm-fleet-cpu-governor.service").write_text(f"{ROUTER_UNIT_MARKER}\n")
    command = FleetRouterUnits().command(unit_dir=str(tmp_path)).get_raw_value()
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert FleetRouterUnits().process(output.stdout.splitlines()) == [
        "vllm-fleet-router-a.service"
    ]


def test_the_rendered_router_unit_starts_with_the_marker() -> None:
    plan = host_plan(load_fleet(VALID), "gpu-a", secrets=lambda ref: "")
    assert plan.routers[0].unit_text.splitlines()[0] == ROUTER_UNIT_MARKER


def test_a_rollout_is_one_callback_with_the_four_steps() -> None:
    fake = FakeHost({})
    with ctx_host.use(fake):
        (command,) = list(ops.replica_rolled._inner(
            rollout=ROLLOUT, unit="vllm-tiny-b.service", url="http://127.0.0.2:18402",
            served_name="tiny",
            env_file="/etc/vllm-fleet/tiny-b.env",
            restore={"/etc/systemd/system/vllm-tiny-b.service": "/p/vllm-tiny-b.service"},
            roll_script="/h/roll_replica.py", router_script="/h/router_workers.py",
        ))  # fmt: skip
    assert command.function is ops.roll
    rollout, remove, update, abandon, add = command.args
    assert rollout is ROLLOUT
    assert remove.get_raw_value() == (
        "python3 /h/router_workers.py --router http://127.0.0.1:18400 --label tiny/b/tiny-b "
        "remove --worker http://127.0.0.1:18402"
    )
    assert add.get_raw_value().endswith(" add --worker http://127.0.0.1:18402")
    assert update.get_raw_value().endswith(
        "--restore /etc/systemd/system/vllm-tiny-b.service=/p/vllm-tiny-b.service "
        "--drain-timeout 30"
    )
    assert " --url http://127.0.0.2:18402 " in update.get_raw_value()
    assert abandon.get_raw_value().endswith("--abandon")
