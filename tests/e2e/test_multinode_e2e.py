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
Then the same group's units over Ray (rendered by the product, installed on the pair: the CPU
build cannot serve over Ray, so nothing deploys it): both Ray nodes joined, the head's wait passing,
a killed Ray worker rejoining, a stopped one failing the head's wait, naming it (the section
"Ray" below). Every wait asks the hosts again until their state holds
(:func:`tests.support.wait.wait_until`), never a fixed sleep. What the CPU build cannot run
across hosts is docs/multinode.md's.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.catalog.paths import PREVIOUS_DIR, remote_program
from fleet.hostplan.render import host_plan
from fleet.hostplan.types import HostPlan
from fleet.load import load_text, merge_defaults, parse_yaml
from fleet.read.problems import FleetError
from fleet.spec.models import Fleet
from sandbox import hosts as sandbox
from tests.support import e2e
from tests.support.e2e import MULTINODE_PORTS, ROOT, changes, deploy, on_host, output
from tests.support.wait import wait_until

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
    wait_until(lambda: main_pid(WORKER) not in (0, pid) and started(HEAD) != head_before
               and answers(), RECOVERY, interval=3,
               message=lambda: f"the group did not serve again{journals()}")
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
    wait_until(answers, RECOVERY, interval=3,
               message=lambda: f"the restored group did not serve{journals()}")


# --------------------------------------------------------------------------- Ray
#
# vLLM's CPU build cannot serve over Ray (``ValueError: current platform cpu does not support
# ray.``; ``fleet check`` refuses ``launcher: ray`` on cpu hosts), so no deploy of a Ray group
# runs here: the fleet file below is rendered with the product's own ``host_plan`` (past that
# one check, which is about vLLM, not Ray) and its units — byte for byte what a GPU deploy
# writes — are installed on the pair with the product's host programs and its Ray pin
# (``ray==2.48.0``, into the pair's vLLM venv). What runs for real: the Ray head unit on the
# head, the Ray worker unit on the other member, both joined (``ray status``: two nodes, each
# with its member resource), the head vLLM unit's bounded wait (``ray_joined.py``) passing,
# then vLLM refusing Ray with its own words; a Ray worker killed coming back and rejoining; a
# Ray worker stopped failing the wait, naming it. Everything is taken down again (no Ray left
# listening for the next module).

RAY_SERVER = "rgrp"
RAY_HEAD_UNIT, RAY_WORKER_UNIT = f"vllm-{RAY_SERVER}-ray.service", f"vllm-{RAY_SERVER}.service"
#: The GCS port, the head's node/object manager ports (the worker's, derived because the pair
#: shares one network: + 2), the group's API port, and the worker port range both split.
RAY_PORT, RAY_NODE_MANAGER, RAY_OBJECT_MANAGER = MULTINODE_PORTS[2:5]
RAY_API = MULTINODE_PORTS[7]
RAY_WORKERS = MULTINODE_PORTS[8], MULTINODE_PORTS[17]
RAY_BIN = "/opt/vllm-fleet/venv/bin/ray"
#: Ray Client's server, which the Ray head opens on this fixed port whenever ``grpc`` imports in
#: the venv (vLLM's venv: yes), outside the fleet file's ports (docs/multinode.md).
RAY_CLIENT_PORT = 10001
RAY_JOIN_TIMEOUT = 60


def machine_address() -> tuple[str, str]:
    """(interface, IPv4 address) of this machine's default route, which the sandbox hosts share:
    where Ray runs their nodes (Ray never runs a node on loopback: it replaces 127.0.0.1 by the
    machine's address, and its workers join the GCS there; measured)."""
    words = subprocess.run(["ip", "-4", "-o", "route", "get", "192.0.2.254"], capture_output=True,
                           text=True, check=True).stdout.split()
    return words[words.index("dev") + 1], words[words.index("src") + 1]


def ray_fleet(native: Path) -> str:
    """The module's fleet file with the group over Ray (another server name and ports)."""
    text = native.read_text().replace("      grp:\n", f"      {RAY_SERVER}:\n")
    text = text.replace(f"port: {API_PORT}\n", f"port: {RAY_API}\n")
    old = f"multinode: {{interface: lo, master_port: {MASTER_PORT}, join_timeout: 300}}"
    assert old in text
    interface, address = machine_address()
    return text.replace(old, (
        f"multinode: {{launcher: ray, interface: {interface}, head_address: {address}, "
        f"ray_port: {RAY_PORT}, "
        f"ray_node_manager_port: {RAY_NODE_MANAGER}, ray_object_manager_port: "
        f"{RAY_OBJECT_MANAGER}, ray_min_worker_port: {RAY_WORKERS[0]}, ray_max_worker_port: "
        f"{RAY_WORKERS[1]}, join_timeout: {RAY_JOIN_TIMEOUT}}}"))


