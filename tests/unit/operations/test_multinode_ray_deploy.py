"""The Ray part of deploys/multinode.py, run with fake facts for the reference deployment
inventory/examples/h200-pair-ray.yaml (two 8×H200 nodes over Ray) as ``pyinfra inventory.py
deploy.py`` would, both hosts at once: what each member gets (the head its Ray head unit and its
vLLM unit with ``--distributed-executor-backend ray``, the worker its Ray worker unit) and the
order across the hosts (the worker restarted first, then the Ray head, then the head's vLLM;
the waits after every restart). tests/e2e/test_multinode_e2e.py runs these units for real on
two sandbox hosts, as far as the CPU build allows (docs/multinode.md, "Ray").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deploys import multinode
from deploys.multinode import group_members
from deploys.plan import current_plan, upload_programs
from fleet.hostplan.render import host_plan
from fleet.load import load_fleet
from tests.support.deployharness import Step, prepared

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "inventory" / "examples" / "h200-pair-ray.yaml"
HEAD, WORKER = "hgx-h200-01", "hgx-h200-02"
UNIT, RAY_UNIT = "vllm-deepseek.service", "vllm-deepseek-ray.service"


def members() -> None:
    """What deploys/services.py runs for a host's group members."""
    plan = current_plan()
    uploaded = upload_programs({program.name: program.description for program in plan.programs})
    group_members([e for e in plan.servers if e.group], uploaded, {})


@pytest.fixture(scope="module")
def steps() -> list[Step]:
    fleet = load_fleet(EXAMPLE)
    plans = {name: host_plan(fleet, name, secrets=lambda ref: "the-key") for name in (HEAD, WORKER)}
    multinode.WAITS.clear()
    try:
        return prepared(plans, members)
    finally:
        multinode.WAITS.clear()


def where(steps: list[Step], host: str, command: str) -> int:
    """The position of the first operation on ``host`` running ``command`` (exactly)."""
    found = [i for i, s in enumerate(steps) if s.host == host and command in s.commands]
    assert found, (host, command, [s.commands for s in steps if s.host == host])
    return found[0]


def written(steps: list[Step], host: str, path: str) -> bool:
    return any(s.host == host and f"Write {Path(path).name}" in " ".join(s.names)
               and path in " ".join(s.commands) for s in steps)


def test_the_head_writes_its_ray_head_unit_and_its_vllm_unit_over_ray(steps) -> None:
    plan = host_plan(load_fleet(EXAMPLE), HEAD, secrets=lambda ref: "k")
    [entry] = plan.servers
    assert entry.ray_head is not None and "--distributed-executor-backend ray" in entry.unit_text
    assert written(steps, HEAD, f"/etc/systemd/system/{RAY_UNIT}")
    assert written(steps, HEAD, f"/etc/systemd/system/{UNIT}")
    # the worker has no Ray head unit and runs no vLLM of its own
    assert not any(s.host == WORKER and RAY_UNIT in " ".join(s.commands) for s in steps)


def test_the_worker_writes_its_ray_worker_unit(steps) -> None:
    plan = host_plan(load_fleet(EXAMPLE), WORKER, secrets=lambda ref: "k")
    [entry] = plan.servers
    assert "ray start --block --address 10.10.0.1:6379" in entry.unit_text
    assert "vllm.entrypoints" not in entry.unit_text
    assert written(steps, WORKER, f"/etc/systemd/system/{UNIT}")


def test_both_members_get_the_ray_programs(steps) -> None:
    for host in (HEAD, WORKER):
        for program in ("ray_node", "ray_joined"):
            assert any(s.host == host and any(c.endswith(f"/hostside/{program}.py)")
                                              for c in s.commands)
                       for s in steps), (host, program)


def test_the_group_restarts_worker_first_then_the_ray_head_then_the_heads_vllm(steps) -> None:
    worker = where(steps, WORKER, f"systemctl restart --no-block {UNIT}")
    ray_head = where(steps, HEAD, f"systemctl restart --no-block {RAY_UNIT}")
    head = where(steps, HEAD, f"systemctl restart --no-block {UNIT}")
    assert worker < ray_head < head
    # no member's start blocks before every member was restarted: the worker's start (its join
    # wait) runs only once the Ray head was restarted, beside the head's own start (its wait
    # for every Ray node)
    ray_started = where(steps, HEAD, f"systemctl start {RAY_UNIT}")
    worker_started = where(steps, WORKER, f"systemctl start {UNIT}")
    head_started = where(steps, HEAD, f"systemctl start {UNIT}")
    assert head < ray_started < head_started
    assert ray_head < worker_started


def test_the_waits_come_after_every_start_and_the_completion_last(steps) -> None:
    starts = max(where(steps, h, f"systemctl start {UNIT}") for h in (HEAD, WORKER))
    worker_wait = [i for i, s in enumerate(steps) if s.host == WORKER
                   and any("group_wait.py --unit" in c for c in s.commands)]
    head_wait = [i for i, s in enumerate(steps) if s.host == HEAD
                 and any("group_wait.py --unit" in c for c in s.commands)]
    completion = [i for i, s in enumerate(steps) if s.host == HEAD
                  and any("check_ready.py --url" in c for c in s.commands)]
    assert starts < worker_wait[0] < head_wait[0] < completion[0]


def test_a_failed_group_gets_the_ray_head_unit_back_too(steps) -> None:
    restore = where(steps, HEAD, f"systemctl restart --no-block {RAY_UNIT}")
    restored = [i for i, s in enumerate(steps) if s.host == HEAD and any(
        f"/var/lib/vllm-fleet/previous/{RAY_UNIT}" in c and "cp -p" in c for c in s.commands)]
    assert restored and restored[0] > restore
