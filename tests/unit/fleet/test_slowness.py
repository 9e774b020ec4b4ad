"""``fleet doctor``'s slow check: a healthy server against its last bench (fleet.judge.slowness and
the diagnosis it feeds), on runs recorded on the sandbox's CPU vLLM (tests/data/doctor-benches:
a real ``fleet bench --plan`` stage 0, and the doctor's report of the same server measured
while 8 long requests held its 4 slots) and on the facts of the causes a CPU host cannot show.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from fleet.judge.diagnosis import OK, PROBLEM, Evidence, diagnose
from fleet.judge.slowness import causes, slowdown

DATA = Path(__file__).resolve().parents[2] / "data" / "doctor-benches"
HEALTHY = {"ActiveState": "active", "SubState": "running", "NRestarts": "0", "MainPID": "812"}
#: The e2e server's flags (tests/e2e/test_doctor_e2e.py).
ARGS = {"max-model-len": 512, "max-num-seqs": 4, "enforce-eager": True}


def recorded() -> tuple[dict, dict]:
    """(the plan run's stage 0 as the doctor reads it, the doctor's report of the slow run)."""
    plan = json.loads((DATA / "plan-base" / "results.json").read_text())
    report = json.loads((DATA / "doctor-slow.json").read_text())
    (server,) = report["servers"]
    baseline = {**plan["servers"]["e2e-vllm/doc"]["baseline"], "run": "plan-base",
                "started": plan["started"], "input_len": 32, "output_len": 16}  # fmt: skip
    return baseline, server["bench"]


def healthy(bench: dict | None, **kwargs) -> Evidence:
    fields = {"args": dict(ARGS), "variant": "cpu", **kwargs}
    return Evidence("e2e-vllm", "doc", unit=dict(HEALTHY), health=200, ready=True, bench=bench,
                    **fields)  # fmt: skip


def test_the_recorded_slow_run_is_clearly_slower_than_its_baseline() -> None:
    baseline, bench = recorded()
    slower = slowdown(baseline, bench["fresh"])
    assert [s["figure"] for s in slower][:1] == ["TTFT P50"]
    assert slower[0]["ratio"] >= 2


def test_the_recorded_slow_run_is_named_queueing_at_max_num_seqs() -> None:
    baseline, bench = recorded()
    d = diagnose(healthy({**bench, "baseline": baseline}))
    assert d.status == PROBLEM and d.signature == "slower-than-bench"
    assert d.cause.startswith("slower than its last bench: TTFT P50 ")
    assert "most likely requests wait in the server's queue" in d.cause
    assert any("max-num-seqs 4 reached" in line and "KV cache was at most 0% used" in line
               for line in d.evidence), d.evidence
    assert any("the server's queue time P50 150.0 ms" in line for line in d.evidence)
    assert d.fix.startswith("raise max-num-seqs (now 4) in hosts.e2e-vllm.servers.doc.args")
    assert d.bench is not None and d.bench["baseline"]["run"] == "plan-base"


def test_a_slow_client_on_an_idle_server_is_not_the_servers_slowness() -> None:
    """A CI run's doctor on the idle e2e server (three streams of tests on two cores): every
    round's client TTFT P50 about 29 ms against the recorded baseline's 8 ms, every stream read
    in one piece (TPOT 0) — while the server's own TTFT over the round was 3.8 ms and it finished
    only the round's 5 requests. The client was slow, not the server: not slower, and ok."""
    baseline, _ = recorded()
    fresh = copy.deepcopy(baseline)
    fresh.update(requests=5, ok=5, warmup_requests=1,
                 ttft_ms={**fresh["ttft_ms"], "p50": 29.064692, "mean": 29.226226},
                 tpot_ms={**fresh["tpot_ms"], "p50": 0.0, "mean": 0.0})
    fresh["server"] = {"ttft": {"count": 5.0, "mean": 0.0037574291229248045, "p50": 0.003},
                       "requests_finished": 5.0}
    assert slowdown(baseline, fresh) == []
    assert diagnose(healthy({"baseline": baseline, "fresh": fresh})).status == OK
    # the same round while the server also finished a request of a neighbour: slower
    busy = copy.deepcopy(fresh)
    busy["server"]["requests_finished"] = 6.0  # one more than its own 5: a neighbour's
    assert [s["figure"] for s in slowdown(baseline, busy)] == ["TTFT P50"]


def test_a_baseline_against_itself_is_ok() -> None:
    baseline, _ = recorded()
    d = diagnose(healthy({"baseline": baseline, "fresh": copy.deepcopy(baseline)}))
    assert d.status == OK
    assert "its last bench" in d.state


def test_without_a_bench_nothing_is_measured_or_said() -> None:
    d = diagnose(healthy(None))
    assert d.status == OK and "bench" not in d.state


def test_a_failed_measurement_is_said_and_not_a_problem() -> None:
    baseline, _ = recorded()
    d = diagnose(healthy({"baseline": baseline, "error": "none of 5 requests succeeded"}))
    assert d.status == OK and "slow check: none of 5 requests succeeded" in d.state


def slow(**fresh) -> dict:
    return {"baseline": {"ttft_ms": {"p50": 10.0, "p99": 12.0}, "tpot_ms": {"p50": 2.0},
                         "run": "r", "started": "s"},
            "fresh": {"ttft_ms": {"p50": 40.0, "p99": 44.0}, "tpot_ms": {"p50": 2.0}, "ok": 5,
                      **fresh}}  # fmt: skip


