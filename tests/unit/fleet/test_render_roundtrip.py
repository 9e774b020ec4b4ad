"""Whatever the fleet file accepts renders back to exactly what it said (issue 11, item 6).

Hypothesis writes fleet files whose values are as hostile as the format allows (quotes,
backslashes, ``$``, ``%``, ``{}``, spaces, non-ASCII) into every field that reaches a host. For
every file ``fleet check`` accepts, each rendered text is read back the way its consumer reads
it, and must hold exactly the values given — no extra line, option or directive:

- the unit's ``ExecStart=``, split by systemd's rules
  (:func:`hostside.validate_args.split_exec_start`), is exactly the argv the fleet file
  describes, and the unit has the template's directives only;
- the environment file, read by systemd's rules (:func:`hostside.envfile.loads`), is exactly the
  server's environment;
- the sysctl drop-in has one ``key = value`` line per declared parameter;
- ``fleet verify``'s ssh_config has exactly one value per directive, the host's own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cli.remote import ssh_config_entry
from fleet.inventory import connection_data
from fleet.load import load_fleet, load_text
from fleet.paths import model_path
from fleet.problems import FleetError
from fleet.render import host_plan, server_env, server_module
from hostside import envfile
from hostside.validate_args import exec_start, split_exec_start
from tests.support.fleetgen import to_yaml

ROOT = Path(__file__).resolve().parents[3]

settings.register_profile(
    "roundtrip-ci", max_examples=300, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile(
    "roundtrip-deep", max_examples=3000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
PROFILE = settings.get_profile(
    "roundtrip-deep" if os.environ.get("FLEET_FUZZ_PROFILE") == "deep" else "roundtrip-ci"
)

#: Characters a person may well put in a value that reaches a host: everything printable that
#: some syntax (systemd, EnvironmentFile, shell) treats specially, and non-ASCII.
TRICKY = [*" \"'\\$%{}[]#;=`&|<>*?~!,:.@+/()^", "é", "你", "😀", "ß"]
LETTERS = st.characters(min_codepoint=0x30, max_codepoint=0x7A)
TEXT = st.text(
    alphabet=st.one_of(st.sampled_from(TRICKY), LETTERS), min_size=1, max_size=24
).filter(lambda s: not s.startswith(("-", "/")))
#: vLLM 0.32 flags that take free text (no choices, no type check).
FREE_TEXT_FLAGS = ["chat-template", "revision", "code-revision", "tokenizer-revision"]
#: vLLM 0.32 flags that take JSON, written as YAML mappings of hostile text and numbers.
JSON_FLAGS = ["override-generation-config", "hf-overrides", "mm-processor-kwargs"]
JSON_MAPPING = st.dictionaries(
    TEXT, st.one_of(TEXT, st.integers(-10**6, 10**6), st.booleans(),
                    st.dictionaries(TEXT, TEXT, max_size=2)), max_size=3,
)
SECRET = 'pl4nted "k3y" \\ $HOME %n'
ENV_NAMES = st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: n not in {"HOME", "TMPDIR", "HF_HOME"} and "TOKEN" not in n and "KEY" not in n
    and "SECRET" not in n and "PASS" not in n and "CRED" not in n
)
SYSCTL = st.dictionaries(
    st.sampled_from(["vm.swappiness", "net.core.somaxconn", "net.ipv4.tcp_rmem", "fs.file-max"]),
    st.one_of(st.integers(0, 2**31),
              st.from_regex(r"[0-9]{1,6}( [0-9]{1,7}){0,2}", fullmatch=True)),
    max_size=3,
)
ADDRESS = st.one_of(
    st.ip_addresses(v=4).map(str),
    st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,8}){0,2}", fullmatch=True)
    .filter(lambda a: not a.endswith("-") and "-." not in a),
)


@st.composite
def servers(draw: Any, ports: Any) -> dict[str, Any]:
    server: dict[str, Any] = {"model": "m", "port": draw(ports)}
    if draw(st.booleans()):
        server["served_model_name"] = draw(
            st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=3, unique=True))
        )
    args: dict[str, Any] = {"max-model-len": draw(st.integers(64, 4096))}
    for flag in draw(st.lists(st.sampled_from(FREE_TEXT_FLAGS), unique=True, max_size=3)):
        args[flag] = draw(TEXT)
    for flag in draw(st.lists(st.sampled_from(JSON_FLAGS), unique=True, max_size=2)):
        args[flag] = draw(JSON_MAPPING)
    if draw(st.booleans()):
        args["enforce-eager"] = True
    server["args"] = args
    server["env"] = draw(st.dictionaries(ENV_NAMES, st.one_of(TEXT, st.integers(0, 10**6)),
                                         max_size=3))
    if draw(st.booleans()):
        server["api_key"] = {"env": "FLEET_ROUNDTRIP_KEY"}
    return server


@st.composite
def fleets(draw: Any) -> dict[str, Any]:
    used_ports = iter(draw(st.lists(st.integers(1024, 65535), min_size=6, max_size=6,
                                    unique=True)))  # fmt: skip
    hosts = {}
    for index in range(draw(st.integers(1, 2))):
        host: dict[str, Any] = {
            "address": draw(ADDRESS) + ("" if index == 0 else f"-{index}"),
            "ssh": {"user": draw(st.from_regex(r"[a-z_][a-z0-9_-]{0,8}", fullmatch=True)),
                    "port": draw(st.integers(1, 65535))},
            "vllm": {"version": "0.32.0", "variant": "cpu"},
            "os": {"sysctl": draw(SYSCTL)},
            "servers": {f"s{n}": draw(servers(st.just(next(used_ports))))
                        for n in range(draw(st.integers(1, 3)))},
        }
        if draw(st.booleans()):
            key = st.from_regex(r"[a-z0-9._+@-]{1,10}(/[a-z0-9._-]{1,8}){0,2}", fullmatch=True)
            host["ssh"]["key"] = "/" + draw(key)
        hosts[f"h{index}"] = host
    return {
        "version": 1,
        "models": {"m": {"url": "https://models.example/m.tar.gz", "sha256": "ab" * 32}},
        "hosts": hosts,
    }


def directive_keys(unit_text: str) -> list[str]:
    """Each line of a unit that is not a comment, a section or blank, as its key."""
    return sorted(line.split("=", 1)[0] for line in unit_text.splitlines()
                  if line.strip() and not line.startswith(("#", "[")))  # fmt: skip


BASELINE_KEYS = directive_keys(
    host_plan(load_fleet(ROOT / "inventory" / "sandbox.yaml"), "sandbox-1",
              secrets=lambda ref: "x").servers[0].unit_text
)  # fmt: skip


def expected_argv(host: dict[str, Any], server: dict[str, Any]) -> list[Any]:
    """The argv a server describes; a mapping stands for one word that is its JSON."""
    names = server.get("served_model_name", server["model"])
    words = ["/opt/vllm-fleet/venv/bin/python", "-m", server_module(host["vllm"]["version"]),
             "--model", model_path(server["model"]),
             "--served-model-name", *(names if isinstance(names, list) else [names]),
             "--host", "127.0.0.1", "--port", str(server["port"])]  # fmt: skip
    for key, value in server["args"].items():
        words += [f"--{key}"] if value is True else [
            f"--{key}", value if isinstance(value, dict) else str(value)]
    return words


def same_argv(got: list[str], want: list[Any]) -> bool:
    """Word for word equal; where ``want`` holds a mapping, the word is JSON that reads as it."""
    return len(got) == len(want) and all(
        json.loads(word) == expected if isinstance(expected, dict) else word == expected
        for word, expected in zip(got, want, strict=True)
    )


@settings(PROFILE)
@given(fleets())
def test_accepted_fleets_render_back_exactly(data: dict[str, Any]) -> None:
    text = to_yaml(data)
    try:
        fleet = load_text(text, "fuzz.yaml")
    except FleetError:
        assume(False)
        return
    for host_name, host in data["hosts"].items():
        plan = host_plan(fleet, host_name, secrets=lambda ref: SECRET)
        for unit, (name, server) in zip(plan.servers, host["servers"].items(), strict=True):
            argv = split_exec_start(exec_start(unit.unit_text))
            assert same_argv(argv, expected_argv(host, server)), argv
            assert directive_keys(unit.unit_text) == BASELINE_KEYS
            want = server_env(fleet.hosts[host_name], name, fleet.hosts[host_name].servers[name],
                              lambda ref: SECRET)  # fmt: skip
            assert envfile.loads(unit.env_text or "") == want
            for key, value in server["env"].items():
                assert want[key] == str(value)
            assert SECRET not in unit.unit_text
        body = [line for line in plan.sysctl_text.splitlines() if line and line[0] != "#"]
        assert body == [f"{key} = {value}" for key, value in host["os"]["sysctl"].items()]
        ssh = ssh_config_entry(host_name, connection_data(host_name, fleet.hosts[host_name],
                                                          "fuzz.yaml"))  # fmt: skip
        directives = [line.split(None, 1) for line in ssh.splitlines()]
        assert all(len(parts) == 2 and " " not in parts[1] for parts in directives)
        got = dict(directives)
        assert len(got) == len(directives)
        assert (got["HostName"], got["Port"], got["User"]) == (
            host["address"], str(host["ssh"]["port"]), host["ssh"]["user"])


def test_the_generator_yields_accepted_fleets() -> None:
    """The property above would hold vacuously if nothing generated were accepted."""
    accepted = 0

    @settings(max_examples=40, derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @given(fleets())
    def count(data: dict[str, Any]) -> None:
        nonlocal accepted
        try:
            load_text(to_yaml(data), "fuzz.yaml")
            accepted += 1
        except FleetError:
            pass

    count()
    assert accepted >= 20
