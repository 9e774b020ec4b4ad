"""``fleet doctor`` finds a server's last archived bench run (cli.doctor.benchcheck) in the
folders ``fleet bench`` and ``fleet bench --plan`` write, and reads the slow tree's facts."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from cli.doctor.benchcheck import REQUESTS, ROUNDS, last_baseline, measure_target
from facts.doctor import BusyProcesses, CpuLoad, MountOf
from fleet.judge.diagnosis import OK, PROBLEM, Evidence, diagnose
from fleet.judge.slowness import slowdown
from loadgen.runner import Target
from tests.support.fakeserver import FakeServer, Script

DATA = Path(__file__).resolve().parents[2] / "data" / "doctor-benches"
HEALTHY = {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "MainPID": "812"}


def healthy(bench: dict) -> Evidence:
    return Evidence("box", "chat", unit=dict(HEALTHY), health=200, ready=True, bench=bench,
                    args={}, variant="cpu")  # fmt: skip


def archive(tmp_path: Path) -> Path:
    """bench-results/ with the recorded plan run and a single bench run made from its step."""
    root = tmp_path / "bench-results"
    shutil.copytree(DATA / "plan-base", root / "plan-20261201-1500")
    plan = json.loads((DATA / "plan-base" / "results.json").read_text())
    step = plan["servers"]["e2e-vllm/doc"]["baseline"]
    single = {"tool": "fleet bench", "target": {"name": "e2e-vllm/doc", "api": "chat"},
              "config": {"api": "chat", "input_len": 64, "output_len": 8, "seed": 3,
                         "prompts": "synthetic", "fixed_output": True},
              "steps": [{**step, "concurrency": 2}, {**step, "concurrency": 1}]}  # fmt: skip
    (root / "20261201-1600").mkdir()
    (root / "20261201-1600" / "bench.json").write_text(json.dumps(single))
    return root


def test_the_newest_run_that_measured_the_server_wins(tmp_path: Path) -> None:
    root = archive(tmp_path)
    os.utime(root / "plan-20261201-1500" / "results.json", (1e9, 1e9))
    found = last_baseline(root, "e2e-vllm/doc")
    assert found is not None and found["run"] == str(root / "20261201-1600")
    assert (found["concurrency"], found["api"], found["input_len"], found["output_len"],
            found["seed"]) == (1, "chat", 64, 8, 3)  # fmt: skip
    os.utime(root / "20261201-1600" / "bench.json", (1e8, 1e8))
    found = last_baseline(root, "e2e-vllm/doc")
    assert found is not None and found["run"] == str(root / "plan-20261201-1500")
    assert (found["input_len"], found["output_len"], found["api"]) == (32, 16, "completions")
    assert found["started"].startswith("2026-12-01")
    assert found["ttft_ms"]["p50"] > 0


def test_no_run_of_the_server_no_baseline(tmp_path: Path) -> None:
    root = archive(tmp_path)
    assert last_baseline(root, "e2e-vllm/other") is None
    assert last_baseline(tmp_path / "absent", "e2e-vllm/doc") is None
    (root / "broken").mkdir()
    (root / "broken" / "results.json").write_text("{not json")
    assert last_baseline(root, "e2e-vllm/doc") is not None


def test_a_run_whose_single_requests_all_failed_is_no_baseline(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    (root / "a").mkdir(parents=True)
    (root / "a" / "results.json").write_text(json.dumps({"servers": {"h/s": {
        "baseline": {"concurrency": 1, "ok": 0, "failed": 5}}}}))
    assert last_baseline(root, "h/s") is None


def test_cpu_load_from_proc_loadavg_and_nproc() -> None:
    assert CpuLoad().process(["5.21 3.10 1.07 7/412 30211", "2"]) == {"load1": 5.21, "cpus": 2}
    assert CpuLoad().process([]) == {}


def test_busy_processes_with_their_cgroups() -> None:
    # ps -eo pid=,user=,pcpu=,comm=,cgroup= --sort=-pcpu on the sandbox host (cgroup v1 names)
    output = [
        "  812 vllm      98.7 python3         12:pids:/system.slice/vllm-doc.service,"
        "1:name=systemd:/system.slice/vllm-doc.service",
        " 4121 nobody    61.0 python3         1:name=systemd:/user.slice/session-3.scope",
        "    1 root       0.1 systemd         -",
    ]
    busy = BusyProcesses().process(output)
    assert [(p["pid"], p["user"], p["cpu"], p["process"]) for p in busy] == [
        (812, "vllm", 98.7, "python3"), (4121, "nobody", 61.0, "python3"),
        (1, "root", 0.1, "systemd")]  # fmt: skip
    assert "/vllm-doc.service" in busy[0]["cgroup"] and busy[2]["cgroup"] == "-"


def test_the_file_system_of_a_path() -> None:
    assert MountOf().process(["nfs4   /var/lib/vllm-fleet/models"]) == {
        "fstype": "nfs4", "target": "/var/lib/vllm-fleet/models"}
    assert MountOf().process([]) == {}


class Settling(FakeServer):
    """A server slow (80 ms to the first token) for its first ``slow_for`` requests, then fast
    (5 ms): a passing hiccup when ``slow_for`` covers one round, a lasting load when more."""

    def __init__(self, slow_for: int) -> None:
        super().__init__()
        self.slow_for = slow_for

    @property
    def script(self) -> Script:
        return Script(ttft=0.08 if self.requests < self.slow_for else 0.005, itl=0.002)

    @script.setter
    def script(self, value: Script) -> None:
        pass


BASE = {"ttft_ms": {"p50": 10.0}, "tpot_ms": {"p50": 2.0}, "api": "completions",
        "input_len": 8, "output_len": 4, "prompts": "synthetic", "fixed_output": True,
        "seed": 0}  # fmt: skip


def rounds_against(server: FakeServer) -> dict:
    target = Target(f"http://127.0.0.1:{server.port}", "tiny", "completions")
    return measure_target(target, BASE, requests=REQUESTS)


def test_a_slow_round_that_passes_is_measured_again_and_not_called_slower() -> None:
    with Settling(slow_for=1 + REQUESTS) as server:  # the warm-up and one round
        found = rounds_against(server)
    assert [r["ttft_p50_ms"] > 50 for r in found["rounds"]] == [True, False], found["rounds"]
    assert found["fresh"]["ttft_ms"]["p50"] < 50 and not slowdown(BASE, found["fresh"])
    d = diagnose(healthy({**found, "baseline": {**BASE, "run": "r", "started": "s"}}))
    assert d.status == OK, d
    assert "measured again" in d.state and "its last bench: 10.0 ms" in d.state, d.state


def test_a_lasting_slowdown_is_slower_in_every_round() -> None:
    with Settling(slow_for=1000) as server:
        found = rounds_against(server)
    assert len(found["rounds"]) == ROUNDS, found["rounds"]
    assert all(r["ttft_p50_ms"] > 50 for r in found["rounds"]), found["rounds"]
    d = diagnose(healthy({**found, "baseline": {**BASE, "run": "r", "started": "s"}}))
    assert d.status == PROBLEM and d.signature == "slower-than-bench", d
    assert f"the least slow of {ROUNDS} rounds" in d.evidence[0], d.evidence


def test_a_slower_round_the_servers_own_queue_explains_is_the_only_one() -> None:
    """A neighbour's load the server itself shows (requests waiting for a slot in its gauges):
    one round says it, and doctor does not queue two more rounds behind that load."""
    with Settling(slow_for=1000) as server:
        server.waiting, server.others_per_request = 12, 3
        found = rounds_against(server)
    assert len(found["rounds"]) == 1 and server.requests == 1 + REQUESTS, found["rounds"]
    d = diagnose(healthy({**found, "baseline": {**BASE, "run": "r", "started": "s"}}))
    assert d.status == PROBLEM and d.signature == "slower-than-bench", d
    assert "requests wait in the server's queue" in d.cause, d


def test_a_queue_with_no_other_clients_is_measured_again() -> None:
    """Requests waiting while the server finished only ours (an engine slow to take a lone
    request on a busy machine): not proof of load, so the rounds go on."""
    with Settling(slow_for=1000) as server:
        server.waiting, server.others_per_request = 1, 0
        found = rounds_against(server)
    assert len(found["rounds"]) == ROUNDS, found["rounds"]


def test_a_round_as_fast_as_the_baseline_is_the_only_one() -> None:
    with Settling(slow_for=0) as server:
        found = rounds_against(server)
    assert len(found["rounds"]) == 1 and server.requests == 1 + REQUESTS
