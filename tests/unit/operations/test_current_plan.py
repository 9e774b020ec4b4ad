"""A deploy reads its host's typed plan, which inventory.py computed from the fleet file; on a
host without one (pyinfra run with another inventory) it stops before acting."""

from __future__ import annotations

import pytest
from pyinfra.api.exceptions import DeployError
from pyinfra.context import ctx_host

from deploys.plan import current_plan
from tests.support.opharness import FakeHost


@pytest.mark.parametrize("data", [{}, {"fleet": {"servers": []}}], ids=["none", "a-dict"])
def test_a_deploy_without_a_typed_plan_is_refused(data: dict) -> None:
    fake = FakeHost({})
    fake.data = data
    fake.name = "box"
    with ctx_host.use(fake), pytest.raises(DeployError, match="has no fleet plan"):
        current_plan()
