"""The models deploy without a host: the model plan, the operation's commands, the fact.

The operation is run as pyinfra's own tests run operations: fake facts in, commands and noop
text out. The real thing (facts from a host, the installer streaming its progress) runs on a
sandbox host in test_models_e2e.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api import FileUploadCommand

from facts.models import ModelCheck
from fleet.hostplan.modelplan import model_check, model_plan
from fleet.hostplan.types import ModelInstall
from fleet.spec.models import Model, SecretRef
from operations import models as deploy_models

SHA = "7bba1c3a1056cbe482242a8d8e69c897ff9ce84035c28602bad26bfe0f76523a"
COMMIT = "c1899de289a04d12100db370d81485cdf75e47ca"


class FakeHost:
    """Just enough of pyinfra's host for an operation: one fact answer, noops recorded."""

    print_prefix = "[fake] "

    def __init__(self, report: dict[str, Any] | None) -> None:
        self.report = report
        self.noops: list[str] = []
        self.fact_args: dict[str, Any] = {}

    def get_fact(self, fact: type, **kwargs: Any) -> dict[str, Any] | None:
        assert fact is ModelCheck
        self.fact_args = kwargs
        return self.report

    def noop(self, text: str) -> None:
        self.noops.append(text)


def run_op(monkeypatch: pytest.MonkeyPatch, report: dict[str, Any] | None, model: ModelInstall,
           check: str = "quick") -> tuple[FakeHost, list[Any]]:
    fake = FakeHost(report)
    monkeypatch.setattr(deploy_models, "host", fake)
    commands = list(deploy_models.model_installed._inner(
        model=model, models_dir="/m", script_path="/s/fetch_model.py", python="python3",
        check=check,
    ))
    return fake, commands


def plan(**fields: Any) -> ModelInstall:
    return model_plan("tiny", Model(**fields), secrets=lambda ref: "hf_secret")


def test_installed_and_intact_is_a_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    report = {"installed": True, "ok": True, "id": SHA, "problems": []}
    fake, commands = run_op(monkeypatch, report, plan(url="http://h/t.tar.gz", sha256=SHA))
    assert commands == []
    assert fake.noops == [f"model tiny {SHA[:16]} is installed and intact (quick check)"]


def test_missing_model_runs_the_installer(monkeypatch: pytest.MonkeyPatch) -> None:
    _, commands = run_op(monkeypatch, None, plan(url="http://h/t.tar.gz", sha256=SHA))
    (command,) = commands
    assert isinstance(command, deploy_models.StreamedCommand)
    text = command.get_raw_value()
    assert "install --name tiny --models-dir /m" in text
    assert f"--url http://h/t.tar.gz --retries 6 --retry-wait 2 --sha256 {SHA} --unpack yes" in text


def test_download_retries_come_from_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    model = plan(url="http://h/t.tar.gz", sha256=SHA, download={"retries": 2, "retry_wait": 0.5})
    _, (command,) = run_op(monkeypatch, None, model)
    assert "--retries 2 --retry-wait 0.5 --sha256" in command.get_raw_value()


def test_other_version_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    report = {"installed": True, "ok": True, "id": "0" * 64, "problems": []}
    _, commands = run_op(monkeypatch, report, plan(url="http://h/t.tar.gz", sha256=SHA))
    assert len(commands) == 1


def test_damaged_copy_is_installed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    report = {"installed": True, "ok": False, "id": SHA,
              "problems": [{"path": "config.json", "problem": "modified after install (mtime)"}]}
    _, commands = run_op(monkeypatch, report, plan(url="http://h/t.tar.gz", sha256=SHA))
    assert len(commands) == 1


def test_deep_check_goes_to_the_fact_and_the_installer(monkeypatch: pytest.MonkeyPatch) -> None:
    fake, commands = run_op(monkeypatch, None, plan(url="http://h/t.gguf", sha256=SHA), "deep")
    assert fake.fact_args["deep"] is True
    assert commands[0].get_raw_value().endswith("--deep")
    assert "--unpack no --filename t.gguf" in commands[0].get_raw_value()


def test_local_file_is_uploaded_first(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    local = tmp_path / "m.tar.zst"
    local.write_bytes(b"x")
    _, commands = run_op(monkeypatch, None, plan(file=str(local), sha256=SHA))
    upload, install = commands
    assert isinstance(upload, FileUploadCommand)
    assert upload.dest == f"/m/.staging/tiny-{SHA[:16]}.upload"
    assert f"--file /m/.staging/tiny-{SHA[:16]}.upload" in install.get_raw_value()


def test_missing_local_file_is_a_deploy_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyinfra.api.exceptions import DeployError

    with pytest.raises(DeployError, match="does not exist on this machine"):
        run_op(monkeypatch, None, plan(file="/nowhere/m.tar", sha256=SHA))


def test_hf_token_goes_to_stdin_not_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    model = plan(hf="org/tiny", revision=COMMIT, endpoint="http://127.0.0.1:1",
                 token=SecretRef(env="HF_TOKEN"))
    _, commands = run_op(monkeypatch, None, model)
    (command,) = commands
    assert "hf_secret" not in command.get_raw_value()
    assert "--token-stdin" in command.get_raw_value()
    assert command.connector_arguments["_stdin"] == "hf_secret\n"
    assert f"--hf org/tiny --revision {COMMIT} --endpoint http://127.0.0.1:1" in (
        command.get_raw_value())


@pytest.mark.parametrize(
    "url,unpack,zstd",
    [("http://h/m.tar.zst", True, True), ("http://h/m.tgz", True, False),
     ("http://h/m.safetensors", False, False), ("http://h/m.tar", True, False)],
)
def test_model_plan_unpacks_by_suffix(url: str, unpack: bool, zstd: bool) -> None:
    entry = plan(url=url, sha256=SHA)
    assert (entry.unpack, entry.needs_zstd) == (unpack, zstd)


def test_unpack_setting_wins_over_the_suffix() -> None:
    assert plan(url="http://h/m.bin", sha256=SHA, unpack=True).unpack is True


def test_the_token_stays_out_of_the_plans_repr() -> None:
    model = plan(hf="org/tiny", revision=COMMIT, token=SecretRef(env="HF_TOKEN"))
    assert model.token == "hf_secret" and "hf_secret" not in repr(model)


@pytest.mark.parametrize(("value", "check"), [(None, "quick"), ("", "quick"), ("quick", "quick"),
                                             ("deep", "deep")])  # fmt: skip
def test_model_check_setting(value: str | None, check: str) -> None:
    assert model_check(value) == check


@pytest.mark.parametrize("value", ["full", "Deep", "quick "])
def test_model_check_refuses_anything_else_with_the_sentence(value: str) -> None:
    with pytest.raises(ValueError, match=rf"^model_check must be quick or deep, not {value!r}$"):
        model_check(value)


def test_fact_command_runs_the_installers_check() -> None:
    command = ModelCheck().command("/s/fetch_model.py", "tiny", "/m", deep=True)
    assert command.get_raw_value() == (
        "if test -f /s/fetch_model.py ; then python3 /s/fetch_model.py check --json --name tiny "
        "--models-dir /m --deep ; fi"
    )


def test_fact_reports_unparsable_output_as_not_installed() -> None:
    assert ModelCheck().process(["Traceback (most recent call last):"])["installed"] is False
