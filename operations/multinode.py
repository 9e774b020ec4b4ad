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


@operation(is_idempotent=False)
def member_restored(unit: str, restore: dict[str, str]):
    """Put a member's previous unit and environment back and restart it without waiting.

    Runs on every member when the group did not come up with its new configuration: each
    saved copy (``previous_saved`` kept it before the new text was written) goes back over the
    live file and is removed (it belongs to this change only); a file without a saved copy (a
    first deploy, or one that did not change) stays. Then systemd is reloaded and the member
    restarted, workers before the head as for any group restart.

    + unit: the member's systemd unit
    + restore: live path → saved copy

    **Example:**

    .. code:: python

        member_restored(unit="vllm-big.service",
                        restore={"/etc/systemd/system/vllm-big.service":
                                 "/var/lib/vllm-fleet/previous/vllm-big.service"},
                        _if=group_failed(key))
    """
    for live, saved in sorted(restore.items()):
        yield StringCommand("if", "test", "-e", QuoteString(saved), ";", "then", "cp", "-p",
                            QuoteString(saved), QuoteString(live), "&&", "rm", "-f",
                            QuoteString(saved), ";", "fi")
    yield StringCommand("systemctl", "daemon-reload")
    yield StringCommand("systemctl", "restart", "--no-block", QuoteString(unit))


@operation(is_idempotent=False)
def previous_forgotten(saved: list[str]):
    """Remove a member's saved copies once its group serves with the new configuration, so that
    a later failure never brings back a copy older than the working file.

    + saved: the saved copies

    **Example:**

    .. code:: python

        previous_forgotten(saved=["/var/lib/vllm-fleet/previous/vllm-big.service"])
    """
    yield StringCommand("rm", "-f", *(QuoteString(path) for path in sorted(saved)))


@operation(is_idempotent=False)
def group_refused(group: str, member: str):
    """Fail the deploy on a member of a group that did not come up with its new configuration
    (after its previous configuration was put back on every member).

    + group: the group's server name
    + member: who this is, for the message

    **Example:**

    .. code:: python

        group_refused(group="big", member="head box", _if=group_failed(key))
    """
    message = (
        f"group {group} did not come up with its new configuration (the failed wait above "
        f"names the member); {member}: its previous unit and environment, where one was "
        "saved, are back and it was restarted, in order with the other members. Fix the "
        "fleet file and deploy again."
    )
    yield StringCommand("echo", QuoteString(message), ">&2", ";", "exit", "1")
