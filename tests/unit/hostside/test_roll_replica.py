"""The replica updater's parts that run without systemd: draining against a server's /metrics,
and putting saved files back when a rollout stopped earlier."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

from hostside import roll_replica
from tests.support.fakeserver import FakeServer, Script
from tests.support.wait import wait_until


def _slow_request(url: str) -> None:
    body = json.dumps({"model": "ttft=1.5,chunks=1", "prompt": "x", "max_tokens": 1}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        reply.read()


def test_drain_returns_at_once_when_nothing_runs(capsys) -> None:
    with FakeServer(0, Script(chunks=1)) as server:
        start = time.monotonic()
        roll_replica.drain(server.url, timeout=10, label="r")
        assert time.monotonic() - start < roll_replica.SETTLE + 1
    assert "r drained in" in capsys.readouterr().out


def test_drain_waits_for_the_running_request_to_finish(capsys) -> None:
    with FakeServer(0, Script(chunks=1)) as server:
        worker = threading.Thread(target=_slow_request, args=(server.url,))
        worker.start()
        # the request is running (asked, not guessed: a busy machine may take its time)
        wait_until(lambda: roll_replica.in_flight(server.url) == 1, 10, interval=0.02)
        roll_replica.drain(server.url, timeout=10, label="r")
        # drain returned because the request ended, not because its timeout ran out
        assert roll_replica.in_flight(server.url) == 0
        worker.join()
    assert "r drained in" in capsys.readouterr().out
    assert roll_replica.in_flight(server.url) is None  # stopped: no answer


def test_drain_gives_up_after_its_timeout(capsys) -> None:
    with FakeServer(0, Script(chunks=1)) as server:
        worker = threading.Thread(target=_slow_request, args=(server.url,))
        worker.start()
        wait_until(lambda: roll_replica.in_flight(server.url) == 1, 10, interval=0.02)
        roll_replica.drain(server.url, timeout=0.5, label="r")
        worker.join()
    assert "still 1 running after the drain timeout" in capsys.readouterr().out


def test_abandon_puts_the_saved_files_back(tmp_path: Path, capsys) -> None:
    live, saved = tmp_path / "vllm-a.service", tmp_path / "saved.service"
    live.write_text("new\n")
    saved.write_text("old\n")
    roll_replica.abandon([[str(live), str(saved)]], "tiny/h/a")
    assert live.read_text() == "old\n"
    assert not saved.exists()
    assert "tiny/h/a not updated" in capsys.readouterr().out
