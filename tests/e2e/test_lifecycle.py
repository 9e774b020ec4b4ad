"""The Molecule lifecycle on a real sandbox host: up → converge → idempotence → verify → down.

Real parts throughout: a systemd container reached over SSH, real apt and pip, the CPU build of
vLLM serving the committed tiny model, downloaded from a loopback HTTP server and verified. The
host is the session's shared vLLM host (tests/e2e/conftest.py): up is its start, converge this
module's first deploy onto it (the servers of a module before are retired), down the last test
of the session that uses it.
Faults: a wrong checksum fails the deploy and leaves the previous model serving; a broken
fleet file stops pyinfra before any host is contacted.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from hostside import envfile
from sandbox import hosts as sandbox
from tests.support import e2e
from tests.support.e2e import TESTMODEL_SHA as ARCHIVE_SHA
from tests.support.e2e import changes, on_host
from tests.unit.hostside.test_envfile import HOSTILE, SYSTEMD_READS

pytestmark = pytest.mark.e2e

ROOT = e2e.ROOT
HOST = e2e.VLLM_HOST
SERVER_PORT = e2e.LIFECYCLE_PORT
#: Quotes, a backslash, ``$`` and spaces: written by the env-file writer, enforced by vLLM, read
#: back on the host by the readiness check, ``fleet verify`` and ``fleet complete`` alike.
API_KEY = 'e2e "se\\cret" $HOME 7f3a9c1d'
ENV = {"FLEET_E2E_API_KEY": API_KEY}
WRONG_SHA = "0" * 63 + "1"

FLEET_TEMPLATE = """\
# yaml-language-server: $schema={schema}
version: 1
defaults:
  os:
    sysctl: {{vm.swappiness: 1, net.core.somaxconn: 65535}}
  vllm: {{version: "0.32.0", variant: cpu, cpu_kvcache_space_gib: 1}}
models:
  tiny-llama:
    url: "{url}"
    sha256: "{sha}"
hosts:
  {host}:
    address: sandbox
    servers:
      chat:
        model: tiny-llama
        port: {port}
        served_model_name: tiny-chat
        api_key: {{env: FLEET_E2E_API_KEY}}
        args: {{max-model-len: 512, max-num-seqs: 4, enforce-eager: true}}
"""


def write_fleet(path: Path, sha: str) -> Path:
    """A fleet file for the e2e host, with the archive digest ``sha``."""
    path.write_text(
        FLEET_TEMPLATE.format(
            schema=ROOT / "inventory" / "fleet.schema.json",
            url=e2e.TESTMODEL_URL,
            sha=sha,
            host=HOST,
            port=SERVER_PORT,
        )
    )
    return path


def deploy(fleet: Path) -> subprocess.CompletedProcess:
    """``pyinfra -y inventory.py deploy.py`` on the fleet file, with the API key set."""
    return e2e.deploy(fleet, ENV)


def fleet_cli(fleet: Path, *args: str) -> subprocess.CompletedProcess:
    """``fleet ARGS`` with the API key set."""
    return e2e.fleet_cli(fleet, *args, env=ENV)


@pytest.fixture(scope="module")
def fleet_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fleet(tmp_path_factory.mktemp("e2e") / "fleet.yaml", ARCHIVE_SHA)


@pytest.fixture(scope="module")
def host_up(vllm_host, testmodel_server):
    """The shared sandbox host (tests/e2e/conftest.py) and the model server."""
    return vllm_host


@pytest.fixture(scope="module")
def converge(host_up, fleet_file: Path) -> subprocess.CompletedProcess:
    return deploy(fleet_file)


@pytest.fixture(scope="module")
def second_run(converge, fleet_file: Path) -> subprocess.CompletedProcess:
    """The deploy again, once the models of modules before (on the shared host) are gone."""
    e2e.prune_other_models(fleet_file, ENV)
    return deploy(fleet_file)


def test_sandbox_host_is_running(host_up) -> None:
    assert host_up.state == "running"


def test_converge_succeeds(converge: subprocess.CompletedProcess) -> None:
    assert converge.returncode == 0, (converge.stdout + converge.stderr)[-4000:]


def test_converge_changes_the_host(converge: subprocess.CompletedProcess) -> None:
    assert changes(converge.stdout + converge.stderr) > 5


def test_converge_reports_read_only_sysctls(converge: subprocess.CompletedProcess) -> None:
    assert "sysctl vm.swappiness: not applicable here" in converge.stdout + converge.stderr


def test_second_deploy_changes_nothing(second_run: subprocess.CompletedProcess) -> None:
    output = second_run.stdout + second_run.stderr
    assert second_run.returncode == 0, output[-4000:]
    assert changes(output) == 0, output[-4000:]


def test_verify_passes(second_run, fleet_file: Path) -> None:
    result = fleet_cli(fleet_file, "verify", str(fleet_file), "-q")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert re.search(r"\b1[0-9] passed\b", result.stdout), result.stdout[-2000:]


def test_complete_prints_an_answer(second_run, fleet_file: Path) -> None:
    result = fleet_cli(fleet_file, "complete", str(fleet_file), "--prompt", "Hello")
    assert result.returncode == 0, result.stderr
    assert "answered 16 tokens" in result.stdout


def test_api_key_stays_out_of_deploy_output(converge, second_run) -> None:
    for output in (converge.stdout, converge.stderr, second_run.stdout, second_run.stderr):
        assert API_KEY not in output
        assert envfile.quote(API_KEY) not in output


def test_api_key_stays_out_of_verbose_deploy_output(second_run, fleet_file: Path) -> None:
    """pyinfra's -vv prints every command and its output: the key is in none of them."""
    verbose = e2e.run([str(e2e.BIN / "pyinfra"), "-y", "-vv", "inventory.py", "deploy.py"],
                      fleet_file, ENV)  # fmt: skip
    assert verbose.returncode == 0, (verbose.stdout + verbose.stderr)[-4000:]
    assert "vllm-chat.service" in verbose.stdout + verbose.stderr
    for secret in (API_KEY, envfile.quote(API_KEY), "7f3a9c1d"):
        assert secret not in verbose.stdout + verbose.stderr


