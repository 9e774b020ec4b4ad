"""Secrets: the files a reference names are examined at ``fleet check`` and read within the same
bounds by the deploy (issue 21, item 4); the flags and variables that carry secrets are known
by what they are, from vLLM's and the router's code, not by the words in their names (item 7).

What cannot be committed as a hostile file (a FIFO, a symlink, a file over the bound, the fleet
file itself, modes) is made here in ``tmp_path``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from fleet.checks.flags import FLAGS_DIR, flag_problems, known_versions, load_flag_list
from fleet.hostplan.endpoints import router_command
from fleet.hostplan.render import host_plan
from fleet.hostplan.secrets import MAX_SECRET_BYTES, read_secret, secret_refs
from fleet.load import FleetError, load_fleet, load_text
from fleet.spec.models import RESERVED_ARGS, SecretRef, Server
from fleet.spec.secretnames import catalogue, release_secret_flags, router_secret_flags, secret_env
from tests.support.vllmparse import vllm_parse
from tests.unit.fleet.test_flags import vllm_python

ROOT = Path(__file__).resolve().parents[3]
PLANTED = "planted-Zq9-s3cr3t"
FLEET = """\
version: 1
models:
  m: {url: "https://models.example/m.tar.gz", sha256: "SHA256"}
hosts:
  box:
    address: 10.0.0.1
    vllm: {version: "0.32.0", variant: cpu}
    servers:
      chat:
        model: m
        port: 8000
        api_key: {file: SECRET}
""".replace("SHA256", "ab" * 32)


@pytest.fixture(autouse=True)
def no_hang(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail, do not hang, if a read blocks (a FIFO without a writer, /dev/zero)."""
    if "vllm" in request.node.name:  # vLLM's parser takes its own time
        yield
        return

    def alarm(*_: object) -> None:
        raise TimeoutError("the secret read blocked")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def fleet_naming(tmp_path: Path, secret: Path | str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET.replace("SECRET", str(secret)), encoding="utf-8")
    return path


def secret_file(tmp_path: Path, content: str | bytes = PLANTED + "\n", mode: int = 0o600) -> Path:
    path = tmp_path / "secrets" / "key"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    path.chmod(mode)
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(FleetError) as info:
        load_fleet(path)
    found = [str(p) for p in info.value.problems]
    assert all(PLANTED not in text for text in found)
    return found


def unchecked(file: str) -> SecretRef:
    """A reference past the spec's rules (as if a rule were forgotten): the reader holds too."""
    return SecretRef.model_construct(env=None, file=file)


# --- item 4: the file a reference names ---------------------------------------------------------


def test_a_good_secret_file_loads_and_is_read(tmp_path: Path) -> None:
    path = fleet_naming(tmp_path, secret_file(tmp_path))
    warnings: list = []
    fleet = load_fleet(path, warnings=warnings)
    assert warnings == []
    assert read_secret(fleet.hosts["box"].servers["chat"].api_key) == PLANTED


def test_a_fifo_is_refused_at_check_and_never_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    [found] = problems(fleet_naming(tmp_path, fifo))
    assert "fleet.yaml:12:" in found and "api_key.file" in found and "not a regular file" in found
    with pytest.raises(ValueError, match="not a regular file"):
        read_secret(unchecked(str(fifo)))


def test_a_file_over_the_bound_is_refused(tmp_path: Path) -> None:
    big = secret_file(tmp_path, "k" * (MAX_SECRET_BYTES + 1))
    [found] = problems(fleet_naming(tmp_path, big))
    assert "larger than 64 KiB" in found
    with pytest.raises(ValueError, match="larger than 64 KiB"):
        read_secret(unchecked(str(big)))


def test_a_file_at_the_bound_is_read(tmp_path: Path) -> None:
    path = secret_file(tmp_path, "k" * MAX_SECRET_BYTES)
    assert len(read_secret(unchecked(str(path)))) == MAX_SECRET_BYTES


def test_the_fleet_file_itself_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET.replace("SECRET", str(path)), encoding="utf-8")
    path.chmod(0o600)
    [found] = problems(path)
    assert "is the fleet file itself" in found


def test_a_symlink_is_followed_and_its_target_examined(tmp_path: Path) -> None:
    good = tmp_path / "mounted"
    good.symlink_to(secret_file(tmp_path))  # how secret mounts look (..data/key)
    assert read_secret(load_fleet(fleet_naming(tmp_path, good)).hosts["box"].servers["chat"]
                       .api_key) == PLANTED
    bad = tmp_path / "innocent"
    bad.symlink_to("/proc/self/environ")
    [found] = problems(fleet_naming(tmp_path, bad))
    assert "leads to /proc/" in found and "under /proc" in found
    with pytest.raises(ValueError, match="under /proc"):
        read_secret(unchecked(str(bad)))


