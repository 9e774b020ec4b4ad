"""``fleet drift`` without a GPU host: the rules (plan + facts → rows) on facts shaped like the
real ones, one broken thing at a time; exit statuses; unreachable hosts as error rows.

The lifecycle on a real sandbox host is tests/test_drift_e2e.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cli import main as cli
from cli.drift.command import to_json
from cli.drift.compare import (
    DRIFT,
    ERROR,
    NA,
    OK,
    Row,
    compare,
    exit_status,
    sha256_text,
    watched_files,
)
from cli.drift.gather import drift, plan_or_error
from fleet.hostplan.render import host_plan
from fleet.hostplan.stack import driver_packages, pin_text, source_text
from fleet.hostplan.types import HostPlan
from fleet.load import load_fleet

SHA = "7bba1c3a1056cbe482242a8d8e69c897ff9ce84035c28602bad26bfe0f76523a"
FLEET = f"""\
version: 1
models:
  chat-model: {{url: "http://models.example/m.tar.gz", sha256: "{SHA}"}}
hosts:
  hgx-1:
    address: 10.0.0.5
    gpus: {{count: 2, model: "H200"}}
    os:
      nvidia: {{driver: "570"}}
      cuda: "12.8"
      python: "3.12"
      cpu_governor: performance
      sysctl: {{vm.swappiness: 1, net.core.somaxconn: 65535}}
    vllm: {{version: "0.11.0", variant: cu129}}
    servers:
      chat:
        model: chat-model
        gpus: [0, 1]
        port: 8000
        api_key: {{env: FLEET_TEST_DRIFT_KEY}}
        args: {{tensor-parallel-size: 2}}
