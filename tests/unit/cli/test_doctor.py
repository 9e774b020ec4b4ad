"""cli.doctor: the report, its exit status, the arguments, and a host that is not there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cli.doctor.command import _split
from cli.doctor.gather import gather_fleet
from cli.doctor.report import READ_ONLY, exit_status, text, to_json
from fleet.judge.diagnosis import Diagnosis, diagnose

ROOT = Path(__file__).resolve().parents[3]
SANDBOX = str(ROOT / "inventory" / "sandbox.yaml")
OK = Diagnosis("h", "a", "ok", "active (running), /health: 200")
PROBLEM = Diagnosis("h", "b", "problem", "failed (failed)", "port-in-use",
                    "port 1 is held by pid 9 (user x, y)", ["OSError: [Errno 98] …"],
                    "give hosts.h.servers.b.port a free port")  # fmt: skip
UNKNOWN = Diagnosis("g", "c", "unknown", "not gathered", cause="could not gather evidence: x")


@pytest.mark.parametrize(("diagnoses", "status"), [
    ([], 0), ([OK], 0), ([OK, UNKNOWN], 1), ([OK, PROBLEM], 2), ([UNKNOWN, PROBLEM], 2),
])  # fmt: skip
def test_exit_status(diagnoses: list[Diagnosis], status: int) -> None:
    assert exit_status(diagnoses) == status


def test_text_shows_cause_evidence_and_fix_and_says_it_changed_nothing() -> None:
    report = text([OK, PROBLEM])
    assert "h/b  problem  [port-in-use]  failed (failed)" in report
    assert "  cause: port 1 is held by pid 9 (user x, y)" in report
    assert "    OSError: [Errno 98] …" in report
    assert "  fix: give hosts.h.servers.b.port a free port" in report
    assert report.endswith(READ_ONLY)


def test_json_report() -> None:
    report = json.loads(to_json([OK, PROBLEM]))
    assert report["status"] == "problems" and report["read_only"] is True
    assert [s["status"] for s in report["servers"]] == ["ok", "problem"]


@pytest.mark.parametrize(("fleet", "target", "expected"), [
    (None, None, ("default.yaml", None)),
    (SANDBOX, None, (SANDBOX, None)),
    ("sandbox-1", None, ("default.yaml", "sandbox-1")),
    ("sandbox-1/tiny", None, ("default.yaml", "sandbox-1/tiny")),
    (SANDBOX, "sandbox-1/tiny", (SANDBOX, "sandbox-1/tiny")),
])  # fmt: skip
def test_arguments(fleet, target, expected) -> None:
    assert _split(SimpleNamespace(fleet=fleet, target=target), "default.yaml") == expected


def test_an_unknown_host_or_server_is_refused() -> None:
    with pytest.raises(KeyError, match="no host 'nope'"):
        gather_fleet(SANDBOX, only="nope")
    with pytest.raises(KeyError, match="no server 'nope' on host sandbox-1"):
        gather_fleet(SANDBOX, only="sandbox-1/nope")


def test_a_sandbox_host_that_is_not_running_is_could_not_diagnose() -> None:
    (evidence,) = gather_fleet(SANDBOX, only="sandbox-1/tiny")
    assert evidence.error and "not running" in evidence.error
    assert diagnose(evidence).status == "unknown"
    result = subprocess.run([sys.executable, "-m", "cli.main", "doctor", SANDBOX, "sandbox-1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120,
                            check=False)  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.rstrip().endswith(READ_ONLY)
