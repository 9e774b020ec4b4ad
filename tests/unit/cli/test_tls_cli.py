"""A server's TLS key never shows (issue 23, TLS): not in `fleet check/plan/render`, not in a
unit, not in the plan's repr; the key reaches only its 0600 file, which the unit's
``LoadCredential=`` hands to the server alone. Certificates come from a test CA in tmp_path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cli import main as cli
from cli.inventory import inventory_hosts
from fleet.hostplan.types import plan_of
from tests.support.testca import TestCA

FLEET = """\
version: 1
models:
  m: {url: "https://models.example/m.tar.gz", sha256: "SHA256"}
hosts:
  box:
    address: gpu-1.example
    vllm: {version: "0.32.0", variant: cpu}
    servers:
      chat:
        model: m
        port: 8443
        host: 0.0.0.0
        tls: {certificate: {file: CERT}, key: {env: FLEET_TLS_KEY}}
""".replace("SHA256", "ab" * 32)


@pytest.fixture
def fleet_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str]]:
    """The fleet file, and the lines of the key's body (any of which must never show)."""
    files = TestCA().server_files(tmp_path, ["gpu-1.example"])
    key = files.key.read_text()
    monkeypatch.setenv("FLEET_TLS_KEY", key)
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET.replace("CERT", str(files.certificate)))
    return path, key.splitlines()[1:-1]


@pytest.mark.parametrize("command", [["check"], ["plan"], ["render"], ["plan", "--json"]])
def test_commands_never_print_the_key(fleet_file: tuple[Path, list[str]], command: list[str],
                                      capsys) -> None:
    path, body = fleet_file
    assert cli.main([command[0], str(path), *command[1:]]) == 0
    printed = capsys.readouterr()
    assert not [line for line in body if line in printed.out + printed.err]


def test_render_names_the_files_and_their_mode(fleet_file: tuple[Path, list[str]],
                                               capsys) -> None:
    cli.main(["render", str(fleet_file[0])])
    out = capsys.readouterr().out
    assert "/etc/vllm-fleet/chat.tls-key.pem (root, 0600; TLS key, handed to vllm-chat.service " \
           "alone by LoadCredential=tls-key; content not shown)" in out
    assert "LoadCredential=tls-key:/etc/vllm-fleet/chat.tls-key.pem" in out


def test_the_key_reaches_only_its_file(fleet_file: tuple[Path, list[str]]) -> None:
    path, body = fleet_file
    [(_, data)] = inventory_hosts(path)
    [server] = plan_of(data).servers
    for line in body:
        assert line not in server.unit_text and line not in (server.env_text or "")
        assert line not in repr(plan_of(data))
    assert server.tls is not None
    [key] = [f for f in server.tls.files if f.part == "key"]
    assert body[0] in key.text
