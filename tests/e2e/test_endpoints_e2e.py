"""An endpoint for real: two CPU vLLM replicas on two sandbox hosts behind the real vllm-router.

Replica ``tiny-a`` listens on 127.0.0.2 only (``host:``), so that the router's worker URL, the
readiness wait, the roll's drain and the canary all reach a replica where it listens.

One deploy sequence, many assertions (two CPU vLLMs on two cores are slow): converge;
a flags change rolled out under a steady load through the router (no failed
request, each replica restarted once, one at a time — the timeline is printed); a replica
killed with SIGKILL under load (the router routes around it, it rejoins); a new configuration
that cannot start (the rollout stops at the first replica, which is restored, the other keeps
serving, the deploy fails naming it); a canary gate that passes (the flags change, both
figures in the output) and one that fails (a slower configuration: that replica is rolled
back, the other untouched, the deploy fails naming it); the router's own restart with the
replicas untouched; and a last deploy that changes nothing and runs no canary.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tests.support import e2e
from tests.support.e2e import changes, on_host, output
from tests.support.wait import wait_until

pytestmark = pytest.mark.e2e

HOST_A, HOST_B = e2e.VLLM_HOST, e2e.VLLM_HOST_B
ROUTER_PORT, PORT_A, PORT_B, METRICS_PORT = e2e.ENDPOINT_PORTS[:4]
KEY = "endpoint e2e key 5d1c"
ENV = {"FLEET_E2E_ENDPOINT_KEY": KEY}
ROUTER_UNIT = "vllm-fleet-router-tiny.service"
UNIT_A, UNIT_B = "vllm-tiny-a.service", "vllm-tiny-b.service"

#: The sandbox hosts share this machine's cores: left at ``auto``, both replicas' CPU vLLMs bind
#: their threads to core 0, and a replica restarting beside one serving a load starves (a
#: rolled deploy ran past 900 s so). Each replica gets a core of its own.
FLEET = """\
# yaml-language-server: $schema={schema}
version: 1
defaults:
  vllm: {{version: "0.32.0", variant: cpu, cpu_kvcache_space_gib: 1}}
models:
  tiny-llama: {{url: "{url}", sha256: "{sha}"}}
hosts:
  {host_a}:
    address: sandbox
    servers:
      tiny-a:
        model: tiny-llama
        port: {port_a}
        host: 127.0.0.2
        served_model_name: tiny
        api_key: {{env: FLEET_E2E_ENDPOINT_KEY}}
        args: {{max-model-len: {max_len}, max-num-seqs: {seqs}, enforce-eager: true{extra}}}
        env: {{VLLM_CPU_OMP_THREADS_BIND: "0"}}
  {host_b}:
    address: sandbox
    servers:
      tiny-b:
        model: tiny-llama
        port: {port_b}
        served_model_name: tiny
        api_key: {{env: FLEET_E2E_ENDPOINT_KEY}}
        args: {{max-model-len: {max_len}, max-num-seqs: {seqs}, enforce-eager: true{extra}}}
        env: {{VLLM_CPU_OMP_THREADS_BIND: "1"}}
endpoints:
  tiny:
    replicas: [{host_a}/tiny-a, {host_b}/tiny-b]
    router:
      host: {host_a}
      port: {router_port}
      metrics_port: {metrics_port}
      policy: {policy}
      api_key: {{env: FLEET_E2E_ENDPOINT_KEY}}
      health_check_interval_s: 2
    rollout: {{max_unavailable: 1, drain_timeout_s: 30{canary}}}
