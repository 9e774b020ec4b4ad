"""What a host gets: unit text, environment files, quoting, and the committed schema.

The units are read the way systemd reads them: ``ExecStart=`` is split into words by
:func:`exec_words` (double quotes with backslash escapes, then ``%%`` and ``$$``), and
environment files by :func:`env_values` (POSIX double-quote rules, as systemd.exec documents
for ``EnvironmentFile=``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import shlex
from pathlib import Path

import pytest

from fleet.hostplan.render import host_plan, read_secret, render_sysctl, systemd_quote
from fleet.hostplan.types import HostPlan, ServerUnit
from fleet.load import load_fleet, load_text
from fleet.spec.schema import SCHEMA_PATH, fleet_schema
from hostside.envfile import quote as env_quote

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data"
SCHEMA_LINE = "# yaml-language-server: $schema="
API_KEY = "sk-test-Zq8'x \"y\" $z%"

#: (fleet file, host) of every fleet rendered here.
FLEETS = {
    "sandbox": (ROOT / "inventory" / "sandbox.yaml", "sandbox-1"),
    "quad": (DATA / "valid" / "quad-4090d.yaml", "quad-4090d"),
    "h200": (DATA / "valid" / "h200-tp8.yaml", "hgx-h200-01"),
}
CPU_SERVERS = [("sandbox", "tiny")]
GPU_SERVERS = [("quad", "llm"), ("quad", "embed-c"), ("h200", "deepseek")]
ALL_SERVERS = CPU_SERVERS + GPU_SERVERS


def ident(case: tuple[str, str]) -> str:
    return "/".join(case)


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, HostPlan]:
    """The host plan of every fleet; secrets from the environment, as on a control machine."""
    patch = pytest.MonkeyPatch()
    patch.setenv("FLEET_DEEPSEEK_API_KEY", API_KEY)
    try:
        return {
            name: host_plan(load_fleet(path), host, secrets=read_secret)
            for name, (path, host) in FLEETS.items()
        }
    finally:
        patch.undo()


def server(plans: dict[str, HostPlan], case: tuple[str, str]) -> ServerUnit:
    fleet, name = case
    return next(s for s in plans[fleet].servers if s.name == name)


def unit_lines(plans: dict[str, HostPlan], case: tuple[str, str]) -> list[str]:
    return server(plans, case).unit_text.splitlines()


def directive(plans: dict[str, HostPlan], case: tuple[str, str], key: str) -> list[str]:
    """The values of ``key=`` lines in a unit."""
    prefix = f"{key}="
    return [line[len(prefix) :] for line in unit_lines(plans, case) if line.startswith(prefix)]


def exec_words(line: str) -> list[str]:
    """Split an ExecStart= value into arguments as systemd does (for what systemd_quote writes).

    Words are separated by spaces; a double-quoted word may hold spaces and ``\\"``/``\\\\``;
    then ``%%`` (specifiers) and ``$$`` (variables) become ``%`` and ``$``. A lone ``%x`` or
    ``$X`` would be expanded by systemd, so it is an error here.
    """
    words: list[str] = []
    index = 0
    while index < len(line):
        if line[index] == " ":
            index += 1
            continue
        word = ""
        if line[index] == '"':
            index += 1
            while line[index] != '"':
                if line[index] == "\\":
                    assert line[index + 1] in '"\\', f"unexpected escape in {line!r}"
                    index += 1
                word += line[index]
                index += 1
            index += 1
            assert index == len(line) or line[index] == " ", f"text after a quote in {line!r}"
        else:
            while index < len(line) and line[index] != " ":
                assert line[index] not in "\"'\\", f"quote inside a bare word in {line!r}"
                word += line[index]
                index += 1
        for mark in "%$":
            assert mark not in word.replace(mark * 2, ""), f"unescaped {mark} in {word!r}"
            word = word.replace(mark * 2, mark)
        words.append(word)
    return words


def argv(plans: dict[str, HostPlan], case: tuple[str, str]) -> list[str]:
    [line] = directive(plans, case, "ExecStart")
    return exec_words(line)


def env_values(text: str) -> dict[str, str]:
    """Parse an EnvironmentFile as systemd does (for what env_quote writes)."""
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, raw = line.partition("=")
        [values[key]] = shlex.split(raw) if raw else [""]
    return values


def env_of(plans: dict[str, HostPlan], case: tuple[str, str]) -> dict[str, str]:
    return env_values(server(plans, case).env_text)


# --- the unit ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ALL_SERVERS, ids=ident)
def test_unit_runs_as_service_user(plans, case):
    assert (directive(plans, case, "User"), directive(plans, case, "Group")) == (
        ["vllm"],
        ["vllm"],
    )


@pytest.mark.parametrize("case", ALL_SERVERS, ids=ident)
def test_unit_restarts_always(plans, case):
    assert directive(plans, case, "Restart") == ["always"]


@pytest.mark.parametrize("case", ALL_SERVERS, ids=ident)
def test_unit_reads_the_server_env_file(plans, case):
    assert directive(plans, case, "EnvironmentFile") == [server(plans, case).env_path]


@pytest.mark.parametrize("case", ALL_SERVERS, ids=ident)
def test_env_file_lives_in_the_fleet_env_dir(plans, case):
    assert server(plans, case).env_path == f"/etc/vllm-fleet/{case[1]}.env"


@pytest.mark.parametrize("case", ALL_SERVERS, ids=ident)
def test_env_file_declares_mode_0600(plans, case):
    assert "mode 0600" in server(plans, case).env_text.splitlines()[0]


@pytest.mark.parametrize(
    ("case", "bind"),
    [
        pytest.param(("sandbox", "tiny"), "127.0.0.1", id="sandbox/tiny-default"),
        pytest.param(("quad", "llm"), "127.0.0.1", id="quad/llm-default"),
        pytest.param(("quad", "embed-c"), "0.0.0.0", id="quad/embed-c-declared"),
        pytest.param(("h200", "deepseek"), "0.0.0.0", id="h200/deepseek-declared"),
    ],
)
def test_unit_binds_the_declared_host(plans, case, bind):
    words = argv(plans, case)
    assert words[words.index("--host") + 1] == bind


@pytest.mark.parametrize(
    ("case", "flags"),
    [
        pytest.param(
            ("sandbox", "tiny"),
            ["--max-model-len", "512", "--max-num-seqs", "8", "--enforce-eager"],
            id="sandbox/tiny",
        ),
        pytest.param(
            ("quad", "llm"),
            ["--max-num-seqs", "64", "--max-num-batched-tokens", "8192",
             "--enable-chunked-prefill", "--enable-prefix-caching"],
            id="quad/llm",
        ),
        pytest.param(
            ("quad", "guard"),
            ["--quantization", "fp8", "--enforce-eager", "--max-num-seqs", "256"],
            id="quad/guard",
        ),
        pytest.param(
            ("h200", "deepseek"),
            ["--tensor-parallel-size", "8", "--gpu-memory-utilization", "0.9",
             "--max-model-len", "32768", "--trust-remote-code"],
            id="h200/deepseek",
        ),
    ],
)
def test_unit_passes_args_in_file_order_with_bare_flags(plans, case, flags):
    words = argv(plans, case)
    assert words[words.index("--port") + 2 :] == flags


@pytest.mark.parametrize(
    ("case", "head"),
    [
        pytest.param(
            ("sandbox", "tiny"),
            ["/opt/vllm-fleet/venv/bin/python", "-m",
             "vllm.entrypoints.launchers.api_server.entry",
             "--model", "/var/lib/vllm-fleet/models/tiny-llama", "--served-model-name", "tiny",
             "--host", "127.0.0.1", "--port", "18000"],
            id="sandbox/tiny",
        ),
        pytest.param(
            ("quad", "llm"),
            ["/opt/vllm-fleet/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server",
             "--model", "/var/lib/vllm-fleet/models/llm-9b-w8a8", "--served-model-name",
             "qwen3.5", "--host", "127.0.0.1", "--port", "16002"],
            id="quad/llm",
        ),
    ],
)
def test_unit_command_serves_the_local_model(plans, case, head):
    assert argv(plans, case)[: len(head)] == head


@pytest.mark.parametrize("case", ALL_SERVERS, ids=ident)
def test_unit_start_timeout_covers_model_loading(plans, case):
    [timeout] = directive(plans, case, "TimeoutStartSec")
    assert int(timeout) >= 600


@pytest.mark.parametrize("case", ALL_SERVERS, ids=ident)
def test_unit_waits_for_health_of_its_own_port(plans, case):
    [post] = directive(plans, case, "ExecStartPost")
    unit = server(plans, case)
    assert f"--url {unit.url} --pid $MAINPID" in post
    assert unit.url.endswith(f":{unit.port}")


HARDENING = [
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "ProtectProc=invisible",
    "RestrictSUIDSGID=yes",
    "CapabilityBoundingSet=",
    "SystemCallFilter=@system-service",
    "UMask=0077",
]


@pytest.mark.parametrize("line", HARDENING)
@pytest.mark.parametrize("case", ALL_SERVERS, ids=ident)
def test_unit_is_hardened(plans, case, line):
    assert line in unit_lines(plans, case)


@pytest.mark.parametrize("case", ALL_SERVERS, ids=ident)
def test_unit_allows_writable_executable_memory(plans, case):
    """MemoryDenyWriteExecute=yes breaks oneDNN: the first completion fails."""
    assert directive(plans, case, "MemoryDenyWriteExecute") == []


@pytest.mark.parametrize("case", CPU_SERVERS, ids=ident)
def test_cpu_unit_has_private_devices(plans, case):
    assert directive(plans, case, "PrivateDevices") == ["yes"]


@pytest.mark.parametrize("case", CPU_SERVERS, ids=ident)
def test_cpu_unit_allows_no_devices(plans, case):
    assert directive(plans, case, "DeviceAllow") == []


@pytest.mark.parametrize("case", GPU_SERVERS, ids=ident)
def test_gpu_unit_does_not_hide_devices(plans, case):
    assert directive(plans, case, "PrivateDevices") != ["yes"]


@pytest.mark.parametrize("case", GPU_SERVERS, ids=ident)
def test_gpu_unit_closes_the_device_policy(plans, case):
    assert directive(plans, case, "DevicePolicy") == ["closed"]


@pytest.mark.parametrize(
    ("case", "device"),
    [
        pytest.param(("quad", "llm"), "/dev/nvidia2 rw", id="quad/llm-nvidia2"),
        pytest.param(("quad", "llm"), "/dev/nvidiactl rw", id="quad/llm-nvidiactl"),
        pytest.param(("quad", "llm"), "/dev/nvidia-uvm rw", id="quad/llm-nvidia-uvm"),
        pytest.param(("quad", "embed-c"), "/dev/nvidia0 rw", id="quad/embed-c-nvidia0"),
        pytest.param(("h200", "deepseek"), "/dev/nvidia0 rw", id="h200/deepseek-nvidia0"),
        pytest.param(("h200", "deepseek"), "/dev/nvidia7 rw", id="h200/deepseek-nvidia7"),
    ],
)
def test_gpu_unit_allows_its_nvidia_devices(plans, case, device):
    assert device in directive(plans, case, "DeviceAllow")


@pytest.mark.parametrize(
    ("case", "device"),
    [
        pytest.param(("quad", "llm"), "/dev/nvidia0 rw", id="quad/llm-nvidia0"),
        pytest.param(("quad", "embed-c"), "/dev/nvidia2 rw", id="quad/embed-c-nvidia2"),
    ],
)
def test_gpu_unit_denies_other_gpus(plans, case, device):
    assert device not in directive(plans, case, "DeviceAllow")


@pytest.mark.parametrize(
    ("name", "after"),
    [
        ("vlm", []),
        ("llm", []),
        ("guard", []),
        ("embed-a", []),
        ("embed-b", ["vllm-embed-a.service"]),
        ("embed-c", ["vllm-embed-a.service", "vllm-embed-b.service"]),
    ],
)
def test_servers_sharing_a_gpu_start_in_file_order(plans, name, after):
    [line] = directive(plans, ("quad", name), "After")
    assert [unit for unit in line.split() if unit.startswith("vllm-")] == after


@pytest.mark.parametrize("case", ALL_SERVERS, ids=ident)
def test_unit_waits_for_the_network(plans, case):
    [line] = directive(plans, case, "After")
    assert "network-online.target" in line.split()


# --- the environment file ----------------------------------------------------------------------


@pytest.mark.parametrize("case", CPU_SERVERS, ids=ident)
def test_cpu_env_sets_kv_cache_space(plans, case):
    assert env_of(plans, case)["VLLM_CPU_KVCACHE_SPACE"] == "1"


@pytest.mark.parametrize("case", CPU_SERVERS, ids=ident)
def test_cpu_env_hides_no_gpus(plans, case):
    assert "CUDA_VISIBLE_DEVICES" not in env_of(plans, case)


@pytest.mark.parametrize(
    ("case", "devices"),
    [
        pytest.param(("quad", "llm"), "2", id="quad/llm"),
        pytest.param(("quad", "embed-c"), "0", id="quad/embed-c"),
        pytest.param(("h200", "deepseek"), "0,1,2,3,4,5,6,7", id="h200/deepseek"),
    ],
)
def test_gpu_env_names_the_server_gpus(plans, case, devices):
    assert env_of(plans, case)["CUDA_VISIBLE_DEVICES"] == devices


@pytest.mark.parametrize("case", GPU_SERVERS, ids=ident)
def test_gpu_env_orders_devices_by_pci_bus(plans, case):
    assert env_of(plans, case)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


@pytest.mark.parametrize("case", GPU_SERVERS, ids=ident)
def test_gpu_env_has_no_cpu_kv_cache_setting(plans, case):
    assert "VLLM_CPU_KVCACHE_SPACE" not in env_of(plans, case)


@pytest.mark.parametrize("case", ALL_SERVERS, ids=ident)
def test_env_keeps_the_hub_offline(plans, case):
    assert env_of(plans, case)["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize(
    "variable",
    ["TMPDIR", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "HF_HOME", "TORCHINDUCTOR_CACHE_DIR"],
)
@pytest.mark.parametrize("case", ALL_SERVERS, ids=ident)
def test_env_points_caches_at_the_server_cache_dir(plans, case, variable):
    assert env_of(plans, case)[variable].startswith(f"/var/cache/vllm-fleet/servers/{case[1]}")


def test_env_file_carries_the_api_key(plans):
    assert env_of(plans, ("h200", "deepseek"))["VLLM_API_KEY"] == API_KEY


def test_api_key_is_not_in_the_unit(plans):
    assert "sk-test" not in server(plans, ("h200", "deepseek")).unit_text


def test_api_key_is_not_a_flag(plans):
    assert "--api-key" not in argv(plans, ("h200", "deepseek"))


def test_plan_records_that_a_server_has_an_api_key(plans):
    assert server(plans, ("h200", "deepseek")).has_api_key is True


@pytest.mark.parametrize("case", [c for c in ALL_SERVERS if c != ("h200", "deepseek")], ids=ident)
def test_env_without_api_key_sets_none(plans, case):
    assert "VLLM_API_KEY" not in env_of(plans, case)


FILE_KEY_FLEET = """\
version: 1
models:
  m: {hf: org/m, revision: 0123456789abcdef0123456789abcdef01234567}
