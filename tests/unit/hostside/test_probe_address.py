"""The host programs that probe a server reach it at the base URL its plan gives them (issue 23,
item 1): a real HTTP server bound to 127.0.0.2 — another address of the loopback range, so
nothing leaves this machine — is found healthy, ready and drained there, where
``http://127.0.0.1:PORT`` (what every probe asked before) finds nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hostside import check_ready, local_command, roll_replica, vllm_serve, wait_healthy
from tests.support.hostprograms import PROBE_KEY as KEY
from tests.support.hostprograms import run_program as run

#: Another address of the loopback range (Linux routes all of 127.0.0.0/8 to lo).
ADDRESS = "127.0.0.2"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet
        pass

    def _answer(self, status: int, body: object, kind: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._answer(200, {})
        elif self.path == "/metrics":
            self._answer(200, 'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n',
                         "text/plain")
        else:
            self._answer(404, {})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/completions":
            self._answer(404, {})
        elif self.headers.get("Authorization") != f"Bearer {KEY}":
            self._answer(401, {"error": "Unauthorized"})
        else:
            self._answer(200, {"choices": [{"text": " hi"}], "usage": {"completion_tokens": 2}})


@pytest.fixture
def server() -> Iterator[int]:
    """The port of an HTTP server listening on 127.0.0.2 only."""
    httpd = ThreadingHTTPServer((ADDRESS, 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_nothing_answers_on_127_0_0_1(server: int) -> None:
    """The premise: the old probes' address finds nothing there."""
    assert not wait_healthy.healthy(f"http://127.0.0.1:{server}")
    assert wait_healthy.healthy(f"http://{ADDRESS}:{server}")


def test_the_readiness_wait_finds_the_server_at_its_url(server: int) -> None:
    result = run("wait_healthy", "--url", f"http://{ADDRESS}:{server}", "--pid",
                 str(os.getpid()), "--timeout", "20")
    assert result.returncode == 0, result.stderr


def test_the_older_port_form_still_means_127_0_0_1(server: int) -> None:
    """A unit written by an earlier release (put back by a failed deploy) runs the same wait."""
    result = run("wait_healthy", "--port", str(server), "--pid", str(os.getpid()),
                 "--timeout", "2")
    assert result.returncode == 2
    assert f"http://127.0.0.1:{server}/health did not answer" in result.stderr


def test_the_readiness_completion_reaches_the_server_at_its_url(server: int, env: str) -> None:
    result = run("check_ready", "--url", f"http://{ADDRESS}:{server}", "--model", "m",
                 "--env-file", env, "--timeout", "20")
    assert result.returncode == 0, result.stderr
    assert f"m at http://{ADDRESS}:{server} answered 2 tokens" in result.stdout


def test_the_readiness_completion_in_process(server: int, env: str) -> None:
    """As roll_replica and canary_saved call it."""
    assert check_ready.main(["--url", f"http://{ADDRESS}:{server}/", "--model", "m",
                             "--env-file", env, "--timeout", "20"]) == 0


def test_a_replica_is_drained_at_its_url(server: int, capsys) -> None:
    assert roll_replica.in_flight(f"http://{ADDRESS}:{server}") == 0
    assert roll_replica.in_flight(f"http://127.0.0.1:{server}") is None
    roll_replica.drain(f"http://{ADDRESS}:{server}", timeout=10, label="r")
    assert "r drained in" in capsys.readouterr().out


def test_a_group_heads_watch_waits_for_health_at_its_url(server: int) -> None:
    """vllm_serve's head watch (``--api-url``) counts members only once the head serves."""
    assert vllm_serve.healthy(f"http://{ADDRESS}:{server}")
    assert not vllm_serve.healthy(f"http://127.0.0.1:{server}")


def test_the_request_program_reaches_the_server_at_its_url(server: int, env: str) -> None:
    """fleet complete, status, doctor and verify ask through it: the payload's url is used."""
    payload = {"url": f"http://{ADDRESS}:{server}", "port": server, "path": "/v1/completions",
               "body": {"model": "m", "prompt": "Hello"}, "auth": True, "env_file": env}
    result = subprocess.run(local_command("request", python="python3"), input=json.dumps(payload),
                            capture_output=True, text=True, check=False, cwd="/", timeout=60,
                            env={"PATH": os.environ["PATH"]})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == 200
    # an older client's payload (no url) still means 127.0.0.1, where nothing listens
    del payload["url"]
    older = subprocess.run(local_command("request", python="python3"), input=json.dumps(payload),
                           capture_output=True, text=True, check=False, cwd="/", timeout=60,
                           env={"PATH": os.environ["PATH"]})
    assert older.returncode == 1 and "request failed" in older.stderr
