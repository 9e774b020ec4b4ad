"""Waiting for a condition in the tests, instead of sleeping a fixed time and hoping.

A fixed ``time.sleep(10)`` before a check is either too long (the run waits for nothing) or
too short on a busy machine (the test fails for the machine's load, not the product's
behaviour). :func:`wait_until` asks the question again every ``interval`` seconds and returns
as soon as it holds; only when it never does within ``timeout`` is that a failure, with the
test's own message (what it waited for, what it saw last).

Example:
    >>> answers = iter([None, "", "ready"])
    >>> wait_until(lambda: next(answers), timeout=5, interval=0)
    'ready'
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Timeout(AssertionError):
    """The condition did not hold in time (an ``AssertionError``: the test fails, it does not
    error)."""


def wait_until(
    condition: Callable[[], T],
    timeout: float,
    interval: float = 1.0,
    message: str | Callable[[], str] = "",
) -> T:
    """Call ``condition`` until it returns something true; return that.

    + condition: the question, asked at once and then every ``interval`` seconds
    + timeout: seconds after which waiting is a failure (:class:`Timeout`)
    + interval: seconds between two questions
    + message: what the failure says (a callable is asked only then: e.g. a journal's tail)

    Example:
        >>> start = time.monotonic()
        >>> wait_until(lambda: time.monotonic() - start > 0.05, timeout=5, interval=0.01)
        True
        >>> wait_until(lambda: 0, timeout=0.05, interval=0.01, message=lambda: "never ready")
        Traceback (most recent call last):
        ...
        tests.support.wait.Timeout: not within 0.05s (last answer 0): never ready
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            said = message() if callable(message) else message
            raise Timeout(f"not within {timeout:g}s (last answer {value!r}): {said}")
        time.sleep(interval)