def ray_plans(native: Path) -> dict[str, HostPlan]:
    """Both members' host plans of :func:`ray_fleet`, rendered by the product (``fleet check``
    would refuse the cpu build over Ray, which only vLLM's part needs: see above)."""
    text = ray_fleet(native)
    with pytest.raises(FleetError) as refused:  # that check, and only that one
        load_text(text, "ray.yaml")
    assert [p.message for p in refused.value.problems] == [
        "the cpu build of vLLM cannot serve over Ray: vLLM 0.32.0 says "
        "`ValueError: current platform cpu does not support ray.`"]
    raw, _ = parse_yaml(text, "ray.yaml")
    fleet = Fleet.model_validate(merge_defaults(raw)[0])
    return {host: host_plan(fleet, host, secrets=lambda ref: "") for host in (HEAD, WORKER)}


def ray_status() -> str:
    """``ray status`` of the group's cluster, asked on the head."""
    return on_host(f"{RAY_BIN} status --address {machine_address()[1]}:{RAY_PORT}", HEAD).stdout


def active_nodes(status: str) -> int:
    """How many nodes ``ray status`` lists as active."""
    section = status.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return sum(1 for line in section.splitlines() if line.strip().startswith("1 node_"))


def ray_joined(timeout: int) -> subprocess.CompletedProcess:
    """The head vLLM unit's wait, as its unit runs it (``ExecStartPre``), with ``timeout``."""
    [line] = [x for x in ray_head_vllm_unit().splitlines() if x.startswith("ExecStartPre=+")]
    words = shlex.split(line.removeprefix("ExecStartPre=+"))
    words[words.index("--timeout") + 1] = str(timeout)
    return on_host(shlex.join(words), HEAD, timeout=timeout + 120)


def ray_head_vllm_unit() -> str:
    return on_host(f"cat /etc/systemd/system/{RAY_WORKER_UNIT}", HEAD).stdout


def ray_main_pid(host: str, unit: str) -> int:
    return int(on_host(f"systemctl show -p MainPID --value {unit}", host).stdout or 0)


def ray_units_down() -> None:
    """Stop and remove every Ray unit, file and package this part installed, on both hosts."""
    for host in (WORKER, HEAD):
        units = f"{RAY_WORKER_UNIT} {RAY_HEAD_UNIT}" if host == HEAD else RAY_WORKER_UNIT
        on_host(f"systemctl stop {units}; rm -f "
                + " ".join(f"/etc/systemd/system/{u}" for u in units.split())
                + f" /etc/vllm-fleet/{RAY_SERVER}.env {remote_program('ray_node')} "
                f"{remote_program('ray_joined')}; systemctl daemon-reload; "
                "systemctl reset-failed; /opt/vllm-fleet/venv/bin/pip uninstall -y -q ray",
                host, timeout=180)


