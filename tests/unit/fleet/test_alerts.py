"""The alert catalogue (fleet/catalog/alerts.py) is the one place an alert is written: the rules
file,
``fleet check``'s threshold check and the healthy ranges of ``fleet status`` all read it, so a
new alert is one entry. Proved on a copy of the catalogue with one alert added, the rules file
it renders checked and tested with Debian's real ``promtool``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cli.status.model import GpuRow, ServerRow, judge_gpus, judge_server
from fleet.catalog.alerts import ALERTS, THRESHOLDS, Alert, Status, Threshold, defaults
from fleet.catalog.paths import PROMETHEUS_RULES_NAME
from fleet.checks.monitoring import check_thresholds
from fleet.hostplan.monitoring import rules_text
from fleet.judge.health import BAD, OK, RANGES, WARN, level, ranges
from fleet.spec.models import Fleet, Monitoring

STATUS_DOC = Path(__file__).resolve().parents[3] / "docs" / "status.md"

#: One alert more, as a site would add it: its threshold and its healthy range in the entry.
RUNNING = Alert(
    expr="vllm:num_requests_running > $running_requests",
    wait="2m",
    severity="warning",
    summary="{{ $labels.server }} on {{ $labels.host }}: {{ $value }} requests running",
    source="a site's own: more requests at once than the server was sized for",
    thresholds={
        "running_requests": Threshold(
            32, 1, 100000, "requests", "vllm:num_requests_running", "the site's max-num-seqs"
        )
    },
    status=Status("running", 24, "running_requests", "near max-num-seqs: requests queue"),
)
WITH_RUNNING = {**ALERTS, "VllmRunningHigh": RUNNING}


def fleet_of(**monitoring: object) -> Fleet:
    return Fleet.model_validate({"version": 1, "monitoring": {"host": "a", **monitoring},
        "hosts": {"a": {"address": "10.0.0.5", "vllm": {"version": "0.32.0", "variant": "cpu"},
                        "servers": {"s": {"model": "m", "port": 8000}}}}})  # fmt: skip


def rules(text: str) -> dict[str, dict]:
    (group,) = yaml.safe_load(text)["groups"]
    return {rule["alert"]: rule for rule in group["rules"]}


def test_a_new_alert_is_rendered_into_the_rules_file_with_its_threshold() -> None:
    rendered = rules(rules_text(fleet_of(thresholds={"running_requests": 48}), WITH_RUNNING))
    assert list(rendered) == [*ALERTS, "VllmRunningHigh"]
    assert rendered["VllmRunningHigh"] == {
        "alert": "VllmRunningHigh", "expr": "vllm:num_requests_running > 48", "for": "2m",
        "labels": {"severity": "warning"}, "annotations": {"summary": RUNNING.summary}}  # fmt: skip


def test_the_catalogue_without_it_renders_the_rules_file_as_before() -> None:
    fleet = fleet_of()
    assert rules_text(fleet, WITH_RUNNING) != rules_text(fleet)
    assert rules_text(fleet, ALERTS) == rules_text(fleet)


def test_its_threshold_and_for_are_accepted_by_the_check_only_with_it() -> None:
    monitoring = Monitoring.model_validate({"host": "a", "thresholds": {"running_requests": 48},
                                            "alert_for_s": {"VllmRunningHigh": 30}})  # fmt: skip
    assert list(check_thresholds(monitoring, WITH_RUNNING)) == []
    refused = [message for _, message, _ in check_thresholds(monitoring)]
    assert refused == ["no alert has a threshold named 'running_requests'",
                       "no alert is named 'VllmRunningHigh'"]  # fmt: skip


def test_its_threshold_range_is_checked() -> None:
    monitoring = Monitoring.model_validate({"host": "a", "thresholds": {"running_requests": 0}})
    ((path, message, fix),) = check_thresholds(monitoring, WITH_RUNNING)
    assert path == ("monitoring", "thresholds", "running_requests")
    assert message == "0 is out of range for running_requests (vllm:num_requests_running)"
    assert fix == "give 1–100000 requests (default 32)"


def test_its_healthy_range_is_in_the_ranges_status_judges_by() -> None:
    table = ranges(WITH_RUNNING)
    assert (table["running"].warn, table["running"].bad) == (24, 32)
    assert [level("running", value, table=table) for value in (8, 24, 40)] == [OK, WARN, BAD]
    assert "running" not in RANGES


def test_the_new_alert_fires_in_promtool(tmp_path: Path) -> None:
    """Rendered from the copy of the catalogue, the rule passes ``promtool check rules`` and
    fires for a server with 50 requests running, not for one with 5 beside it."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: scripts/install.sh installs Debian's prometheus")
        pytest.skip("promtool is missing (apt-get install prometheus, as scripts/install.sh)")
    (tmp_path / PROMETHEUS_RULES_NAME).write_text(rules_text(fleet_of(), WITH_RUNNING))
    series = 'vllm:num_requests_running{{host="a",server="{}"}}'
    test = {
        "rule_files": [PROMETHEUS_RULES_NAME],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": series.format("busy"), "values": "50x10"},
                             {"series": series.format("good"), "values": "5x10"}],
            "alert_rule_test": [{"eval_time": "5m", "alertname": "VllmRunningHigh", "exp_alerts": [
                {"exp_labels": {"severity": "warning", "host": "a", "server": "busy"},
                 "exp_annotations": {"summary": "busy on a: 50 requests running"}}]}],
        }],
    }  # fmt: skip
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    for command in (["check", "rules", PROMETHEUS_RULES_NAME], ["test", "rules", "test.yml"]):
        done = subprocess.run([promtool, *command], cwd=tmp_path, capture_output=True,
                              text=True, check=False)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS) + 1} rules found" in subprocess.run(
        [promtool, "check", "rules", PROMETHEUS_RULES_NAME], cwd=tmp_path, capture_output=True,
        text=True, check=False).stdout  # fmt: skip