"""


@pytest.fixture
def plan(tmp_path: Path) -> HostPlan:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return host_plan(load_fleet(path), "hgx-1", secrets=lambda ref: "s3cret")


def clean_facts(plan: HostPlan) -> dict[str, Any]:
    """Facts of a host that has exactly what ``plan`` declares (Ubuntu 24.04, HGX board)."""
    stack = plan.stack
    nvidia, cuda, governor = stack.nvidia, stack.cuda, stack.governor
    assert nvidia is not None and cuda is not None and governor is not None
    layout = driver_packages("ubuntu2404", 570, True, "nvidia")
    texts = {
        stack.nofile.path: stack.nofile.text,
        plan.sysctl_path: plan.sysctl_text,
        nvidia.persistenced_path: nvidia.persistenced_text,
        nvidia.preferences_path: pin_text(layout.packages, "570"),
        nvidia.sources_path: source_text(nvidia, "ubuntu2404", "x86_64"),
        cuda.profile_path: cuda.profile_text,
        governor.unit_path: governor.unit_text,
    }
    for server in plan.servers:
        texts[server.unit_path] = server.unit_text
        texts[server.env_path] = server.env_text
    versions = {p: "570.172.08-0ubuntu1" for p in layout.packages}
    versions[cuda.package] = "12.8.1-1"
    gpus = [
        {"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H200", "memory_total_mib": 143771,
         "memory_used_mib": 0, "persistence": True, "driver_version": "570.172.08",
         "pci_bus_id": f"00000000:0{i}:00.0"}
        for i in range(2)
    ]  # fmt: skip
    active = {"ActiveState": "active", "SubState": "running", "UnitFileState": "enabled"}
    return {
        "distro": {"name": "Ubuntu", "major": 24, "minor": 4},
        "arch": "amd64",
        "pci": {"gpus": [{}, {}], "nvswitches": [{}]},
        "smi": {"gpus": gpus, "error": None},
        "loaded": {"version": "570.172.08", "open": True},
        "fabric_manager": {"version": "570.172.08", "active": "active", "enabled": "enabled"},
        "packages": {p: {"version": v, "held": True} for p, v in versions.items()},
        "held": sorted(versions),
        "cuda": {"toolkits": {"12.8": "12.8.93"}, "default": "12.8"},
        "digests": {path: sha256_text(text) for path, text in texts.items() if text is not None},
        "units": {
            "nvidia-persistenced.service": dict(active),
            "nvidia-fabricmanager.service": dict(active),
            governor.unit: {"ActiveState": "inactive", "UnitFileState": "enabled"},
            "vllm-chat.service": dict(active),
        },
        "governor": {"performance": 32},
        "sysctl": {"vm.swappiness": 1, "net.core.somaxconn": 65535},
        "sysctl_writable": {"vm.swappiness": True, "net.core.somaxconn": True},
        "venv": {"python": "3.12.3", "packages": {"vllm": "0.11.0"}},
        "models": {"chat-model": {"sha256": SHA}},
        "fleet_units": ["vllm-chat.service"],
    }


def drifted(plan: HostPlan, facts: dict[str, Any]) -> list[str]:
    return [row.item for row in compare(plan, facts) if row.status == DRIFT]


def test_a_host_as_declared_has_no_drift(plan) -> None:
    rows = compare(plan, clean_facts(plan))
    assert [r for r in rows if r.status != OK] == []
    assert exit_status(rows) == 0


def test_every_declared_item_is_checked(plan) -> None:
    items = {row.item for row in compare(plan, clean_facts(plan))}
    assert {
        "gpus", "driver", "fabric manager", "persistence", "apt pin", "apt source", "cuda",
        "cuda on PATH", "held packages", "governor", "nofile drop-in", "sysctl drop-in",
        "sysctl vm.swappiness", "sysctl net.core.somaxconn", "vllm", "python",
        "unit vllm-chat.service", "env chat", "service vllm-chat.service", "model chat-model",
    } <= items  # fmt: skip


def _set(path: str, value: Any) -> Callable[[dict], None]:
    def change(facts: dict) -> None:
        *parents, last = path.split("/")
        node = facts
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value

    return change


def _upgrade_driver(facts: dict) -> None:
    facts["packages"]["nvidia-driver-570"] = {"version": "570.195.03-0ubuntu1", "held": False}
    facts["held"].remove("nvidia-driver-570")
    facts["loaded"] = {"version": "570.195.03", "open": True}
    for gpu in facts["smi"]["gpus"]:
        gpu["driver_version"] = "570.195.03"


def _edit(key: str) -> Callable[[dict], None]:
    def change(facts: dict) -> None:
        path = next(p for p in facts["digests"] if key in p)
        facts["digests"][path] = "0" * 64

    return change


@pytest.mark.parametrize(
    ("change", "items"),
    [
        (_upgrade_driver, ["driver", "fabric manager", "held packages"]),
        (_set("loaded", {"version": "570.133.20", "open": True}), ["driver"]),
        (_set("fabric_manager/active", "failed"), ["fabric manager"]),
        (_set("units/nvidia-persistenced.service/ActiveState", "inactive"), ["persistence"]),
        (_set("smi/gpus/1/persistence", False), ["persistence"]),
        (_edit("nvidia-persistenced"), ["persistence"]),
        (_set("cuda/toolkits", {"12.4": "12.4.131"}), ["cuda"]),
        (_set("held", []), ["held packages"]),
        (_set("governor", {"powersave": 32}), ["governor"]),
        (_edit("cpu-governor"), ["governor"]),
        (_edit("sysctl.d"), ["sysctl drop-in"]),
        (_set("sysctl/vm.swappiness", 60), ["sysctl vm.swappiness"]),
        (_edit("vllm-.service.d"), ["nofile drop-in"]),
        (_edit("vllm-chat.service"), ["unit vllm-chat.service"]),
        (_edit("chat.env"), ["env chat"]),
        (_set("units/vllm-chat.service/ActiveState", "failed"), ["service vllm-chat.service"]),
        (_set("models/chat-model", None), ["model chat-model"]),
        (_set("venv/packages/vllm", "0.10.2"), ["vllm"]),
        (_set("venv/python", "3.11.2"), ["python"]),
        (_edit("preferences.d"), ["apt pin"]),
        (_set("smi", {"gpus": [], "error": "NVIDIA-SMI has failed"}), ["gpus", "persistence"]),
        (_set("fleet_units", ["vllm-chat.service", "vllm-old.service"]),
         ["unit vllm-old.service"]),
        (_set("installed_models", [{"name": "chat-model", "live": "x", "versions": 1,
                                    "bytes": 9}, {"name": "old", "live": "y", "versions": 2,
                                                  "bytes": 3 * 2**30}]), ["model old"]),
    ],
)  # fmt: skip
def test_one_broken_thing_is_named(plan, change, items: list[str]) -> None:
    facts = clean_facts(plan)
    change(facts)
    assert drifted(plan, facts) == items


def test_read_only_kernel_parameter_is_not_drift(plan) -> None:
    facts = clean_facts(plan)
    facts["sysctl"]["vm.swappiness"] = 60
    facts["sysctl_writable"]["vm.swappiness"] = False
    row = next(r for r in compare(plan, facts) if r.item == "sysctl vm.swappiness")
    assert (row.status, row.actual) == (NA, "60 (read-only here)")


def test_no_cpufreq_is_not_drift(plan) -> None:
    facts = clean_facts(plan)
    facts["governor"] = {}
    row = next(r for r in compare(plan, facts) if r.item == "governor")
    assert row.status == OK and "no cpufreq here" in row.actual


def test_pending_reboot_is_reported(plan) -> None:
    facts = clean_facts(plan)
    facts["loaded"] = {"version": "570.133.20", "open": True}
    row = next(r for r in compare(plan, facts) if r.item == "driver")
    assert "loaded 570.133.20: reboot pending" in row.actual


def test_env_file_without_its_secret_is_not_compared(plan) -> None:
    plan = dataclasses.replace(
        plan, servers=(dataclasses.replace(plan.servers[0], env_text=None),))
    row = next(r for r in compare(plan, clean_facts(plan)) if r.item == "env chat")
    assert row.status == NA


def test_drift_blanks_the_env_file_whose_secret_is_missing_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLEET_TEST_DRIFT_KEY", raising=False)
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    data, plan, error = plan_or_error(load_fleet(path), "hgx-1", str(path))
    assert (error, data["ssh_hostname"]) == ("", "10.0.0.5")
    assert plan is not None and plan.servers[0].env_text is None
    assert plan.servers[0].unit_text.startswith("# Managed by vllm-fleet")


def test_drift_keeps_the_env_file_whose_secret_is_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_TEST_DRIFT_KEY", "s3cret")
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    _, plan, _ = plan_or_error(load_fleet(path), "hgx-1", str(path))
    assert plan is not None and plan.servers[0].env_text is not None
    [key] = [line for line in plan.servers[0].env_text.splitlines() if "VLLM_API_KEY" in line]
    assert "s3cret" in key


def _without_servers(plan: HostPlan, keep_units: bool) -> HostPlan:
    stack = dataclasses.replace(plan.stack, serves=False)
    return dataclasses.replace(plan, stack=stack, servers=plan.servers if keep_units else ())


def test_host_without_servers_skips_vllm(plan) -> None:
    plan = _without_servers(plan, keep_units=True)
    items = {row.item for row in compare(plan, clean_facts(plan))}
    assert not items & {"vllm", "python", "unit vllm-chat.service", "model chat-model"}


def test_units_left_from_removed_servers_are_drift_even_without_servers(plan) -> None:
    """A host whose servers were all taken out of the fleet still reports their units."""
    plan = _without_servers(plan, keep_units=False)
    rows = [r for r in compare(plan, clean_facts(plan)) if r.status == DRIFT]
    assert [(r.item, r.actual) for r in rows] == [
        ("unit vllm-chat.service", "still installed: the next deploy stops and removes it")
    ]


def test_unsupported_distribution_is_an_error_row(plan) -> None:
    facts = clean_facts(plan)
    facts["distro"] = {"name": "Fedora", "major": 40, "minor": None}
    row = next(r for r in compare(plan, facts) if r.item == "driver")
    assert row.status == ERROR and "not supported" in row.actual


@pytest.mark.parametrize(
    ("statuses", "code"),
    [([OK, NA], 0), ([OK, DRIFT], 2), ([DRIFT, ERROR], 1), ([], 0)],
)
def test_exit_status(statuses: list[str], code: int) -> None:
    assert exit_status([Row("h", str(i), "", "", s) for i, s in enumerate(statuses)]) == code


def test_json_report(plan) -> None:
    facts = clean_facts(plan)
    facts["held"] = []
    report = json.loads(to_json(compare(plan, facts)))
    assert report["status"] == "drift"
    held = next(row for row in report["rows"] if row["item"] == "held packages")
    assert held["status"] == "drift" and held["actual"].startswith("not held: nvidia-driver-570")


# --- hosts that cannot be reached --------------------------------------------------------------

UNREACHABLE = """\
version: 1
hosts:
  down-1:
    address: 127.0.0.1
    ssh: {port: 1}
    vllm: {version: "0.32.0", variant: cpu}
  gone-1:
    address: sandbox
    vllm: {version: "0.32.0", variant: cpu}
