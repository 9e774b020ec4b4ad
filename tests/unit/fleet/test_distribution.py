"""The fan-out schedule of a model over the fleet (fleet/planner/distribution.py).

Properties over any fleet: every host that needs the model gets it exactly once and no holder
fetches it; a transfer names only hosts that held the model when its round began; no source is
assigned more receivers in a round than its bound; only the first round touches the origin,
and only when nobody holds the model; every round but the last uses every source to its bound;
the number of rounds is the smallest R with h·(1+c)^R ≥ h+N (after the origin round), which is
⌈log2⌉ for c = 1; the same inputs give the same rounds.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.planner.distribution import Distribution, plan_distribution, rounds_needed


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[str], list[str], int, int, int]:
    """(needing, holding, origin_fetchers, per_source, fallbacks) with distinct host names."""
    total = draw(st.integers(0, 300))
    names = [f"gpu-{i:03d}" for i in range(total)]
    names = draw(st.permutations(names))
    held = draw(st.integers(0, min(total, 8)))
    return (list(names[held:]), list(names[:held]), draw(st.integers(1, 4)),
            draw(st.integers(1, 4)), draw(st.integers(0, 3)))


def plan_of(case: tuple[list[str], list[str], int, int, int]) -> Distribution:
    needing, holding, origin, per_source, fallbacks = case
    return plan_distribution(needing, holding, origin_fetchers=origin, per_source=per_source,
                             fallbacks=fallbacks)


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_every_host_that_needs_it_gets_it_exactly_once(case) -> None:
    needing, holding, *_ = case
    got = Counter(t.host for r in plan_of(case).rounds for t in r.transfers)
    assert sorted(got) == sorted(needing)
    assert set(got.values()) <= {1}
    assert not set(got) & set(holding)


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_peers_are_holders_at_the_start_of_the_round(case) -> None:
    needing, holding, _, _, fallbacks = case
    held = set(holding)
    for round_ in plan_of(case).rounds:
        assert set(round_.sources) == held
        for transfer in round_.transfers:
            assert set(transfer.peers) <= held
            assert transfer.host not in transfer.peers
            assert len(set(transfer.peers)) == len(transfer.peers) <= 1 + fallbacks
        held |= {t.host for t in round_.transfers}
    assert held == set(needing) | set(holding)


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_no_source_is_assigned_more_than_its_bound(case) -> None:
    plan = plan_of(case)
    for round_ in plan.rounds:
        assigned = Counter(t.peers[0] for t in round_.transfers if t.peers)
        assert max(assigned.values(), default=0) <= plan.per_source


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_only_the_first_round_asks_the_origin_and_only_when_nobody_holds_it(case) -> None:
    needing, holding, origin, *_ = case
    plan = plan_of(case)
    expected = min(origin, len(needing)) if not holding else 0
    assert plan.origin_fetches == expected
    for round_ in plan.rounds[1:]:
        assert all(t.peers for t in round_.transfers)


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_every_round_but_the_last_uses_every_source_to_its_bound(case) -> None:
    plan = plan_of(case)
    for round_ in plan.rounds[:-1]:
        if round_.sources:
            assert len(round_.transfers) == len(round_.sources) * plan.per_source


@settings(max_examples=300, deadline=None)
@given(fleets())
def test_the_number_of_rounds_is_the_smallest_that_reaches_every_host(case) -> None:
    needing, holding, origin, per_source, _ = case
    plan = plan_of(case)
    n, h = len(needing), len(holding)
    assert len(plan.rounds) == rounds_needed(n, h, origin, per_source)
    if n == 0:
        assert plan.rounds == ()
        return
    start, extra = (h, 0) if h else (min(origin, n), 1)
    r = 0
    while start * (1 + per_source) ** r < h + n:
        r += 1
    assert len(plan.rounds) == extra + r
    assert r == 0 or start * (1 + per_source) ** (r - 1) < h + n


@pytest.mark.parametrize("hosts,rounds", [(1, 1), (2, 2), (3, 3), (4, 3), (6, 4), (8, 4),
                                          (9, 5), (100, 8), (1000, 11)])
def test_doubling_from_one_origin_fetch_takes_one_plus_ceil_log2_rounds(hosts, rounds) -> None:
    plan = plan_distribution([f"h{i}" for i in range(hosts)], [])
    assert len(plan.rounds) == rounds == 1 + math.ceil(math.log2(hosts))
    assert plan.origin_fetches == 1
    assert [len(r.sources) for r in plan.rounds[1:]] == [2**i for i in range(rounds - 1)]


@settings(max_examples=100, deadline=None)
@given(fleets())
def test_the_same_inputs_give_the_same_rounds(case) -> None:
    assert plan_of(case) == plan_of(case)


def test_fallbacks_are_spread_over_the_sources() -> None:
    plan = plan_distribution(["c", "d", "e", "f"], ["a", "b"], per_source=2, fallbacks=1)
    assert [(t.host, t.peers) for t in plan.rounds[0].transfers] == [
        ("c", ("a", "b")), ("d", ("b", "a")), ("e", ("a", "b")), ("f", ("b", "a")),
    ]


@pytest.mark.parametrize(
    "needing,holding,kwargs,message",
    [
        (["a", "a"], [], {}, "needing names a more than once"),
        (["a"], ["b", "b"], {}, "holding names b more than once"),
        (["a", "b"], ["b"], {}, "b both need the model and hold it"),
        (["a"], [], {"per_source": 0}, "must be 1 or more"),
        (["a"], [], {"origin_fetchers": 0}, "must be 1 or more"),
    ],
)
def test_inconsistent_inputs_are_refused(needing, holding, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        plan_distribution(needing, holding, **kwargs)
