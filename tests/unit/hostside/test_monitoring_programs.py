"""The host-side monitoring programs, run here by their files as on a host: the GPU textfile
feeder (on a stand-in nvidia-smi that prints the captured H200 figures — a stand-in, named as
such) and the promtool- (amtool-) checked configuration installer (with Debian's real promtool and
amtool).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.hostplan.monitoring import alertmanager_config
from hostside import gpu_metrics, local_path

ROOT = Path(__file__).resolve().parents[3]
#: One GPU of the captured h200x1-busy fixture (query-gpu-extra.csv: 143771 MiB total, 1551 MiB
#: used, 700 W limit), with utilisation, temperature and draw of a loaded H200 added.
H200_ROW = ("0, GPU-6fd24cb4-69aa-13b0-a98d-a0866c96739e, NVIDIA H200, 87, 1551, 143771, 41, "
            "118.52, 700.00")
STANDIN = f"""#!/bin/sh
# STAND-IN nvidia-smi for this test (not NVIDIA software)
case "$*" in
  *--query-gpu=index,uuid,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,power.limit*)
    echo "{H200_ROW}"; echo "1, GPU-2, NVIDIA H200, 0, 0, 143771, [N/A], [N/A], [N/A]" ;;
  *) exit 9 ;;
esac
"""


@pytest.fixture
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: scripts/install.sh installs Debian's prometheus")
        pytest.skip("promtool is missing (apt-get install prometheus)")
    return found


def run(program: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(local_path(program)), *args],
                          capture_output=True, text=True, check=False)  # fmt: skip


def test_gpu_metrics_writes_the_textfile(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(STANDIN)
    smi.chmod(0o755)
    out = tmp_path / "gpu.prom"
    result = run("gpu_metrics", "--out", str(out), "--once", "--nvidia-smi", str(smi))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    labels = 'gpu="0",uuid="GPU-6fd24cb4-69aa-13b0-a98d-a0866c96739e",gpu_name="NVIDIA H200"'
    assert f"vllm_fleet_gpu_memory_total_bytes{{{labels}}} {143771 * 1024 * 1024}" in text
    assert f"vllm_fleet_gpu_power_limit_watts{{{labels}}} 700" in text
    assert f"vllm_fleet_gpu_temperature_celsius{{{labels}}} 41" in text
    assert "vllm_fleet_gpu_query_success 1" in text
    # GPU 1 reports no temperature: no sample, rather than a made-up 0
    assert 'vllm_fleet_gpu_temperature_celsius{gpu="1"' not in text
    assert 'vllm_fleet_gpu_utilization_percent{gpu="1"' in text
    assert not list(tmp_path.glob("*.tmp"))


def test_a_failed_query_is_a_series_of_its_own(tmp_path):
    out = tmp_path / "gpu.prom"
    result = run("gpu_metrics", "--out", str(out), "--once", "--nvidia-smi",
                 str(tmp_path / "missing-nvidia-smi"))  # fmt: skip
    assert result.returncode == 1
    assert "vllm_fleet_gpu_query_success 0" in out.read_text()


def test_textfile_passes_promtool_check_metrics(promtool):
    text = gpu_metrics.exposition(gpu_metrics.parse(H200_ROW))
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                            text=True, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def folders(tmp_path: Path, config: str) -> tuple[Path, Path]:
    staged, live = tmp_path / "staged", tmp_path / "live"
    staged.mkdir()
    live.mkdir()
    (staged / "prometheus.yml").write_text(config)
    (staged / "fleet-rules.yml").write_text("groups: []\n")
    (live / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    (live / "fleet-rules.yml").write_text("groups: []\n")
    return staged, live


def install(promtool: str, staged: Path, live: Path) -> subprocess.CompletedProcess:
    return run("prometheus_config", "--staged", str(staged), "--live", str(live),
               "--promtool", promtool, "--files", "prometheus.yml", "fleet-rules.yml")


def test_a_checked_configuration_replaces_the_live_one(promtool, tmp_path):
    config = "global: {scrape_interval: 5s}\nrule_files: [fleet-rules.yml]\n"
    staged, live = folders(tmp_path, config)
    result = install(promtool, staged, live)
    assert result.returncode == 0, result.stderr
    assert (live / "prometheus.yml").read_text() == config
    assert oct((live / "prometheus.yml").stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize("broken", [
    "global: {scrape_interval: soon}\n",                      # not a duration
    "rule_files: [missing-rules.yml]\n",                      # a rules file that is not there
    "scrape_configs:\n  - job_name: a\n  - job_name: a\n",    # a job twice
])  # fmt: skip
def test_a_broken_configuration_never_replaces_the_live_one(promtool, tmp_path, broken):
    staged, live = folders(tmp_path, broken)
    before = (live / "prometheus.yml").read_text()
    result = install(promtool, staged, live)
    assert result.returncode == 1
    assert "keeps the working one" in result.stderr
    assert (live / "prometheus.yml").read_text() == before


def test_broken_rules_are_refused_too(promtool, tmp_path):
    staged, live = folders(tmp_path, "rule_files: [fleet-rules.yml]\n")
    (staged / "fleet-rules.yml").write_text(
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: 'up =='\n"
    )
    assert install(promtool, staged, live).returncode == 1
    assert (live / "fleet-rules.yml").read_text() == "groups: []\n"


@pytest.fixture(scope="module")
def amtool() -> str:
    found = shutil.which("amtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("amtool is missing: scripts/install.sh installs prometheus-alertmanager")
        pytest.skip("amtool is missing (apt-get install prometheus-alertmanager)")
    return found


@pytest.mark.parametrize(("text", "passes"), [
    (alertmanager_config(), True),                                  # the rendered one
    ("route: {receiver: nobody}\nreceivers: [{name: fleet}]\n", False),  # unknown receiver
    ("route: {receiver: fleet, group_wait: soon}\nreceivers: [{name: fleet}]\n", False),
])  # fmt: skip
def test_alertmanager_config_is_installed_only_once_amtool_passes(amtool, tmp_path, text, passes):
    staged, live = tmp_path / "staged", tmp_path / "live"
    staged.mkdir()
    live.mkdir()
    (staged / "alertmanager.yml").write_text(text)
    (live / "alertmanager.yml").write_text("working\n")
    result = run("prometheus_config", "--staged", str(staged), "--live", str(live),
                 "--amtool", amtool, "--files", "alertmanager.yml")  # fmt: skip
    assert result.returncode == (0 if passes else 1), result.stdout + result.stderr
    assert (live / "alertmanager.yml").read_text() == (text if passes else "working\n")
    if not passes:
        assert "amtool refused the new configuration" in result.stderr
