"""Operations of a server across hosts: restart a member without blocking, wait for it.

A group restarts as one: every member is restarted without waiting (``--no-block``), workers
first, then the head, and only then does the deploy wait for each member, with a bound, so that
no member's start blocks on another that has not been restarted yet.

Example:
    from operations import multinode
    multinode.member_restarted(unit="vllm-big.service", _if=changed)
    multinode.member_up(unit="vllm-big.service", member="worker box-2 (node rank 1)",
                        group="big", timeout=600, script=waiter)
"""

from __future__ import annotations

from pyinfra.api import QuoteString, StringCommand, operation


@operation(is_idempotent=False)
def member_restarted(unit: str):
    """Restart a group member's unit without waiting for its start to finish.

    + unit: the member's systemd unit

    **Example:**

    .. code:: python

        member_restarted(unit="vllm-big.service", _if=unit_op.did_change)
    """
    yield StringCommand("systemctl", "restart", "--no-block", QuoteString(unit))


@operation(is_idempotent=False)
def member_up(unit: str, member: str, group: str, timeout: int, script: str):
    """Wait until a member's unit is active (joined, or serving), failing with its name.

    + unit: the member's systemd unit
    + member: who it is, for the message (``worker box-2 (node rank 1)``)
    + group: the group's server name
    + timeout: seconds to wait
    + script: the host-side waiter (group_wait.py)

    **Example:**

    .. code:: python

        member_up(unit="vllm-big.service", member="head box", group="big", timeout=600,
                  script="/usr/local/lib/vllm-fleet/hostside/group_wait.py")
    """
    yield StringCommand(
        "python3", QuoteString(script), "--unit", QuoteString(unit),
        "--member", QuoteString(member), "--group", QuoteString(group),
        "--timeout", str(timeout),
    )