def test_a_symlink_to_dev_zero_is_never_read(tmp_path: Path) -> None:
    link = tmp_path / "zero"
    link.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="under /dev"):
        read_secret(unchecked(str(link)))


@pytest.mark.parametrize("path", ["/dev/zero", "/proc/self/environ", "/etc/shadow",
                                  "/etc/ssh/ssh_host_ed25519_key", "/tmp/../etc/passwd"])
def test_the_reader_refuses_what_the_spec_refuses(path: str) -> None:
    with pytest.raises(ValueError):
        read_secret(unchecked(path))


def test_a_folder_is_refused_by_the_reader(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is a folder"):
        read_secret(unchecked(str(tmp_path)))


@pytest.mark.parametrize(("content", "words"), [
    ("", "is empty"), (" \n\n", "is empty"), (b"\xff\xfe\x00k", "is not UTF-8"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\n",
     "holds a private key"),
])
def test_an_empty_or_binary_file_is_refused(tmp_path: Path, content: str | bytes,
                                            words: str) -> None:
    [found] = problems(fleet_naming(tmp_path, secret_file(tmp_path, content)))
    assert words in found


def test_a_world_readable_file_is_a_warning(tmp_path: Path) -> None:
    secret = secret_file(tmp_path, mode=0o644)
    warnings: list = []
    load_fleet(fleet_naming(tmp_path, secret), warnings=warnings)
    [warning] = [str(w) for w in warnings]
    assert "warning: hosts.box.servers.chat.api_key.file" in warning
    assert "readable by every user" in warning and f"chmod 600 {secret}" in warning
    assert PLANTED not in warning


def test_a_file_missing_here_is_a_warning_and_an_error_when_read(tmp_path: Path) -> None:
    missing = tmp_path / "not-here"
    warnings: list = []
    fleet = load_fleet(fleet_naming(tmp_path, missing), warnings=warnings)
    assert any("does not exist on this machine" in str(w) for w in warnings)
    with pytest.raises(ValueError, match="does not exist"):
        read_secret(fleet.hosts["box"].servers["chat"].api_key)


def test_text_without_a_file_skips_the_fleet_file_rule() -> None:
    load_text(FLEET.replace("SECRET", "~/definitely-not-here/key"), "<fleet>")


def test_every_reference_is_found_with_its_path() -> None:
    fleet = load_fleet(ROOT / "tests" / "data" / "valid" / "v032-secret-words.yaml")
    paths = {".".join(map(str, path)) for path, _ in secret_refs(fleet)}
    assert paths == {"hosts.l40s-01.servers.chat.api_key",
                     "hosts.l40s-01.servers.chat.env.HF_TOKEN"}


@pytest.mark.parametrize("path", sorted((ROOT / "tests/data/invalid").glob("secrets-*.yaml")),
                         ids=lambda p: p.stem)
def test_no_message_holds_the_inline_secret(path: Path) -> None:
    with pytest.raises(FleetError) as info:
        load_fleet(path)
    for word in ("hf_AbCdEf", "AKIAIOSFODNN7", "wJalrXUtnFEMI"):
        assert word not in str(info.value)


# --- item 7: which flags and variables carry secrets --------------------------------------------


def generator():
    spec = importlib.util.spec_from_file_location(
        "gen_vllm_releases", ROOT / "scripts" / "gen_vllm_releases.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_secret_list_is_what_the_generator_reads_from_the_flag_lists() -> None:
    data, unreviewed = generator().secret_catalogue(FLAGS_DIR, {}, {})
    assert unreviewed == []
    committed = catalogue()
    assert set(committed["vllm"]) == set(known_versions())
    for version, entry in data["vllm"].items():
        assert committed["vllm"][version]["flags"] == entry["flags"], version
    for key in ("flags", "env", "not_secret", "library_env"):
        assert committed[key] == data[key]


def test_a_new_credential_word_stops_the_generator(tmp_path: Path) -> None:
    flags = json.loads((FLAGS_DIR / "0.32.0.json").read_text())
    flags["flags"]["hub-password"] = {"dest": "hub_password", "takes_value": True}
    (tmp_path / "0.99.0.json").write_text(json.dumps(flags))
    _, unreviewed = generator().secret_catalogue(tmp_path, {}, {})
    assert unreviewed == ["vLLM 0.99.0 flag: hub-password"]


def test_every_release_lists_its_secret_flags() -> None:
    for version in known_versions():
        assert release_secret_flags(version) == ["api-key", "hf-token"], version


SECRET_FLAGS = sorted(catalogue()["flags"])
#: Flags the old word rule refused, though none carries a secret (switches and token counts).
WORD_FLAGS = sorted(
    name for name in load_flag_list("0.32.0").flags
    if name.removeprefix("no-") in catalogue()["not_secret"]
)


def test_the_words_the_old_rule_refused_are_covered() -> None:
    assert {"return-tokens-as-token-ids", "no-return-tokens-as-token-ids", "allow-credentials",
            "no-allow-credentials", "long-prefill-token-threshold",
            "long-prefill-token-threshold-adaptive", "no-long-prefill-token-threshold-adaptive",
            "dbo-decode-token-threshold", "dbo-prefill-token-threshold"} <= set(WORD_FLAGS)


def _value(name: str) -> object:
    flag = load_flag_list("0.32.0").flags[name]
    return 64 if flag.takes_value else True


@pytest.mark.parametrize("name", WORD_FLAGS)
def test_a_flag_that_merely_holds_a_credential_word_passes(name: str) -> None:
    server = Server(model="m", port=8000, args={name: _value(name)})
    assert list(flag_problems(("hosts", "a", "servers", "s"), server, "0.32.0")) == []


@pytest.mark.parametrize("name", SECRET_FLAGS)
def test_a_secret_flag_given_inline_is_refused_with_the_reference(name: str) -> None:
    with pytest.raises(ValidationError) as info:
        Server(model="m", port=8000, args={name: "inline-v4lue"})
    [error] = info.value.errors()
    text = error["msg"]  # what fleet check prints (pydantic's own repr is never shown)
    assert "inline-v4lue" not in text
    if name in RESERVED_ARGS:
        assert "api_key key" in text
    else:
        assert f"{name} carries a secret" in text and "{env: NAME}" in text


def test_hf_token_as_a_bare_switch_names_no_secret() -> None:
    server = Server(model="m", port=8000, args={"hf-token": True})
    assert list(flag_problems(("hosts", "a", "servers", "s"), server, "0.32.0")) == []


@pytest.mark.parametrize("value", ["inline-v4lue", SecretRef(env="FROM_HERE")])
def test_the_api_key_variable_is_the_api_key_keys_alone(value: object) -> None:
    with pytest.raises(ValueError, match="api_key key"):
        Server(model="m", port=8000, env={"VLLM_API_KEY": value})


@pytest.mark.parametrize("name", sorted(set(catalogue()["env"]) - {"VLLM_API_KEY"}))
def test_a_secret_variable_given_inline_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} holds a secret"):
        Server(model="m", port=8000, env={name: "inline-v4lue"})
    Server(model="m", port=8000, env={name: SecretRef(env="FROM_HERE")})


@pytest.mark.parametrize("name", ["VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD",
                                  "VLLM_COHERE2_ATTN_MOE_DUAL_STREAM_TOKEN_THRESHOLD",
                                  "VLLM_MAX_BAD_WORDS_TOTAL_TOKENS", "TOKENIZERS_PARALLELISM",
                                  "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD", "HF_HUB_OFFLINE"])
def test_a_variable_that_merely_holds_a_credential_word_passes(name: str) -> None:
    assert not secret_env(name)
    Server(model="m", port=8000, env={name: "1024"})


@pytest.mark.parametrize("name", ["DB_PASSWORD", "MY_SERVICE_TOKEN", "WANDB_API_KEY"])
def test_a_variable_no_code_defines_is_a_secret_by_its_last_word(name: str) -> None:
    assert secret_env(name)


def test_the_router_command_carries_no_secret_flag() -> None:
    fleet = load_fleet(ROOT / "tests" / "data" / "valid" / "endpoint-two-replicas.yaml")
    words = {word.removeprefix("--") for word in router_command(fleet, "chat")}
    assert router_secret_flags() == {"api-key"}
    assert not words & router_secret_flags()


def test_vllm_reads_the_word_flags_as_switches_and_counts() -> None:
    """vLLM 0.32's own parser reads the rendered lines of the corpus file as no secret at all."""
    python = vllm_python()
    if python is None:
        pytest.skip("needs a Python with vLLM (FLEET_VLLM_PYTHON)")
    fleet = load_fleet(ROOT / "tests" / "data" / "valid" / "v032-secret-words.yaml")
    lines = {unit.name: next(line for line in unit.unit_text.splitlines()
                             if line.startswith("ExecStart="))
             for unit in host_plan(fleet, "l40s-01", secrets=lambda ref: "").servers}
    read = vllm_parse(python, lines)
    assert read["chat"][0] == 0 and read["chat-off"][0] == 0, read
    on, off = read["chat"][2], read["chat-off"][2]
    assert (on["return_tokens_as_token_ids"], on["allow_credentials"]) == (True, True)
    assert (on["long_prefill_token_threshold"], on["dbo_prefill_token_threshold"]) == (512, 512)
    assert on["long_prefill_token_threshold_adaptive"] is True and on["hf_token"] is None
    assert (off["return_tokens_as_token_ids"], off["allow_credentials"]) == (False, False)
    assert off["hf_token"] is True  # the bare switch: the Hub's own login, no secret inline
