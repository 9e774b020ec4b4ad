"""The start recorder (``hostside/startup_phases.py``), run by its file as the deploy runs it on
a host, on the real journal of a deployed server (tests/data/vllm-startup/, captured on the
e2e sandbox host) printed by a STAND-IN ``journalctl`` (this machine runs no systemd), and the
model installer's log of installs; then the record read back as ``fleet status --startup``
reads it (merged with the journal's own starts).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from cli.status.view import startup_table
from hostside import local_path
from hostside.fetch_model import INSTALLS_LOG, log_install
from hostside.startup_phases import merge_recorded, starts

JOURNAL = Path(__file__).resolve().parents[2] / "data" / "vllm-startup" / (
    "sandbox-cpu-v032-bench.journal.txt")  # fmt: skip
LINES = JOURNAL.read_bytes().decode().split("\n")


def recorder(
    tmp_path: Path, record: Path, installs: Path, journal: Path = JOURNAL
) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    standin = bin_dir / "journalctl"
    standin.write_text(f"#!/bin/sh\n# STAND-IN journalctl for this test\ncat {journal}\n")
    standin.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(
        [sys.executable, str(local_path("startup_phases")), "--unit", "vllm-bench.service",
         "--name", "bench", "--record", str(record), "--model", "tiny-bench",
         "--model-installs", str(installs)],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip


def test_the_deploy_records_each_start_once_with_the_model_install_before_it(tmp_path):
    began = starts(LINES)[-1].marks["begin"]
    installs = tmp_path / INSTALLS_LOG
    installs.write_text("\n".join(json.dumps(entry) for entry in [
        {"model": "tiny-bench", "ended_s": began - 2, "seconds": 3.25},   # this start's
        {"model": "other", "ended_s": began - 1, "seconds": 50},          # another model's
        {"model": "tiny-bench", "ended_s": began + 60, "seconds": 9},     # after it began
    ]) + "\n")  # fmt: skip
    record = tmp_path / "bench.jsonl"
    result = recorder(tmp_path, record, installs)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "bench: ready in 30.6 s (model install 3.2 s before it); process start 27.9 s, "
        "weight loading 0.1 s,"
    ), result.stdout
    (kept,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert kept["model_install_s"] == 3.25 and kept["total_s"] == 30.57
    assert kept["phases"]["process start"] == 27.9
    assert recorder(tmp_path, record, installs).returncode == 0  # the same start again
    assert len(record.read_text().splitlines()) == 1


def test_a_recorded_start_outlives_the_journal(tmp_path):
    record = tmp_path / "bench.jsonl"
    assert recorder(tmp_path, record, tmp_path / "none.jsonl").returncode == 0
    kept = record.read_text().splitlines()
    (live,) = merge_recorded(starts(LINES), kept)
    assert live.recorded and live.phases["process start"] == 27.9
    (rotated,) = merge_recorded([], kept)  # the journal no longer has it
    assert rotated.recorded and rotated.total_s == 30.57 and rotated.model_install_s is None


def test_the_installer_logs_each_install(tmp_path):
    log_install(tmp_path, "tiny", 4.256, "tiny: installed 1a2b3c4d")
    log_install(tmp_path / "missing", "tiny", 1, "x")  # never fails the install
    (entry,) = [json.loads(line) for line in (tmp_path / INSTALLS_LOG).read_text().splitlines()]
    assert (entry["model"], entry["seconds"], entry["summary"]) == (
        "tiny", 4.26, "tiny: installed 1a2b3c4d")  # fmt: skip


def test_a_start_that_cannot_be_recorded_never_fails_the_deploy(tmp_path):
    empty = tmp_path / "empty.journal"
    empty.write_text("-- No entries --\n")
    result = recorder(tmp_path, tmp_path / "a.jsonl", tmp_path / "none.jsonl", empty)
    assert result.returncode == 0 and "nothing recorded" in result.stdout
    assert not (tmp_path / "a.jsonl").exists()
    unwritable = tmp_path / "missing-folder" / "a.jsonl"
    result = recorder(tmp_path, unwritable, tmp_path / "none.jsonl")
    assert result.returncode == 0 and "start not recorded" in result.stdout


def test_status_shows_the_model_install_beside_the_phases(tmp_path):
    began = starts(LINES)[-1].marks["begin"]
    installs = tmp_path / INSTALLS_LOG
    installs.write_text(json.dumps({"model": "tiny-bench", "ended_s": began - 1, "seconds": 3.25}))
    record = tmp_path / "bench.jsonl"
    assert recorder(tmp_path, record, installs).returncode == 0
    merged = merge_recorded(starts(LINES), record.read_text().splitlines())
    console = Console(record=True, width=250, file=io.StringIO())
    console.print(startup_table({"e2e-vllm/bench": merged}))
    lines = console.export_text().splitlines()
    header, row = [line for line in lines if "┃" in line or "│" in line]
    assert header.split("┃")[4].strip() == "model install"
    assert row.split("│")[4].strip() == "3.2" and row.split("│")[5].strip() == "27.9"
