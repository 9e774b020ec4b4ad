"""deploys/plan.py's upload of host programs, with fake facts: each program's files land where
it imports them on the host, the canary's share of ``loadgen`` included
(``/usr/local/lib/vllm-fleet/loadgen/``, beside ``hostside/``), each file uploaded once."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploys.plan import upload_programs
from fleet.hostplan.render import host_plan
from fleet.load import load_fleet
from tests.support.deployharness import Step, prepared

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "inventory" / "examples" / "h200-pair-ray.yaml"
HOST = "hgx-h200-01"


@pytest.fixture(scope="module")
def steps() -> list[Step]:
    plan = host_plan(load_fleet(EXAMPLE), HOST, secrets=lambda ref: "the-key")
    return prepared({HOST: plan}, lambda: upload_programs({
        "canary": "the canary gate", "check_ready": "the readiness check",
    }))  # fmt: skip


def test_the_canary_uploads_loadgen_beside_hostside(steps) -> None:
    names = [" ".join(s.names) for s in steps]
    assert "Upload the canary gate" in names
    for module in ("__init__", "timing", "stats", "prompts"):
        assert f"Upload loadgen/{module}.py (for the canary gate)" in names
    assert "Upload loadgen/client.py (for the canary gate)" not in names  # aiohttp's part
    joined = " ".join(c for s in steps for c in s.commands)
    assert "/usr/local/lib/vllm-fleet/loadgen/timing.py" in joined
    assert "/usr/local/lib/vllm-fleet/hostside/canary.py" in joined


def test_a_shared_file_is_uploaded_once(steps) -> None:
    names = [" ".join(s.names) for s in steps]
    assert names.count("Upload hostside/envfile.py (for the canary gate)") == 1
    assert not any("envfile.py (for the readiness check)" in n for n in names)