"""

#: The canary gate of the steps that have one (a short measurement: 2 × (1 + 5) requests).
CANARY = "requests: 5, input_len: 150, output_len: 16"  # ~330 tokens in: max-model-len 512


def write_fleet(path: Path, seqs: int = 4, max_len: int = 512, policy: str = "round_robin",
                canary: str = "", extra: str = ""):
    """The module's fleet file with the given replica flags and router policy; ``canary``:
    the fields of ``rollout.canary`` (none when empty); ``extra``: more replica flags."""
    path.write_text(FLEET.format(
        schema=e2e.ROOT / "inventory" / "fleet.schema.json", url=e2e.TESTMODEL_URL,
        sha=e2e.TESTMODEL_SHA, host_a=HOST_A, host_b=HOST_B, port_a=PORT_A, port_b=PORT_B,
        router_port=ROUTER_PORT, metrics_port=METRICS_PORT, seqs=seqs, max_len=max_len,
        policy=policy, canary=f", canary: {{{canary}}}" if canary else "",
        extra=f", {extra}" if extra else "",
    ))  # fmt: skip
    return path


def canary_lines(text: str) -> list[str]:
    """The canary's lines of a deploy's output (``canary: HH:MM:SS.mmm …``, stamp dropped)."""
    return [line[line.index("canary: ") + 8:].split(" ", 1)[1]
            for line in text.splitlines() if "canary: " in line]  # fmt: skip


def complete(timeout: float = 60) -> str:
    """One completion through the router (sandbox hosts share this machine's network)."""
    body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{ROUTER_PORT}/v1/completions", data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.load(reply)["choices"][0]["text"]


def chat(timeout: float = 60) -> str:
    """One chat completion through the router."""
    body = json.dumps({"model": "tiny", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "Hello"}]}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{ROUTER_PORT}/v1/chat/completions", data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.load(reply)["choices"][0]["message"]["content"]


class Load:
    """A steady small load through the router while the block runs: ``clients`` clients, each
    waiting ``pause`` seconds between its requests (two CPU vLLMs on two cores: a replica
    starting must not be starved); counts results by kind (``ok``, ``HTTP 503``, …)."""

    def __init__(self, clients: int = 2, pause: float = 1.0) -> None:
        self.pause = pause
        self.results: Counter[str] = Counter()
        self.failures: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                complete()
                self.results["ok"] += 1
            except urllib.error.HTTPError as error:
                kind = f"HTTP {error.code}: {error.read(200).decode(errors='replace')}"
                self.results[kind] += 1
                self.failures.append((time.time(), kind))
            except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
                kind = type(error).__name__ + f": {error}"
                self.results[kind] += 1
                self.failures.append((time.time(), kind))
            self._stop.wait(self.pause)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)
        print(f"load through the router: {dict(self.results)}")

    def wait_for(self, more: int, timeout: float = 60) -> None:
        """Return once ``more`` requests more than now were answered."""
        goal = self.results["ok"] + more
        wait_until(lambda: self.results["ok"] >= goal, timeout, interval=0.2,
                   message=lambda: f"the load got no {more} answers: {dict(self.results)}")

    @property
    def failed(self) -> int:
        return sum(n for kind, n in self.results.items() if kind != "ok")


def main_pid(unit: str, host: str) -> str:
    return on_host(f"systemctl show -p MainPID --value {unit}", host=host).stdout.strip()


def timeline(text: str) -> list[str]:
    """The rollout's timeline lines of a deploy's output (``rollout: HH:MM:SS.mmm …``)."""
    return [line[line.index("rollout: ") + 9:] for line in text.splitlines() if "rollout: " in line]


@pytest.fixture(scope="module")
def hosts(vllm_pair, testmodel_server):
    return vllm_pair


@pytest.fixture(scope="module")
def fleet_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fleet(tmp_path_factory.mktemp("endpoints") / "fleet.yaml")


@pytest.fixture(scope="module")
def converge(hosts, fleet_file: Path):
    return e2e.deploy(fleet_file, ENV)


def test_converge_serves_the_endpoint_through_the_router(converge) -> None:
    assert converge.returncode == 0, output(converge)[-5000:]
    assert on_host(f"systemctl is-active {ROUTER_UNIT}").stdout.strip() == "active"
    workers = json.loads(on_host(f"curl -s http://127.0.0.1:{ROUTER_PORT}/list_workers").stdout)
    # tiny-a listens on 127.0.0.2 only: the router reaches each replica where it listens
    assert sorted(workers["urls"]) == [f"http://127.0.0.1:{PORT_B}", f"http://127.0.0.2:{PORT_A}"]
    assert complete()


