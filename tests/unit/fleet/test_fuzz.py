"""Property-based fuzzing of the loader: whatever the text or bytes, loading ends cleanly.

Clean means a valid :class:`fleet.spec.models.Fleet`, or a :class:`FleetError` whose every problem
names a line; never another exception, and within a time and memory bound per input. The
structures and damage come from :mod:`tests.support.fleetgen`.

Profiles: ``ci`` (the default; derandomized, so CI runs the same examples every time) and
``deep`` (many more, random): ``FLEET_FUZZ_PROFILE=deep pytest tests/unit/fleet/test_fuzz.py``.
"""

from __future__ import annotations

import os
import tempfile
import time
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from fleet.load import load_fleet, load_text
from fleet.read.problems import FleetError
from fleet.spec.models import Fleet
from tests.support.fleetgen import fleet_bytes, fleet_texts

settings.register_profile(
    "ci", max_examples=250, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "deep", max_examples=5000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = settings.get_profile(os.environ.get("FLEET_FUZZ_PROFILE", "ci"))

#: Per input (the issue's bound for ``fleet check`` is 2 s and 500 MB for the whole process).
MAX_SECONDS = 2.0
MAX_TRACED_BYTES = 200 << 20
TRACE = os.environ.get("FLEET_FUZZ_TRACE") != "0"
HERE = Path(__file__).resolve().parent


def assert_clean(load) -> None:
    """Run ``load``; it returns a Fleet or raises a located FleetError, within the bounds."""
    tracemalloc.start() if TRACE else None
    start = time.monotonic()
    try:
        result = load()
    except FleetError as error:
        assert error.problems, "a FleetError without problems"
        unlocated = [str(p) for p in error.problems if p.line is None]
        assert not unlocated, unlocated
    else:
        assert isinstance(result, Fleet)
    finally:
        seconds = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory() if TRACE else (0, 0)
        tracemalloc.stop() if TRACE else None
    assert seconds < MAX_SECONDS, f"took {seconds:.2f} s"
    assert peak < MAX_TRACED_BYTES, f"peak {peak >> 20} MiB"


@settings(PROFILE)
@given(fleet_texts())
def test_load_text_ends_cleanly(text):
    assert_clean(lambda: load_text(text, str(HERE / "fuzz.yaml")))


@settings(PROFILE, max_examples=max(PROFILE.max_examples // 3, 1))
@given(fleet_bytes())
def test_load_fleet_ends_cleanly_on_any_bytes(data):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fleet.yaml"
        path.write_bytes(data)
        assert_clean(lambda: load_fleet(path))
