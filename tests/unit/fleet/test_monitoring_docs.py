"""docs/monitoring.md's table of alert rules is the generated rules file: every rule, its
expression with the default thresholds, its ``for``, its severity, and each threshold it names
with that threshold's default (and a source for each)."""

from __future__ import annotations

import re
from pathlib import Path

from fleet.monitoring import ALERTS, THRESHOLDS, alert_rules

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
    rules = alert_rules({name: t.default for name, t in THRESHOLDS.items()})
    assert set(rows) == {rule["alert"] for rule in rules} == set(ALERTS)
    for rule in rules:
        _, expr, wait, severity, named, source = rows[rule["alert"]]
        assert expr == f"`{rule['expr']}`", rule["alert"]
        assert wait == rule.get("for", "—"), rule["alert"]
        assert severity == rule["labels"]["severity"]
        assert source, rule["alert"]
        for name, default in re.findall(r"`(\w+)` \(([\d.]+)\)", named):
            assert THRESHOLDS[name].default == float(default), name


def test_every_threshold_is_named_in_the_table() -> None:
    named = " ".join(cells[4] for cells in table().values())
    assert all(f"`{name}`" in named for name in THRESHOLDS)
