"""``fleet bench`` against the real CPU vLLM on a sandbox host, directly and through SSH.

Deploys the committed tiny model to the session's shared vLLM host (tests/e2e/conftest.py;
server ``bench`` on 127.0.0.2, port 18300, so that every probe must reach it where it listens:
the deploy's readiness wait and completion, ``fleet verify``, ``fleet complete``, ``fleet
bench`` and ``fleet status``; retiring the servers of a module before; a name of its own, so
that no module's server inherits another's saved configuration), then runs one short ladder (1, 2)
with the fleet's API key, and one step through an SSH local port forward over the host's sshd.
Then ``fleet bench --plan`` with a plan file on the whole host (baseline of 3, ladder 1, 2, a
6-second soak; stage 3 has nothing to share with), checking its run directory, the unit's memory
sampled over SSH, and ``--compare`` of the run with itself (about 10 s more). Last, a second
server ``bench-b`` (port 18301) joins ``bench`` on the host, each bound to a core of its own, and
a plan with stage 3 loads both alone and then at once: what sharing the host's 2 cores costs each.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli.status.startup import starts
from tests.support import e2e

pytestmark = pytest.mark.e2e

HOST = e2e.VLLM_HOST
SERVER_PORT = e2e.BENCH_PORT
API_KEY = "bench-e2e-5b8d2e"
ENV = {"FLEET_BENCH_E2E_KEY": API_KEY}
OUTPUT_LEN = 16
#: The server listens on an address of its own (sandbox hosts share this machine's network, and
#: the whole 127.0.0.0/8 is loopback): every probe and client of the tool must reach it there,
#: never at 127.0.0.1 (`fleet/planner/reach.py`).
BIND = "127.0.0.2"

FLEET = e2e.fleet_header(HOST) + f"""\
      bench:
        model: tiny-llama
        host: {BIND}
        port: {SERVER_PORT}
        served_model_name: tiny-bench
        api_key: {{env: FLEET_BENCH_E2E_KEY}}
        args: {{max-model-len: 512, max-num-seqs: 4, enforce-eager: true}}
"""


@pytest.fixture(scope="module")
def deployed(vllm_host, testmodel_server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared host with the tiny model served as this module's fleet file says."""
    fleet = tmp_path_factory.mktemp("bench-e2e") / "fleet.yaml"
    fleet.write_text(FLEET)
    result = e2e.deploy(fleet, ENV)
    assert result.returncode == 0, e2e.output(result)[-4000:]
    return fleet


def test_the_server_listens_only_on_its_own_address(deployed: Path) -> None:
    listening = e2e.on_host(f"ss -Hltn 'sport = :{SERVER_PORT}'").stdout.split()
    assert f"{BIND}:{SERVER_PORT}" in listening, listening
    assert f"127.0.0.1:{SERVER_PORT}" not in listening, listening


def test_verify_and_complete_reach_it_where_it_listens(deployed: Path) -> None:
    verified = e2e.fleet_cli(deployed, "verify", str(deployed), "-q", env=ENV)
    assert verified.returncode == 0, e2e.output(verified)[-4000:]
    completed = e2e.fleet_cli(deployed, "complete", str(deployed), "--prompt", "Hello", env=ENV)
    assert completed.returncode == 0, e2e.output(completed)[-3000:]
    assert "answered" in completed.stdout, completed.stdout
    assert API_KEY not in e2e.output(verified) + e2e.output(completed)


