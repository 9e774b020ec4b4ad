"""docs/monitoring.md's table of alert rules is the catalogue (fleet/catalog/alerts.py) as the rules
file renders it: every rule, its expression with the default thresholds, its ``for``, its
severity, each threshold it names with that threshold's default, and its source."""

from __future__ import annotations

import re
from pathlib import Path

from fleet.catalog.alerts import ALERTS, THRESHOLDS, defaults
from fleet.hostplan.monitoring import alert_rules

DOC = Path(__file__).resolve().parents[3] / "docs" / "monitoring.md"


def table() -> dict[str, list[str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        if line.startswith("| `") and line.split("|")[1].strip().strip("`") in ALERTS:
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows[cells[0].strip("`")] = cells
    return rows


def test_every_rule_is_in_the_docs_as_generated() -> None:
    rows = table()
    rules = alert_rules(defaults())
    assert set(rows) == {rule["alert"] for rule in rules} == set(ALERTS)
    for rule in rules:
        _, expr, wait, severity, _, source = rows[rule["alert"]]
        assert expr == f"`{rule['expr']}`", rule["alert"]
        assert wait == rule.get("for", "—"), rule["alert"]
        assert severity == rule["labels"]["severity"]
        assert source == ALERTS[rule["alert"]].source, rule["alert"]


def test_each_row_names_its_alerts_thresholds_with_their_defaults() -> None:
    for name, cells in table().items():
        named = dict(re.findall(r"`(\w+)` \(([\d.]+)\)", cells[4]))
        assert set(named) == set(ALERTS[name].thresholds), name
        for threshold, default in named.items():
            assert THRESHOLDS[threshold].default == float(default), threshold


def test_every_threshold_is_named_in_the_table() -> None:
    named = " ".join(cells[4] for cells in table().values())
    assert all(f"`{name}`" in named for name in THRESHOLDS)
