"""``start_recorded``: the record's folder, then the start recorder, streamed (its line appears in
the deploy's output), run by its file with the server's record and the installer's log."""

from __future__ import annotations

import shlex

from fleet.catalog.paths import MODEL_INSTALLS, STARTUPS_DIR, remote_program, startup_record
from operations.startups import start_recorded
from tests.support.opharness import run_op


def test_the_recorder_runs_on_the_servers_record() -> None:
    script = remote_program("startup_phases")
    commands, noops = run_op(start_recorded, {}, unit="vllm-tiny.service", server="tiny",
                             model="tiny-llama", script=script)  # fmt: skip
    assert noops == [] and commands[0] == f"install -d -m 755 {STARTUPS_DIR}"
    assert shlex.split(commands[1]) == [
        "python3", script, "--unit", "vllm-tiny.service", "--name", "tiny",
        "--record", startup_record("tiny"), "--model", "tiny-llama",
        "--model-installs", MODEL_INSTALLS,
    ]  # fmt: skip
