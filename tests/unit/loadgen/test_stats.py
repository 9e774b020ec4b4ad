"""Percentiles, SLOs, goodput and the knee (:mod:`loadgen.stats`) on known samples."""

from __future__ import annotations

import pytest

from loadgen import stats


def test_percentiles_on_known_samples() -> None:
    values = [float(v) for v in range(1, 101)]
    assert stats.percentile(values, 50) == pytest.approx(50.5)
    assert stats.percentile(values, 90) == pytest.approx(90.1)
    assert stats.percentile(values, 95) == pytest.approx(95.05)
    assert stats.percentile(values, 99) == pytest.approx(99.01)
    assert stats.summarize(values)["mean"] == pytest.approx(50.5)


def test_percentile_of_one_sample_is_that_sample() -> None:
    assert stats.percentile([0.25], 99) == 0.25


@pytest.mark.parametrize(
    ("throughput", "latency", "knee"),
    [
        ([100, 200, 400, 500, 510], [1.0, 1.0, 1.1, 2.0, 4.0], 4),  # 4 → 8: ×1.25 work, ×1.8 wait
        ([100, 200, 400, 800, 1600], [1.0, 1.0, 1.0, 1.0, 1.0], None),  # linear: no knee
        ([100, 105, 110, 115, 120], [1.0, 2.0, 4.0, 8.0, 16.0], 1),  # saturated from the start
    ],
)
def test_knee_on_synthetic_steps(throughput, latency, knee) -> None:
    assert stats.find_knee([1, 2, 4, 8, 16], throughput, latency) == knee


def test_goodput_counts_requests_within_every_slo() -> None:
    slo = stats.parse_slo("ttft=500ms,tpot=50ms")
    requests = [
        {"ttft": 0.2, "tpot": 0.04},  # good
        {"ttft": 0.6, "tpot": 0.04},  # TTFT too long
        {"ttft": 0.2, "tpot": 0.06},  # TPOT too long
        {"ttft": 0.5, "tpot": None},  # one token, on the TTFT limit: good
    ]
    assert stats.goodput(requests, slo, seconds=4.0) == {
        "good": 2, "total": 4, "fraction": 0.5, "requests_per_s": 0.5,
    }


@pytest.mark.parametrize("text", ["ttft", "ttft=fast", "speed=1s"])
def test_bad_slo_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        stats.parse_slo(text)
