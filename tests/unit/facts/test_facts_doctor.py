"""facts.doctor: each fact's command run for real on this machine where it can be (ss, df,
runuser, curl, ps), and parsed from real captures where it cannot (nvidia-smi on H200s)."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from facts.doctor import (
    Completion,
    CudaDriverVersion,
    DiskSpace,
    GpuFreeMemory,
    HttpStatus,
    ListeningSockets,
    ProcessOwners,
    ReadableAs,
    UnitJournal,
    UnitStatus,
)

NVIDIA = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia" / "h200x1-busy"


def run(command) -> list[str]:
    """A fact's command through the shell, as pyinfra runs it; its output lines."""
    text = command if isinstance(command, str) else command.get_raw_value()
    result = subprocess.run(["sh", "-c", text], capture_output=True, text=True, timeout=30,
                            check=False)  # fmt: skip
    return result.stdout.splitlines()


def test_listening_sockets_names_the_owner_and_its_user() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        found = [s for s in ListeningSockets().process(run(ListeningSockets().command()))
                 if s["port"] == port]  # fmt: skip
    assert found == [{"port": port, "address": "127.0.0.1", "pid": os.getpid(),
                      "process": found[0]["process"], "user": "root"}]  # fmt: skip
    assert found[0]["process"].startswith("python")


def test_process_owners() -> None:
    owners = ProcessOwners().process(run(ProcessOwners().command(pids=[os.getpid()])))
    assert owners[os.getpid()]["user"] == "root"


@pytest.fixture
def model_dir() -> Iterator[Path]:
    """A model folder in /tmp that others may enter, with one private file."""
    with tempfile.TemporaryDirectory(dir="/tmp") as name:
        folder = Path(name)
        folder.chmod(0o755)
        (folder / "tokenizer.json").write_text("{}")
        (folder / "tokenizer.json").chmod(0o644)
        (folder / "config.json").write_text("{}")
        (folder / "config.json").chmod(0o600)
        yield folder


def test_readable_as_tests_as_the_user(model_dir: Path) -> None:
    fact = ReadableAs()
    result = fact.process(run(fact.command(user="nobody", path=str(model_dir))))
    assert result["exists"] and result["user_exists"]
    assert result["unreadable"] == [
        {"path": str(model_dir / "config.json"), "owner": "root:root", "mode": "600",
         "dir": False}]  # fmt: skip


def test_readable_as_reports_a_parent_folder_it_cannot_enter(model_dir: Path) -> None:
    model_dir.chmod(0o700)
    inner = model_dir / "inner"
    inner.mkdir()
    result = ReadableAs().process(run(ReadableAs().command(user="nobody", path=str(inner))))
    assert {"path": str(model_dir), "owner": "root:root", "mode": "700", "dir": True} in (
        result["unreadable"])


def test_readable_as_says_when_the_path_or_user_is_missing(tmp_path: Path) -> None:
    fact = ReadableAs()
    assert fact.process(run(fact.command(user="nobody", path=str(tmp_path / "x"))))[
        "exists"] is False
    assert fact.process(run(fact.command(user="no-such-user-9", path="/")))["user_exists"] is False


def test_disk_space_of_existing_and_future_paths(tmp_path: Path) -> None:
    later = tmp_path / "not" / "yet"
    result = DiskSpace().process(run(DiskSpace().command(paths=[str(tmp_path), str(later)])))
    statvfs = os.statvfs(tmp_path)
    assert result[str(tmp_path)]["total_bytes"] == statvfs.f_blocks * statvfs.f_frsize
    assert result[str(later)]["mount"] == result[str(tmp_path)]["mount"]


@pytest.fixture
def web() -> Iterator[int]:
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


def test_http_status_answers_and_refusals(web: int) -> None:
    fact = HttpStatus()
    assert fact.process(run(fact.command(url=f"http://127.0.0.1:{web}/")))["status"] == 200
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    answer = fact.process(run(fact.command(url=f"http://127.0.0.1:{closed}/health")))
    assert answer == {"status": None, "error": "connection refused"}


