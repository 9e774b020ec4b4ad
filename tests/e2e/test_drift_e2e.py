"""The pinned GPU stack on a real sandbox host, from the STAND-IN NVIDIA repository.

Real parts: a systemd container reached over SSH, real apt (a signed repository on loopback,
keyring + signed-by source, preferences pin, holds), systemd units and drop-ins, the deploy and
``fleet drift`` as users run them. Stand-ins: the packages' contents and the GPUs
(tests/standin_nvidia: an 8 × H200 HGX board with NVSwitches, whose nvidia-smi prints the
formats captured from real H200s).

The lifecycle: deploy → deploy again with zero changes → drift clean → break things by hand →
drift names each → deploy → clean; then the fleet file moves the driver from 535 to 570, and
driver and fabric manager move together, both held. No vLLM here: the host has GPUs but no
servers, so the deploy installs the stack only (a few seconds of apt instead of gigabytes).
That is also why it keeps a host of its own instead of the session's shared vLLM host: that one
must stay a CPU host, and this fleet file (no servers) would retire its servers.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sandbox import hosts as sandbox
from sandbox import modelserver
from tests.support import e2e
from tests.support.e2e import ROOT, changes, deploy
from tests.support.standin_nvidia.build import build
from tests.support.standin_nvidia.hardware import hgx_h200, install

pytestmark = pytest.mark.e2e

HOST = "gpu-e2e"
REPO_PORT = 18800  # outside every block of tests.support.e2e: this module runs beside them

FLEET = """\
# yaml-language-server: $schema={schema}
version: 1
hosts:
  {host}:
    address: sandbox
    gpus: {{count: 8, model: "H200 SXM", memory_gib: 140}}
    os:
      nvidia:
        driver: "{driver}"
        fabric_manager: auto
        reboot: false
        repository: "http://127.0.0.1:{port}"
        repository_key: {key}
      cuda: "12.8"
      cpu_governor: performance
      sysctl: {{vm.swappiness: 1, net.core.somaxconn: 4096}}
    vllm: {{version: "0.11.0", variant: cu129}}
"""
DRIVER_PARTS = ["nvidia-driver", "nvidia-smi", "nvidia-kernel-dkms", "libcuda1",
                "nvidia-persistenced"]  # fmt: skip


def drift(fleet: Path) -> tuple[int, dict]:
    result = e2e.fleet_cli(fleet, "drift", str(fleet), "--json")
    return result.returncode, json.loads(result.stdout)


def on_host(command: str, stdin: str = "") -> subprocess.CompletedProcess:
    """A shell command on this module's GPU host."""
    return e2e.on_host(command, HOST, stdin)


def drifted(report: dict) -> set[str]:
    return {row["item"] for row in report["rows"] if row["status"] == "drift"}


def versions() -> dict[str, str]:
    out = on_host("dpkg-query -W -f '${Package} ${Version}\\n' 'nvidia-*' libcuda1").stdout
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)


def held() -> set[str]:
    return set(on_host("apt-mark showhold").stdout.split())


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory):
    """The stand-in repository, served on loopback for the whole module."""
    built = build(tmp_path_factory.mktemp("standin") / "repo")
    modelserver.start(built.root, port=REPO_PORT)
    yield built
    modelserver.stop(port=REPO_PORT)