def bench(fleet: Path, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``fleet bench`` on the host's server; the process and its JSON report."""
    result = e2e.run([sys.executable, "-m", "cli.main", "bench", str(fleet), "--server",
                      f"{HOST}/bench", "--input-len", "32", "--output-len", str(OUTPUT_LEN),
                      "--out", str(out), "--no-progress", "--sample-interval", "0.2", *extra],
                     fleet, ENV, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, json.loads((out / "bench.json").read_text())


@pytest.fixture(scope="module")
def ladder(deployed: Path, tmp_path_factory: pytest.TempPathFactory):
    return bench(deployed, tmp_path_factory.mktemp("ladder"), "--concurrency", "1,2",
                 "--requests", "6", "--slo", "ttft=2s,tpot=500ms")


def test_ladder_requests_all_succeed(ladder) -> None:
    _, report = ladder
    assert [s["load"] for s in report["steps"]] == [1, 2]
    assert all(s["ok"] == 6 and s["failed"] == 0 for s in report["steps"])


def test_output_lengths_are_exact_and_from_usage(ladder) -> None:
    _, report = ladder
    for step in report["steps"]:
        assert step["output_tokens"] == 6 * OUTPUT_LEN
        assert step["usage_missing"] == 0
        # 32 tokens calibrated through /tokenize, + BOS, ± a merge where windows were cut
        assert 6 * 28 <= step["input_tokens"] <= 6 * 36


def test_timings_are_plausible(ladder) -> None:
    _, report = ladder
    for step in report["steps"]:
        ttft, e2e_ms, tpot = step["ttft_ms"], step["e2e_ms"], step["tpot_ms"]
        # A request's first token never comes after its last: per request, so per figure.
        for key in ("min", "p50", "mean", "max"):
            assert 0 < ttft[key] <= e2e_ms[key], (key, step)
        assert 0 <= tpot["mean"] < e2e_ms["mean"] / 2
        # Where the server streamed (token chunks apart in time), the stream was measured:
        # TTFT before E2E. The CPU vLLM on 2 busy cores may hand a short answer over in one
        # burst (a CI run had all six of a step so: TTFT == E2E, no gap, TPOT 0); it is
        # measured as it arrived, and a burst is what the user saw too.
        if step["itl_ms"]["count"] and step["itl_ms"]["max"] > 0:
            assert ttft["mean"] < e2e_ms["mean"], step
            assert tpot["mean"] > 0, step
        else:
            assert ttft["mean"] == e2e_ms["mean"] and tpot["mean"] == 0, step
        assert step["goodput"]["good"] == 6


def test_server_side_figures_beside_the_clients(ladder) -> None:
    _, report = ladder
    server = report["steps"][0]["server"]
    assert server["ttft"]["count"] == 6
    assert 0 < server["ttft"]["mean"] * 1000 <= report["steps"][0]["ttft_ms"]["mean"]
    assert server["generation_tokens"] == 6 * OUTPUT_LEN
    assert "preemptions" in server


def test_cpu_host_is_not_gpu_sampled(ladder) -> None:
    _, report = ladder
    assert f"{HOST} is a cpu host: no GPU sampling" in report["notes"]


def test_api_key_is_used_and_never_shown(ladder) -> None:
    result, report = ladder
    assert report["target"]["api_key"] == "set"
    assert API_KEY not in result.stdout + result.stderr + json.dumps(report)


def test_bench_through_an_ssh_port_forward(deployed: Path, tmp_path: Path) -> None:
    _, report = bench(deployed, tmp_path, "--tunnel", "always", "--concurrency", "1",
                           "--requests", "3")
    assert report["steps"][0]["ok"] == 3
    assert any("SSH port forward" in note for note in report["notes"])
    assert str(SERVER_PORT) not in report["target"]["url"]  # a local port, not the server's


PLAN = """\
baseline: {requests: 3}
ladder: {concurrency: "1,2", requests: 4}
soak: {duration: 6s, windows: 6}
"""


def run_plan(fleet: Path, root: Path, plan: str):
    """``fleet bench FLEET --plan`` with plan file text ``plan`` on the host's servers, in
    ``root``: (the process, the run directory, its results.json)."""
    (root / "plan.yaml").write_text(plan)
    out = root / "run"
    result = e2e.run([sys.executable, "-m", "cli.main", "bench", str(fleet), "--plan",
                      str(root / "plan.yaml"), "--server", HOST, "--input-len", "32",
                      "--output-len", str(OUTPUT_LEN), "--out", str(out), "--no-progress",
                      "--sample-interval", "0.5"], fleet, ENV, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, out, json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def plan_run(deployed: Path, tmp_path_factory: pytest.TempPathFactory):
    """``fleet bench --plan`` with a plan file (short ladder, a 6 s soak) on the whole host."""
    return run_plan(deployed, tmp_path_factory.mktemp("plan"), PLAN)


def test_plan_runs_every_stage_on_the_hosts_server(plan_run) -> None:
    _, _, results = plan_run
    assert list(results["servers"]) == [f"{HOST}/bench"]
    server = results["servers"][f"{HOST}/bench"]
    assert server["baseline"]["ok"] == 3 and server["baseline"]["concurrency"] == 1
    assert [s["load"] for s in server["ladder"]["steps"]] == [1, 2]
    assert all(s["failed"] == 0 for s in server["ladder"]["steps"])
    soak = server["soak"]
    knee = server["ladder"]["knee"]["load"] or 2  # no knee: the top of the ladder
    assert soak["load"] == knee and soak["duration_s"] == 6
    assert soak["requests"] >= 3 and soak["error_rate"] == 0
    assert len(soak["windows"]) == 6 and sum(w["requests"] for w in soak["windows"]) == \
        soak["requests"]
    # one server on the host: nothing shares its CPU, and the report says so
    assert results["mixed"] == []
    assert any("stage 3 skipped" in note for note in results["notes"])


def test_plan_samples_the_units_memory_over_ssh(plan_run) -> None:
    _, _, results = plan_run
    memory = results["servers"][f"{HOST}/bench"]["soak"]["memory"]
    assert "the unit's" in memory["source"]  # over SSH, not the API process's /metrics
    assert memory["mib"]["samples"] >= 3
    # the CPU vLLM (API server + engine core) holds hundreds of MiB, far below the host's RAM
    assert 100 < memory["mib"]["first"] < 64 * 1024


def test_plan_run_directory_is_consistent(plan_run) -> None:
    result, out, results = plan_run
    server = results["servers"][f"{HOST}/bench"]
    ladder = list(csv.DictReader((out / "ladder.csv").open()))
    assert [int(r["load"]) for r in ladder] == [1, 2]
    assert [float(r["output_tokens_per_s"]) for r in ladder] == pytest.approx(
        [s["output_tokens_per_s"] for s in server["ladder"]["steps"]])
    soak = list(csv.DictReader((out / "soak.csv").open()))
    assert len(soak) == 6
    for name in ("ladder-e2e-vllm-bench.png", "soak-e2e-vllm-bench.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert report.index("## Summary") < report.index("### Stage 0") < \
        report.index("### Stage 1") < report.index("### Stage 2")
    assert "(ladder-e2e-vllm-bench.png)" in report and "(soak-e2e-vllm-bench.png)" in report
    every = "".join(p.read_text(errors="replace") for p in out.iterdir() if p.suffix != ".png")
    assert API_KEY not in every + result.stdout + result.stderr


def test_compare_a_run_with_itself_changes_nothing(plan_run, deployed: Path) -> None:
    _, out, _ = plan_run
    result = e2e.run([sys.executable, "-m", "cli.main", "bench", "--compare", str(out),
                      str(out)], deployed, ENV, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "0 worse, 0 better" in result.stdout


# --- fleet status on the same deployed server (after the ladder: its TTFT histogram is filled) --


def status(fleet: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """``fleet status FLEET --json …``: the process and its report."""
    result = e2e.fleet_cli(fleet, "status", str(fleet), "--json", *extra, env=ENV, timeout=120)
    return result, json.loads(result.stdout) if result.stdout.startswith("{") else None


def test_status_shows_the_live_server(deployed: Path, ladder) -> None:
    result, report = status(deployed)
    assert result.returncode == 0, e2e.output(result)[-3000:]
    (row,) = report["servers"]
    assert (row["host"], row["server"], row["health"], row["model"], row["port"]) == (
        HOST, "bench", "up", "tiny-bench", SERVER_PORT)
    assert row["state"] == "active (running)" and isinstance(row["restarts"], int)
    assert (row["running"], row["waiting"], row["preemptions"]) == (0, 0, 0)
    assert 0 <= row["kv_cache_pct"] < 100
    # the ladder's requests, on 2 busy cores: a TTFT p50 since start, in seconds
    assert 0 < row["ttft_p50_s"] < 5 and row["ttft_window_s"] is None
    assert report["gpus"] == [] and report["unreachable"] == {}
    assert API_KEY not in result.stdout + result.stderr


def test_status_screen_names_the_server_and_its_figures(deployed: Path, ladder) -> None:
    result = e2e.fleet_cli(deployed, "status", str(deployed), env=ENV, timeout=120)
    assert result.returncode == 0, e2e.output(result)[-3000:]
    print(result.stdout)  # the screen docs/status.md shows (pytest -rP prints it)
    line = next(line for line in result.stdout.splitlines() if f"{HOST}/bench" in line)
    assert "up" in line and "tiny-bench" in line and "since start" in line
    assert "active (running)" in line


def test_status_startup_cuts_the_last_start_into_phases(deployed: Path, ladder) -> None:
    result, report = status(deployed, "--startup")
    assert result.returncode == 0, e2e.output(result)[-3000:]
    start = report["startup"][f"{HOST}/bench"][-1]
    assert start["version"] == "0.32.0" and start["ready"]
    phases = start["phases"]
    for phase in ("process start", "weight loading", "compile + profile", "KV cache + warmup",
                  "API server", "first completion"):
        assert phases[phase] is not None and phases[phase] >= 0, (phase, phases)
    assert phases["CUDA graph capture"] is None  # the CPU build captures no graph
    assert 5 < start["total_s"] < 600
    journal = e2e.on_host("journalctl -u vllm-bench.service -o short-iso-precise --no-pager")
    print("=== journal of vllm-bench.service ===\n" + journal.stdout)  # pytest -rP shows it
    # The journal's own reading of its last start is the screen's, but for what only the
    # deploy's record of that start holds (kept per start, beyond the journal's rotation).
    record_only = ("model_install_s", "recorded")
    from_journal = starts(journal.stdout.splitlines())[-1].to_json()
    assert start["recorded"], start
    assert {k: v for k, v in start.items() if k not in record_only} == {
        k: v for k, v in from_journal.items() if k not in record_only
    }


def test_stopped_server_shows_as_down(deployed: Path, ladder) -> None:
    """Last in the module: the next module's deploy starts its own servers."""
    stopped = e2e.on_host("systemctl stop vllm-bench.service")
    assert stopped.returncode == 0, stopped.stderr
    result, report = status(deployed)
    assert result.returncode == 2, e2e.output(result)[-3000:]
    (row,) = report["servers"]
    assert (row["health"], row["state"]) == ("down", "inactive (dead)")
    assert row["running"] is None  # nothing answered /metrics


# --- the plan's mixed stage: two real vLLMs sharing the host's cores (last: it adds a server) --

#: A second server beside ``bench``: the plan groups the servers of a cpu host (they share its
#: cores). Each binds its OpenMP threads to a core of its own (two ``auto`` would bind the same).
BIND_0 = '        env: {VLLM_CPU_OMP_THREADS_BIND: "0"}\n        args:'
PAIR = FLEET.replace("        args:", BIND_0) + f"""\
      bench-b:
        model: tiny-llama
        port: {e2e.BENCH_PORT_B}
        served_model_name: tiny-bench-b
        api_key: {{env: FLEET_BENCH_E2E_KEY}}
        env: {{VLLM_CPU_OMP_THREADS_BIND: "1"}}
        args: {{max-model-len: 512, max-num-seqs: 4, enforce-eager: true}}
"""
#: Every stage, short: the run directory is the report attached to docs/bench.md.
MIXED_PLAN = """\
stages: [baseline, ladder, soak, mixed]
baseline: {requests: 3}
ladder: {concurrency: "1,2", requests: 4}
soak: {duration: 4s, windows: 4}
mixed: {duration: 5s, concurrency: 2}
"""


@pytest.fixture(scope="module")
def mixed_run(deployed: Path, tmp_path_factory: pytest.TempPathFactory):
    """Both servers deployed, then the plan on the whole host: stage 3 loads them at once."""
    root = tmp_path_factory.mktemp("mixed")
    fleet = root / "fleet.yaml"
    fleet.write_text(PAIR)
    result = e2e.deploy(fleet, ENV)
    assert result.returncode == 0, e2e.output(result)[-4000:]
    return run_plan(fleet, root, MIXED_PLAN)


def test_mixed_stage_loads_two_real_servers_at_once(mixed_run) -> None:
    result, out, results = mixed_run
    names = [f"{HOST}/bench", f"{HOST}/bench-b"]
    assert list(results["servers"]) == names
    (group,) = results["mixed"]
    assert group["servers"] == names and group["shares"] == f"the CPU cores of cpu host {HOST}"
    assert group["loads"] == {name: 2 for name in names}
    for name in names:
        solo, shared = group["solo"][name], group["shared"][name]
        assert solo["ok"] > 0 and shared["ok"] > 0 and solo["failed"] == shared["failed"] == 0
        cost = group["cost"][name]
        assert cost["ttft_p50"] == pytest.approx(
            shared["ttft_ms"]["p50"] / solo["ttft_ms"]["p50"])
        assert cost["output_tokens_per_s"] == pytest.approx(
            shared["output_tokens_per_s"] / solo["output_tokens_per_s"])
    rows = list(csv.DictReader((out / "mixed.csv").open()))
    assert [r["server"] for r in rows] == names
    assert (out / "mixed-1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert report.index("### Stage 1") < report.index("### Stage 2") < report.index("## Stage 3")
    assert "(mixed-1.png)" in report
    assert API_KEY not in report + result.stdout + result.stderr
    record = os.environ.get("FLEET_BENCH_RECORD")
    if record:  # docs/bench-plan-example/, the report attached to docs/bench.md
        shutil.copytree(out, record, dirs_exist_ok=True)
