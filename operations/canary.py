"""The canary gate of a rolling update, inside :func:`operations.endpoints.roll`.

The first replica of an endpoint with ``rollout.canary`` that rolls in a pyinfra run is its
canary: its previous configuration is kept past the restart (:mod:`hostside.canary_saved`),
then, once it is ready and before it goes back into the router, the router's host measures it
against a replica still on the old configuration (:mod:`hostside.canary`). Passed: the kept
copies go and the rollout goes on. Slower beyond a margin (or not measurable): the replica is
rolled back to its previous configuration and the endpoint's rollout stops.

Example:
    from operations.canary import canary_commands
    commands = canary_commands(rollout, label, unit, url, served_name, env_file, pairs)
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api import QuoteString, StringCommand

from fleet.catalog.paths import remote_program
from fleet.hostplan.types import ReplicaRollout

#: Endpoints whose canary ran (or was skipped) during this pyinfra run: the next replicas roll
#: without one.
DONE: set[str] = set()


@dataclass(frozen=True)
class CanaryCommands:
    """What the gate runs: on the replica's host (keep, forget, rollback), on the router's
    host (measure)."""

    keep: StringCommand
    forget: StringCommand
    rollback: StringCommand
    measure: StringCommand


def canary_commands(
    rollout: ReplicaRollout,
    label: str,
    unit: str,
    url: str,
    served_name: str,
    env_file: str,
    pairs: list[object],
) -> CanaryCommands | None:
    """The gate's commands for a replica whose endpoint has a canary (None otherwise).

    + url: the replica's base URL on its host (its rollback's readiness check)
    + pairs: the ``--restore LIVE=SAVED`` arguments of the replica's update
    """
    canary = rollout.canary
    if canary is None:
        return None
    saved = ["python3", QuoteString(remote_program("canary_saved"))]
    olds: list[object] = []
    for ref, old_url in canary.baselines:
        olds += ["--old", QuoteString(f"{rollout.endpoint}/{ref}={old_url}")]
    rollback = [
        *saved, "rollback", "--label", QuoteString(label), "--unit", QuoteString(unit),
        "--url", QuoteString(url), "--model", QuoteString(served_name),
        "--env-file", QuoteString(env_file), *pairs,
    ]  # fmt: skip
    measure = [
        "python3", QuoteString(remote_program("canary")), "--label", QuoteString(label),
        "--new", QuoteString(rollout.worker_url), *olds,
        "--model", QuoteString(served_name), "--key-file", QuoteString(canary.key_file),
        "--requests", str(canary.requests), "--input-len", str(canary.input_len),
        "--output-len", str(canary.output_len), "--seed", str(canary.seed),
        "--ttft-margin", str(canary.ttft_margin), "--tpot-margin", str(canary.tpot_margin),
        "--floor-ms", str(canary.floor_ms),
    ]  # fmt: skip
    return CanaryCommands(
        keep=StringCommand(*saved, "keep", *pairs),
        forget=StringCommand(*saved, "forget", *pairs),
        rollback=StringCommand(*rollback),
        measure=StringCommand(*measure),
    )


def goes_first(rollout: ReplicaRollout, commands: CanaryCommands | None) -> bool:
    """Whether this replica is its endpoint's canary in this run (and records that it is)."""
    if commands is None or rollout.endpoint in DONE:
        return False
    DONE.add(rollout.endpoint)
    return True


def decision_words(lines: list[str]) -> str:
    """The canary's decision from its output lines (its last ``canary:`` line, less the stamp).

    Example:
        >>> decision_words(["canary: 10:00:00.000 t/a/x (new configuration): TTFT P50 9 ms",
        ...                 "canary: 10:00:00.100 t/a/x: failed: TTFT P50 40.0 ms against 9 ms"])
        'failed: TTFT P50 40.0 ms against 9 ms'
    """
    for line in reversed(lines):
        if line.startswith("canary: "):
            return line.split(": ", 2)[-1] if line.count(": ") >= 2 else line
    return "no answer from the canary"
