"""The healthy ranges and the GPU health rules (drift, verify and status share them)."""

from __future__ import annotations

import pytest

from fleet.judge.health import BAD, IDLE, OK, WARN, gpu_problems, level, pcie_problems, pcie_text


def card(gen=5, gen_max=5, width=16, width_max=16, pstate="P0", **ecc) -> dict:
    return {"pstate": pstate,
            "pcie": {"gen": gen, "gen_max": gen_max, "width": width, "width_max": width_max},
            "ecc": {"uncorrected_volatile": 0, "uncorrected_aggregate": 0, **ecc}}  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("temperature_c", 79, OK), ("temperature_c", 80, WARN), ("temperature_c", 85, BAD),
        ("memory_pct", 89.9, OK), ("memory_pct", 94, WARN), ("memory_pct", 95, BAD),
        ("waiting", 0, OK), ("waiting", 3, WARN), ("preemptions", 0, OK),
        ("preemptions", 1, WARN), ("kv_cache_pct", 50, OK), ("kv_cache_pct", 99, BAD),
        ("restarts", 0, OK), ("restarts", 2, WARN), ("restarts", 5, BAD),
        ("power_pct", 60, OK), ("power_pct", 99, WARN),
        ("utilization_pct", 75, OK), ("utilization_pct", 45, WARN),
        ("utilization_pct", 20, BAD), ("utilization_pct", 99, WARN),
    ],
)  # fmt: skip
def test_levels_follow_the_field_report(key: str, value: float, expected: str) -> None:
    assert level(key, value) == expected


def test_low_utilisation_without_load_is_idle_not_bad() -> None:
    assert level("utilization_pct", 0, busy=False) == IDLE


def test_unknown_value_has_no_level() -> None:
    assert level("temperature_c", None) is None


def test_healthy_card_has_no_problem() -> None:
    assert gpu_problems(card()) == []


@pytest.mark.parametrize(
    ("link", "expected"),
    [
        ({"gen": 1}, ["PCIe Gen1 of Gen5"]),
        ({"width": 8}, ["PCIe x8 of x16"]),
        ({"gen": 1, "pstate": "P8"}, []),  # power saving at idle, back to Gen5 under load
        ({"width": 8, "pstate": "P8"}, ["PCIe x8 of x16"]),
    ],
)
def test_pcie_fallback_is_found(link: dict, expected: list[str]) -> None:
    assert pcie_problems(card(**link)) == expected


def test_uncorrected_ecc_errors_are_problems_corrected_ones_are_not() -> None:
    assert gpu_problems(card(uncorrected_volatile=2, corrected_volatile=40)) == [
        "ECC: 2 uncorrected (volatile)"
    ]


def test_unknown_link_is_not_a_problem() -> None:
    gpu = {"pcie": {"gen": None, "gen_max": 5, "width": None, "width_max": 16}, "ecc": {}}
    assert gpu_problems(gpu) == []
    assert pcie_text(gpu) == "Gen? x?"
