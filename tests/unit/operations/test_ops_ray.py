"""Ray in the vLLM venv (fake facts): installed when missing or another version, else a noop."""

from __future__ import annotations

import pytest

from operations.ray import ray_installed
from tests.support.opharness import run_op

VENV = "/opt/vllm-fleet/venv"


@pytest.mark.parametrize("have", [None, {"vllm": "0.32.0"}, {"vllm": "0.32.0", "ray": "2.47.1"}],
                         ids=["no-venv", "no-ray", "other-ray"])
def test_ray_is_installed_when_the_pinned_version_is_missing(have) -> None:
    facts = {"VenvPackages": None if have is None else {"python": "3.12.3", "packages": have}}
    commands, noops = run_op(ray_installed, facts, venv=VENV, requirement="ray[cgraph]==2.48.0",
                             extra_index_url="https://download.pytorch.org/whl/cu130")
    assert commands == [
        f"{VENV}/bin/pip install --no-input --disable-pip-version-check --extra-index-url "
        "https://download.pytorch.org/whl/cu130 'ray[cgraph]==2.48.0'"]
    assert noops == []


def test_the_pinned_ray_installed_is_a_noop() -> None:
    facts = {"VenvPackages": {"python": "3.12.3", "packages": {"ray": "2.48.0"}}}
    commands, noops = run_op(ray_installed, facts, venv=VENV, requirement="ray[cgraph]==2.48.0")
    assert commands == [] and noops == [f"ray 2.48.0 is installed in {VENV}"]
