"""fleet.judge.diagnosis on real vLLM log text (tests/data/doctor-logs, each citing its source) and
on the facts ``fleet doctor`` gathers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleet.judge.diagnosis import (
    OK,
    PROBLEM,
    SIGNATURES,
    UNKNOWN,
    Evidence,
    diagnose,
    last_start,
    mask,
    match,
)

LOGS = Path(__file__).resolve().parents[2] / "data" / "doctor-logs"
LOG_FILES = sorted(LOGS.glob("*.log"))
FAILED = {"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "1"}


def header(path: Path, key: str) -> str:
    found = re.search(rf"^# {key}: (.+)$", path.read_text(), re.MULTILINE)
    assert found, f"{path.name} has no '# {key}:' line"
    return found.group(1)


def body(path: Path) -> str:
    return "\n".join(line for line in path.read_text().splitlines() if not line.startswith("# "))


def failing(journal: str = "", **kwargs) -> Evidence:
    return Evidence("gpu-a", "chat", unit=dict(FAILED), health_error="connection refused",
                    journal=journal, **kwargs)  # fmt: skip


@pytest.mark.parametrize("path", LOG_FILES, ids=lambda p: p.stem)
def test_every_log_cites_its_source(path: Path) -> None:
    source = header(path, "source")
    assert source.startswith(("https://github.com/", "captured here"))


@pytest.mark.parametrize("path", LOG_FILES, ids=lambda p: p.stem)
def test_each_real_log_is_named_by_its_signature(path: Path) -> None:
    expected = header(path, "signature")
    found = match(last_start(body(path)))
    assert found and found[0].name == expected, [s.name for s in found]


@pytest.mark.parametrize("path", LOG_FILES, ids=lambda p: p.stem)
def test_each_real_log_gets_cause_evidence_and_fix(path: Path) -> None:
    text = body(path)
    diagnosis = diagnose(failing(text, vllm_version="0.32.0", variant="cu129"))
    assert diagnosis.status == PROBLEM
    assert diagnosis.signature == header(path, "signature")
    assert diagnosis.cause and diagnosis.fix
    log_lines = [line for line in diagnosis.evidence if line in text]
    assert log_lines, diagnosis.evidence


def test_every_signature_has_a_real_log() -> None:
    named = {header(path, "signature") for path in LOG_FILES}
    # model-unreadable is shown end to end (tests/e2e/test_doctor_e2e.py) and by facts
    assert {s.name for s in SIGNATURES} - named <= {"model-unreadable"}


def test_graph_capture_lines_of_a_healthy_start_are_not_an_oom() -> None:
    healthy = ("INFO 08-19 07:51:12 model_runner.py:1024] Capturing the model for CUDA graphs. "
               "This may lead to unexpected consequences if the model is not static.\n"
               "If out-of-memory error occurs during cudagraph capture, consider decreasing "
               "`gpu_memory_utilization` or switching to eager mode.")
    assert match(healthy)[:1] != ["oom-graph-capture"]
    assert [s.name for s in match(healthy)] == []


def test_last_start_keeps_the_failed_invocation_of_a_restart_loop() -> None:
    journal = ("Started vllm-chat.service - vLLM server chat\nold line\n"
               "Started vllm-chat.service - vLLM server chat\n"
               "vllm: error: unrecognized arguments: --foo\n"
               "Started vllm-chat.service - vLLM server chat\nloading weights")
    assert last_start(journal).splitlines() == [
        "Started vllm-chat.service - vLLM server chat",
        "vllm: error: unrecognized arguments: --foo",
    ]


def test_oom_at_load_names_the_gpu_the_process_and_its_user() -> None:
    ev = failing(
        (LOGS / "oom-load.log").read_text(),
        gpus=[{"index": 0, "total_mib": 24564, "used_mib": 15200, "free_mib": 9318}],
        host_gpus=[{"index": 0, "total_mib": 24564, "free_mib": 9318},
                   {"index": 3, "total_mib": 24564, "free_mib": 24000}],
        gpu_apps=[{"gpu": 0, "pid": 4121, "user": "aiadm", "process": "python",
                   "used_mib": 14541}],
        plan={"utilization": 0.9, "gpus": [0], "weights_per_gpu_bytes": 8 * 2**30,
              "budget_bytes": int(0.9 * 24 * 2**30)},
    )  # fmt: skip
    d = diagnose(ev)
    assert d.signature == "oom-load"
    assert d.cause == ("GPU 0 has 9.1 GiB free of 24.0 GiB: pid 4121 (user aiadm, python) holds "
                       "14.2 GiB")
    assert d.fix == ("move this server to GPU 3 (hosts.gpu-a.servers.chat.gpus: [3]) or lower "
                     "gpu-memory-utilization to 0.35")


def test_kv_too_small_fix_is_the_planners_largest_max_model_len() -> None:
    ev = failing("ValueError: No available memory for the cache blocks. Try increasing "
                 "`gpu_memory_utilization` when initializing the engine.",
                 args={"max-model-len": 32768}, plan={"kv_cache_tokens": 21504,
                                                      "kv_budget_bytes": 2 * 2**30})
    d = diagnose(ev)
    assert d.signature == "kv-too-small"
    assert d.fix.startswith("set max-model-len: 21504 in hosts.gpu-a.servers.chat.args")
    assert "planner: the KV cache holds 21,504 tokens (budget 2.0 GiB)" in d.evidence


def test_kv_too_small_on_cpu_from_vllms_own_numbers() -> None:
    d = diagnose(failing(body(LOGS / "cpu-kv-too-small.log"), variant="cpu"))
    assert d.cause.startswith("max-model-len 4,194,304 does not fit the KV cache")
    assert "set max-model-len: 2097024" in d.fix
    assert "vllm.cpu_kvcache_space_gib: 2" in d.fix


def test_nccl_names_the_interface_it_used() -> None:
    d = diagnose(failing(body(LOGS / "nccl-interface.log")))
    assert "NCCL used interface eno3" in d.evidence
    assert "NCCL_SOCKET_IFNAME" in d.fix and "NCCL picked eno3" in d.fix


def test_port_owner_from_facts_alone() -> None:
    d = diagnose(failing("", port=18700, own_pids=[77],
                         port_owners=[{"port": 18700, "pid": 4121, "user": "nobody",
                                       "process": "python3"}]))  # fmt: skip
    assert d.signature == "port-in-use"
    assert d.cause == "port 18700 is held by pid 4121 (user nobody, python3)"


def test_the_servers_own_listener_is_not_a_squatter() -> None:
    d = diagnose(failing("", port=18700, own_pids=[77],
                         port_owners=[{"port": 18700, "pid": 77, "user": "vllm"}]))
    assert d.signature != "port-in-use"


def test_unreadable_model_from_facts() -> None:
    d = diagnose(failing("", model_path="/var/lib/vllm-fleet/models/m", unreadable=[
        {"path": "/var/lib/vllm-fleet/models/m/config.json", "owner": "root:root",
         "mode": "600", "dir": False}]))  # fmt: skip
    assert d.signature == "model-unreadable"
    assert ("/var/lib/vllm-fleet/models/m/config.json (root:root, mode 600) is not readable "
            "by vllm") in d.evidence
    assert "chmod -R a+rX /var/lib/vllm-fleet/models/m" in d.fix


def test_full_disk_from_facts() -> None:
    d = diagnose(failing("", disks=[{"path": "/dev/shm", "free_bytes": 0,
                                     "total_bytes": 262144, "mount": "/dev/shm"}]))
    assert d.signature == "disk-full"
    assert d.cause == "/dev/shm is full"


def test_fabric_manager_off_version_on_an_nvswitch_host() -> None:
    d = diagnose(failing(body(LOGS / "fabric-manager.log"), nvswitches=4, driver="570.172.08",
                         fabric_manager={"active": "active", "version": "570.133.20"}))
    assert d.signature == "fabric-manager"
    assert any("version 570.133.20; driver 570.172.08" in line for line in d.evidence)


def test_a_healthy_server_is_ok() -> None:
    ev = Evidence("h", "s", unit={"ActiveState": "active", "SubState": "running",
                                  "NRestarts": "0"}, health=200)  # fmt: skip
    assert diagnose(ev).status == OK


def test_an_unreachable_host_is_unknown_with_its_reason() -> None:
    d = diagnose(Evidence("h", "s", error="host unreachable: ConnectionRefusedError"))
    assert d.status == UNKNOWN and "host unreachable" in d.cause


def test_a_loop_with_no_known_cause_keeps_the_raw_evidence() -> None:
    ev = failing("Started vllm-chat.service\nsomething odd happened\nexit 3")
    ev.unit["NRestarts"] = "7"
    d = diagnose(ev)
    assert d.signature == "restart-loop" and "7 restarts" in d.cause
    assert "something odd happened" in d.evidence


def test_unclassified_is_unknown_with_the_raw_lines() -> None:
    d = diagnose(failing("Started vllm-chat.service\nsomething odd happened"))
    assert d.status == UNKNOWN
    assert "something odd happened" in d.evidence


def test_unreadable_journal_is_said() -> None:
    d = diagnose(failing("", journal_error="journalctl exited 1: No journal files"))
    assert d.status == UNKNOWN
    assert d.evidence == ["journal: journalctl exited 1: No journal files"]


@pytest.mark.parametrize(("line", "secrets", "expected"), [
    ("non-default args: {'api_key': ['k-123456'], 'port': 8}", [],
     "non-default args: {'api_key': ['***'], 'port': 8}"),
    ("Namespace(api_key='k-123456', host=None)", [], "Namespace(api_key='***', host=None)"),
    ("curl -H 'Authorization: Bearer abcdef'", [], "curl -H 'Authorization: Bearer ***"),
    ("token hf_abcdefghijklmnopqrstu used", [], "token hf_*** used".replace("hf_***", "***")),
    ("loaded key 5b8d2e-secret from env", ["5b8d2e-secret"], "loaded key *** from env"),
    ("max_num_batched_tokens=2048 max_tokens=16", [], "max_num_batched_tokens=2048 max_tokens=16"),
])  # fmt: skip
def test_mask(line: str, secrets: list[str], expected: str) -> None:
    assert mask(line, secrets) == expected


def test_a_real_healthy_start_matches_no_signature() -> None:
    text = body(LOGS / "healthy-cpu-startup.txt")
    assert match(text) == []
    assert diagnose(failing(text)).status == UNKNOWN


def test_a_cause_the_facts_show_beats_a_generic_engine_death() -> None:
    d = diagnose(failing(body(LOGS / "engine-died.log"), model_path="/m", unreadable=[
        {"path": "/m/config.json", "owner": "root:root", "mode": "600", "dir": False}]))
    assert d.signature == "model-unreadable"


def test_health_without_a_completion_is_not_healthy() -> None:
    ev = Evidence("h", "s", unit={"ActiveState": "active", "SubState": "running",
                                  "NRestarts": "0"}, health=200, ready=False,
                  ready_error="HTTP 500: engine dead")  # fmt: skip
    d = diagnose(ev)
    assert d.status == UNKNOWN
    assert d.state.endswith("completion: HTTP 500: engine dead")
