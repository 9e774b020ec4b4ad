"""``fleet render`` shows every monitoring file a host gets, as the deploy writes it."""

from __future__ import annotations

from pathlib import Path

from cli import main as cli
from fleet.hostplan.monitoring import monitoring_plan, rendered_files
from fleet.load import load_fleet

EXAMPLE = Path(__file__).resolve().parents[2] / "data" / "valid" / "monitoring-prometheus.yaml"


def test_render_shows_the_monitoring_files_of_each_host(capsys) -> None:
    assert cli.main(["render", str(EXAMPLE)]) == 0
    shown = capsys.readouterr().out
    fleet = load_fleet(str(EXAMPLE))
    for name in fleet.hosts:
        files = rendered_files(monitoring_plan(fleet, name))
        assert files, name
        for path, text in files:
            assert f"{name}: {path}" in shown
            assert text.splitlines()[1] in shown  # the file's own text, not only its name
    prometheus = monitoring_plan(fleet, fleet.monitoring.host).prometheus
    assert "alertmanager.yml" in shown and "groups:" in prometheus.rules_text
