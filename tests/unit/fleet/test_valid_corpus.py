"""Correct vLLM 0.32 configurations pass, as vLLM itself reads them (issue 16, item 0).

Every ``tests/data/valid/v032-*.yaml`` is a configuration people run (dense, MoE with expert and
data parallel, MLA, quantized, LoRA, speculative decoding, vision-language, pooling, aliases,
JSON-valued flags as mappings and as strings, ``auto`` lengths, numbers in the environment), each
flag and value checked against vLLM 0.32's own parser and docs. For each file:

- ``fleet check`` accepts it (capacity included);
- each server's ``ExecStart=``, split by systemd's rules, is exactly the flags the file gives
  (expected words built here from the YAML itself, not by the renderer);
- vLLM 0.32's own parser (``hostside/validate_args.py`` with ``FLEET_VLLM_PYTHON``) accepts the
  rendered command line, and reads the aliases, ``auto`` lengths and JSON mappings as written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleet.catalog.paths import model_path
from fleet.hostplan.render import host_plan
from fleet.load import load_fleet, load_text
from fleet.planner.fit import plan_fleet
from fleet.read.problems import Problem
from fleet.read.yamlread import read_yaml
from hostside import envfile
from hostside.validate_args import exec_start, server_words, split_exec_start
from tests.support.vllmparse import vllm_parse
from tests.unit.fleet.test_flags import vllm_python

ROOT = Path(__file__).resolve().parents[3]
CORPUS = sorted((ROOT / "tests" / "data" / "valid").glob("v032-*.yaml"))


def servers_of(path: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """(host, server, the server's raw YAML mapping) for every server of a corpus file."""
    raw, _ = read_yaml(path.read_text(encoding="utf-8"))
    return [
        (host_name, name, server)
        for host_name, host in raw["hosts"].items()
        for name, server in host.get("servers", {}).items()
    ]


def expected_words(server: dict[str, Any], name: str = "") -> list[str]:
    """The vLLM words a server's YAML says, built without the renderer (mappings: any JSON)."""
    names = server.get("served_model_name", server["model"])
    words = ["--model", model_path(server["model"]), "--served-model-name",
             *(names if isinstance(names, list) else [names]),
             "--host", server.get("host", "127.0.0.1"), "--port", str(server["port"])]
    for key, value in server.get("args", {}).items():
        words.append(f"--{key}")
        if isinstance(value, list):
            words.extend(str(item) for item in value)
        elif value is not True:
            words.append(value if isinstance(value, dict) else str(value))
    return words + tls_words(server, name)


def tls_words(server: dict[str, Any], name: str) -> list[str]:
    """vLLM's TLS words of a server with ``tls``: the copies systemd hands its unit."""
    tls = server.get("tls")
    if tls is None:
        return []
    handed = f"/run/credentials/vllm-{name}.service/tls-"
    words = ["--ssl-certfile", f"{handed}certificate", "--ssl-keyfile", f"{handed}key"]
    if "client_ca" in tls:
        words += ["--ssl-ca-certs", f"{handed}client-ca", "--ssl-cert-reqs",
                  {"optional": "1", "required": "2"}[tls.get("client_certificates", "optional")]]
    return words


def rendered_lines(path: Path) -> dict[str, str]:
    """``host/server`` → the ExecStart= value of its rendered unit."""
    fleet = load_fleet(path)
    return {
        f"{host}/{unit.name}": exec_start(unit.unit_text)
        for host in fleet.hosts
        for unit in host_plan(fleet, host, secrets=lambda ref: "secret").servers
    }


def test_the_corpus_has_at_least_twenty_configurations():
    assert len(CORPUS) >= 20


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_fleet_check_accepts_the_configuration(path):
    warnings: list[Problem] = []
    load_fleet(path, warnings=warnings)
    assert not [w for w in warnings if "all-reduce" in (w.hint or "") and "tensor" not in w.message]


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_exec_start_is_exactly_the_flags_given(path):
    lines = rendered_lines(path)
    for host, name, server in servers_of(path):
        words = server_words(split_exec_start(lines[f"{host}/{name}"]))
        expected = expected_words(server, name)
        assert len(words) == len(expected), (words, expected)
        for word, want in zip(words, expected, strict=True):
            if isinstance(want, dict):
                assert json.loads(word) == want  # one word: the mapping as JSON
            else:
                assert word == want


def test_aliases_are_words_of_their_own_and_the_first_is_checked():
    path = ROOT / "tests" / "data" / "valid" / "v032-aliases.yaml"
    fleet = load_fleet(path)
    [unit] = host_plan(fleet, "l40s-04", secrets=lambda ref: "").servers
    words = server_words(split_exec_start(exec_start(unit.unit_text)))
    at = words.index("--served-model-name")
    assert words[at + 1 : at + 4] == ["qwen3-8b", "Qwen/Qwen3-8B", "gpt-4o-mini"]
    assert unit.served_name == "qwen3-8b"


def test_environment_numbers_are_the_text_written():
    path = ROOT / "tests" / "data" / "valid" / "v032-env-numbers.yaml"
    fleet = load_fleet(path)
    [unit] = host_plan(fleet, "a6000-02", secrets=lambda ref: "").servers
    env = envfile.loads(unit.env_text)
    assert {key: env[key] for key in ("OMP_NUM_THREADS", "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
                                      "TOKENIZERS_PARALLELISM", "FLEET_NOTE_VERSION")} == {
        "OMP_NUM_THREADS": "16", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
        "TOKENIZERS_PARALLELISM": "false", "FLEET_NOTE_VERSION": "1.10",
    }


def test_auto_length_is_the_models_limit_fitted_to_memory():
    """max-model-len auto: vLLM starts from the model's 40,960 and lowers it to what fits."""
    fleet = load_fleet(ROOT / "tests" / "data" / "valid" / "v032-auto-length-rtx4090.yaml")
    [plan] = plan_fleet(fleet).servers
    assert plan.verdict != "does not fit"
    assert plan.auto_fit_from == 40960
    assert 0 < plan.max_model_len < 40960
    assert plan.kv_cache_tokens >= plan.max_model_len


def test_minus_one_length_keeps_the_models_limit_where_it_fits():
    fleet = load_fleet(ROOT / "tests" / "data" / "valid" / "v032-auto-length-minus-one.yaml")
    [plan] = plan_fleet(fleet).servers
    assert (plan.verdict, plan.max_model_len, plan.auto_fit_from) == ("fits", 40960, None)


def test_data_and_expert_parallel_on_four_gpus_is_counted_and_fits():
    fleet = load_fleet(ROOT / "tests" / "data" / "valid" / "v032-moe-dp4-ep-4gpu.yaml")
    server = fleet.hosts["pcie-h100-01"].servers["moe"]
    assert (server.dp, server.gpus_needed) == (4, 4)
    [plan] = plan_fleet(fleet).servers
    assert plan.verdict == "fits"


# --- vLLM 0.32's own parser ---------------------------------------------------------------------



@pytest.fixture(scope="module")
def vllm_reads() -> dict[str, list[Any]]:
    """Every corpus server's rendered line through vLLM's parser, in one vLLM process."""
    python = vllm_python()
    if python is None:
        pytest.skip("no python with vLLM installed (set FLEET_VLLM_PYTHON)")
    lines = {f"{path.stem}:{key}": line for path in CORPUS
             for key, line in rendered_lines(path).items()}
    return vllm_parse(python, lines)


def _parsed(vllm_reads: dict[str, list[Any]], stem: str) -> dict[str, Any]:
    [(_, _, parsed)] = [value for key, value in vllm_reads.items() if key.startswith(stem + ":")]
    return parsed


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_vllm_accepts_the_rendered_command_line(vllm_reads, path):
    mine = {key: value for key, value in vllm_reads.items() if key.startswith(path.stem + ":")}
    assert mine
    for key, (code, output, _) in mine.items():
        assert code == 0, f"{key}: {output}"


def test_vllm_reads_every_alias(vllm_reads):
    parsed = _parsed(vllm_reads, "v032-aliases")
    assert parsed["served_model_name"] == ["qwen3-8b", "Qwen/Qwen3-8B", "gpt-4o-mini"]


@pytest.mark.parametrize("stem", ["v032-auto-length-rtx4090", "v032-auto-length-minus-one"])
def test_vllm_reads_auto_length_as_auto(vllm_reads, stem):
    assert _parsed(vllm_reads, stem)["max_model_len"] == -1


def test_vllm_reads_mappings_as_the_strings_do(vllm_reads):
    """The same JSON-valued flags, as YAML mappings and as JSON strings: vLLM reads them alike."""
    mappings = _parsed(vllm_reads, "v032-json-flags-mappings")
    strings = _parsed(vllm_reads, "v032-json-flags-strings")
    for dest in ("hf_overrides", "compilation_config", "override_generation_config",
                 "default_chat_template_kwargs", "structured_outputs_config"):
        assert mappings[dest] == strings[dest], dest
    assert mappings["hf_overrides"]["rope_scaling"]["rope_type"] == "yarn"


def test_vllm_reads_the_speculative_mapping(vllm_reads):
    parsed = _parsed(vllm_reads, "v032-spec-eagle3-mapping")["speculative_config"]
    assert (parsed["method"], parsed["num_speculative_tokens"]) == ("eagle3", 3)


# --- what crosses a slow link ------------------------------------------------------------------

SLOW_PAIR = """version: 1
models:
  m: {hf: "org/m", revision: "0123456789abcdef0123456789abcdef01234567"}
hosts:
  box:
    address: 10.0.0.1
    gpus: {count: 2, model: "RTX 4090", topology: {"0-1": PHB}}
    os:
      nvidia: {driver: "570"}
    vllm: {version: "0.32.0", variant: cu129}
    servers:
      chat: {model: m, gpus: [0, 1], port: 8000, args: {ARGS}}
"""


def link_warnings(args: str) -> list[Problem]:
    warnings: list[Problem] = []
    load_text(SLOW_PAIR.replace("ARGS", args), "f.yaml", warnings=warnings)
    return [w for w in warnings if w.path[-1] == "gpus"]


def test_pipeline_parallel_over_pcie_is_not_an_all_reduce():
    assert link_warnings("pipeline-parallel-size: 2") == []


def test_tensor_parallel_over_pcie_expects_all_reduce():
    [warning] = link_warnings("tensor-parallel-size: 2")
    assert warning.message.startswith("tensor parallel over GPUs 0, 1 without NVLink")
    assert "all-reduce" in (warning.hint or "")


def test_expert_parallel_over_pcie_expects_all_to_all():
    [warning] = link_warnings("data-parallel-size: 2, enable-expert-parallel: true")
    assert warning.message.startswith("expert parallel over GPUs 0, 1")
    assert "all-to-all" in (warning.hint or "") and "all-reduce" not in (warning.hint or "")


def test_data_parallel_alone_shares_nothing_per_step():
    assert link_warnings("data-parallel-size: 2") == []