def test_api_key_stays_out_of_the_journal(second_run) -> None:
    journal = on_host("journalctl --no-pager -o cat")
    assert journal.returncode == 0 and "vllm" in journal.stdout
    assert "7f3a9c1d" not in journal.stdout


def test_api_key_stays_out_of_the_unit(second_run) -> None:
    unit = on_host("cat /etc/systemd/system/vllm-chat.service")
    assert unit.returncode == 0 and "ExecStart=" in unit.stdout
    assert API_KEY not in unit.stdout


def test_api_key_stays_out_of_process_lists(second_run) -> None:
    processes = on_host("ps -eo args")
    assert "vllm.entrypoints.launchers.api_server.entry" in processes.stdout
    assert API_KEY not in processes.stdout


def test_api_key_is_in_the_private_environment_file(second_run) -> None:
    env = on_host("stat -c '%a %U' /etc/vllm-fleet/chat.env && cat /etc/vllm-fleet/chat.env")
    assert env.stdout.splitlines()[0] == "600 root"
    assert envfile.loads(env.stdout)["VLLM_API_KEY"] == API_KEY


def test_systemd_gives_the_server_the_api_key(second_run) -> None:
    """What systemd itself read from the environment file: the running server's environment."""
    environ = on_host(
        "tr '\\0' '\\n' < /proc/$(systemctl show -p MainPID --value vllm-chat.service)/environ"
    )
    assert f"VLLM_API_KEY={API_KEY}" in environ.stdout.splitlines()


def systemd_reads(text: str) -> dict[str, str]:
    """The variables real systemd reads from an environment file of ``text`` (on the host)."""
    put_on_host("/tmp/envfile-check.env", text)
    result = on_host(
        "systemd-run --quiet --wait --pipe -p EnvironmentFile=/tmp/envfile-check.env "
        "/usr/bin/env -0"
    )
    assert result.returncode == 0, result.stderr
    pairs = (item.partition("=") for item in result.stdout.split("\0") if item)
    return {key: value for key, _, value in pairs}


def test_systemd_reads_what_the_writer_writes(second_run) -> None:
    env = {f"FLEET_V{i}": value for i, value in enumerate(HOSTILE.values())}
    read = systemd_reads(envfile.dumps(env, comment="written by hostside.envfile"))
    assert {key: read.get(key) for key in env} == env


@pytest.mark.parametrize("text", [text for text, _ in SYSTEMD_READS.values()],
                         ids=list(SYSTEMD_READS))
def test_the_reader_reads_what_systemd_reads(second_run, text: str) -> None:
    read = systemd_reads(text)
    ours = envfile.loads(text)
    assert {key: read.get(key) for key in ours} == ours
    names = {key for key in read if key in {"A", "B", "C", "1A", "A-B", "JUNK"}}
    assert names == set(ours)


