"""Operations of endpoints: roll a replica through its router, retire routers no longer declared.

A rollout is ordered across hosts by pyinfra itself: :func:`replica_rolled` runs with
``_parallel=max_unavailable``, so pyinfra runs it on at most that many hosts at once, host
batch after host batch. Each run is one Python callback (a ``FunctionCommand``, executed in
the pyinfra process in that order) that drives three host-side steps over the hosts' own
connections: take the replica out of its router (on the router's host), drain, restart or
restore, check readiness (on the replica's host), put it back (on the router's host).

The first replica of an endpoint that fails stops the endpoint's rollout for the rest of the
run (:data:`STOPPED`): each later replica puts its saved previous files back unstarted (it
keeps serving what it runs) and fails with a message naming the replica that stopped it.

Example:
    from operations.endpoints import replica_rolled
    replica_rolled(name="Roll chat-a", rollout=entry.rollout, unit=..., _parallel=1)
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.api.host import Host
from pyinfra.api.state import State

from facts.router import FleetRouterUnits
from fleet.hostplan.types import ReplicaRollout
from operations.canary import CanaryCommands, canary_commands, decision_words, goes_first

#: Endpoints whose rollout stopped during this pyinfra run: endpoint → what stopped it.
STOPPED: dict[str, str] = {}


def _sudo(target: Host) -> dict[str, bool]:
    """The connector arguments a host's own operations run with (``_sudo`` from its data)."""
    return {"_sudo": bool(target.data.get("_sudo", False))}


def _show(target: Host, lines: list[str], error: bool = False) -> None:
    """Print a host-side program's lines in the deploy's output, under the host's name."""
    for line in lines:
        if line.strip():
            target.log_styled(line, log_func=logger.error if error else logger.info)


def _run(target: Host, command: StringCommand) -> tuple[bool, list[str], list[str]]:
    """Run a command on ``target`` now; (ok, stdout lines, stderr lines), stdout printed."""
    ok, output = target.run_shell_command(command, **_sudo(target))
    _show(target, output.stdout_lines)
    return ok, output.stdout_lines, output.stderr_lines


def _stop(target: Host, rollout: ReplicaRollout, why: str) -> bool:
    """Record why the endpoint's rollout stops here; print it; fail this host."""
    STOPPED.setdefault(rollout.endpoint, f"{rollout.replica}: {why}")
    target.log_styled(
        f"rollout of endpoint {rollout.endpoint} stopped at replica {rollout.replica}: {why}",
        fg="red",
        log_func=logger.error,
    )
    return False


def roll(
    state: State,
    host: Host,
    rollout: ReplicaRollout,
    remove: StringCommand,
    update: StringCommand,
    abandon: StringCommand,
    add: StringCommand,
    canary: CanaryCommands | None = None,
) -> bool:
    """The callback of :func:`replica_rolled`, run by pyinfra in its host order."""
    if rollout.endpoint in STOPPED:
        _run(host, abandon)
        host.log_styled(
            f"{rollout.replica} not updated: the rollout of endpoint {rollout.endpoint} stopped "
            f"at {STOPPED[rollout.endpoint]}",
            fg="red",
            log_func=logger.error,
        )
        return False
    router = state.inventory.get_host(rollout.router_host, None)
    if router is None:
        return _stop(host, rollout, f"its router's host {rollout.router_host} is not in this run")
    ok, _, err = _run(router, remove)
    if not ok:
        return _stop(host, rollout, "the router did not take it out: " + " ".join(err[-3:]))
    first = goes_first(rollout, canary)
    if first:
        _run(host, canary.keep)
    ok, _, err = _run(host, update)
    if not ok:
        if first:
            _run(host, canary.forget)
        _show(host, err[-25:], error=True)
        restored = any("back on its previous configuration" in line for line in err)
        if restored:
            _run(router, add)
        why = "it did not come back with the new configuration" + (
            " (restored to its previous configuration, serving again)"
            if restored
            else " and its previous configuration did not start either"
        )
        return _stop(host, rollout, why)
    if first:
        passed, lines, _ = _run(router, canary.measure)
        if not passed:
            why = "its canary " + decision_words(lines)
            back, out, _ = _run(host, canary.rollback)
            kept = not any("nothing kept to roll back to" in line for line in out)
            if back or not kept:
                _run(router, add)
            return _stop(host, rollout, why + (
                " (rolled back to its previous configuration, serving again)" if back
                else " (nothing kept to roll back to: it serves the new configuration)"
                if not kept else " (not serving after the rollback: see above)"
            ))
        _run(host, canary.forget)
    ok, _, err = _run(router, add)
    if not ok:
        return _stop(host, rollout, "the router did not take it back: " + " ".join(err[-3:]))
    return True


