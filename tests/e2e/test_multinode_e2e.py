"""One vLLM server across two sandbox hosts: deployed, joined, serving, recovering, refused.

The session's two shared hosts (tests/e2e/conftest.py ``vllm_pair``) run the test model as
**one** server with vLLM's own multi-node launcher on the CPU build: tensor parallel 2, one
rank per host (``--nnodes 2``; the worker ``--headless``), over gloo on the shared loopback.
One deploy for the module (it retires what the module before left on both hosts); then: both
members joined, a completion answered by the group, a second deploy with zero changes, drift
clean and verify passing on both; the refusals: a worker host that cannot be reached, a worker
on another vLLM release — both before any restart; a worker killed and the group serving
again by itself, drift clean; last, a new configuration that vLLM refuses at start put back on
both members (restart-or-restore), and the group serving again.
What the CPU build cannot run across hosts (pipeline parallel, Ray) is docs/multinode.md's.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest

from fleet.paths import PREVIOUS_DIR, remote_program
from tests.support import e2e
from tests.support.e2e import MULTINODE_PORTS, changes, deploy, on_host, output

pytestmark = pytest.mark.e2e

HEAD, WORKER = e2e.VLLM_HOST, e2e.VLLM_HOST_B
API_PORT, MASTER_PORT, DEAD_SSH_PORT = MULTINODE_PORTS[0], MULTINODE_PORTS[1], MULTINODE_PORTS[19]
UNIT = "vllm-grp.service"
#: Seconds the group may take to serve again after a member was killed (two CPU vLLM starts
#: on a loaded two-core machine).
RECOVERY = 420

FLEET = """\
version: 1
defaults:
  vllm: {{version: "{version}", variant: cpu, cpu_kvcache_space_gib: 1}}
models:
  tiny: {{url: "http://127.0.0.1:{model_port}/tiny-llama.tar.gz", sha256: "{sha}"}}
hosts:
  {head}:
    address: sandbox
    servers:
      grp:
        model: tiny
        port: {api}
        worker_hosts: [{worker}]
        multinode: {{interface: lo, master_port: {master}, join_timeout: 300}}
        args: {{tensor-parallel-size: 2, max-model-len: 512, max-num-seqs: 4, enforce-eager: true}}
        env: {{VLLM_CPU_OMP_THREADS_BIND: nobind}}
  {worker}:
{worker_host}
"""
WORKER_HOST = """\
    address: sandbox
"""


def write_fleet(path: Path, worker: str = WORKER, worker_host: str = WORKER_HOST,
                worker_version: str | None = None) -> Path:
    """The module's fleet file (optionally a worker that differs)."""
    text = FLEET.format(version="0.32.0", model_port=e2e.TESTMODEL_PORT, sha=e2e.TESTMODEL_SHA,
                        head=HEAD, worker=worker, api=API_PORT, master=MASTER_PORT,
                        worker_host=worker_host.rstrip("\n"))
    if worker_version is not None:
        text += f'    vllm: {{version: "{worker_version}", variant: cpu}}\n'
    path.write_text(text)
    return path


def answers(port: int = API_PORT) -> bool:
    """Whether the head answers a real completion."""
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 4}
    script = (
        "import json, sys, urllib.request as u; "
        f"r = u.urlopen(u.Request('http://127.0.0.1:{port}/v1/completions', "
        f"data={json.dumps(body)!r}.encode(), headers={{'Content-Type': 'application/json'}}), "
        "timeout=60); sys.exit(0 if json.load(r)['usage']['completion_tokens'] > 0 else 1)"
    )
    return on_host(f"python3 -c {shlex.quote(script)}", HEAD).returncode == 0


def journals(lines: int = 60) -> str:
    """Every member's last log lines of the group's unit (for a failure's message)."""
    return "".join(
        f"\n--- {host}: journalctl -u {UNIT}\n"
        + on_host(f"journalctl -u {UNIT} -n {lines} --no-pager -o short-monotonic", host).stdout
        for host in (HEAD, WORKER)
    )


def started(host: str) -> str:
    """When the group's unit on ``host`` last became active (changes on every restart)."""
    return on_host(f"systemctl show -p ActiveEnterTimestampMonotonic --value {UNIT}", host).stdout


def unit_text(host: str) -> str:
    """The group's unit file on ``host``."""
    return on_host(f"cat /etc/systemd/system/{UNIT}", host).stdout


def main_pid(host: str) -> int:
    """The group unit's main process on ``host``."""
    return int(on_host(f"systemctl show -p MainPID --value {UNIT}", host).stdout)


