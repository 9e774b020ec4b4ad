"""Tests for ``fleet bench --plan`` and ``--compare`` against scripted servers.

The scripted server (tests/support/fakeserver.py) is given a :class:`SharedDevice` of known
capacity: up to it, requests in flight cost nothing extra; past it every delay stretches in
proportion. So the ladder's knee must be found at the capacity, and two servers on one device
loaded at once must each be slower by the factor the device gives. It also leaks a known amount
of memory per request, fails every Nth request, and slows down with time, so the soak's
memory growth, error counts and drift are known. Timing assertions are orders and ratios with
wide margins (a busy 2-core machine), never milliseconds.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.bench import compare, memory, plan, stages
from cli.main import main
from fleet.spec.models import Fleet
from loadgen.prompts import synthetic_prompts
from loadgen.runner import Options, Runner, Target
from loadgen.timing import RequestResult
from tests.support.fakeserver import FakeServer, SharedDevice

# ------------------------------------------------------------------ plans and durations


@pytest.mark.parametrize(("text", "seconds"), [
    ("30m", 1800.0), ("90s", 90.0), ("1h30m", 5400.0), ("2.5s", 2.5), ("45", 45.0),
    ("1h", 3600.0),
])
def test_spans(text: str, seconds: float) -> None:
    assert plan.parse_span(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5x", "-3s", "0s", "2d", "25h", "m"])
def test_bad_spans_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        plan.parse_span(text)


def test_a_plan_file_sets_every_stage() -> None:
    text = ("stages: [soak, baseline]\nbaseline: {requests: 3}\n"
            "ladder: {concurrency: '1,2', duration: 20s}\n"
            "soak: {duration: 1h, concurrency: 8, windows: 6}\n"
            "mixed: {duration: 90s, concurrency: knee}\n")
    p = plan.plan_from_text(text, "p.yaml")
    assert p.stages == ("baseline", "soak")  # running order, whatever the file's
    assert (p.baseline_requests, p.ladder, p.ladder_duration) == (3, "1,2", 20.0)
    assert (p.soak_duration, p.soak_concurrency, p.soak_windows) == (3600.0, 8, 6)
    assert (p.mixed_duration, p.mixed_concurrency) == (90.0, None)


@pytest.mark.parametrize(("text", "message"), [
    ("soak:\n  duraton: 5m\n", "p.yaml:2:3: soak.duraton: unknown key; did you mean 'duration'?"),
    ("soak:\n  duration: 5 minutes\n",
     "p.yaml:2:13: soak.duration: '5 minutes' is not a duration"),
    ("stages: [baseline, ladr]\n", "p.yaml:1:20: stages.1: unknown stage 'ladr'; did you mean "
     "'ladder'?"),
    ("ladder: {concurrency: 0..4}\n", "p.yaml:1:23: ladder.concurrency: '0..4' is not a load"),
    ("baseline: {requests: -1}\n", "p.yaml:1:22: baseline.requests: -1 is not a whole number"),
    ("mixed: 5m\n", "p.yaml:1:8: mixed: mixed is a mapping of settings"),
    ("sok: {duration: 5m}\n", "p.yaml:1:1: sok: unknown key; did you mean 'soak'?"),
    ("- baseline\n", "p.yaml:1:1: (file): a plan file is a mapping"),
    ("soak: {duration: 5m\n", "p.yaml:"),
    ("version: 1\nhosts: {}\n", "p.yaml:1:1: version: this is a fleet file, not a plan file; "
     "--plan takes an optional plan file next to it: name the fleet file first"),
])
def test_bad_plan_files_are_located(text: str, message: str) -> None:
    with pytest.raises(plan.PlanError) as caught:
        plan.plan_from_text(text, "p.yaml")
    assert str(caught.value).startswith(message)


def test_stages_by_name_or_number() -> None:
    assert plan.stages_from_text("3, 0") == ("baseline", "mixed")
    with pytest.raises(ValueError, match="did you mean 'soak'"):
        plan.stages_from_text("soaks")


GPU_FLEET = {
    "version": 1,
    "models": {"m": {"url": "http://x/m.tgz", "sha256": "a" * 64}},
    "hosts": {
        "quad": {"address": "10.0.0.1", "vllm": {"version": "0.32.0", "variant": "cu129"},
                 "servers": {"chat": {"model": "m", "port": 8000, "gpus": [0]},
                             "embed": {"model": "m", "port": 8001, "gpus": [0]},
                             "code": {"model": "m", "port": 8002, "gpus": [1, 2]},
                             "small": {"model": "m", "port": 8003, "gpus": [3]}}},
        "other": {"address": "10.0.0.2", "vllm": {"version": "0.32.0", "variant": "cu129"},
                  "servers": {"solo": {"model": "m", "port": 8000, "gpus": [0]}}},
    },
}


@pytest.fixture(scope="module")
def gpu_fleet():
    return Fleet.model_validate(GPU_FLEET)


@pytest.mark.parametrize(("selector", "gpu", "names"), [
    ("quad", None, ["quad/chat", "quad/embed", "quad/code", "quad/small"]),
    ("quad", 0, ["quad/chat", "quad/embed"]),
    ("quad/code", None, ["quad/code"]),
    ("solo", None, ["other/solo"]),
])
def test_servers_are_chosen_by_host_gpu_or_name(gpu_fleet, selector, gpu, names) -> None:
    assert [c.name for c in plan.choose_servers(gpu_fleet, selector, gpu, "f.yaml")] == names


@pytest.mark.parametrize(("selector", "gpu", "message"), [
    ("quadd", None, "no server or host 'quadd' in f.yaml; did you mean 'quad'?"),
    ("quad", 7, "no server of 'quad' runs on GPU 7; their GPUs: quad/chat [0]"),
    ("zzz", None, "no server or host 'zzz' in f.yaml; servers: quad/chat"),
])
def test_servers_not_found_say_what_exists(gpu_fleet, selector, gpu, message) -> None:
    with pytest.raises(ValueError) as caught:
        plan.choose_servers(gpu_fleet, selector, gpu, "f.yaml")
    assert str(caught.value).startswith(message)


def test_servers_sharing_a_gpu_are_grouped(gpu_fleet) -> None:
    chosen = plan.choose_servers(gpu_fleet, "quad", None, "f.yaml")
    groups = plan.sharing_groups(chosen)
    assert [[c.name for c in g] for g in groups] == [["quad/chat", "quad/embed"]]


# ------------------------------------------------------------------ pure readings


def test_growth_of_a_steady_climb() -> None:
    samples = [(float(t), 100.0 + t) for t in range(0, 40)]
    g = stages.growth(samples)
    assert g["first"] == 100.0 and g["last"] == 139.0 and g["max"] == 139.0
    assert g["growth"] == pytest.approx(30.0)  # mean of the last 10 minus the first 10
    assert g["slope_per_h"] == pytest.approx(3600.0)


def test_growth_of_a_flat_line_is_zero() -> None:
    assert stages.growth([(float(t), 7.0) for t in range(10)])["growth"] == 0


def test_soak_windows_count_requests_and_errors_by_start_time() -> None:
    ok = [RequestResult(ok=True, start=t, ttft=0.1, e2e=0.2, output_tokens=2) for t in
          (0.1, 0.2, 1.1, 2.5)]
    bad = [RequestResult(error="http_503", start=1.5), RequestResult(error="timeout", start=2.9)]
    windows = stages.soak_windows(ok + bad, start=0.0, seconds=3.0, count=3,
                                  memory=[(0.5, 10.0), (1.5, 12.0), (2.5, 15.0)])
    assert [(w["ok"], w["failed"]) for w in windows] == [(2, 0), (1, 1), (1, 1)]
    assert windows[1]["errors"] == {"http_503": 1}
    assert [w["memory_mib"] for w in windows] == [10.0, 12.0, 15.0]
    assert windows[0]["output_tokens_per_s"] == 4.0


def test_sharing_cost_is_shared_over_solo() -> None:
    solo = {"ttft_ms": {"p50": 20.0, "p99": 30.0}, "tpot_ms": {"p50": 5.0, "p99": None},
            "output_tokens_per_s": 200.0}
    shared = {"ttft_ms": {"p50": 50.0, "p99": 90.0}, "tpot_ms": {"p50": 10.0, "p99": 12.0},
              "output_tokens_per_s": 150.0}
    assert stages.sharing_cost(solo, shared) == {
        "ttft_p50": 2.5, "ttft_p99": 3.0, "tpot_p50": 2.0, "tpot_p99": None,
        "output_tokens_per_s": 0.75}


# ------------------------------------------------------------------ running the stages

SCRIPT = "ttft=0.05,itl=0.02"
LEAK_MIB = 16


def _bench(*argv: str) -> int:
    return main(["bench", *argv, "--no-progress", "--output-len", "8", "--input-len", "8",
                 "--sample-interval", "0.1"])


@pytest.fixture(scope="module")
def saturating(tmp_path_factory: pytest.TempPathFactory):
    """A plan run on a server that saturates at 4 requests in flight and leaks 16 MiB each."""
    out = tmp_path_factory.mktemp("plan") / "run"
    with FakeServer(device=SharedDevice(capacity=4), leak_bytes=LEAK_MIB << 20) as server:
        code = _bench("--plan", "--url", server.url, "--model", SCRIPT, "--concurrency",
                      "1,2,4,8", "--requests", "16", "--soak", "3s", "--out", str(out))
    return code, out, json.loads((out / "results.json").read_text()), server.url


def test_ladder_knee_is_where_the_server_saturates(saturating) -> None:
    code, _, results, url = saturating
    assert code == 0
    ladder = results["servers"][url]["ladder"]
    assert ladder["knee"]["load"] == 4
    tput = {s["load"]: s["output_tokens_per_s"] for s in ladder["steps"]}
    e2e = {s["load"]: s["e2e_ms"]["p50"] for s in ladder["steps"]}
    assert tput[4] > 2.5 * tput[1]  # up to the capacity, load buys throughput …
    assert tput[8] < 1.4 * tput[4]  # … past it, none
    assert e2e[8] > 1.5 * e2e[4]  # only waiting


def test_baseline_is_single_requests(saturating) -> None:
    _, _, results, url = saturating
    baseline = results["servers"][url]["baseline"]
    assert baseline["concurrency"] == 1 and baseline["ok"] == 5
    assert 40 <= baseline["ttft_ms"]["p50"] < 150  # the script's 50 ms, unloaded


def test_soak_runs_at_the_knee_and_sees_the_leak(saturating) -> None:
    _, _, results, url = saturating
    soak = results["servers"][url]["soak"]
    assert soak["load"] == 4 and soak["load_from"] == "the knee"
    assert soak["error_rate"] == 0 and soak["requests"] >= 12
    memory = soak["memory"]
    assert memory["source"].startswith("the server's /metrics")
    # 16 MiB a request: from the first quarter's mean to the last's, about half of them
    assert 0.25 * soak["requests"] * LEAK_MIB < memory["mib"]["growth"] < \
        soak["requests"] * LEAK_MIB
    assert any("server memory grew" in f for f in soak["findings"]) and not soak["stable"]


def test_run_directory_has_json_csv_png_and_report(saturating) -> None:
    _, out, results, url = saturating
    ladder = list(csv.DictReader((out / "ladder.csv").open()))
    assert [r["load"] for r in ladder] == ["1", "2", "4", "8"]
    assert [r["knee"] for r in ladder] == ["False", "False", "True", "False"]
    soak = list(csv.DictReader((out / "soak.csv").open()))
    assert len(soak) == results["plan"]["soak_windows"]
    assert sum(int(r["requests"]) for r in soak) == results["servers"][url]["soak"]["requests"]
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list(out.glob("*.png"))) == 2
    report = (out / "report.md").read_text()
    assert report.index("## Summary") < report.index("### Stage 0") < \
        report.index("### Stage 1") < report.index("### Stage 2")
    assert "The knee is at concurrency **4**" in report and "**Not stable**" in report
    for name in out.glob("*.png"):
        assert f"]({name.name})" in report


def test_soak_counts_errors_and_drift(tmp_path: Path) -> None:
    """Every 5th request fails; delays grow 100 % a second: the soak says both."""
    (tmp_path / "plan.yaml").write_text("stages: [soak]\nsoak: {duration: 3s, concurrency: 2, "
                                        "windows: 3}\n")
    with FakeServer() as server:
        code = _bench("--plan", str(tmp_path / "plan.yaml"), "--url", server.url, "--model",
                      SCRIPT + ",fail_every=5,drift=1.0", "--out", str(tmp_path / "run"))
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    soak = results["servers"][server.url]["soak"]
    assert code == 0 and soak["load_from"] == "the plan"
    assert set(soak["errors"]) == {"http_503"}
    assert 0.1 < soak["error_rate"] < 0.3
    assert sum(w["failed"] for w in soak["windows"]) == soak["errors"]["http_503"]
    assert soak["drift"]["tpot_p50"] > 1.3
    assert soak["windows"][-1]["tpot_p50_ms"] > soak["windows"][0]["tpot_p50_ms"]
    assert any("failed" in f for f in soak["findings"])
    assert any("TPOT P50 rose" in f for f in soak["findings"])


FLEET = """\
version: 1
defaults:
  vllm: {{version: "0.32.0", variant: cpu}}