"""


@pytest.fixture
def unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEET_SANDBOX_DIR", str(tmp_path / "no-sandboxes"))
    path = tmp_path / "fleet.yaml"
    path.write_text(UNREACHABLE)
    return path


def test_each_unreachable_host_is_one_error_row(unreachable: Path) -> None:
    rows = drift(str(unreachable))
    assert [(r.host, r.item, r.status) for r in rows] == [
        ("down-1", "reachable", ERROR),
        ("gone-1", "reachable", ERROR),
    ]
    assert "Could not connect" in rows[0].actual
    assert "sandbox host gone-1 is not running" in rows[1].actual


def test_cli_exits_1_on_errors_with_json(unreachable: Path, capsys) -> None:
    assert cli.main(["drift", str(unreachable), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "error"


def test_cli_checks_one_host(unreachable: Path, capsys) -> None:
    assert cli.main(["drift", str(unreachable), "--host", "gone-1", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [row["host"] for row in rows] == ["gone-1"]


TLS_FLEET = FLEET.replace(
    "        args: {{tensor-parallel-size: 2}}\n".replace("{{", "{").replace("}}", "}"),
    "        args: {tensor-parallel-size: 2}\n"
    "        tls: {certificate: {env: FLEET_TEST_DRIFT_CERT}, key: {env: FLEET_TEST_DRIFT_TLS}}\n")


@pytest.fixture
def tls_plan(tmp_path: Path) -> HostPlan:
    path = tmp_path / "fleet.yaml"
    path.write_text(TLS_FLEET)
    return host_plan(load_fleet(path), "hgx-1",
                     secrets=lambda ref: f"PEM {ref.env}\n" if "TLS" in ref.env or "CERT" in ref.env
                     else "s3cret")


def test_tls_files_are_compared(tls_plan: HostPlan) -> None:
    facts = clean_facts(tls_plan)
    for tls_file in tls_plan.servers[0].tls.files:
        facts["digests"][tls_file.path] = sha256_text(tls_file.text)
    assert drifted(tls_plan, facts) == []
    facts["digests"]["/etc/vllm-fleet/chat.tls-key.pem"] = sha256_text("another key")
    assert drifted(tls_plan, facts) == ["tls key chat"]
    assert "/etc/vllm-fleet/chat.tls-certificate.pem" in watched_files(tls_plan)


def test_drift_does_not_compare_a_tls_file_missing_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_TEST_DRIFT_KEY", "s3cret")
    from tests.support.testca import TestCA

    files = TestCA().server_files(tmp_path, ["127.0.0.1"])
    monkeypatch.setenv("FLEET_TEST_DRIFT_CERT", files.certificate.read_text())
    monkeypatch.delenv("FLEET_TEST_DRIFT_TLS", raising=False)
    path = tmp_path / "fleet.yaml"
    path.write_text(TLS_FLEET)
    _, plan, _ = plan_or_error(load_fleet(path), "hgx-1", str(path))
    assert plan is not None
    texts = {f.part: f.text for f in plan.servers[0].tls.files}
    assert texts["key"] == "" and texts["certificate"].startswith("-----BEGIN CERTIFICATE")
    rows = {r.item: r.status for r in compare(plan, clean_facts(plan))}
    assert rows["tls key chat"] == NA