@pytest.fixture(scope="module")
def converged(vllm_pair, testmodel_server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The group deployed across both hosts (retiring what the module before left there)."""
    fleet = write_fleet(tmp_path_factory.mktemp("fleet") / "fleet.yaml")
    result = deploy(fleet)
    assert result.returncode == 0, output(result)[-6000:] + journals()
    e2e.prune_other_models(fleet)
    return fleet


# --------------------------------------------------------------------------- converge


@pytest.mark.parametrize("host", [HEAD, WORKER])
def test_every_member_runs_the_group_unit(converged: Path, host: str) -> None:
    assert on_host(f"systemctl is-active {UNIT}", host).stdout.strip() == "active"
    listing = "ls /etc/systemd/system | grep -E '^vllm-.+[.]service$' | grep -v '^vllm-fleet'"
    units = on_host(listing,
                    host).stdout
    assert units.split() == [UNIT]  # what the module before left is retired


def test_the_worker_runs_headless_and_has_joined_the_head(converged: Path) -> None:
    unit = on_host(f"cat /etc/systemd/system/{UNIT}", WORKER).stdout
    assert "--headless" in unit and "--node-rank 1" in unit
    # the hosts share one network: only a link held by the worker unit's own processes counts
    waiter = remote_program("wait_joined")
    joined = on_host(f"python3 {waiter} --head {HEAD} --connect 127.0.0.1:{MASTER_PORT} "
                     f"--pid {main_pid(WORKER)} --timeout 10", WORKER)
    assert joined.returncode == 0, joined.stderr


def test_a_completion_is_answered_by_the_group(converged: Path) -> None:
    assert answers()
    log = on_host(f"journalctl -u {UNIT} --no-pager -o cat | grep -c 'world_size=2 rank=1'",
                  WORKER).stdout
    assert int(log.strip() or 0) >= 1  # the worker holds rank 1 of a world of 2


def test_second_deploy_changes_nothing(converged: Path) -> None:
    before = {host: started(host) for host in (HEAD, WORKER)}
    result = deploy(converged)
    assert result.returncode == 0, output(result)[-6000:]
    assert changes(output(result)) == 0, output(result)[-4000:]
    assert {host: started(host) for host in (HEAD, WORKER)} == before


def test_drift_is_clean_on_every_member(converged: Path) -> None:
    result = e2e.fleet_cli(converged, "drift", str(converged), "--json")
    assert result.returncode == 0, output(result)[-4000:]


def test_verify_checks_every_member(converged: Path) -> None:
    result = e2e.fleet_cli(converged, "verify", str(converged))
    assert result.returncode == 0, output(result)[-6000:]


# --------------------------------------------------------------------------- faults


def test_an_unreachable_worker_host_fails_the_deploy_before_any_restart(
    converged: Path, tmp_path: Path
) -> None:
    gone = "e2e-vllm-gone"  # nothing listens on its ssh port: pyinfra cannot connect
    fleet = write_fleet(tmp_path / "fleet.yaml", worker=gone,
                        worker_host=f"    address: 127.0.0.1\n    ssh: {{port: {DEAD_SSH_PORT}}}\n")
    fleet.write_text(fleet.read_text().replace(  # the head is not on loopback for another machine
        "multinode: {interface: lo,", "multinode: {head_address: 10.255.0.1, interface: lo,"))
    before = started(HEAD)
    result = deploy(fleet)
    assert result.returncode != 0
    assert f"member host {gone} is not reachable" in output(result), output(result)[-4000:]
    assert started(HEAD) == before
    assert answers()


def test_a_worker_on_another_vllm_release_is_refused_before_any_restart(
    converged: Path, tmp_path: Path
) -> None:
    fleet = write_fleet(tmp_path / "fleet.yaml", worker_version="0.33.0")
    before = {host: started(host) for host in (HEAD, WORKER)}
    result = deploy(fleet)
    assert result.returncode != 0
    assert f"host {WORKER!r} runs vLLM 0.33.0 cpu, this host 0.32.0 cpu" in output(result)
    assert {host: started(host) for host in (HEAD, WORKER)} == before


def test_a_killed_worker_rejoins_and_the_group_serves_again(converged: Path) -> None:
    head_before = started(HEAD)
    pid = main_pid(WORKER)
    on_host(f"kill -9 {pid}", WORKER)
    deadline = time.monotonic() + RECOVERY
    while time.monotonic() < deadline:
        time.sleep(10)
        if main_pid(WORKER) not in (0, pid) and started(HEAD) != head_before and answers():
            break
    else:
        pytest.fail(f"the group did not serve again within {RECOVERY}s")
    drift = e2e.fleet_cli(converged, "drift", str(converged), "--json")
    assert drift.returncode == 0, output(drift)[-4000:]


def test_a_group_that_does_not_come_up_gets_its_previous_configuration_back(
    converged: Path, tmp_path: Path
) -> None:
    # vLLM refuses this at start on every member (the model's max_position_embeddings is 2048);
    # the flag check before the restart cannot know it
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(converged.read_text().replace("max-model-len: 512", "max-model-len: 99999")
                     .replace("join_timeout: 300", "join_timeout: 20"))
    units = {host: unit_text(host) for host in (HEAD, WORKER)}
    result = deploy(fleet)
    assert result.returncode != 0
    assert "group grp did not come up with its new configuration" in output(result), \
        output(result)[-6000:]
    assert {host: unit_text(host) for host in (HEAD, WORKER)} == units
    for host in (HEAD, WORKER):  # the saved copies served this change only
        saved = on_host(f"ls {PREVIOUS_DIR}", host).stdout.split()
        assert UNIT not in saved and "grp.env" not in saved
    deadline = time.monotonic() + RECOVERY
    while not answers():
        assert time.monotonic() < deadline, \
            f"the restored group did not serve within {RECOVERY}s{journals()}"
        time.sleep(10)