@pytest.fixture(scope="module")
def ray_group(converged: Path) -> Iterator[dict[str, HostPlan]]:
    """The Ray head unit on the head and the Ray worker unit on the other member, started."""
    plans = ray_plans(converged)
    try:
        for host, plan in plans.items():
            [entry] = [s for s in plan.servers if s.name == RAY_SERVER]
            files = {entry.unit_path: entry.unit_text, entry.env_path: entry.env_text or ""}
            if entry.ray_head is not None:
                files[entry.ray_head.unit_path] = entry.ray_head.unit_text
            for name in ("ray_node", "ray_joined"):
                files[remote_program(name)] = (ROOT / "hostside" / f"{name}.py").read_text()
            for path, text in files.items():
                put = on_host(f"cat > {path} && chmod {600 if path.endswith('.env') else 644} "
                              f"{path}", host, stdin=text)
                assert put.returncode == 0, put.stderr
        installs = {host: subprocess.Popen(
            sandbox.ssh_argv(host, f"/opt/vllm-fleet/venv/bin/pip install -q --no-input "
                             f"--disable-pip-version-check {shlex.quote(plan.ray_package)}"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for host, plan in plans.items()}  # both members at once
        for host, install in installs.items():
            assert install.wait(timeout=300) == 0, f"{host}: {install.stdout.read()}"
        # the deploy's order for a Ray group: the worker restarted without waiting, then the
        # Ray head (its start waits for its own node), then the worker's join wait
        on_host(f"systemctl daemon-reload && systemctl start --no-block {RAY_WORKER_UNIT}",
                WORKER)
        head = on_host(f"systemctl daemon-reload && systemctl start {RAY_HEAD_UNIT}", HEAD)
        assert head.returncode == 0, head.stdout + head.stderr + on_host(
            f"journalctl -u {RAY_HEAD_UNIT} -n 40 --no-pager", HEAD).stdout
        wait_until(lambda: on_host(f"systemctl is-active {RAY_WORKER_UNIT}",
                                   WORKER).stdout.strip() == "active",
                   RAY_JOIN_TIMEOUT + 60, interval=2, message=lambda: on_host(
                       f"journalctl -u {RAY_WORKER_UNIT} -n 40 --no-pager", WORKER).stdout)
        yield plans
    finally:
        ray_units_down()
        for host in (HEAD, WORKER):  # nothing of Ray left listening for the next module
            listening = on_host("ss -Htlnp", host).stdout
            ray_ports = [*MULTINODE_PORTS[2:7], *range(RAY_WORKERS[0], RAY_WORKERS[1] + 1),
                         RAY_CLIENT_PORT]
            assert not any(f":{port} " in listening for port in ray_ports), listening


def test_ray_status_shows_both_members_nodes_with_their_resources(ray_group) -> None:
    status = ray_status()
    assert active_nodes(status) == 2, status
    for host in (HEAD, WORKER):
        assert f"0.0/1.0 fleet_member_{host}" in status, status
    listening = on_host("ss -Htlnp", HEAD).stdout  # the worker's node on its own ports
    for port in (RAY_PORT, RAY_NODE_MANAGER, RAY_OBJECT_MANAGER,
                 RAY_NODE_MANAGER + 2, RAY_OBJECT_MANAGER + 2):
        assert f":{port} " in listening, (port, listening)


def test_the_heads_wait_passes_once_both_nodes_joined(ray_group) -> None:
    # The wait exactly as the head's vLLM unit runs it (its ExecStartPre line). What vLLM does
    # after it on the CPU build (``ValueError: current platform cpu does not support ray.``)
    # is read from vLLM's own code by the unit tests (tests/unit/fleet/test_release_data.py),
    # not started here: a CPU vLLM start that can only fail cost this module ~90 s.
    joined = ray_joined(RAY_JOIN_TIMEOUT)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    address = machine_address()[1]
    assert f"every member's Ray node has joined {address}:{RAY_PORT}: {HEAD}, {WORKER}" \
        in joined.stdout


def test_a_killed_ray_worker_comes_back_and_rejoins(ray_group) -> None:
    pid = ray_main_pid(WORKER, RAY_WORKER_UNIT)
    on_host(f"kill -9 {pid}", WORKER)

    def rejoined() -> bool:
        now = ray_main_pid(WORKER, RAY_WORKER_UNIT)
        state = on_host(f"systemctl is-active {RAY_WORKER_UNIT}", WORKER).stdout.strip()
        return now not in (0, pid) and state == "active" and active_nodes(ray_status()) == 2

    wait_until(rejoined, 180, interval=2, message=lambda: ray_status() + on_host(
        f"journalctl -u {RAY_WORKER_UNIT} -n 40 --no-pager", WORKER).stdout)
    joined = ray_joined(30)
    assert joined.returncode == 0, joined.stdout + joined.stderr


def test_a_stopped_ray_worker_fails_the_heads_wait_naming_it(ray_group) -> None:
    on_host(f"systemctl stop {RAY_WORKER_UNIT}", WORKER)
    # `ray status` drops a stopped node from its node list within seconds, and its resources
    # (the member resource the wait reads) some seconds later (measured); until then the
    # wait still passes
    stopped = time.monotonic()
    wait_until(lambda: active_nodes(ray_status()) == 1, 120, message=ray_status)
    left = time.monotonic() - stopped
    wait_until(lambda: f"fleet_member_{WORKER}" not in ray_status(),
               120 - left, message=ray_status)
    print(f"the stopped Ray worker left `ray status`'s nodes after {left:.0f}s, its resources "
          f"after {time.monotonic() - stopped:.0f}s")
    start = time.monotonic()
    joined = ray_joined(15)
    assert joined.returncode == 2, joined.stdout + joined.stderr
    address = machine_address()[1]
    assert (f"the Ray node of {WORKER} did not join the Ray head at {address}:{RAY_PORT} "
            "within 15s") in joined.stderr
    assert time.monotonic() - start < 15 + 60  # bounded (one last `ray status` after it)
