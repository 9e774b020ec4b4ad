"""Whatever the fleet file accepts renders back to exactly what it said (issue 11, item 6).

Hypothesis writes fleet files whose values are as hostile as the format allows (quotes,
backslashes, ``$``, ``%``, ``{}``, spaces, non-ASCII) into every field that reaches a host. For
every file ``fleet check`` accepts, each rendered text is read back the way its consumer reads
it, and must hold exactly the values given — no extra line, option or directive:

- the unit's ``ExecStart=``, split by systemd's rules
  (:func:`hostside.validate_args.split_exec_start`), is exactly the argv the fleet file
  describes, and the unit has the template's directives only — read line by line as systemd
  does (:mod:`tests.support.systemdwords`: continuations, comments), every ``Exec*=`` one
  command, the readiness wait and ``Description=`` exactly their values;
- a group's units (native and Ray) with any ``head_address``, even one no check would pass,
  hold one command per ``Exec*=`` line and one variable per ``Environment=`` line (issue 21);
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

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cli.inventory import connection_data
from cli.remote import ssh_config_entry
from fleet.catalog.paths import model_path
from fleet.hostplan.render import START_TIMEOUT, WAIT_SCRIPT, host_plan, server_env, server_module
from fleet.load import load_fleet, load_text
from fleet.read.problems import FleetError
from hostside import envfile
from hostside.validate_args import exec_start, split_exec_start
from tests.support import systemdwords
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
            # every line as systemd reads it (continuations, comments): the same directives,
            # each Exec*= one command, the readiness wait exactly its words
            read = systemdwords.lines(unit.unit_text)
            assert sorted(key for key, _ in read if key[0] != "[") == BASELINE_KEYS
            execs = exec_lines(unit.unit_text)
            assert all(len(found) == 1 and found[0].prefix in ("", "+") for _, found in execs)
            assert [found for key, found in execs if key == "ExecStartPost"] == [[
                systemdwords.Exec(prefix="+", argv=[
                    "/opt/vllm-fleet/venv/bin/python", WAIT_SCRIPT,
                    "--url", f"http://127.0.0.1:{server['port']}",
                    "--pid", "$MAINPID", "--timeout", str(START_TIMEOUT)])]]
            description = dict(read)["Description"]
            assert systemdwords.specifiers(description) == (
                f"vLLM server {name} ({fleet.hosts[host_name].servers[name].served_name}, "
                f"port {server['port']})")
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


# --------------------------------------------------------------------------------------------
# Every Exec*= and Environment= line of a group's units, with a hostile head address (issue 21)
# --------------------------------------------------------------------------------------------

#: The zone id that Python's ipaddress lets hold blanks, ``;`` and ``+`` (issue 21): today's
#: main wrote it unquoted, so systemd read a second command, run as root (``+``).
ZONE_ID_ATTACK = "fe80::1%i --help ; +touch PWNED ; +echo "
RAY_ATTACK = "fe80::1%i VLLM_SERVER_DEV_MODE=1"
#: The same without a specifier (today's main also left ``%i`` unescaped: systemd expands it).
PLAIN_ATTACK = "fe80::1 --help ; +touch PWNED ; +echo "


def with_head_address(fleet: Any, value: str) -> Any:
    """``fleet`` with every group's ``multinode.head_address`` set to ``value``, unvalidated:
    the emitters must hold even for a value that a check let through."""
    hosts = {}
    for name, host in fleet.hosts.items():
        servers = {}
        for server_name, server in host.servers.items():
            if server.worker_hosts and server.multinode is not None:
                multinode = server.multinode.model_copy(update={"head_address": value})
                server = server.model_copy(update={"multinode": multinode})
            servers[server_name] = server
        hosts[name] = host.model_copy(update={"servers": servers})
    return fleet.model_copy(update={"hosts": hosts})


def unit_texts(fleet: Any) -> list[tuple[str, str]]:
    """Every server, group-worker and Ray head unit of every host, as (where, text)."""
    texts = []
    for host_name in fleet.hosts:
        plan = host_plan(fleet, host_name, secrets=lambda ref: SECRET)
        for unit in plan.servers:
            texts.append((f"{host_name}:{unit.unit}", unit.unit_text))
            if unit.ray_head is not None:
                texts.append((f"{host_name}:{unit.ray_head.unit}", unit.ray_head.unit_text))
    return texts


def exec_lines(text: str) -> list[tuple[str, list[systemdwords.Exec]]]:
    """Each ``Exec*=`` directive of a unit, read by systemd's rules into its commands."""
    return [(key, systemdwords.commands(value)) for key, value in systemdwords.lines(text)
            if key.startswith("Exec") and value]