def test_unit_journal_bounds_and_exit_status() -> None:
    fact = UnitJournal()
    assert fact.process(["Started vllm-a.service", "boom", "@@rc=0"]) == {
        "text": "Started vllm-a.service\nboom", "rc": 0, "truncated": False, "error": None}
    assert fact.process(["@@rc=124"])["error"] == "journalctl timed out"
    assert fact.process(["half a line"])["error"] == "journalctl's output was cut"
    command = fact.command(unit="vllm-a.service", lines=50, max_bytes=4096, seconds=3)
    assert "timeout 3 journalctl" in command.get_raw_value()
    assert command.get_raw_value().endswith("tail -c 4096")


def test_unit_status_parses_systemctl_show() -> None:
    output = ["Id=vllm-a.service", "ActiveState=activating", "SubState=auto-restart",
              "NRestarts=4", "MainPID=0", "", "Id=vllm-b.service", "ActiveState=active"]
    assert UnitStatus().process(output) == {
        "vllm-a.service": {"ActiveState": "activating", "SubState": "auto-restart",
                           "NRestarts": "4", "MainPID": "0"},
        "vllm-b.service": {"ActiveState": "active"}}  # fmt: skip


def test_gpu_free_memory_and_cuda_version_from_a_real_h200() -> None:
    # query-gpu-extra.csv: index, uuid, name, total, used, free, … — the free column alone
    rows = [line.split(", ") for line in (NVIDIA / "query-gpu-extra.csv").read_text().splitlines()]
    assert GpuFreeMemory().process([f"{r[0]}, {r[5]}" for r in rows]) == {0: 141606}
    header = (NVIDIA / "nvidia-smi.txt").read_text().splitlines()[:5]
    assert CudaDriverVersion().process(header) == "13.0"


def test_completion_through_the_real_request_program(web: int, tmp_path: Path) -> None:
    env = tmp_path / "chat.env"
    env.write_text("VLLM_API_KEY=k\n")
    program = ["python3", str(Path(__file__).resolve().parents[3] / "hostside" / "request.py")]
    fact = Completion()
    get = json.dumps({"port": web, "path": "/", "body": None, "auth": False,
                      "env_file": str(env)})  # fmt: skip
    assert fact.process(run(fact.command(program=program, payload=get)))["ok"] is True
    post = json.dumps({"port": web, "path": "/v1/completions", "body": {"prompt": "x"},
                       "auth": True, "env_file": str(env)})  # fmt: skip
    answer = fact.process(run(fact.command(program=program, payload=post)))
    assert answer["ok"] is False and answer["status"] == 501
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    refused = json.dumps({"port": closed, "path": "/", "body": None, "auth": False,
                          "env_file": str(env)})  # fmt: skip
    answer = fact.process(run(fact.command(program=program, payload=refused)))
    assert answer["ok"] is False and "request failed" in answer["error"]


@pytest.mark.parametrize("pinned", [False, True])
def test_http_status_asks_a_tls_server_by_the_name_clients_use(tmp_path, pinned: bool) -> None:
    """doctor's /health of a TLS server: curl connects to where it listens (loopback) for the
    name its certificate covers, trusting the plan's CA file alone (the CA, or the deployed
    certificate itself); another name is a certificate error, not a health answer."""
    import ssl

    from cli.doctor.gather import health_request
    from fleet.planner.reach import Reach
    from tests.support.testca import TestCA

    files = TestCA().server_files(tmp_path, ["gpu-1.example"])
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.certificate, files.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        cafile = str(files.certificate if pinned else files.ca)
        fact = HttpStatus()
        reach = Reach("https", "127.0.0.1", port, "", cafile, "gpu-1.example")
        assert fact.process(run(fact.command(**health_request(reach))))["status"] == 404
        wrong = Reach("https", "127.0.0.1", port, "", cafile, "gpu-2.example")
        answer = fact.process(run(fact.command(**health_request(wrong))))
        assert answer["status"] is None and "certificate" in answer["error"]
    finally:
        server.shutdown()
