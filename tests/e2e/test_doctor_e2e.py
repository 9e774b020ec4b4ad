"""``fleet doctor`` end to end: faults provoked on a real server, named with evidence and fix.

One deploy of the tiny model on the session's shared vLLM host (server ``doc``, port 18700 of
the doctor block), healthy first; then, one after another, the faults a CPU host can have are
provoked by hand on the host, the way they happen there (another process on the port, a model
file someone made private, a drop-in that passes a flag this vLLM does not know, a context
longer than the KV cache, a full /dev/shm), each while the unit restarts in its loop. For each,
``fleet doctor`` must name the cause, print the fix, exit 2 and change nothing on the host
(unit files, drop-ins, environment files, model files and modes, mounts: compared before and
after). Each fault is undone before the next.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import e2e
from tests.support.e2e import on_host

pytestmark = pytest.mark.e2e

HOST = e2e.VLLM_HOST
PORT = e2e.DOCTOR_PORTS[0]
UNIT = "vllm-doc.service"
API_KEY = "doctor-e2e-key-5c1f9b"
ENV = {"FLEET_DOCTOR_E2E_KEY": API_KEY}
DROPIN_DIR = f"/run/systemd/system/{UNIT}.d"
DROPIN = f"{DROPIN_DIR}/50-doctor-fault.conf"
MODEL = "/var/lib/vllm-fleet/models/tiny-llama"

FLEET = f"""\
version: 1
defaults:
  vllm: {{version: "0.32.0", variant: cpu, cpu_kvcache_space_gib: 1}}
models:
  tiny-llama:
    url: "{e2e.TESTMODEL_URL}"
    sha256: "{e2e.TESTMODEL_SHA}"
hosts:
  {HOST}:
    address: sandbox
    servers:
      doc:
        model: tiny-llama
        port: {PORT}
        served_model_name: tiny-doc
        api_key: {{env: FLEET_DOCTOR_E2E_KEY}}
        args: {{max-model-len: 512, max-num-seqs: 4, enforce-eager: true}}
"""
#: A second host nobody answers for (ssh to a closed port): the report must go on without it.
ABSENT = """\
  doctor-absent:
    address: 127.0.0.1
    ssh: {user: root, port: 1}
    servers:
      gone:
        model: tiny-llama
        port: 18719
        args: {max-model-len: 512, enforce-eager: true}
"""

#: What doctor must not change: unit files and drop-ins, environment files, the model's files
#: with their owners and modes, the mounts, and what systemd loaded for the unit (not its
#: ExecStart property: that carries the pid and times of the current attempt).
SNAPSHOT = (
    "sha256sum /etc/systemd/system/vllm-*.service /etc/vllm-fleet/*.env "
    f"{DROPIN_DIR}/* 2>/dev/null; "
    f"find -L {MODEL} -exec stat -L -c '%n %a %U:%G %s %Y' {{}} +; "
    "findmnt -rn -o TARGET,FSTYPE,OPTIONS | sort; "
    f"systemctl show -p FragmentPath,DropInPaths,UnitFileState {UNIT}"
)


@pytest.fixture(scope="module")
def fleet(vllm_host, testmodel_server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared host serving ``doc`` as this module's fleet file says."""
    path = tmp_path_factory.mktemp("doctor-e2e") / "fleet.yaml"
    path.write_text(FLEET)
    result = e2e.deploy(path, ENV)
    assert result.returncode == 0, e2e.output(result)[-4000:]
    yield path
    on_host(f"rm -f {DROPIN}; systemctl daemon-reload; systemctl stop {UNIT}; "
            f"systemctl reset-failed {UNIT}")


def doctor(fleet: Path, *extra: str) -> tuple[int, dict, str]:
    """``fleet doctor --json`` on the server; (exit status, report, all output), with the host
    snapshot compared before and after."""
    before = on_host(SNAPSHOT).stdout
    result = e2e.fleet_cli(fleet, "doctor", str(fleet), *extra, "--json", env=ENV, timeout=120)
    after = on_host(SNAPSHOT).stdout
    assert before == after, "fleet doctor changed the host"
    text = e2e.output(result)
    assert API_KEY not in text
    assert result.stdout.strip(), text[-3000:]
    return result.returncode, json.loads(result.stdout), text


def server(report: dict, name: str = "doc") -> dict:
    return next(s for s in report["servers"] if s["server"] == name)


def start_failing(pattern: str, restarts: int = 1, timeout: float = 150) -> None:
    """Start the unit without waiting; return once its journal shows ``pattern`` (a grep -E
    expression) since now and systemd counted ``restarts`` restarts."""
    since = on_host("date +%s").stdout.strip()
    on_host(f"systemctl reset-failed {UNIT}; systemctl start --no-block {UNIT}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = on_host(f"journalctl -u {UNIT} --since @{since} -o cat --no-pager "
                       f"| grep -Ec {shlex.quote(pattern)}").stdout.strip()
        count = on_host(f"systemctl show -p NRestarts --value {UNIT}").stdout.strip()
        if seen not in ("", "0") and count.isdigit() and int(count) >= restarts:
            return
        time.sleep(2)
    log = on_host(f"journalctl -u {UNIT} --since @{since} -o cat --no-pager | tail -40").stdout
    raise AssertionError(f"{UNIT} never showed {pattern!r}:\n{log}")


def stop() -> None:
    on_host(f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}")


def dropin(text: str) -> None:
    """A runtime drop-in for the unit (in /run: gone at the next boot), then daemon-reload."""
    stop()
    on_host(f"mkdir -p {DROPIN_DIR} && cat > {DROPIN} && systemctl daemon-reload", stdin=text)


