"""GPU health of each server's host, checked by ``fleet verify`` where the NVIDIA stack is
declared: every card's PCIe link at its maximum generation and width (a lower generation in an
idle power state is power saving), and no uncorrected ECC error (:mod:`fleet.judge.health`).
"""

from __future__ import annotations

import pytest
from conftest import Target

from facts.gpuhealth import HEALTH_COMMAND, parse_health
from fleet.judge.health import gpu_problems


def health(target: Target) -> dict:
    if target.plan.stack.nvidia is None:
        pytest.skip("no NVIDIA GPUs declared on this host")
    result = target.host.run(HEALTH_COMMAND)
    return parse_health(result.stdout.splitlines())


def test_gpus_report_their_health(target: Target) -> None:
    report = health(target)
    assert report["gpus"], report["error"]
    assert len(report["gpus"]) == target.plan.stack.gpus.count


def test_pcie_links_run_at_their_maximum(target: Target) -> None:
    problems = {g["index"]: [p for p in gpu_problems(g) if p.startswith("PCIe")]
                for g in health(target)["gpus"]}  # fmt: skip
    assert {i: p for i, p in problems.items() if p} == {}


def test_no_uncorrected_ecc_errors(target: Target) -> None:
    problems = {g["index"]: [p for p in gpu_problems(g) if p.startswith("ECC")]
                for g in health(target)["gpus"]}  # fmt: skip
    assert {i: p for i, p in problems.items() if p} == {}
