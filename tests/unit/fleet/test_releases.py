"""Driver minima are written once (fleet/catalog/releases.py): each vLLM GPU build's follows from
the
CUDA it is built with."""

from __future__ import annotations

import pytest

from fleet.catalog import releases
from fleet.checks.flags import known_versions, load_flag_list
from fleet.load import FleetError, load_text
from fleet.spec.models import Variant


def test_every_gpu_build_has_a_cuda_version_and_so_a_driver_minimum() -> None:
    gpu_builds = {variant.value for variant in Variant if variant is not Variant.cpu}
    assert set(releases.CUDA_OF_VARIANT) == gpu_builds == set(releases.MIN_DRIVER_FOR_VARIANT)


def test_a_builds_minimum_is_its_cuda_majors() -> None:
    assert releases.MIN_DRIVER_FOR_VARIANT == {"cu129": 525, "cu130": 580}
    for variant, (major, minor) in releases.CUDA_OF_VARIANT.items():
        assert variant == f"cu{major}{minor}"
        assert releases.MIN_DRIVER_FOR_VARIANT[variant] == releases.MIN_DRIVER_FOR_CUDA[major]


def test_every_minimum_is_a_published_driver_branch() -> None:
    for need in (*releases.MIN_DRIVER_FOR_CUDA.values(), *releases.MIN_DRIVER_FOR_VARIANT.values()):
        assert releases.driver_branch_known(need)


FOUR_PART = """\
version: 1
models:
  m: {{hf: "org/m", revision: "0123456789abcdef0123456789abcdef01234567"}}
hosts:
  box:
    address: 10.0.0.1
    os: {{nvidia: {{driver: "570"}}}}
    gpus: {{count: 1, model: "A100 80GB"}}
    vllm: {{version: "{version}", variant: cu129}}
"""


@pytest.mark.parametrize("version", ["0.10.1.1", "0.10.1.post1", "0.11.0"])
def test_a_published_release_is_accepted(version: str) -> None:
    """vLLM published 0.10.1.1 (four parts) beside post releases: both are real pins."""
    fleet = load_text(FOUR_PART.format(version=version), "f.yaml")
    assert fleet.hosts["box"].vllm.package == f"vllm=={version}"


@pytest.mark.parametrize("version", ["0.10", "0.10.1.1.1", "0.10.1-1", "latest", "0.10.1.1 "])
def test_a_malformed_release_is_refused_at_its_line(version: str) -> None:
    with pytest.raises(FleetError) as caught:
        load_text(FOUR_PART.format(version=version), "f.yaml")
    assert any(".".join(map(str, p.path)) == "hosts.box.vllm.version" and p.line == 9
               for p in caught.value.problems), caught.value.problems


def test_the_scale_out_release_is_where_the_flag_appears_in_vllms_own_flag_lists() -> None:
    """``render_needs_scale_out`` agrees with the flag lists read from each vLLM release."""
    for version in known_versions():
        has_flag = "enable-scale-out" in load_flag_list(version).flags
        assert releases.render_needs_scale_out(version) == has_flag, version