@operation(is_idempotent=False)
def replica_rolled(
    rollout: ReplicaRollout,
    unit: str,
    url: str,
    served_name: str,
    env_file: str,
    restore: dict[str, str],
    roll_script: str,
    router_script: str,
):
    """Update one replica while its endpoint keeps serving (run with ``_parallel``).

    + rollout: the replica's endpoint, router and policy (from the host plan)
    + unit, url, served_name, env_file: the replica's server (``url``: its base URL on its
      host, ``ServerUnit.url``)
    + restore: live path → saved previous copy (from ``previous_saved``)
    + roll_script: the host-side roll_replica.py; router_script: router_workers.py

    **Example:**

    .. code:: python

        ops.replica_rolled(rollout=entry.rollout, unit="vllm-a.service",
                           url="http://127.0.0.1:18401",
                           served_name="tiny", env_file="/etc/vllm-fleet/a.env",
                           restore={unit_path: saved_unit}, roll_script=..., router_script=...,
                           _parallel=entry.rollout.max_unavailable, _if=changed)
    """
    label = f"{rollout.endpoint}/{rollout.replica}"
    pairs: list[object] = []
    for live, saved in sorted(restore.items()):
        pairs += ["--restore", QuoteString(f"{live}={saved}")]
    base = [
        "python3", QuoteString(roll_script), "--label", QuoteString(label),
        "--unit", QuoteString(unit), "--url", QuoteString(url),
        "--model", QuoteString(served_name),
        "--env-file", QuoteString(env_file), *pairs,
    ]  # fmt: skip
    update = StringCommand(*base, "--drain-timeout", str(rollout.drain_timeout))
    abandon = StringCommand(*base, "--abandon")
    canary = canary_commands(rollout, label, unit, url, served_name, env_file, pairs)

    def router_call(action: str) -> StringCommand:
        return StringCommand(
            "python3", QuoteString(router_script), "--router", QuoteString(rollout.router_url),
            "--label", QuoteString(label), action, "--worker", QuoteString(rollout.worker_url),
        )  # fmt: skip

    steps = (rollout, router_call("remove"), update, abandon, router_call("add"))
    yield FunctionCommand(roll, (*steps, canary) if canary else steps, {})


@operation()
def undeclared_routers_removed(keep: list[str], unit_dir: str):
    """Stop, disable and delete the router units vllm-fleet wrote that the fleet no longer has.

    + keep: the router units the fleet file declares for this host
    + unit_dir: where the units live (``/etc/systemd/system``)

    Only units carrying the router marker line are candidates (:class:`FleetRouterUnits`).

    **Example:**

    .. code:: python

        ops.undeclared_routers_removed(keep=["vllm-fleet-router-chat.service"],
                                       unit_dir="/etc/systemd/system")
    """
    undeclared = [u for u in host.get_fact(FleetRouterUnits, unit_dir=unit_dir) if u not in keep]
    if not undeclared:
        host.noop("no router units beyond those the fleet file declares")
        return
    for unit in undeclared:
        logger.warning(f"{host.print_prefix}{unit}: its endpoint is no longer in the fleet file "
                       "(or its router moved): stopping and removing it")
        yield StringCommand("systemctl", "disable", "--now", QuoteString(unit), "||", "true")
        yield StringCommand("rm", "-f", QuoteString(f"{unit_dir}/{unit}"))
    yield StringCommand("systemctl", "daemon-reload")
    yield StringCommand(
        "systemctl", "reset-failed", *[QuoteString(u) for u in undeclared], "2>/dev/null", "||",
        "true",
    )  # fmt: skip
