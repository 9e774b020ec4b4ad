"""``fleet drift`` and ``fleet render`` on a head over Ray: its Ray head unit is declared (not a
retired server) and shown."""

from __future__ import annotations

from pathlib import Path

from cli.drift.compare import _retired_rows
from cli.main import main
from fleet.hostplan.render import host_plan
from fleet.load import load_fleet

EXAMPLE = Path(__file__).resolve().parents[3] / "inventory" / "examples" / "h200-pair-ray.yaml"


def test_the_ray_head_unit_is_not_a_retired_server() -> None:
    plan = host_plan(load_fleet(EXAMPLE), "hgx-h200-01", secrets=lambda ref: "k")
    units = ["vllm-deepseek-ray.service", "vllm-deepseek.service", "vllm-old.service"]
    rows = list(_retired_rows("hgx-h200-01", plan, {"fleet_units": units}))
    assert [row.item for row in rows] == ["unit vllm-old.service"]


def test_fleet_render_shows_the_ray_head_unit_before_the_heads_unit(capsys) -> None:
    assert main(["render", str(EXAMPLE), "--host", "hgx-h200-01"]) == 0
    text = capsys.readouterr().out
    assert text.index("vllm-deepseek-ray.service") < text.index("/vllm-deepseek.service")
    assert "ray start --block --head --port 6379" in text