def titles(ev: Evidence) -> list[str]:
    return [c[0].split(" (")[0] for c in causes(ev)]


def test_p99_far_above_p50_points_at_max_num_batched_tokens() -> None:
    bench = slow(ttft_ms={"p50": 40.0, "p99": 400.0})
    bench["metrics_ttft"] = {"p50": 0.02, "p99": 0.09, "count": 900}
    ev = healthy(bench, args={**ARGS, "max-num-batched-tokens": 8192})
    assert titles(ev) == ["a few requests wait far longer than the rest"]
    _, evidence, fix = causes(ev)[0]
    assert evidence == ["TTFT P99 400.0 ms against P50 40.0 ms (×10.0) in the fresh measurement",
                        "TTFT P99 90.0 ms against P50 20.0 ms (×4.5) in the server's /metrics "
                        "since its start"]  # fmt: skip
    assert fix.startswith("lower max-num-batched-tokens (now 8192) in hosts.e2e-vllm")


def test_an_idle_gpu_points_at_the_cpu_side_and_numa() -> None:
    bench = slow(gpu={"0": {"util_mean": 18.0, "util_max": 40.0}})
    ev = healthy(bench, variant="cu129", gpus=[{"index": 0, "total_mib": 24564}])
    title, evidence, fix = causes(ev)[0]
    assert title.startswith("the GPU is starved")
    assert evidence == ["GPU 0 was 18 % busy on average during the measurement"]
    assert "gpus.topology" in fix and "NUMA" in fix


def test_an_oversubscribed_cpu_host_and_its_busy_neighbour() -> None:
    ev = healthy(slow(), cpu_load={"load1": 5.2, "cpus": 2}, busy_processes=[
        {"pid": 812, "user": "vllm", "cpu": 180.0, "process": "python3", "own": True},
        {"pid": 4121, "user": "aiadm", "cpu": 99.0, "process": "python", "own": False}],
        neighbours=["chat"])  # fmt: skip
    assert titles(ev) == ["the host's CPUs are oversubscribed: the server gets only part of its "
                          "cores", "other work shares the server's GPU or cores"]
    evidence = causes(ev)[1][1]
    assert evidence == ["pid 4121 (user aiadm, python) uses 99 % of a CPU",
                        "hosts.e2e-vllm.servers.doc shares its cores with chat (the fleet file)"]


def test_another_users_process_on_the_servers_gpu() -> None:
    ev = healthy(slow(), variant="cu129", own_pids=[812], gpus=[{"index": 0}], gpu_apps=[
        {"gpu": 0, "pid": 812, "user": "vllm", "process": "python3", "used_mib": 20000},
        {"gpu": 0, "pid": 4121, "user": "aiadm", "process": "python", "used_mib": 9000},
        {"gpu": 1, "pid": 5000, "user": "bob", "process": "python", "used_mib": 9000}])
    (title, evidence, fix), = causes(ev)
    assert title == "other work shares the server's GPU or cores"
    assert evidence == ["GPU 0: pid 4121 (user aiadm, python) holds 9,000 MiB"]
    assert "hosts.e2e-vllm.servers.doc.gpus" in fix


def test_a_model_on_a_network_file_system() -> None:
    ev = healthy(slow(), model_path="/var/lib/vllm-fleet/models/m", model_fstype="nfs4",
                 model_mount="/var/lib/vllm-fleet/models")  # fmt: skip
    (title, evidence, fix), = causes(ev)
    assert title == "the model is on a network file system"
    assert "is on nfs4 (mounted at /var/lib/vllm-fleet/models)" in evidence[0]
    assert "local disk" in fix


def test_slower_with_nothing_to_explain_it_says_so() -> None:
    d = diagnose(healthy(slow(), model_fstype="ext4"))
    assert d.status == PROBLEM and d.signature == "slower-than-bench"
    assert d.cause.endswith("nothing read here explains it")
    assert "fleet bench --compare" in d.fix


def test_noise_is_not_a_slowdown() -> None:
    base = {"ttft_ms": {"p50": 10.0}, "tpot_ms": {"p50": 2.0}}
    assert slowdown(base, {"ttft_ms": {"p50": 19.0}, "tpot_ms": {"p50": 3.9}}) == []
    # doubled, but by under the floor: 7 ms → 15 ms of TTFT is this machine's noise
    assert slowdown({"ttft_ms": {"p50": 7.0}}, {"ttft_ms": {"p50": 15.0}}) == []
    assert [s["figure"] for s in slowdown(base, {"tpot_ms": {"p50": 4.5}})] == ["TPOT P50"]


def test_the_gauges_just_after_count_where_the_samples_missed_the_busy_moments() -> None:
    bench = slow(server={"queue": {"p50": 0.03}}, server_gauges={})
    bench["metrics_gauges"] = {"running": 4.0, "waiting": 3.0, "kv_cache_usage": 0.95}
    (title, evidence, fix), = causes(healthy(bench))
    assert title.startswith("requests wait in the server's queue")
    assert evidence[1:] == ["requests running up to 4, waiting up to 3 (vllm:num_requests_running "
                            "/ _waiting, during and just after)",
                            "max-num-seqs 4 reached: at most 4 requests run at once and new ones "
                            "wait for a running one to end (4 were running)"]  # fmt: skip
    assert fix.startswith("raise max-num-seqs (now 4)")
