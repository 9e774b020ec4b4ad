"""The host-side programs as a host runs them: by their file, with the system's python3.

A loopback server that demands one exact API key stands in for vLLM; the key is written to an
environment file by the one writer (as ``fleet render`` does) and read back on the "host" by the
readiness check and the request program through the one reader. Keys with quotes, backslashes,
``$`` and spaces must work for both (they did not for the request program's own reader).
Also: what each program needs uploaded (:func:`hostside.program_files`), and that every program
imports only the standard library and its siblings.
"""

from __future__ import annotations

import ast
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import hostside
from hostside import envfile, local_command, program_files
from tests.support.hostprograms import run_program

KEYS = {
    "plain": "sk-plain-123",
    "hostile": 'k "quoted" \\back\\slash $HOME `id` #x =y %z',
    "spaces": "  padded key  ",
    "single-quote": "it's",
}


class _Handler(BaseHTTPRequestHandler):
    key = ""

    def log_message(self, *args) -> None:  # quiet
        pass

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._route()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self._route()

    def _route(self) -> None:
        if self.path == "/health":
            self._answer(200, {})
        elif self.headers.get("Authorization") != f"Bearer {self.server.key}":  # type: ignore
            self._answer(401, {"error": "Unauthorized"})
        else:
            self._answer(200, {"choices": [{"text": " hi"}], "usage": {"completion_tokens": 2}})


@pytest.fixture(params=KEYS.values(), ids=KEYS.keys())
def server(request, tmp_path: Path) -> Iterator[tuple[int, str, str]]:
    """(port, key, env file) of a loopback server demanding ``key``."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.key = request.param  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    env = tmp_path / "chat.env"
    env.write_text(envfile.dumps({"HOME": "/x", "VLLM_API_KEY": request.param}, comment="c"))
    yield httpd.server_address[1], request.param, str(env)
    httpd.shutdown()
    httpd.server_close()


def payload(port: int, env: str, path: str, auth: bool = True) -> str:
    body = {"model": "m", "prompt": "Hello"} if path != "/health" else None
    return json.dumps({"port": port, "path": path, "body": body, "auth": auth, "env_file": env})


def test_request_program_sends_the_key(server) -> None:
    port, _, env = server
    result = run_program("request", stdin=payload(port, env, "/v1/completions"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == 200


def test_request_program_without_auth_is_refused(server) -> None:
    port, _, env = server
    result = run_program("request", stdin=payload(port, env, "/v1/models", auth=False))
    assert json.loads(result.stdout)["status"] == 401


def test_request_program_says_when_nothing_answers(tmp_path: Path) -> None:
    result = run_program("request", stdin=payload(9, str(tmp_path / "none.env"), "/health"))
    assert result.returncode == 1
    assert "request failed" in result.stderr


def test_readiness_check_sends_the_key(server) -> None:
    port, _, env = server
    result = run_program("check_ready", "--url", f"http://127.0.0.1:{port}", "--model", "m",
                         "--env-file", env, "--timeout", "10")
    assert result.returncode == 0, result.stderr
    assert "answered 2 tokens" in result.stdout


def test_key_never_reaches_a_command_line(server) -> None:
    port, key, env = server
    argv = local_command("check_ready", "--url", f"http://127.0.0.1:{port}", "--model", "m",
                         "--env-file", env)
    assert key not in " ".join(argv)


@pytest.mark.parametrize(
    ("program", "files"),
    [
        ("wait_healthy", ["hostside/__init__.py", "hostside/tlsprobe.py",
                          "hostside/wait_healthy.py"]),
        ("openpgp", ["hostside/openpgp.py"]),
        ("check_ready", ["hostside/__init__.py", "hostside/check_ready.py", "hostside/envfile.py",
                         "hostside/tlsprobe.py"]),
        ("request", ["hostside/__init__.py", "hostside/envfile.py", "hostside/request.py",
                     "hostside/tlsprobe.py"]),
        ("peer_serve", [
            "hostside/__init__.py", "hostside/models/__init__.py", "hostside/models/blobs.py",
            "hostside/models/common.py", "hostside/models/transport.py", "hostside/peer_serve.py",
            "hostside/peertoken.py",
        ]),
        ("canary", [
            "hostside/__init__.py", "hostside/canary.py", "hostside/envfile.py",
            "hostside/router_workers.py", "loadgen/__init__.py", "loadgen/prompts.py",
            "loadgen/stats.py", "loadgen/timing.py",
        ]),
    ],
)
def test_program_files_are_what_it_imports(program: str, files: list[str]) -> None:
    assert program_files(program) == files


def test_the_installer_needs_its_modules() -> None:
    files = program_files("fetch_model")
    assert files[0] == "hostside/__init__.py" and "hostside/fetch_model.py" in files
    assert all((hostside.ROOT_DIR / name).is_file() for name in files)
    assert len(files) > 3


def test_program_sent_as_text_imports_no_sibling() -> None:
    assert "def fingerprints" in hostside.program_source("openpgp")
    with pytest.raises(ValueError, match="cannot run as python3 -c"):
        hostside.program_source("check_ready")


MODULES = sorted(hostside.PACKAGE_DIR.rglob("*.py"))
MODULE_IDS = [str(p.relative_to(hostside.PACKAGE_DIR)) for p in MODULES]


@pytest.mark.parametrize("path", MODULES, ids=MODULE_IDS)
def test_modules_import_only_the_standard_library_and_siblings(path: Path) -> None:
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    # siblings, loadgen's uploaded core (tests/unit/test_architecture.py holds it to the
    # standard library), and the vLLM venv's optional two
    imported -= {"__future__", *hostside.UPLOADED_PACKAGES, "huggingface_hub", "vllm"}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


@pytest.mark.parametrize("path", MODULES, ids=MODULE_IDS)
def test_no_module_shadows_the_standard_library(path: Path) -> None:
    """A program run by its file has its own folder on sys.path too."""
    assert path.stem not in sys.stdlib_module_names
