"""Fixtures the host-program tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.hostprograms import key_env_file


@pytest.fixture
def env(tmp_path: Path) -> str:
    """An environment file with the probe tests' API key (``PROBE_KEY``)."""
    return key_env_file(tmp_path)