def test_the_router_checks_no_key_but_the_replicas_do(converge) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{ROUTER_PORT}/v1/completions",
        data=json.dumps({"model": "tiny", "prompt": "Hi", "max_tokens": 2}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 401


def test_the_router_unit_is_hardened_and_holds_no_key(converge) -> None:
    exposure = on_host(f"systemd-analyze security {ROUTER_UNIT} --no-pager | tail -n 1").stdout
    print(exposure)
    assert float(exposure.split("exposure level for")[1].split(":")[1].split()[0]) <= 2.0
    unit = on_host(f"cat /etc/systemd/system/{ROUTER_UNIT}").stdout
    assert KEY not in unit
    cmdline = on_host(
        f"cat /proc/$(systemctl show -p MainPID --value {ROUTER_UNIT})/cmdline | tr '\\0' ' '"
    ).stdout
    assert "router" in cmdline and KEY not in cmdline  # it names itself vllm::router
    user = on_host(f"ps -o user= -p $(systemctl show -p MainPID --value {ROUTER_UNIT})").stdout
    assert user.strip() != "root"


#: What the replicas run now (the later steps deploy these flags, so that only what they change
#: changes, whichever steps ran before: `-k` may leave some out).
DEPLOYED = {"seqs": 4}


@pytest.fixture(scope="module")
def rolled(converge, tmp_path_factory: pytest.TempPathFactory):
    """A flags change (max-num-seqs 4 → 3) deployed under load through the router, through a
    canary gate with wide margins: the change does not slow a server, but under this load on
    two shared cores the figures are noisy (one run: the fresh replica's API server, short of
    CPU, streamed its 16 tokens in one chunk: TTFT 36 ms against 20 ms, TPOT 0.01 ms; another:
    TTFT +246 %), so a slowdown must pass 250 ms too to fail it here: the failing canary below
    is the one that shows the gate tells a slower replica apart."""
    before = {UNIT_A: main_pid(UNIT_A, HOST_A), UNIT_B: main_pid(UNIT_B, HOST_B)}
    fleet = write_fleet(tmp_path_factory.mktemp("rolled") / "fleet.yaml", seqs=3,
                        canary=CANARY + ", ttft_margin: 1, tpot_margin: 1, floor_ms: 250")
    with Load() as load:
        load.wait_for(2)  # the load runs before the rollout starts
        started = time.monotonic()
        result = e2e.deploy(fleet, ENV)
        took = time.monotonic() - started
        load.wait_for(2)  # and still after it ends
    if result.returncode == 0:
        DEPLOYED["seqs"] = 3
    print(f"rolled deploy: {took:.0f} s")
    after = {UNIT_A: main_pid(UNIT_A, HOST_A), UNIT_B: main_pid(UNIT_B, HOST_B)}
    lines = timeline(output(result))
    print("rollout timeline:\n  " + "\n  ".join(lines))
    return result, load, lines, before, after


def test_rolling_update_drops_no_request(rolled) -> None:
    result, load, _, _, _ = rolled
    assert result.returncode == 0, output(result)[-5000:]
    assert load.results["ok"] > 10
    assert load.failed == 0, load.failures


def test_rolling_update_restarts_each_replica_once_one_at_a_time(rolled) -> None:
    _, _, lines, before, after = rolled
    assert all(before[unit] != after[unit] for unit in before)
    restarting = [line for line in lines if line.endswith(" restarting")]
    assert len(restarting) == 2, lines
    steps = [(line.split(" ", 1)[1]) for line in lines]
    a, b = f"tiny/{HOST_A}/tiny-a", f"tiny/{HOST_B}/tiny-b"
    # A whole cycle of one replica, then of the other (pyinfra picks which goes first): never
    # both out at once.
    edges = (" out of the router", " back in the router (healthy)")
    order = [s for s in steps if s.endswith(edges)]
    first, second = (a, b) if order and order[0].startswith(a) else (b, a)
    assert order == [f"{first} out of the router", f"{first} back in the router (healthy)",
                     f"{second} out of the router", f"{second} back in the router (healthy)"], lines


def test_rolling_update_passes_its_canary_with_both_figures_in_the_output(rolled) -> None:
    result, _, _, _, _ = rolled
    lines = canary_lines(output(result))
    print("canary:\n  " + "\n  ".join(lines))
    a, b = f"tiny/{HOST_A}/tiny-a", f"tiny/{HOST_B}/tiny-b"
    first, other = (a, b) if lines and lines[0].startswith(a) else (b, a)
    assert f"{first}: measuring it against {other} (5 requests each" in lines[0], lines
    assert any(line.startswith(f"{first} (new configuration): TTFT P50 ") for line in lines)
    assert any(line.startswith(f"{other} (old configuration): TTFT P50 ") for line in lines)
    assert lines[-1].startswith(f"{first}: passed: TTFT "), lines
    assert len(lines) == 4, lines  # one canary: the second replica rolled without one


def test_a_killed_replica_is_routed_around_and_rejoins(converge) -> None:
    def workers() -> list[dict]:
        return json.loads(on_host(f"curl -s http://127.0.0.1:{ROUTER_PORT}/workers").stdout
                          )["workers"]  # fmt: skip

    with Load() as load:
        load.wait_for(2)
        on_host(f"kill -9 {main_pid(UNIT_B, HOST_B)}", host=HOST_B)
        killed = time.time()
        # requests keep being answered (by tiny-a) while tiny-b is down
        load.wait_for(3, timeout=30)
        wait_until(lambda: on_host(f"curl -sf http://127.0.0.1:{PORT_B}/health",
                                   host=HOST_B).returncode == 0, 120, interval=2,
                   message="tiny-b never answered /health again")
        # the router's own health checks (every 2 s) take it back
        wait_until(lambda: all(w["is_healthy"] for w in workers()), 30, interval=1,
                   message=lambda: f"the router never took tiny-b back: {workers()}")
    print(f"after SIGKILL: failures {[(round(t - killed, 1), k) for t, k in load.failures]}")
    assert on_host(f"systemctl is-active {UNIT_B}", host=HOST_B).stdout.strip() == "active"


@pytest.fixture(scope="module")
def failed_rollout(converge, tmp_path_factory: pytest.TempPathFactory):
    """A configuration vLLM refuses at startup (max-model-len above the model's 2048)."""
    paths = {h: on_host(f"cat /etc/systemd/system/{u}", host=h).stdout
             for h, u in ((HOST_A, UNIT_A), (HOST_B, UNIT_B))}  # fmt: skip
    fleet = write_fleet(tmp_path_factory.mktemp("failed") / "fleet.yaml", seqs=DEPLOYED["seqs"],
                        max_len=4096)  # fmt: skip
    with Load() as load:
        result = e2e.deploy(fleet, ENV)
    return result, load, paths


def test_failed_rollout_stops_at_the_first_replica_naming_it(failed_rollout) -> None:
    result, _, _ = failed_rollout
    text = output(result)
    assert result.returncode != 0
    # pyinfra picks which replica goes first (as in the rolled update): either, but only one
    restarting = [line for line in timeline(text) if line.endswith(" restarting")]
    assert len(restarting) == 1, timeline(text)
    first, other = (
        (f"{HOST_A}/tiny-a", f"{HOST_B}/tiny-b")
        if restarting[0].endswith(f"{HOST_A}/tiny-a restarting")
        else (f"{HOST_B}/tiny-b", f"{HOST_A}/tiny-a")
    )
    assert restarting[0].endswith(f"{first} restarting"), restarting
    assert f"rollout of endpoint tiny stopped at replica {first}" in text, text[-5000:]
    assert f"{other} not updated" in text


def test_failed_rollout_leaves_both_replicas_on_the_old_configuration(failed_rollout) -> None:
    _, load, units = failed_rollout
    for host, unit in ((HOST_A, UNIT_A), (HOST_B, UNIT_B)):
        assert on_host(f"cat /etc/systemd/system/{unit}", host=host).stdout == units[host]
        assert on_host(f"systemctl is-active {unit}", host=host).stdout.strip() == "active"
    assert load.failed == 0, load.failures
    assert complete()


def replica_pids() -> dict[str, str]:
    """Each replica's main PID, by ``HOST/SERVER``."""
    return {
        f"{HOST_A}/tiny-a": main_pid(UNIT_A, HOST_A),
        f"{HOST_B}/tiny-b": main_pid(UNIT_B, HOST_B),
    }


@pytest.fixture(scope="module")
def failed_canary(failed_rollout, tmp_path_factory: pytest.TempPathFactory):
    """A configuration that starts but is slower: prefill in chunks of 4 tokens (the canary's
    prompts have ~330 tokens: ~83 engine steps before the first token) makes the first token
    several times later; the canary's default margins (25 %, floor 2 ms) catch it. Chunks of 8
    were too close on a busy machine: one run measured the new replica's TTFT P50 97 ms
    against the old one's 105 ms, when its neighbours' load had slowed the old one's too."""
    units = {h: on_host(f"cat /etc/systemd/system/{u}", host=h).stdout
             for h, u in ((HOST_A, UNIT_A), (HOST_B, UNIT_B))}  # fmt: skip
    pids = replica_pids()
    fleet = write_fleet(tmp_path_factory.mktemp("canary") / "fleet.yaml", seqs=DEPLOYED["seqs"],
                        canary=CANARY, extra="max-num-batched-tokens: 4")  # fmt: skip
    started = time.monotonic()
    result = e2e.deploy(fleet, ENV)
    print(f"failed canary deploy: {time.monotonic() - started:.0f} s")
    return result, units, pids, replica_pids()


def test_a_slower_canary_fails_the_deploy_naming_the_replica_and_both_figures(
    failed_canary,
) -> None:
    result, _, before, after = failed_canary
    text = output(result)
    lines = canary_lines(text)
    print("canary:\n  " + "\n  ".join(lines))
    assert result.returncode != 0
    first = lines[0].split(":", 1)[0]
    other = lines[0].split("measuring it against ", 1)[1].split(" ", 1)[0]
    new = next(line for line in lines if line.startswith(f"{first} (new configuration): "))
    old = next(line for line in lines if line.startswith(f"{other} (old configuration): "))
    assert lines[-1].startswith(f"{first}: failed: TTFT P50 "), lines
    replica = first.split("/", 1)[1]
    stopped = f"rollout of endpoint tiny stopped at replica {replica}: its canary failed: TTFT P50"
    assert stopped in text, text[-5000:]
    assert "(rolled back to its previous configuration, serving again)" in text
    ttft = [float(line.split("TTFT P50 ", 1)[1].split(" ", 1)[0]) for line in (new, old)]
    assert ttft[0] > 1.25 * ttft[1], (new, old)
    assert f"{other.split('/', 1)[1]} not updated" in text
    # the canary restarted twice (the new configuration, then the old one), the other never
    assert after[replica] != before[replica]
    assert after[other.split("/", 1)[1]] == before[other.split("/", 1)[1]]


def test_a_failed_canary_leaves_both_replicas_on_their_old_configuration(failed_canary) -> None:
    _, units, _, _ = failed_canary
    for host, unit in ((HOST_A, UNIT_A), (HOST_B, UNIT_B)):
        assert on_host(f"cat /etc/systemd/system/{unit}", host=host).stdout == units[host]
        assert on_host(f"systemctl is-active {unit}", host=host).stdout.strip() == "active"
        assert "max-num-batched-tokens" not in on_host(
            f"cat /proc/$(systemctl show -p MainPID --value {unit})/cmdline | tr '\\0' ' '",
            host=host,
        ).stdout
    assert complete()


@pytest.fixture(scope="module")
def router_restarted(failed_rollout, failed_canary, tmp_path_factory: pytest.TempPathFactory):
    """The router's policy changed (round_robin → cache_aware, the router's default, which
    asks a replica to render each request first): the router restarts, the replicas do not."""
    before = {
        "router": main_pid(ROUTER_UNIT, HOST_A),
        UNIT_A: main_pid(UNIT_A, HOST_A),
        UNIT_B: main_pid(UNIT_B, HOST_B),
    }
    fleet = write_fleet(tmp_path_factory.mktemp("policy") / "fleet.yaml", seqs=DEPLOYED["seqs"],
                        policy="cache_aware", canary=CANARY)  # fmt: skip
    result = e2e.deploy(fleet, ENV)
    between = {
        "router": main_pid(ROUTER_UNIT, HOST_A),
        UNIT_A: main_pid(UNIT_A, HOST_A),
        UNIT_B: main_pid(UNIT_B, HOST_B),
    }
    again = e2e.deploy(fleet, ENV)
    after = {
        "router": main_pid(ROUTER_UNIT, HOST_A),
        UNIT_A: main_pid(UNIT_A, HOST_A),
        UNIT_B: main_pid(UNIT_B, HOST_B),
    }
    return result, again, before, between, after


def test_router_restart_leaves_the_replicas_alone(router_restarted) -> None:
    result, _, before, _, _ = router_restarted
    assert result.returncode == 0, output(result)[-5000:]
    assert main_pid(ROUTER_UNIT, HOST_A) != before["router"]
    assert main_pid(UNIT_A, HOST_A) == before[UNIT_A]
    assert main_pid(UNIT_B, HOST_B) == before[UNIT_B]
    assert "--policy cache_aware" in on_host(f"systemctl cat {ROUTER_UNIT}").stdout
    assert complete()


def test_every_call_the_router_makes_to_a_replica_succeeds(router_restarted) -> None:
    """vllm-router's cache_aware policy posts ``/v1/completions/render`` (and the chat one)
    to a replica before each request: every replica serves them (``--enable-scale-out``), so
    no 403 (vLLM's answer without the flag, once per request), and no other refusal."""
    since = on_host("date +%s").stdout.strip()
    for _ in range(3):
        assert complete()
        assert chat()
    lines = []
    for host, unit in ((HOST_A, UNIT_A), (HOST_B, UNIT_B)):
        journal = on_host(f"journalctl -u {unit} --since @{since} --no-pager -o cat",
                          host=host).stdout
        lines += [line for line in journal.splitlines() if '" ' in line and "HTTP/1.1" in line]
    print("replica access lines:\n  " + "\n  ".join(lines))
    render = [line for line in lines if "/render HTTP" in line]
    assert render, lines  # the router did ask (else the check below proves nothing)
    refused = [line for line in lines if not re.search(r'HTTP/1\.1" 2\d\d ', line)]
    assert refused == [], refused


def test_second_deploy_changes_nothing_and_restarts_nothing(router_restarted) -> None:
    _, again, _, between, after = router_restarted
    assert again.returncode == 0, output(again)[-5000:]
    assert changes(output(again)) == 0, output(again)[-5000:]
    assert after == between
    assert "canary: " not in output(again)  # nothing rolled: no canary


def test_fleet_verify_checks_the_router(router_restarted, tmp_path: Path) -> None:
    """``fleet verify``'s router checks against the deployed endpoint (release, unit, port,
    user, /health, every replica healthy, a completion through it)."""
    fleet = write_fleet(tmp_path / "fleet.yaml", seqs=DEPLOYED["seqs"], policy="cache_aware",
                        canary=CANARY)
    result = e2e.fleet_cli(fleet, "verify", str(fleet), "-k", "router", "-q", env=ENV)
    assert result.returncode == 0, output(result)[-5000:]
    assert "8 passed" in output(result), output(result)[-3000:]
