"""How exposed the monitoring units are: ``systemd-analyze security --offline`` on Debian 12's
own units (tests/data/monitoring/debian-units, as shipped) alone and with vllm-fleet's drop-ins
(and vllm-fleet's own GPU metrics unit). tests/e2e/test_monitoring_e2e.py measures the same
units live on a sandbox host.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fleet.hostplan.monitoring import monitoring_plan
from fleet.spec.models import Fleet

DEBIAN = Path(__file__).resolve().parents[2] / "data" / "monitoring" / "debian-units"
FLEET = Fleet.model_validate({
    "version": 1,
    "monitoring": {"host": "a", "alertmanager": {"port": 18602}},
    "hosts": {"a": {"address": "sandbox", "gpus": {"count": 1}, "os": {"nvidia": {"driver": "580"}},
                    "vllm": {"version": "0.32.0", "variant": "cu130"}}},
})  # fmt: skip


@pytest.fixture(scope="module")
def analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("systemd-analyze is missing (the systemd package)")
        pytest.skip("systemd-analyze is missing")
    return found


def exposure(analyze: str, root: Path, unit: str) -> float:
    result = subprocess.run(
        [analyze, "security", "--offline=true", f"--root={root}", "--no-pager", unit],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    match = re.search(r"exposure level for \S+: ([0-9.]+)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    return float(match.group(1))


def tree(folder: Path, dropins: bool) -> Path:
    """A root with Debian's units (and, when ``dropins``, the plan's drop-ins and own unit)."""
    units = folder / "lib/systemd/system"
    units.mkdir(parents=True)
    for unit in DEBIAN.glob("*.service"):
        shutil.copy(unit, units / unit.name)
    if dropins:
        plan = monitoring_plan(FLEET, "a")
        assert plan and plan.prometheus and plan.prometheus.alertmanager and plan.gpu_metrics
        files = {d.path: d.text for d in
                 (plan.node_exporter, plan.prometheus.service, plan.prometheus.alertmanager)}
        files[plan.gpu_metrics.unit_path] = plan.gpu_metrics.unit_text
        for path, text in files.items():
            target = folder / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    return folder


@pytest.mark.parametrize(
    ("unit", "debian"),
    [("prometheus.service", 4.0), ("prometheus-node-exporter.service", 9.2),
     ("prometheus-alertmanager.service", 9.2)],
)  # fmt: skip
def test_dropins_lower_the_exposure_of_debians_units(analyze, tmp_path, unit, debian):
    alone = exposure(analyze, tree(tmp_path / "debian", dropins=False), unit)
    hardened = exposure(analyze, tree(tmp_path / "fleet", dropins=True), unit)
    print(f"{unit}: Debian's {alone}, with vllm-fleet's drop-in {hardened}")
    assert alone == debian
    assert hardened <= 1.5


def test_the_gpu_metrics_unit_is_hardened(analyze, tmp_path):
    assert exposure(analyze, tree(tmp_path, dropins=True), "vllm-fleet-gpu-metrics.service") <= 1.5
