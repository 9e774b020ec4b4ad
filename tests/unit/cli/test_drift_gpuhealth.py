"""``fleet drift`` on GPU health: a card whose PCIe link fell back, or with uncorrected ECC
errors, is drift; healthy cards (the stand-in nvidia-smi's report of the captured H200s,
parsed by the real fact) are ok."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.drift.compare import DRIFT, ERROR, OK, compare
from facts.gpuhealth import HEALTH_QUERY, GpuHealth
from fleet.hostplan.render import host_plan
from fleet.hostplan.types import HostPlan
from fleet.load import load_fleet
from tests.unit.cli.test_drift import FLEET, clean_facts
from tests.unit.facts.test_facts_standin import machine, standin


@pytest.fixture
def plan(tmp_path: Path) -> HostPlan:
    """The HGX host of test_drift's fleet file (NVIDIA stack declared, 2 GPUs)."""
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return host_plan(load_fleet(path), "hgx-1", secrets=lambda ref: "s3cret")


def health(tmp_path: Path, overrides: dict | None = None) -> dict:
    root = machine(tmp_path / "standin", busy=False)
    if overrides:
        path = root / "etc/nvidia-standin/gpus.json"
        hardware = json.loads(path.read_text())
        hardware["health"] = overrides
        path.write_text(json.dumps(hardware))
    output = standin(root, f"--query-gpu={HEALTH_QUERY}", "--format=csv,noheader,nounits")
    return GpuHealth().process(output.splitlines())


def rows(plan, facts) -> dict[str, tuple[str, str]]:
    return {r.item: (r.status, r.actual) for r in compare(plan, facts) if "health" in r.item}


def test_healthy_cards_are_ok(plan, tmp_path: Path) -> None:
    facts = clean_facts(plan)
    facts["health"] = health(tmp_path)
    assert rows(plan, facts) == {
        "gpu0 health": (OK, "Gen5 x16, ECC uncorrected 0"),
        "gpu1 health": (OK, "Gen5 x16, ECC uncorrected 0"),
    }


@pytest.mark.parametrize(
    ("override", "actual"),
    [
        ({"pcie.link.gen.current": 1}, "PCIe Gen1 of Gen5"),
        ({"pcie.link.width.current": 8}, "PCIe x8 of x16"),
        ({"ecc.errors.uncorrected.volatile.total": 2}, "ECC: 2 uncorrected (volatile)"),
    ],
)
def test_a_card_that_fell_back_or_has_ecc_errors_is_drift(
    plan, tmp_path: Path, override: dict, actual: str
) -> None:
    facts = clean_facts(plan)
    facts["health"] = health(tmp_path, {"0000:00:07.0": override})
    found = rows(plan, facts)
    assert found["gpu0 health"][0] == OK
    assert found["gpu1 health"] == (DRIFT, actual)


def test_unreadable_health_is_an_error_row(plan) -> None:
    facts = clean_facts(plan)
    facts["health"] = {"gpus": [], "error": "NVIDIA-SMI has failed"}
    assert rows(plan, facts) == {"gpu health": (ERROR, "NVIDIA-SMI has failed")}


def test_facts_without_health_add_no_row(plan) -> None:
    assert rows(plan, clean_facts(plan)) == {}
