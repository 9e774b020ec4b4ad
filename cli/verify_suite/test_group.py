"""`fleet verify` for servers across hosts: every worker has joined its head.

The head's own checks (unit, port, /health, a real completion) are test_server.py's: vLLM's
head answers only once every member has joined, so its completion is the group's.
"""

from __future__ import annotations

import shlex

import pytest
from conftest import Target

from fleet.catalog.paths import remote_program


def test_worker_has_joined_its_head(target: Target) -> None:
    group = target.server.group
    if group is None or group.is_head:
        pytest.skip("not a group worker")
    pid = int(target.host.run(f"systemctl show -p MainPID --value {target.server.unit}").stdout)
    command = [
        "python3", remote_program("wait_joined"), "--head", group.head,
        "--connect", f"{group.head_address}:{group.join_port}", "--pid", str(pid),
        "--timeout", "10",
    ]
    result = target.host.run(" ".join(shlex.quote(word) for word in command))
    assert result.rc == 0, result.stderr


def test_head_lists_every_member_in_its_unit(target: Target) -> None:
    group = target.server.group
    if group is None or not group.is_head:
        pytest.skip("not a group head")
    unit = target.host.file(target.server.unit_path).content_string
    assert f"group revision {group.revision}" in unit
    assert " ".join(group.members) in unit


def test_ray_head_holds_every_members_node(target: Target) -> None:
    """Over Ray: the head's Ray head unit runs, and ``ray status`` shows every member's node
    with its resources — the head vLLM unit's own wait (its ``ExecStartPre``), bounded here."""
    ray = target.server.ray_head
    if ray is None:
        pytest.skip("not the head of a group over Ray")
    assert target.host.service(ray.unit).is_running, f"{ray.unit} is not running"
    [line] = [x for x in target.server.unit_text.splitlines()
              if x.startswith("ExecStartPre=+") and remote_program("ray_joined") in x]
    words = shlex.split(line.removeprefix("ExecStartPre=+"))
    words[words.index("--timeout") + 1] = "10"
    result = target.host.run(" ".join(shlex.quote(word) for word in words))
    assert result.rc == 0, result.stderr