hosts:
  box:
    address: 10.0.0.1
    vllm: {version: "0.32.0", variant: cpu}
    servers:
      chat: {model: m, port: 8000, api_key: {file: KEYFILE}}
"""


def test_api_key_from_a_file_is_stripped_into_the_env_file(tmp_path):
    key = tmp_path / "chat.key"
    key.write_text("sk-from-file\n", encoding="utf-8")
    fleet = load_text(FILE_KEY_FLEET.replace("KEYFILE", str(key)))
    [chat] = host_plan(fleet, "box").servers
    assert env_values(chat.env_text)["VLLM_API_KEY"] == "sk-from-file"


def test_api_key_from_a_missing_env_var_is_refused(monkeypatch):
    monkeypatch.delenv("FLEET_DEEPSEEK_API_KEY", raising=False)
    fleet = load_fleet(FLEETS["h200"][0])
    with pytest.raises(ValueError, match="FLEET_DEEPSEEK_API_KEY is not set"):
        host_plan(fleet, "hgx-h200-01", secrets=read_secret)


@pytest.mark.parametrize("fleet", sorted(FLEETS))
def test_host_plan_is_plain_json(plans, fleet):
    """Its fields are plain data all the way down (what ``fleet drift --json`` could print)."""
    data = dataclasses.asdict(plans[fleet])
    assert json.loads(json.dumps(data)) == json.loads(json.dumps(data, sort_keys=True))
    assert data["servers"][0]["unit_text"] == plans[fleet].servers[0].unit_text


@pytest.mark.parametrize("fleet", sorted(FLEETS))
def test_host_plan_survives_pyinfras_copy_and_pickling(plans, fleet):
    """pyinfra hands host data out as a shallow copy; parallel tools pickle it."""
    plan = plans[fleet]
    assert copy.copy(plan) == plan
    assert pickle.loads(pickle.dumps(plan)) == plan


@pytest.mark.parametrize("fleet", sorted(FLEETS))
def test_host_plan_is_frozen(plans, fleet):
    with pytest.raises(dataclasses.FrozenInstanceError):
        plans[fleet].servers[0].port = 1  # type: ignore[misc]


def test_secrets_stay_out_of_the_plans_repr(plans):
    assert "sk-test" in server(plans, ("h200", "deepseek")).env_text
    assert "sk-test" not in repr(plans["h200"])


def test_sysctl_drop_in_lists_each_key():
    fleet = load_fleet(DATA / "valid" / "rtx4090-workstation.yaml")
    text = render_sysctl(fleet.hosts["ws-4090"].os.sysctl)
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "vm.swappiness = 1",
        "net.core.somaxconn = 65535",
        "fs.file-max = 2097152",
    ]


# --- quoting -----------------------------------------------------------------------------------

TRICKY = {
    "plain": "max-model-len",
    "empty": "",
    "spaces": "a b  c",
    "double-quotes": 'say "hi"',
    "single-quote": "it's",
    "percent": "50%",
    "specifier": "%h/%n",
    "dollar": "$HOME",
    "braced-variable": "${HOME}x",
    "backslash": "C:\\path\\n",
    "json": '{"temperature": 0.6, "stop": ["\\n", "</s>"], "p": "50%"}',
    "backtick": "`id`",
    "semicolon": "a;b",
    "hash": "#not-a-comment",
    "unicode": "日本語 é",
}


@pytest.mark.parametrize("value", TRICKY.values(), ids=TRICKY.keys())
def test_systemd_quote_round_trips(value):
    assert exec_words(systemd_quote(value)) == [value]


@pytest.mark.parametrize("value", TRICKY.values(), ids=TRICKY.keys())
def test_systemd_quote_keeps_words_apart(value):
    assert exec_words(f"{systemd_quote(value)} {systemd_quote(value)}") == [value, value]


@pytest.mark.parametrize("value", TRICKY.values(), ids=TRICKY.keys())
def test_env_quote_round_trips(value):
    assert env_values(f"KEY={env_quote(value)}\n") == {"KEY": value}


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "trailing\n"], ids=["lf", "cr", "trailing-lf"])
def test_env_quote_refuses_line_breaks(value):
    with pytest.raises(ValueError, match="newlines"):
        env_quote(value)


def test_safe_word_is_left_bare():
    assert systemd_quote("/var/lib/vllm-fleet/models/m") == "/var/lib/vllm-fleet/models/m"


def test_json_arg_reaches_vllm_intact():
    fleet = load_fleet(DATA / "valid" / "hf-pinned.yaml")
    [small] = host_plan(fleet, "cpu-box", secrets=lambda ref: "k").servers
    [line] = [x for x in small.unit_text.splitlines() if x.startswith("ExecStart=")]
    words = exec_words(line[len("ExecStart=") :])
    config = words[words.index("--override-generation-config") + 1]
    assert json.loads(config) == {"temperature": 0.6, "top_p": 0.95}


def test_extra_env_reaches_the_env_file():
    fleet = load_fleet(DATA / "valid" / "hf-pinned.yaml")
    [small] = host_plan(fleet, "cpu-box", secrets=lambda ref: "k").servers
    env = env_values(small.env_text)
    assert (env["VLLM_LOGGING_LEVEL"], env["OMP_NUM_THREADS"]) == ("INFO", "8")


# --- the schema and the fleet files' first lines -------------------------------------------------


def test_committed_schema_is_current():
    current = json.dumps(fleet_schema(), indent=2) + "\n"
    assert SCHEMA_PATH.read_text(encoding="utf-8") == current, (
        f"{SCHEMA_PATH.relative_to(ROOT)} is stale: run `python -m fleet.spec.schema` and commit it"
    )


FLEET_FILES = sorted((ROOT / "inventory").rglob("*.yaml")) + sorted(DATA.rglob("*.yaml"))


def schema_line(path: Path) -> str:
    """The line that points editors at the schema (the second in invalid examples, some of
    which are UTF-16 or Latin-1 on purpose)."""
    raw = path.read_bytes()
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        text = raw.decode("utf-16")
    elif raw[1:2] == b"\0":
        text = raw.decode("utf-16-le")
    else:
        text = raw.decode("utf-8-sig", "replace")
    lines = [*text.splitlines(), "", ""]
    return lines[1] if path.parent.name == "invalid" else lines[0]


@pytest.mark.parametrize("path", FLEET_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_fleet_file_declares_the_schema(path):
    assert schema_line(path).startswith(SCHEMA_LINE)


@pytest.mark.parametrize("path", FLEET_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_fleet_file_schema_reference_resolves(path):
    reference = schema_line(path).removeprefix(SCHEMA_LINE).strip()
    assert (path.parent / reference).resolve() == SCHEMA_PATH