models:
  m: {{url: "http://127.0.0.1:1/m.tar.gz", sha256: "{sha}"}}
hosts:
  box:
    address: 127.0.0.1
    servers:
      a: {{model: m, port: {a}, served_model_name: "{script}"}}
      b: {{model: m, port: {b}, served_model_name: "{script}"}}
"""


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory: pytest.TempPathFactory):
    """Two servers of one host on a device that runs 2 requests at full speed, each loaded at
    concurrency 2: alone each has the device to itself, together they stretch it twice."""
    tmp = tmp_path_factory.mktemp("mixed")
    device = SharedDevice(capacity=2)
    with FakeServer(device=device) as a, FakeServer(device=device) as b:
        fleet = tmp / "fleet.yaml"
        fleet.write_text(FLEET.format(sha="a" * 64, a=a.port, b=b.port, script=SCRIPT))
        (tmp / "plan.yaml").write_text("mixed: {duration: 2s, concurrency: 2}\n")
        code = _bench(str(fleet), "--plan", str(tmp / "plan.yaml"), "--stages", "mixed",
                      "--server", "box", "--tunnel", "never", "--out", str(tmp / "run"))
    return code, tmp / "run", json.loads((tmp / "run" / "results.json").read_text())


def test_mixed_stage_costs_each_server_what_the_device_gives(shared_run) -> None:
    code, _, results = shared_run
    assert code == 0
    (group,) = results["mixed"]
    assert group["servers"] == ["box/a", "box/b"]
    assert group["shares"] == "the CPU cores of cpu host box"
    for name in group["servers"]:
        cost = group["cost"][name]
        assert 1.5 < cost["tpot_p50"] < 3.0, cost  # the device's ×2
        assert cost["ttft_p50"] > 1.3, cost
        assert cost["output_tokens_per_s"] < 0.75, cost
        assert group["shared"][name]["failed"] == group["solo"][name]["failed"] == 0
    totals = group["output_tokens_per_s"]
    assert totals["shared_sum"] < 0.75 * totals["solo_sum"]


def test_mixed_stage_is_in_the_csv_png_and_report(shared_run) -> None:
    _, out, results = shared_run
    rows = list(csv.DictReader((out / "mixed.csv").open()))
    assert [r["server"] for r in rows] == ["box/a", "box/b"]
    assert float(rows[0]["cost_tpot_p50"]) == pytest.approx(
        results["mixed"][0]["cost"]["box/a"]["tpot_p50"])
    assert (out / "mixed-1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "## Stage 3" in report and "(mixed-1.png)" in report
    assert "**box/a** sharing the CPU cores of cpu host box: TTFT P50 +" in report
    assert "Files: results.json (everything), mixed.csv;" in report  # only what was written


def test_compare_shows_what_got_slower(tmp_path: Path) -> None:
    """The same server benched twice, the second time five times slower (wide enough that a
    loaded machine's scheduling delay, added to both, keeps the ratio above 2)."""
    with FakeServer() as server:
        for name, script in (("a", "ttft=0.03,itl=0.01,chunks=4"),
                             ("b", "ttft=0.15,itl=0.05,chunks=4")):
            assert _bench("--plan", "--url", server.url, "--model", script, "--stages", "0,1",
                          "--concurrency", "1,2", "--requests", "4",
                          "--out", str(tmp_path / name)) == 0
    a = compare.load_run(str(tmp_path / "a"))
    b = compare.load_run(str(tmp_path / "b"))
    rows = {(r["stage"], r["figure"]): r for r in compare.compare_runs(a, b)}
    assert rows[("baseline", "TTFT P50 (ms)")]["verdict"] == "worse"
    assert rows[("baseline", "TTFT P50 (ms)")]["ratio"] > 2
    assert rows[("ladder c=2", "TPOT P50 (ms)")]["ratio"] > 2
    assert rows[("ladder c=2", "output tokens/s")]["verdict"] == "worse"
    assert rows[("ladder", "peak output tokens/s")]["ratio"] < 0.6
    same = {r["verdict"] for r in compare.compare_runs(a, a)}
    assert same == {"same"}  # the knee too: not reached in either


def test_compare_command_prints_the_changes(tmp_path: Path, capsys) -> None:
    with FakeServer() as server:
        for name in ("a", "b"):
            assert _bench("--plan", "--url", server.url, "--model", "ttft=0.01,itl=0.005",
                          "--stages", "0", "--out", str(tmp_path / name)) == 0
    capsys.readouterr()
    assert main(["bench", "--compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    printed = capsys.readouterr().out
    assert "TTFT P50 (ms)" in printed and "B ÷ A" in printed and " worse, " in printed


# ------------------------------------------------------------------ bad input


def test_a_bad_plan_file_is_located_not_a_traceback(tmp_path: Path, capsys) -> None:
    (tmp_path / "plan.yaml").write_text("soak:\n  duration: forever\n")
    code = main(["bench", "--plan", str(tmp_path / "plan.yaml"), "--url", "http://127.0.0.1:1"])
    assert code == 2
    assert f"{tmp_path / 'plan.yaml'}:2:13: soak.duration: 'forever' is not a duration" in \
        capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--plan", "/nonexistent/plan.yaml"], "/nonexistent/plan.yaml: (file): cannot read"),
    (["--plan", "--soak", "5x"], "--soak: '5x' is not a duration"),
    (["--plan", "--mixed", "0s"], "--mixed: '0s': a duration must be more than 0"),
    (["--plan", "--stages", "2,9"], "--stages: unknown stage '9'"),
    (["--plan", "--gpu", "0"], "--gpu names a GPU of a fleet host"),
    (["--plan", "--rate", "1,2"], "--rate: the plan's ladder is closed-loop"),
])
def test_bad_plan_options_are_refused(argv: list[str], message: str, capsys) -> None:
    assert main(["bench", *argv, "--url", "http://127.0.0.1:1"]) == 2
    assert message in capsys.readouterr().err


def test_a_server_not_in_the_fleet_is_refused(tmp_path: Path, capsys) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET.format(sha="a" * 64, a=18398, b=18399, script="x"))
    assert main(["bench", str(fleet), "--plan", "--server", "bx"]) == 2
    assert "no server or host 'bx'" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "message"), [
    (None, "no results.json"),
    ("{not json", "not JSON"),
    ('{"tool": "fleet bench"}', "not the results of `fleet bench --plan`"),
])
def test_compare_refuses_what_is_not_a_run(tmp_path: Path, content, message, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    if content is not None:
        (run / "results.json").write_text(content)
    assert main(["bench", "--compare", str(run), str(run)]) == 2
    assert message in capsys.readouterr().err


def _printer(line: str) -> list[str]:
    """A local command printing ``line`` (formatted with a counter) every 0.05 s, standing in
    for the sampling commands that run over SSH (nvidia-smi, the unit's memory loop)."""
    program = ("import itertools, sys, time\n"
               "for i in itertools.count():\n"
               f"    print({line!r}.format(i=i), flush=True)\n"
               "    time.sleep(0.05)\n")
    return [sys.executable, "-c", program]


def test_soak_samples_gpu_and_unit_memory_from_their_commands() -> None:
    """The soak reads the GPU's memory from nvidia-smi lines (GPU 1 only: the server's) and the
    unit's memory from the byte counts its loop prints."""
    gpu_lines = "0, 50, {i}000, 24564\n1, 80, 2000, 24564"  # GPU 0 grows, the server's does not
    with FakeServer() as server:
        target = Target(server.url, SCRIPT)
        runner = Runner(target, synthetic_prompts(4, 8, 8), Options(timeout=10,
                                                                    sample_interval=0.1))
        plan_target = stages.PlanTarget(
            name="box/a", runner=runner, gpu_argv=_printer(gpu_lines), gpus=(1,),
            memory_argv=_printer("anon {i}00000000"))
        run = stages.PlanRun(plan.Plan(stages=("soak",), soak_duration=2.0,
                                       soak_concurrency=2, soak_windows=4), [plan_target])
        results = asyncio.run(run.run())
    soak = results["servers"]["box/a"]["soak"]
    assert soak["memory"]["source"].startswith("the unit's cgroup")
    assert soak["memory"]["mib"]["growth"] > 100  # 100 MB more every 0.05 s
    gpu = soak["gpu_memory"]["mib"]
    assert gpu["first"] == gpu["last"] == gpu["max"] == 2000 and gpu["growth"] == 0
    assert all(w["gpu_memory_mib"] == 2000 for w in soak["windows"])
    assert soak["step"]["gpu"]["1"]["mem_used_max_mib"] == 2000


def test_memory_loop_reads_this_machines_cgroup(tmp_path: Path) -> None:
    """The loop run for real on this machine, ``systemctl`` answering with this test's own
    cgroup: whichever layout the machine has, it prints the memory of a live cgroup."""
    own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text()
               .splitlines() if line.split(":")[1] in ("memory", ""))
    (tmp_path / "systemctl").write_text(f"#!/bin/sh\necho '{own}'\n")
    (tmp_path / "systemctl").chmod(0o755)
    result = subprocess.run(
        ["timeout", "2", "sh", "-c", memory.cgroup_memory_command("vllm-x.service", 0.5)],
        capture_output=True, text=True, env={**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"},
        check=False)
    samples = [memory.parse_sample(line) for line in result.stdout.splitlines()]
    assert samples and all(s is not None and s[1] > 1 << 20 for s in samples), result
