"""Servers taken out of the fleet file are stopped and removed; hand-written units are not.

Operation level (fake facts); tests/test_e2e.py runs the same on a real systemd host.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from facts.host import FLEET_UNIT_MARKER, FleetServerUnits
from operations import services as ops
from tests.support.opharness import run_op

ROOT = Path(__file__).resolve().parents[3]
ARGS = {"unit_dir": "/etc/systemd/system"}


def test_nothing_to_do_when_the_host_has_only_declared_units() -> None:
    commands, noops = run_op(
        ops.undeclared_servers_removed,
        {"FleetServerUnits": ["vllm-chat.service"]},
        keep=["vllm-chat.service", "vllm-embed.service"],
        **ARGS,
    )
    assert commands == []
    assert noops == ["no server units beyond those the fleet file declares"]


def test_an_undeclared_server_is_stopped_disabled_and_its_files_removed() -> None:
    commands, _ = run_op(
        ops.undeclared_servers_removed,
        {"FleetServerUnits": ["vllm-chat.service", "vllm-old.service"]},
        keep=["vllm-chat.service"],
        **ARGS,
    )
    assert commands[0] == "systemctl disable --now vllm-old.service || true"
    assert commands[1] == (
        "rm -f /etc/systemd/system/vllm-old.service /etc/vllm-fleet/old.env "
        "/var/lib/vllm-fleet/previous/vllm-old.service /var/lib/vllm-fleet/previous/old.env"
    )
    assert commands[2] == "systemctl daemon-reload"
    assert "vllm-chat" not in " ".join(commands)


def test_the_fact_lists_only_units_that_carry_the_marker(tmp_path: Path) -> None:
    """The fact's shell command, run for real on a folder of units."""
    (tmp_path / "vllm-ours.service").write_text(f"{FLEET_UNIT_MARKER}\n[Unit]\n")
    governor = ROOT / "templates" / "cpu-governor.service.j2"  # vllm-fleet's, not a server
    (tmp_path / "vllm-fleet-cpu-governor.service").write_text(governor.read_text())
    (tmp_path / "vllm-mine.service").write_text("# my own vLLM, by hand\n[Service]\n")
    (tmp_path / "vllm-late.service").write_text(f"[Unit]\n{FLEET_UNIT_MARKER}\n")  # not line 1
    (tmp_path / "other.service").write_text(f"{FLEET_UNIT_MARKER}\n")
    (tmp_path / "vllm-.service.d").mkdir()  # the shared drop-in folder
    fact = FleetServerUnits()
    command = fact.command(unit_dir=str(tmp_path)).get_raw_value()
    output = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert fact.process(output) == ["vllm-ours.service"]


def test_the_fact_is_empty_on_a_host_without_units(tmp_path: Path) -> None:
    command = FleetServerUnits().command(unit_dir=str(tmp_path)).get_raw_value()
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert FleetServerUnits().process(output.stdout.splitlines()) == []


def test_the_rendered_unit_starts_with_the_marker() -> None:
    """What the fact looks for is what the template writes."""
    from fleet.hostplan.render import host_plan
    from fleet.load import load_fleet

    fleet = load_fleet(ROOT / "inventory" / "sandbox.yaml")
    plan = host_plan(fleet, next(iter(fleet.hosts)))
    assert plan.servers[0].unit_text.splitlines()[0] == FLEET_UNIT_MARKER