@pytest.mark.parametrize("example", ["h200-pair.yaml", "h200-pair-ray.yaml"])
@pytest.mark.parametrize("attack", [ZONE_ID_ATTACK, RAY_ATTACK, PLAIN_ATTACK])
def test_a_hostile_head_address_cannot_add_a_command_or_a_variable(example: str,
                                                                   attack: str) -> None:
    """Fails on today's main (09cd376): its worker unit's ``ExecStartPost=+…wait_joined.py
    --connect fe80::1%i --help ; +touch PWNED ; …`` is three commands, the second ``+touch``
    (root), and the Ray head's vLLM unit gets ``Environment=RAY_ADDRESS=fe80::1%i
    VLLM_SERVER_DEV_MODE=1:6379`` (two variables)."""
    fleet = with_head_address(load_fleet(ROOT / "inventory" / "examples" / example), attack)
    texts = unit_texts(fleet)
    assert len(texts) >= 2
    seen_address = 0
    for where, text in texts:
        for key, commands in exec_lines(text):
            assert len(commands) == 1, (where, key, commands)
            assert commands[0].prefix in ("", "+"), (where, key, commands)
            argv = commands[0].argv
            for flag in ("--connect", "--address"):
                if flag in argv and argv.index(flag) + 1 < len(argv):
                    value = argv[argv.index(flag) + 1]
                    if value.startswith(attack[:7]):
                        assert value.rsplit(":", 1)[0] == attack, (where, key, value)
                        seen_address += 1
        for key, value in systemdwords.lines(text):
            if key == "Environment":
                env = systemdwords.environment(value)
                assert list(env) == ["RAY_ADDRESS"], (where, value)
                assert env["RAY_ADDRESS"].rsplit(":", 1)[0] == attack, (where, value)
                seen_address += 1
    assert seen_address >= 1


@settings(max_examples=150, derandomize=True, deadline=None, database=None)
@given(st.text(alphabet=st.one_of(st.sampled_from(TRICKY), LETTERS), max_size=30)
       .filter(lambda s: s.strip() == s and not s.endswith("\\")))
def test_group_units_carry_any_head_address_as_one_word(zone: str) -> None:
    """Whatever ``head_address`` holds, every Exec*= line of every group unit is one command and
    the address comes back word for word (``--connect``/``--address``, ``RAY_ADDRESS``)."""
    address = f"fe80::1%{zone}"
    for example in ("h200-pair.yaml", "h200-pair-ray.yaml"):
        fleet = with_head_address(load_fleet(ROOT / "inventory" / "examples" / example), address)
        for where, text in unit_texts(fleet):
            for key, commands in exec_lines(text):
                assert len(commands) == 1 and commands[0].prefix in ("", "+"), (where, key)
                argv = commands[0].argv
                for flag in ("--connect", "--address"):
                    if flag in argv:
                        value = argv[argv.index(flag) + 1]
                        assert value.rsplit(":", 1)[0] == address, (where, key, value)
            for key, value in systemdwords.lines(text):
                if key == "Environment":
                    assert systemdwords.environment(value) == {"RAY_ADDRESS": f"{address}:6379"}
