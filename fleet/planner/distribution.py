"""The fan-out of one model over the fleet: in which round each host fetches it, and from whom.

The origin (a model's URL) is asked as little as possible: when no host holds a verified copy
yet, ``origin_fetchers`` hosts fetch it from the origin in the first round; from then on every
host that holds it serves up to ``per_source`` hosts per round (``hostside/peer_serve.py``,
bounded by ``--max-transfers``), so the sources grow from ``s`` to ``s·(1 + per_source)`` each
round: with ``per_source=1`` they double. Rounds are barriers: a round starts once the one
before it has ended, and a host that fetched the model in a round serves from the next.

Each transfer names its sources in the order to try them: the host it is assigned to first,
then up to ``fallbacks`` other holders (the next ones in the round's order, so fallbacks are
spread too); the origin is always the last resort and is not named. Only the first source counts
against a holder's bound: a fallback that is busy answers 503 and the next source is tried.
Should a transfer fail outright, plan again with the hosts that really hold it: the schedule is
a pure function of its inputs (same inputs, same rounds), so re-planning is cheap.

Rounds, for ``N`` hosts needing the model, ``h`` holding it, ``k`` origin fetchers and a bound
of ``c`` receivers per source (every round but the last uses every source to its bound):

- ``h ≥ 1``: the smallest ``R`` with ``h·(1 + c)^R ≥ h + N``, i.e. ``⌈log_{1+c}(1 + N/h)⌉``;
- ``h = 0``: ``1`` when ``N ≤ k``, else ``1 + ⌈log_{1+c}(N/k)⌉``. With ``c = 1, k = 1``, 1000
  hosts take ``1 + ⌈log2 1000⌉ = 11`` rounds, 6 hosts 4; the origin serves the archive once
  (``k`` times in general), against ``N`` times when every host fetches it.

Example:
    >>> plan = plan_distribution(["a", "b", "c", "d", "e"], [], origin_fetchers=1, per_source=1)
    >>> [[(t.host, t.peers) for t in r.transfers] for r in plan.rounds]
    [[('a', ())], [('b', ('a',))], [('c', ('a', 'b')), ('d', ('b', 'a'))],
     [('e', ('a', 'b', 'c'))]]
    >>> plan.origin_fetches, len(plan.rounds) == rounds_needed(5, 0, 1, 1) == 4
    (1, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Transfer:
    """One host fetching the model in one round.

    + host: the host that fetches it
    + peers: the holders to try, in order (the first is the one it is assigned to); empty:
      it fetches from the origin
    """

    host: str
    peers: tuple[str, ...]

    @property
    def from_origin(self) -> bool:
        """Whether this host is one of the first, which fetch from the origin.

        >>> Transfer("a", ()).from_origin, Transfer("b", ("a",)).from_origin
        (True, False)
        """
        return not self.peers


@dataclass(frozen=True)
class Round:
    """The transfers of one round, run together.

    + sources: the holders at the start of the round (the peers its transfers may name)
    + transfers: who fetches from whom
    """

    sources: tuple[str, ...]
    transfers: tuple[Transfer, ...]


@dataclass(frozen=True)
class Distribution:
    """The whole fan-out: its rounds, in order.

    + holding: the hosts that held a verified copy before the first round
    + per_source: the bound of receivers per source per round it was planned with
    """

    rounds: tuple[Round, ...]
    holding: tuple[str, ...]
    per_source: int

    @property
    def origin_fetches(self) -> int:
        """How many hosts fetch from the origin (how many times the origin sends the archive,
        when nothing fails)."""
        return sum(t.from_origin for r in self.rounds for t in r.transfers)


def rounds_needed(needing: int, holding: int, origin_fetchers: int, per_source: int) -> int:
    """The number of rounds of :func:`plan_distribution` for these counts (integers only).

    >>> rounds_needed(1000, 0, 1, 1), rounds_needed(1000, 0, 1, 3), rounds_needed(31, 1, 1, 1)
    (11, 6, 5)
    >>> rounds_needed(0, 0, 1, 1), rounds_needed(2, 0, 4, 1)
    (0, 1)
    """
    if needing <= 0:
        return 0
    rounds, held = 0, holding
    if held == 0:
        rounds, held = 1, min(origin_fetchers, needing)
    while held < holding + needing:
        held += min(held * per_source, holding + needing - held)
        rounds += 1
    return rounds


def plan_distribution(
    needing: Sequence[str],
    holding: Sequence[str],
    *,
    origin_fetchers: int = 1,
    per_source: int = 1,
    fallbacks: int = 2,
) -> Distribution:
    """The rounds in which ``needing`` get the model, from the origin and then from peers.

    + needing: the hosts that must get it, in the order they are served (the fleet file's)
    + holding: the hosts that hold a verified copy already (they never fetch it)
    + origin_fetchers: how many hosts fetch from the origin when no host holds it (≥ 1)
    + per_source: how many hosts one source serves at once (``--max-transfers``, ≥ 1)
    + fallbacks: how many more holders each transfer names after its own (≥ 0)

    Raises ValueError for a host named twice, a host both needing and holding, or a bound
    below 1.

    Example:
        >>> plan = plan_distribution(["c", "d", "e"], ["a", "b"], per_source=1, fallbacks=1)
        >>> [[(t.host, t.peers) for t in r.transfers] for r in plan.rounds]
        [[('c', ('a', 'b')), ('d', ('b', 'a'))], [('e', ('a', 'b'))]]
        >>> plan.origin_fetches
        0
    """
    if origin_fetchers < 1 or per_source < 1 or fallbacks < 0:
        raise ValueError("origin_fetchers and per_source must be 1 or more, fallbacks 0 or more")
    for label, hosts in (("needing", needing), ("holding", holding)):
        twice = sorted({h for h in hosts if list(hosts).count(h) > 1})
        if twice:
            raise ValueError(f"{label} names {', '.join(twice)} more than once")
    both = sorted(set(needing) & set(holding))
    if both:
        raise ValueError(f"{', '.join(both)} both need the model and hold it")
    sources = list(holding)
    waiting = list(needing)
    rounds: list[Round] = []
    if waiting and not sources:
        first, waiting = waiting[:origin_fetchers], waiting[origin_fetchers:]
        rounds.append(Round((), tuple(Transfer(host, ()) for host in first)))
        sources = list(first)
    while waiting:
        served, waiting = waiting[: len(sources) * per_source], waiting[len(sources) * per_source :]
        transfers = []
        for index, host in enumerate(served):
            count = min(1 + fallbacks, len(sources))
            peers = tuple(sources[(index + step) % len(sources)] for step in range(count))
            transfers.append(Transfer(host, peers))
        rounds.append(Round(tuple(sources), tuple(transfers)))
        sources += served
    return Distribution(tuple(rounds), tuple(holding), per_source)