def test_server_restarts_when_its_engine_dies(second_run) -> None:
    """vLLM exits 0 when its engine dies; Restart=always must bring it back."""
    before = on_host("systemctl show -p NRestarts --value vllm-chat.service").stdout.strip()
    on_host("pkill -9 -f 'EngineCore' || pkill -9 -f 'VLLM::EngineCore'")
    check = (
        "for i in $(seq 120); do "
        "n=$(systemctl show -p NRestarts --value vllm-chat.service); "
        f"[ \"$n\" != '{before}' ] && systemctl is-active -q vllm-chat.service "
        "&& python3 -c \"import urllib.request as u; "
        f"u.urlopen('http://127.0.0.1:{SERVER_PORT}/health', timeout=2)\" 2>/dev/null "
        "&& exit 0; sleep 1; done; exit 1"
    )
    assert on_host(check).returncode == 0


def test_wrong_checksum_fails_and_keeps_the_model(second_run, tmp_path: Path) -> None:
    link_before = on_host("readlink /var/lib/vllm-fleet/models/tiny-llama").stdout
    broken = deploy(write_fleet(tmp_path / "wrong.yaml", WRONG_SHA))
    output = broken.stdout + broken.stderr
    assert broken.returncode != 0
    assert "checksum mismatch" in output
    assert f"expected sha256 {WRONG_SHA}, got {ARCHIVE_SHA}" in output
    assert on_host("readlink /var/lib/vllm-fleet/models/tiny-llama").stdout == link_before
    staged = on_host("ls /var/lib/vllm-fleet/models/.staging").stdout.split()
    assert [name for name in staged if not name.endswith(".lock")] == []
    assert on_host("systemctl is-active vllm-chat.service").stdout.strip() == "active"


def test_broken_fleet_file_stops_before_any_host(host_up, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        write_fleet(tmp_path / "ok.yaml", ARCHIVE_SHA).read_text().replace("port:", "prot:")
    )
    result = deploy(broken)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{broken}:17:" in output
    assert "did you mean 'port'?" in output
    assert "Connected" not in output


#: The API key after a rotation: the failed-restart test rotates it first, so that the saved
#: copy from before the rotation is the one a careless restore would bring back.
ROTATED_ENV = {**ENV, "FLEET_E2E_API_KEY": API_KEY + " rotated"}


def test_failed_restart_restores_the_previous_service(second_run, tmp_path: Path) -> None:
    """A new configuration that cannot start must not leave the host without its server, and
    what comes back is the last working configuration: a key rotated by an earlier deploy stays
    rotated (an older saved copy must not return)."""
    unit, env = "/etc/systemd/system/vllm-chat.service", "/etc/vllm-fleet/chat.env"
    rotated = e2e.deploy(write_fleet(tmp_path / "rotated.yaml", ARCHIVE_SHA), ROTATED_ENV)
    assert rotated.returncode == 0, (rotated.stdout + rotated.stderr)[-4000:]
    unit_before, env_before = on_host(f"cat {unit}").stdout, on_host(f"cat {env}").stdout
    assert envfile.loads(env_before)["VLLM_API_KEY"] == ROTATED_ENV["FLEET_E2E_API_KEY"]
    bad = write_fleet(tmp_path / "too-long.yaml", ARCHIVE_SHA)
    # The model allows 2048 positions: vLLM refuses 4096 at startup, after the unit is written.
    bad.write_text(bad.read_text().replace("max-model-len: 512", "max-model-len: 4096"))
    result = e2e.deploy(bad, ROTATED_ENV)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "failed to start with the new configuration" in output
    assert "restored the previous configuration of vllm-chat.service" in output
    assert on_host(f"cat {unit}").stdout == unit_before
    assert on_host(f"cat {env}").stdout == env_before
    assert on_host("systemctl is-active vllm-chat.service").stdout.strip() == "active"


def test_deploy_after_a_restored_failure_changes_nothing(
    second_run, fleet_file: Path, tmp_path: Path
) -> None:
    result = e2e.deploy(write_fleet(tmp_path / "rotated.yaml", ARCHIVE_SHA), ROTATED_ENV)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert changes(output) == 0, output[-4000:]
    back = deploy(fleet_file)  # the module's own key again, for the tests after this one
    assert back.returncode == 0, (back.stdout + back.stderr)[-4000:]