@pytest.mark.parametrize("name", list(ALERTS))
def test_each_alert_names_exactly_its_own_thresholds(name: str) -> None:
    assert sorted(ALERTS[name].named()) == sorted(ALERTS[name].thresholds)


@pytest.mark.parametrize("name", list(THRESHOLDS))
def test_each_default_is_in_its_own_range(name: str) -> None:
    entry = THRESHOLDS[name]
    assert entry.low <= entry.default <= entry.high


def test_no_threshold_is_owned_by_two_alerts() -> None:
    owned = [name for alert in ALERTS.values() for name in alert.thresholds]
    assert len(owned) == len(set(owned)) == len(defaults())


def test_status_ranges_name_thresholds_of_the_catalogue_and_one_figure_each() -> None:
    statuses = [alert.status for alert in ALERTS.values() if alert.status is not None]
    assert len({status.figure for status in statuses}) == len(statuses)
    for status in statuses:
        for given in (status.warn, status.bad):
            assert not isinstance(given, str) or given in THRESHOLDS, status.figure


def test_fleet_status_judges_every_range_of_the_catalogue() -> None:
    """A range is only worth its entry when ``fleet status`` gathers the figure: every one of
    the catalogue's is judged on a server's or a GPU's row (a new figure needs its field in
    cli/status/model.py and the code that fills it: that part is not data)."""
    server = ServerRow(host="a", server="s", model="m", port=1, health="up", state="active",
                       waiting=0, kv_cache_pct=1, preemptions=0, restarts=0)  # fmt: skip
    gpu = GpuRow(host="a", index=0, memory_pct=1, utilization_pct=80, temperature_c=40,
                 power_pct=50)  # fmt: skip
    judge_server(server)
    judge_gpus([gpu], busy_hosts={"a"})
    assert set(RANGES) <= set(server.levels) | set(gpu.levels)


#: docs/status.md's row of each figure.
STATUS_ROWS = {"memory_pct": "GPU memory used", "temperature_c": "temperature",
               "utilization_pct": "utilisation", "power_pct": "power",
               "waiting": "requests waiting", "preemptions": "preemptions",
               "kv_cache_pct": "KV cache usage", "restarts": "restarts"}  # fmt: skip


@pytest.mark.parametrize("figure", list(RANGES))
def test_docs_status_table_gives_each_range_as_the_catalogue(figure: str) -> None:
    rows = {}
    for line in STATUS_DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 4:
            rows[cells[0].split(" (")[0]] = cells
    _, warn, bad, _ = rows[STATUS_ROWS[figure]]
    judged = RANGES[figure]
    assert f"{judged.warn:g}" in re.findall(r"[\d.]+", warn), warn
    assert (bad == "—") if judged.bad is None else f"{judged.bad:g}" in re.findall(r"[\d.]+", bad)
