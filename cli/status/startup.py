"""Time to ready, in parts, for ``fleet status --startup``: the parser is the host-side
program's (:mod:`hostside.startup_phases`, which the deploy also runs on the host to record
each start), named here for the status code and the benchmarks.

Example:
    >>> PHASES[0], PHASES[-1]
    ('process start', 'first completion')
"""

from __future__ import annotations

from hostside.startup_phases import MARKERS, PHASES, Start, merge_recorded, split_line, starts

__all__ = ["MARKERS", "PHASES", "Start", "merge_recorded", "split_line", "starts"]
