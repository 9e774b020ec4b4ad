"""Bulk steps without Python's cyclic garbage collector: loading and planning a fleet.

Loading a fleet file builds objects that all live until the command ends (the YAML's data
and positions, the validated models, each server's plan) and form no reference cycles. The
collector does not know that: every 700 allocations it looks at the newest objects, and
whenever those outgrew a quarter of the old ones it walks them all again. On a 10,000-host
fleet (benchmarks/fleet_scale.py, 4.1 MB) that walking was about 40 % of the CPU time of
loading it (8.0–9.5 s with it, 4.9–5.8 s without) and half of planning it (2.6–2.8 s, 1.2–1.7 s).
:func:`without_gc` turns it off for one
step and restores it after, whatever the step raises.

Example:
    >>> import gc
    >>> with without_gc():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def without_gc() -> Iterator[None]:
    """The block runs with the cyclic collector off (reference counting still frees what it
    drops); the collector's state before the block is restored after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