def test_flag_rejected_by_the_installed_vllm_stops_before_the_unit(
    second_run, tmp_path: Path
) -> None:
    """A whole number passes `fleet check`; only vLLM's own checks know -1 is out of range."""
    unit = "/etc/systemd/system/vllm-chat.service"
    unit_before = on_host(f"cat {unit}").stdout
    bad = write_fleet(tmp_path / "keep-alive.yaml", ARCHIVE_SHA)
    flags = "max-num-seqs: 4, sse-keep-alive-interval: -1"
    bad.write_text(bad.read_text().replace("max-num-seqs: 4", flags))
    result = deploy(bad)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "rejects the command line of vllm-chat.service" in output, output[-4000:]
    assert "--sse-keep-alive-interval must be a non-negative integer" in output
    assert on_host(f"cat {unit}").stdout == unit_before
    health = (
        "python3 -c \"import urllib.request as u; "
        f"u.urlopen('http://127.0.0.1:{SERVER_PORT}/health', timeout=5)\""
    )
    assert on_host(health).returncode == 0


RETIRED_UNIT = """\
# Managed by vllm-fleet — edit the fleet file, not this unit.
[Unit]
Description=a server since taken out of the fleet file
[Service]
ExecStart=/usr/bin/python3 -m http.server 18190 --bind 127.0.0.1
[Install]
WantedBy=multi-user.target
"""
HAND_UNIT = """\
# A vLLM unit written by hand: not vllm-fleet's to remove.
[Service]
ExecStart=/usr/bin/sleep infinity
[Install]
WantedBy=multi-user.target
"""


def put_on_host(path: str, text: str) -> None:
    result = on_host(f"printf %s {shlex.quote(text)} > {shlex.quote(path)}")
    assert result.returncode == 0, result.stderr


def test_a_server_taken_out_of_the_fleet_is_stopped_and_removed(
    second_run, fleet_file: Path
) -> None:
    """A server renamed or deleted in the fleet file: drift names it, the deploy stops it and
    deletes its unit and environment, the declared server keeps running untouched, a unit
    written by hand stays, and the next deploy changes nothing."""
    put_on_host("/etc/systemd/system/vllm-retired.service", RETIRED_UNIT)
    put_on_host("/etc/vllm-fleet/retired.env", "VLLM_API_KEY=old\n")
    put_on_host("/etc/systemd/system/vllm-mine.service", HAND_UNIT)
    started = on_host("systemctl daemon-reload && systemctl enable --now vllm-retired vllm-mine")
    assert started.returncode == 0, started.stderr
    before = main_pid()

    report = fleet_cli(fleet_file, "drift", str(fleet_file), "--json")
    assert report.returncode == 2, report.stdout + report.stderr
    rows = json.loads(report.stdout)["rows"]
    assert [r["item"] for r in rows if r["status"] == "drift"] == [
        "unit vllm-retired.service"
    ]

    result = deploy(fleet_file)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "server 'retired' is no longer in the fleet file" in output
    gone = on_host(
        "test ! -e /etc/systemd/system/vllm-retired.service"
        " && test ! -e /etc/vllm-fleet/retired.env"
        " && ! systemctl is-active --quiet vllm-retired"
        " && ! python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 18190), 2)'"
    )
    assert gone.returncode == 0, "the retired server is still installed or listening"
    assert on_host("systemctl is-active vllm-mine").stdout.strip() == "active"
    assert main_pid() == before, "the declared server was restarted"
    again = deploy(fleet_file)
    assert changes(again.stdout + again.stderr) == 0
    on_host("systemctl disable --now vllm-mine; rm -f /etc/systemd/system/vllm-mine.service; "
            "systemctl daemon-reload")


def main_pid() -> str:
    return on_host("systemctl show -p MainPID --value vllm-chat.service").stdout.strip()


def test_changed_file_limit_restarts_the_server(second_run, tmp_path: Path) -> None:
    """The open-file limit drop-in is shared by every vLLM unit: a change restarts them."""
    before = main_pid()
    fleet = write_fleet(tmp_path / "nofile.yaml", ARCHIVE_SHA)
    fleet.write_text(
        fleet.read_text().replace("    sysctl:", "    nofile: 50000\n    sysctl:", 1)
    )
    result = deploy(fleet)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert main_pid() not in ("0", before)
    assert on_host("systemctl is-active vllm-chat.service").stdout.strip() == "active"


@pytest.mark.ends_vllm_host
def test_down_stops_the_host(vllm_host, fleet_file: Path) -> None:
    """Last of all the shared host's users (tests/e2e/conftest.py moves it there)."""
    serving = on_host("systemctl list-units --state=active --plain --no-legend 'vllm-*.service'")
    assert serving.stdout.strip(), "the host to stop should be serving vLLM"
    result = fleet_cli(fleet_file, "sandbox", "down", str(fleet_file))
    assert result.returncode == 0, result.stderr
    assert sandbox.status([HOST])[0].state == "absent"
    assert sandbox.connection(HOST) is None
