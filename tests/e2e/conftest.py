"""Fixtures of the end-to-end tests: one sandbox host with vLLM for the whole session.

Installing vLLM on a fresh host costs ~90 s of pip and a server ~30 s to come up, so the
modules that serve vLLM (test_lifecycle, test_models_e2e, test_bench_e2e) share one host,
:data:`tests.support.e2e.VLLM_HOST`, booted fresh once per session. The first module to deploy
installs vLLM there; each module's own fixture deploys its own fleet file onto the host, which
retires the servers of the module before (and :func:`tests.support.e2e.prune_other_models`
removes their models where a module asks drift for a clean host). Any module still passes
alone, on the fresh host of its own session.

A test marked ``ends_vllm_host`` stops the shared host: it runs after every other test that
uses the host, wherever pytest collected it.

Modules that need two hosts (replicas behind a router, a server across hosts) use
``vllm_pair``: the shared host and a second one, :data:`tests.support.e2e.VLLM_HOST_B`, started
on first use and kept for the session; born with a copy of the first host's vLLM venv when a
deploy already installed it there, so a run pays one vLLM install from scratch. Their fleet
files name both hosts, so each deploy retires on both what the module before left.

test_drift_e2e does not share: its host has a stand-in GPU board and no vLLM servers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.catalog.paths import VENV_DIR
from sandbox import hosts as sandbox
from sandbox import modelserver, state
from tests.support.e2e import TESTMODEL, TESTMODEL_PORT, VLLM_HOST, VLLM_HOST_B, VLLM_HOST_PORTS

END_MARK = "ends_vllm_host"
#: Where a deploy puts the vLLM venv on a host.
VLLM_VENV = Path(VENV_DIR)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{END_MARK}: stops the shared vLLM host; runs after all its other users"
    )


#: Modules that judge timings (doctor's "slower than its last bench" holds a fresh round against
#: an archived one) run after this module: CI runs the unit-test stream beside this one for its
#: first minutes, when three streams share two cores and an idle server's round looked slower.
TIMING_AFTER = "test_endpoints_e2e.py"
TIMING_MODULES = {"test_doctor_e2e.py"}


def _timing_last(items: list[pytest.Item]) -> None:
    """Move the timing modules' tests to just after :data:`TIMING_AFTER`'s last test (in place;
    nothing moves when either is not collected)."""
    timing = [item for item in items if item.path.name in TIMING_MODULES]
    rest = [item for item in items if item.path.name not in TIMING_MODULES]
    after = [i for i, item in enumerate(rest) if item.path.name == TIMING_AFTER]
    if timing and after:
        items[:] = [*rest[: after[-1] + 1], *timing, *rest[after[-1] + 1 :]]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the timing modules after :data:`TIMING_AFTER`, then the tests that stop the shared
    host to just after its last other user."""
    _timing_last(items)
    enders = [item for item in items if item.get_closest_marker(END_MARK)]
    if not enders:
        return
    rest = [item for item in items if not item.get_closest_marker(END_MARK)]
    users = [
        i for i, item in enumerate(rest)
        if {"vllm_host", "vllm_pair"} & set(getattr(item, "fixturenames", ()))
    ]  # fmt: skip
    at = users[-1] + 1 if users else len(rest)
    items[:] = [*rest[:at], *enders, *rest[at:]]


@pytest.fixture(scope="session")
def vllm_session_host() -> Iterator[sandbox.SandboxHost]:
    """The shared host, booted fresh (whatever an earlier session left is thrown away)."""
    sandbox.down([VLLM_HOST])
    try:
        (host,) = sandbox.up({VLLM_HOST: VLLM_HOST_PORTS})
        yield host
    finally:
        sandbox.down([VLLM_HOST])


@pytest.fixture(scope="module")
def vllm_host(vllm_session_host: sandbox.SandboxHost) -> sandbox.SandboxHost:
    """The shared host, running (started again, fresh, if a test stopped it).

    Example:
        def test_x(vllm_host): assert vllm_host.state == "running"
    """
    (host,) = sandbox.up({VLLM_HOST: VLLM_HOST_PORTS})
    return host


@pytest.fixture(scope="session")
def testmodel_server() -> Iterator[str]:
    """The committed tiny model served on loopback for the session; its base URL."""
    modelserver.start(TESTMODEL, port=TESTMODEL_PORT)
    try:
        yield f"http://127.0.0.1:{TESTMODEL_PORT}"
    finally:
        modelserver.stop(port=TESTMODEL_PORT)


def installed_venv(host: str) -> Path | None:
    """The vLLM venv a deploy left on ``host`` (in its overlay's upper layer), or None."""
    venv = state.host_dir(host) / "upper" / VLLM_VENV.relative_to("/")
    return venv if (venv / "pyvenv.cfg").is_file() and (venv / "bin/vllm").is_file() else None


@pytest.fixture(scope="session")
def vllm_session_host_b() -> Iterator[sandbox.SandboxHost]:
    """The second shared host, booted fresh on first use and stopped at the session's end.

    When the first host already has the vLLM venv a deploy of this session installed, the
    second is born with a copy of it (a few seconds instead of ~90 s of pip): its first deploy
    then checks that venv (Python, the pinned vLLM) as any re-deploy does and installs only
    what differs. The install from scratch stays tested on the first host.
    """
    sandbox.down([VLLM_HOST_B])
    venv = installed_venv(VLLM_HOST)
    seeds = {VLLM_HOST_B: {str(VLLM_VENV): venv}} if venv else None
    try:
        (host,) = sandbox.up({VLLM_HOST_B: []}, seeds)
        yield host
    finally:
        sandbox.down([VLLM_HOST_B])


@pytest.fixture(scope="module")
def vllm_pair(
    vllm_session_host: sandbox.SandboxHost, vllm_session_host_b: sandbox.SandboxHost
) -> tuple[sandbox.SandboxHost, sandbox.SandboxHost]:
    """Both shared hosts, running: (VLLM_HOST, VLLM_HOST_B).

    The second declares no ports of its own: the hosts share one network, and every block in
    ``VLLM_HOST_PORTS`` is already checked free when the first starts.

    Example:
        def test_x(vllm_pair): a, b = vllm_pair; assert b.name == "e2e-vllm-b"
    """
    (host_a,) = sandbox.up({VLLM_HOST: VLLM_HOST_PORTS})
    (host_b,) = sandbox.up({VLLM_HOST_B: []})
    return host_a, host_b
