"""``fleet drift`` on a head over Ray: its Ray head unit is declared, not a retired server."""

from __future__ import annotations

from pathlib import Path

from cli.drift.compare import _retired_rows
from fleet.load import load_fleet
from fleet.render import host_plan

EXAMPLE = Path(__file__).resolve().parents[3] / "inventory" / "examples" / "h200-pair-ray.yaml"


def test_the_ray_head_unit_is_not_a_retired_server() -> None:
    plan = host_plan(load_fleet(EXAMPLE), "hgx-h200-01", secrets=lambda ref: "k")
    units = ["vllm-deepseek-ray.service", "vllm-deepseek.service", "vllm-old.service"]
    rows = list(_retired_rows("hgx-h200-01", plan, {"fleet_units": units}))
    assert [row.item for row in rows] == ["unit vllm-old.service"]
