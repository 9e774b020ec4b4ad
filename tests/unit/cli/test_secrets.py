"""A planted secret never shows: not in `fleet check/plan/render`, not in a unit, not in any
message; it reaches only the server's 0600 environment file (and the model installer's stdin).

The deploy's side (pyinfra output with -vv, the journal, process lists) is tested on a real
host in tests/e2e/test_lifecycle.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cli import main as cli
from cli.inventory import inventory_hosts
from fleet.hostplan.types import plan_of

SECRET = "planted-s3cr3t-Zq9"
FLEET = """\
version: 1
models:
  m: {hf: "org/m", revision: "0123456789abcdef0123456789abcdef01234567",
      token: {env: FLEET_PLANTED}}
hosts:
  box:
    address: 10.0.0.1
    vllm: {version: "0.32.0", variant: cpu}
    servers:
      chat:
        model: m
        port: 8000
        api_key: {env: FLEET_PLANTED}
        env: {HF_TOKEN: {file: SECRET_FILE}, OMP_NUM_THREADS: "4"}
"""


@pytest.fixture
def fleet_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    secret_file = tmp_path / "hf-token"
    secret_file.write_text(SECRET + "-file\n")
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET.replace("SECRET_FILE", str(secret_file)))
    monkeypatch.setenv("FLEET_PLANTED", SECRET)
    return path


@pytest.mark.parametrize("command", [["check"], ["plan"], ["render"], ["plan", "--json"]])
def test_commands_never_print_the_secret(fleet_file: Path, command: list[str], capsys) -> None:
    argv = [command[0], str(fleet_file), *command[1:]]
    assert cli.main(argv) == 0
    printed = capsys.readouterr()
    assert SECRET not in printed.out + printed.err


def test_render_masks_every_secret(fleet_file: Path, capsys) -> None:
    cli.main(["render", str(fleet_file)])
    out = capsys.readouterr().out
    assert re.search(r'^VLLM_API_KEY="?\*{8}"?$', out, re.M)
    assert re.search(r'^HF_TOKEN="?\*{8}"?$', out, re.M)
    assert re.search(r"^OMP_NUM_THREADS=4$", out, re.M)


def test_secrets_reach_only_the_environment_file(fleet_file: Path) -> None:
    [(_, data)] = inventory_hosts(fleet_file)
    plan = plan_of(data)
    [server] = plan.servers
    assert SECRET not in server.unit_text
    assert f"VLLM_API_KEY={SECRET}" in (server.env_text or "")
    assert f"HF_TOKEN={SECRET}-file" in (server.env_text or "")
    assert SECRET not in repr(plan)


def test_a_missing_secret_names_its_reference_not_a_value(fleet_file: Path, monkeypatch,
                                                          capsys) -> None:
    monkeypatch.delenv("FLEET_PLANTED")
    assert cli.main(["verify", str(fleet_file)]) == 1
    err = capsys.readouterr().err
    assert "environment variable FLEET_PLANTED is not set" in err
