"""Fixtures the host-program tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.faultserver import FaultServer
from tests.support.hostprograms import key_env_file


@pytest.fixture
def env(tmp_path: Path) -> str:
    """An environment file with the probe tests' API key (``PROBE_KEY``)."""
    return key_env_file(tmp_path)


@pytest.fixture
def www(tmp_path: Path) -> Path:
    """The folder a model origin serves (:func:`origin`)."""
    folder = tmp_path / "www"
    folder.mkdir()
    return folder


@pytest.fixture
def origin(www: Path) -> Iterator[FaultServer]:
    """A model origin on loopback serving ``www``, misbehaving on demand."""
    server = FaultServer(www).start()
    yield server
    server.stop()
