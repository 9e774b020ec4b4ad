"""The servers' deploy (deploys/services.py) composes what the host plan decided: it uploads
exactly the plan's host programs (``HostPlan.programs``), writes every server's unit, and
restarts each through restart-or-restore (a replica through its endpoint, a group member in its
group's order) — run with fake facts for every example and valid fleet file, all hosts at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.operations import server

from deploys import multinode
from deploys.services import retired_servers, services
from fleet.catalog.paths import remote_program
from fleet.hostplan.render import host_plan
from fleet.load import load_fleet
from tests.support.deployharness import Step, prepared

ROOT = Path(__file__).resolve().parents[3]
#: Every example, and the valid files with replicas, a canary, monitoring and many servers.
FILES = sorted((ROOT / "inventory").rglob("*.yaml")) + [
    ROOT / "tests" / "data" / "valid" / f"{name}.yaml"
    for name in ("endpoint-canary", "endpoint-two-replicas", "endpoint-replica-count",
                 "monitoring-prometheus",
                 "quad-4090d", "dp2-two-gpus")
]
FACTS = {"Groups": [], "Users": {}, "Os": "Linux", "FleetServerUnits": []}


def deploy() -> None:
    retired_servers()
    venv = server.shell(name="the venv", commands=["true"])
    services(venv_changed=venv, models_changed={})


def steps_of(path: Path) -> tuple[dict, list[Step]]:
    fleet = load_fleet(path)
    plans = {name: host_plan(fleet, name, secrets=lambda ref: "k") for name in fleet.hosts}
    plans = {name: plan for name, plan in plans.items() if plan.servers}
    multinode.WAITS.clear()
    try:
        facts = {**FACTS, "Which": "/usr/sbin/useradd"}
        return plans, prepared(plans, deploy, facts) if plans else []
    finally:
        multinode.WAITS.clear()


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_deploy_uploads_the_plans_programs_and_restarts_every_server(path: Path) -> None:
    plans, steps = steps_of(path)
    for name, plan in plans.items():
        mine = [s for s in steps if s.host == name]
        uploaded = {c.split(", ")[-1].rstrip(")") for s in mine for c in s.commands
                    if c.startswith("FileUploadCommand(") and "/hostside/" in c}
        wanted = {remote_program(program.name) for program in plan.programs}
        assert wanted <= uploaded, (name, wanted - uploaded)
        # and nothing else as a program: the other uploads are the modules they import
        programs = {n.split(" | ", 1)[-1] for s in mine for n in s.names
                    if n.split(" | ", 1)[-1].startswith("Upload ")
                    and not n.split(" | ", 1)[-1].startswith("Upload hostside/")}
        assert programs == {f"Upload {program.description}" for program in plan.programs}
        for entry in plan.servers:
            assert any(f"Write {entry.unit}" in " ".join(s.names) for s in mine), entry.unit
            restarted = [s for s in mine if entry.unit in " ".join(s.names)
                         and ("Restart" in " ".join(s.names) or "Roll" in " ".join(s.names))]
            assert restarted, (name, entry.unit)


TLS_FLEET = """\
version: 1
models:
  m: {url: "https://models.example/m.tar.gz", sha256: "SHA256"}
hosts:
  box:
    address: 10.0.0.1
    vllm: {version: "0.32.0", variant: cpu}
    servers:
      chat:
        model: m
        port: 8443
        tls: {certificate: {env: CERT}, key: {env: KEY}, client_ca: {env: CLIENTS}}
""".replace("SHA256", "ab" * 32)


def test_a_tls_server_gets_its_files_0600_kept_and_restored(tmp_path: Path) -> None:
    """Each TLS file: its current copy kept, written root 0600, part of what restarts the
    server and of what its restart puts back; its text in no command."""
    path = tmp_path / "fleet.yaml"
    path.write_text(TLS_FLEET)
    fleet = load_fleet(path)
    plans = {"box": host_plan(fleet, "box", secrets=lambda ref: f"PEM-TEXT-{ref.env}\n")}
    steps = prepared(plans, deploy, {**FACTS, "Which": "/usr/sbin/useradd"})
    names = [n for s in steps for n in s.names]
    for part in ("certificate", "key", "client-ca", "ca"):
        assert f"vLLM services | Keep the current TLS {part} of vllm-chat.service" in names
        [write] = [s for s in steps if f"Write the TLS {part} of vllm-chat.service" in s.names[0]]
        assert any(f"/etc/vllm-fleet/chat.tls-{part}.pem" in c for c in write.commands)
        assert any("chmod 600" in c for c in write.commands), write.commands
    [restart] = [s for s in steps if "Restart vllm-chat.service" in s.names[0]]
    assert ("/etc/vllm-fleet/chat.tls-key.pem=/var/lib/vllm-fleet/previous/chat.tls-key.pem"
            in " ".join(restart.commands))
    assert not [c for s in steps for c in s.commands if "PEM-TEXT" in c]