def exec_start() -> str:
    unit = on_host(f"cat /etc/systemd/system/{UNIT}").stdout
    return next(line for line in unit.splitlines() if line.startswith("ExecStart="))


#: Processes a test started on the host (by pid), to end after it.
SQUATTERS: list[str] = []


@pytest.fixture
def undo() -> Iterator[None]:
    """Put the host back after a fault: drop-in, squatter, modes and mounts."""
    yield
    while SQUATTERS:
        pid = SQUATTERS.pop()
        if pid.isdigit():
            on_host(f"kill {pid}")
    on_host(f"rm -f {DROPIN}; systemctl daemon-reload; "
            f"chmod 0644 $(readlink -f {MODEL}/config.json); "
            "mountpoint -q /dev/shm && grep -q ' /dev/shm tmpfs .*size=256k' /proc/mounts "
            "&& umount /dev/shm; true")
    stop()


def test_a_healthy_server_is_ok(fleet: Path) -> None:
    status, report, text = doctor(fleet)
    assert status == 0, text[-3000:]
    assert server(report)["status"] == "ok"
    assert report["read_only"] is True


def test_an_unreachable_host_is_reported_and_the_report_goes_on(fleet: Path, tmp_path) -> None:
    both = tmp_path / "fleet.yaml"
    both.write_text(FLEET + ABSENT)
    status, report, text = doctor(both)
    assert status == 1, text[-3000:]
    assert server(report)["status"] == "ok"
    gone = server(report, "gone")
    assert gone["status"] == "unknown" and "unreachable" in gone["cause"]


def test_port_taken_by_another_user_in_a_restart_loop(fleet: Path, undo) -> None:
    stop()
    # SO_REUSEADDR as servers set it: the port's connections to the stopped server are still
    # in TIME_WAIT, and a plain bind would fail on them.
    code = ("import socket,time; s=socket.socket(); "
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f's.bind(("127.0.0.1", {PORT})); s.listen(); time.sleep(900)')
    squatter = on_host("setpriv --reuid=nobody --regid=nogroup --clear-groups python3 -c "
                       f"{shlex.quote(code)} "
                       "</dev/null >/dev/null 2>&1 & echo $!").stdout.strip()
    SQUATTERS.append(squatter)
    for _ in range(30):
        if f"pid={squatter}," in on_host(f"ss -Hltnp 'sport = :{PORT}'").stdout:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"the squatter (pid {squatter!r}) never listened on {PORT}")
    start_failing("Address already in use", restarts=3)
    status, report, text = doctor(fleet, f"{HOST}/doc")
    doc = server(report)
    assert status == 2, text[-3000:]
    assert doc["signature"] == "port-in-use"
    assert f"port {PORT} is held by pid" in doc["cause"] and "user nobody" in doc["cause"]
    assert "restarting in a loop" in doc["cause"]
    assert any("Address already in use" in line for line in doc["evidence"])
    assert f"hosts.{HOST}.servers.doc.port" in doc["fix"]


def test_a_flag_the_installed_vllm_rejects(fleet: Path, undo) -> None:
    dropin(f"[Service]\nExecStart=\n{exec_start()} --no-such-flag\n")
    start_failing("unrecognized arguments")
    status, report, text = doctor(fleet, f"{HOST}/doc")
    doc = server(report)
    assert status == 2, text[-3000:]
    assert doc["signature"] == "bad-flag"
    assert doc["cause"].split(" (")[0] == "vLLM 0.32.0 rejects no-such-flag"
    assert "remove no-such-flag" in doc["fix"]


def test_a_model_the_service_user_cannot_read(fleet: Path, undo) -> None:
    stop()
    on_host(f"chmod 0600 $(readlink -f {MODEL}/config.json)")
    start_failing("Error|error", restarts=1)
    status, report, text = doctor(fleet, f"{HOST}/doc")
    doc = server(report)
    assert status == 2, text[-3000:]
    assert doc["signature"] == "model-unreadable"
    assert any("config.json (root:root, mode 600) is not readable by vllm" in line
               for line in doc["evidence"]), doc
    assert "chmod -R a+rX" in doc["fix"]


def test_a_kv_cache_too_small_for_max_model_len(fleet: Path, undo) -> None:
    line = exec_start().replace("--max-model-len 512", "--max-model-len 4194304")
    dropin(f"[Service]\nEnvironment=VLLM_ALLOW_LONG_MAX_MODEL_LEN=1\nExecStart=\n{line}\n")
    start_failing("KV cache is needed", timeout=240)
    status, report, text = doctor(fleet, f"{HOST}/doc")
    doc = server(report)
    assert status == 2, text[-3000:]
    assert doc["signature"] == "kv-too-small"
    assert "max-model-len 4,194,304 does not fit the KV cache" in doc["cause"]
    assert "set max-model-len: 2097024" in doc["fix"]
    assert "vllm.cpu_kvcache_space_gib: 2" in doc["fix"]


def test_a_full_shared_memory(fleet: Path, undo) -> None:
    stop()
    on_host("mount -t tmpfs -o size=256k tmpfs /dev/shm && "
            "dd if=/dev/zero of=/dev/shm/fill bs=4k count=64 2>/dev/null; true")
    start_failing("No space left|Bus error|shared memory|Errno 28|Error", timeout=150)
    status, report, text = doctor(fleet, f"{HOST}/doc")
    doc = server(report)
    assert status == 2, text[-3000:]
    assert doc["signature"] == "disk-full", doc
    assert any(line.startswith("/dev/shm: ") for line in doc["evidence"]), doc