@pytest.fixture(scope="module")
def fleet_files(repo, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("fleet")
    files = {}
    for driver in ("535", "570"):
        files[driver] = folder / f"gpu-{driver}.yaml"
        files[driver].write_text(FLEET.format(
            schema=ROOT / "inventory" / "fleet.schema.json", host=HOST, driver=driver,
            port=REPO_PORT, key=repo.fingerprint,
        ))  # fmt: skip
    return files


@pytest.fixture(scope="module")
def host_up(repo):
    """The sandbox host with its stand-in HGX board; gone afterwards."""
    sandbox.down([HOST])
    hosts = sandbox.up({HOST: []})
    install(lambda command, stdin: on_host(command, stdin), hgx_h200(gpus=8))
    yield hosts[0]
    sandbox.down([HOST])


@pytest.fixture(scope="module")
def converge(host_up, fleet_files) -> subprocess.CompletedProcess:
    return deploy(fleet_files["535"])


@pytest.fixture(scope="module")
def second_run(converge, fleet_files) -> subprocess.CompletedProcess:
    return deploy(fleet_files["535"])


@pytest.fixture(scope="module")
def clean_drift(second_run, fleet_files) -> tuple[int, dict]:
    return drift(fleet_files["535"])


@pytest.fixture(scope="module")
def broken(clean_drift, fleet_files) -> tuple[int, dict]:
    """Break the host by hand, the ways production breaks, then ask drift."""
    v = "570.172.08-1"
    upgrade = " ".join(f"{p}={v}" for p in DRIVER_PARTS)
    script = (
        f"apt-mark unhold {' '.join(DRIVER_PARTS)} >/dev/null && "
        f"DEBIAN_FRONTEND=noninteractive apt-get install -y -q {upgrade} >/dev/null && "
        "systemctl stop nvidia-persistenced && "
        "echo 'vm.swappiness = 10' >> /etc/sysctl.d/90-vllm-fleet.conf && "
        "sed -i 's/echo performance/echo powersave/' "
        "/etc/systemd/system/vllm-fleet-cpu-governor.service && "
        "sed -i 's/LimitNOFILE=65536/LimitNOFILE=1024/' "
        "/etc/systemd/system/vllm-.service.d/50-vllm-fleet-nofile.conf"
    )
    result = on_host(script)
    assert result.returncode == 0, result.stderr
    return drift(fleet_files["535"])


@pytest.fixture(scope="module")
def repaired(broken, fleet_files) -> subprocess.CompletedProcess:
    return deploy(fleet_files["535"])


@pytest.fixture(scope="module")
def moved(repaired, fleet_files) -> subprocess.CompletedProcess:
    return deploy(fleet_files["570"])


# --- converge and idempotence ------------------------------------------------------------------


def test_converge_succeeds(converge) -> None:
    assert converge.returncode == 0, (converge.stdout + converge.stderr)[-4000:]


def test_converge_reports_the_pending_reboot(converge) -> None:
    assert "REBOOT IS PENDING" in converge.stdout + converge.stderr


def test_converge_reports_that_cpufreq_is_missing(converge) -> None:
    assert "this host has no cpufreq" in converge.stdout + converge.stderr


def test_second_deploy_changes_nothing(second_run) -> None:
    output = second_run.stdout + second_run.stderr
    assert second_run.returncode == 0, output[-4000:]
    assert changes(output) == 0, output[-4000:]


def test_drift_is_clean_after_deploy(clean_drift) -> None:
    code, report = clean_drift
    assert (code, report["status"]) == (0, "clean"), report


def test_newest_535_with_its_fabric_manager_is_held(second_run) -> None:
    have = versions()
    assert {have[p] for p in [*DRIVER_PARTS, "nvidia-fabricmanager-535"]} == {"535.230.02-1"}
    assert {*DRIVER_PARTS, "nvidia-fabricmanager-535", "cuda-toolkit-12-8"} <= held()


def test_gpus_are_in_persistence_mode_through_the_daemon(second_run) -> None:
    smi = on_host("nvidia-smi --query-gpu=persistence_mode --format=csv,noheader").stdout
    assert smi.split() == ["Enabled"] * 8
    assert on_host("systemctl is-enabled nvidia-persistenced").stdout.strip() == "enabled"


def test_fabric_manager_runs(second_run) -> None:
    assert on_host("systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"


def test_repository_is_signed_and_trusted_for_its_key_only(second_run) -> None:
    source = on_host("cat /etc/apt/sources.list.d/vllm-fleet-nvidia.list").stdout
    assert "[signed-by=/etc/apt/keyrings/vllm-fleet-nvidia.gpg]" in source
    global_keys = on_host("ls /etc/apt/trusted.gpg.d/").stdout.split()
    assert [k for k in global_keys if not k.startswith("debian-archive-")] == []


def test_cuda_is_on_login_shells_path(second_run) -> None:
    nvcc = on_host("bash -lc 'nvcc --version'").stdout
    assert "release 12.8, V12.8.93" in nvcc


# --- drift names each thing broken by hand ------------------------------------------------------


def test_drift_exits_2_when_broken(broken) -> None:
    code, report = broken
    assert (code, report["status"]) == (2, "drift")


@pytest.mark.parametrize(
    "item",
    ["driver", "fabric manager", "held packages", "persistence", "sysctl drop-in", "governor",
     "nofile drop-in"],
)  # fmt: skip
def test_drift_names_each_broken_item(broken, item: str) -> None:
    assert item in drifted(broken[1])


def test_drift_names_nothing_else(broken) -> None:
    assert drifted(broken[1]) == {
        "driver", "fabric manager", "held packages", "persistence", "sysctl drop-in",
        "governor", "nofile drop-in",
    }  # fmt: skip


def test_drift_says_what_the_driver_is(broken) -> None:
    row = next(r for r in broken[1]["rows"] if r["item"] == "driver")
    assert row["actual"].startswith("570.172.08") and "NOT held" in row["actual"]


def test_deploy_repairs_the_host(repaired, fleet_files) -> None:
    output = repaired.stdout + repaired.stderr
    assert repaired.returncode == 0, output[-4000:]
    code, report = drift(fleet_files["535"])
    assert (code, drifted(report)) == (0, set())
    assert versions()["nvidia-driver"] == "535.230.02-1"


def test_deploy_after_repair_changes_nothing(repaired, fleet_files) -> None:
    result = deploy(fleet_files["535"])
    output = result.stdout + result.stderr
    assert changes(output) == 0, output[-4000:]


# --- 535 → 570 in the fleet file ------------------------------------------------------------


def test_upgrade_succeeds(moved) -> None:
    assert moved.returncode == 0, (moved.stdout + moved.stderr)[-4000:]


def test_driver_and_fabric_manager_move_together(moved) -> None:
    have = versions()
    assert {have[p] for p in [*DRIVER_PARTS, "nvidia-fabricmanager-570"]} == {"570.172.08-1"}
    assert "nvidia-fabricmanager-535" not in have


def test_both_are_held_after_the_move(moved) -> None:
    assert {*DRIVER_PARTS, "nvidia-fabricmanager-570"} <= held()


def test_fabric_manager_runs_the_new_version(moved) -> None:
    assert on_host("nv-fabricmanager --version").stdout.strip().endswith("570.172.08")
    assert on_host("systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"


def test_drift_is_clean_after_the_move(moved, fleet_files) -> None:
    code, report = drift(fleet_files["570"])
    assert (code, report["status"]) == (0, "clean"), report


def test_wrong_gpu_count_is_refused_before_installing(moved, fleet_files, tmp_path) -> None:
    wrong = tmp_path / "four.yaml"
    wrong.write_text(fleet_files["570"].read_text().replace("count: 8", "count: 4"))
    result = deploy(wrong)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "declares 4 GPUs, but lspci shows 8 NVIDIA GPUs" in output
    assert "Starting operation" not in output
