"""Operations of vLLM servers: keep the last working configuration, check flags with the
installed vLLM, restart or restore, check readiness, retire servers taken out of the fleet.

Example:
    from operations import services
    services.server_answers(name="Check tiny", port=18000, served_name="tiny", ...)
"""

from __future__ import annotations

import hashlib

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import Sha256File

from facts.host import FleetServerUnits
from fleet.catalog.paths import env_path, previous_paths, unit_path
from hostside.validate_args import exec_start


@operation()
def previous_saved(path: str, text: str, backup: str):
    """Save the current copy of a file before a new text replaces it (for restore on failure).

    + path: the live file
    + text: the text about to be written there
    + backup: where to keep the current copy (its folder must exist)

    **Example:**

    .. code:: python

        ops.previous_saved(path="/etc/systemd/system/vllm-chat.service", text=unit_text,
                           backup="/var/lib/vllm-fleet/previous/vllm-chat.service")
    """
    current = host.get_fact(Sha256File, path=path)
    wanted = hashlib.sha256(text.encode()).hexdigest()
    if current is None or current == wanted:
        host.noop(f"{path} is unchanged or new: nothing to save")
        return
    yield StringCommand("cp", "-p", QuoteString(path), QuoteString(backup))


@operation(is_idempotent=False)
def server_restarted(unit: str, restore: dict[str, str], script: str):
    """Restart a unit; if it fails, restore the saved files and start the previous service.

    + unit: the systemd unit
    + restore: live path → saved copy (from previous_saved)
    + script: the host-side restart_or_restore.py

    **Example:**

    .. code:: python

        ops.server_restarted(unit="vllm-chat.service", restore={unit_path: backup},
                             script="/usr/local/lib/vllm-fleet/restart_or_restore.py",
                             _if=any_changed(unit_op, env_op))
    """
    pairs = [QuoteString(f"{live}={saved}") for live, saved in sorted(restore.items())]
    restore_args: list[object] = []
    for pair in pairs:
        restore_args += ["--restore", pair]
    yield StringCommand("python3", QuoteString(script), "--unit", QuoteString(unit), *restore_args)


def _exec_start(unit_text: str) -> str:
    """The ExecStart= value of a unit's text (:func:`hostside.validate_args.exec_start`, the
    reader the host-side check uses too), or ValueError when there is none."""
    line = exec_start(unit_text)
    if not line:
        raise ValueError("the unit has no ExecStart= line")
    return line


@operation()
def server_args_valid(unit: str, unit_path: str, unit_text: str, python: str, script: str):
    """Check a server's command line with the installed vLLM's parser, before its unit is written.

    + unit: the unit's name (for messages)
    + unit_path: where the unit is written
    + unit_text: the unit about to be written; its ExecStart= is what vLLM parses
    + python: the venv's interpreter, so the vLLM that will serve is the one that checks
    + script: the host-side check (validate_args.py)

    Runs only when the unit would change (an unchanged unit was checked when it was written, and
    importing vLLM takes seconds); a rejected line fails the host with vLLM's own message, so the
    unit is not written and the running server keeps its old one.

    **Example:**

    .. code:: python

        ops.server_args_valid(unit="vllm-chat.service",
                              unit_path="/etc/systemd/system/vllm-chat.service",
                              unit_text=unit_text, python="/opt/vllm-fleet/venv/bin/python",
                              script="/usr/local/lib/vllm-fleet/validate_args.py")
    """
    current = host.get_fact(Sha256File, path=unit_path)
    if current == hashlib.sha256(unit_text.encode()).hexdigest():
        host.noop(f"{unit} is unchanged: vLLM checked its flags when it was written")
        return
    yield StringCommand(
        QuoteString(python), QuoteString(script), "--name", QuoteString(unit),
        "--exec-start", QuoteString(_exec_start(unit_text)),
    )


@operation(is_idempotent=False)
def server_answers(url: str, served_name: str, env_file: str, script: str, python: str,
                   tls: list[str] | None = None):
    """Check that a server answers a real completion (readiness, beyond /health).

    + url: the server's base URL as the plan reaches it on its host (``ServerUnit.url``,
      ``RouterUnit.url``: scheme, address, port)
    + served_name: the model name clients ask for
    + env_file: the server's environment file (for its API key, read on the host)
    + script: the host-side check (check_ready.py)
    + python: interpreter to run it with
    + tls: an https server's trust words (``Reach.probe_args``: ``--cafile F --tls-name N``)

    **Example:**

    .. code:: python

        ops.server_answers(url="http://127.0.0.1:18000", served_name="tiny",
                           env_file="/etc/vllm-fleet/tiny.env",
                           script="/usr/local/lib/vllm-fleet/check_ready.py",
                           python="/opt/vllm-fleet/venv/bin/python",
                           _if=unit_changed.did_change)
    """
    yield StringCommand(
        QuoteString(python), QuoteString(script),
        "--url", QuoteString(url), "--model", QuoteString(served_name),
        "--env-file", QuoteString(env_file), *(QuoteString(word) for word in tls or []),
    )


def server_name_of(unit: str) -> str:
    """The fleet server name of a unit: ``vllm-chat.service`` → ``chat``.

    Example:
        >>> server_name_of("vllm-chat.service")
        'chat'
    """
    return unit.removeprefix("vllm-").removesuffix(".service")


@operation()
def undeclared_servers_removed(keep: list[str], unit_dir: str):
    """Stop, disable and delete the server units vllm-fleet wrote that the fleet no longer has.

    + keep: the units the fleet file declares for this host
    + unit_dir: where the units live (``/etc/systemd/system``); each unit's files (its
      environment, its saved previous copies) are where :mod:`fleet.catalog.paths` puts them

    Only units carrying vllm-fleet's marker line are candidates (:class:`FleetServerUnits`):
    a ``vllm-*.service`` written by hand is never touched. Runs before any declared server is
    (re)started, so a renamed server or a new server on a freed port finds its port and GPU
    memory free.

    **Example:**

    .. code:: python

        ops.undeclared_servers_removed(keep=["vllm-chat.service"],
                                       unit_dir="/etc/systemd/system")
    """
    undeclared = [u for u in host.get_fact(FleetServerUnits, unit_dir=unit_dir) if u not in keep]
    if not undeclared:
        host.noop("no server units beyond those the fleet file declares")
        return
    for unit in undeclared:
        name = server_name_of(unit)
        logger.warning(
            f"{host.print_prefix}{unit}: server {name!r} is no longer in the fleet file: "
            "stopping and removing it"
        )
        yield StringCommand("systemctl", "disable", "--now", QuoteString(unit), "||", "true")
        yield StringCommand(
            "rm", "-f", *(QuoteString(path) for path in (
                unit_path(name), env_path(name), *previous_paths(name))),
        )  # fmt: skip
    yield StringCommand("systemctl", "daemon-reload")
    yield StringCommand(
        "systemctl", "reset-failed", *[QuoteString(u) for u in undeclared], "2>/dev/null", "||",
        "true",
    )  # fmt: skip
