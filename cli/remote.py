"""Reach fleet hosts with the system's ssh client, using the inventory's connection data.

Used by ``fleet verify`` (an ssh_config for testinfra) and ``fleet complete``.

Example:
    >>> print(ssh_config_entry("sandbox-1", {"ssh_hostname": "127.0.0.1", "ssh_port": 2222,
    ...     "ssh_user": "root"}))
    Host sandbox-1
      HostName 127.0.0.1
      Port 2222
      User root
      BatchMode yes
      StrictHostKeyChecking yes
    <BLANKLINE>
"""

from __future__ import annotations

import shlex
import subprocess
from typing import Any

from fleet.catalog.paths import program_command
from fleet.hostplan.emit import SshValue, ssh_value

#: The request program (hostside/request.py, uploaded by the services deploy) as a shell command:
#: a JSON payload {port, path, body, auth, env_file} on stdin, {"status", "body"} on stdout; the
#: API key is read on the host from the server's environment file, never put on a command line.
REQUEST_COMMAND = shlex.join(program_command("request"))


def ssh_config_entry(name: str, data: dict[str, Any]) -> str:
    """One ``Host`` block of an ssh_config for a host's pyinfra connection data.

    Every value is an emitted :class:`fleet.hostplan.emit.SshValue`
    (:func:`fleet.hostplan.emit.ssh_value`, which
    refuses what could start another directive: a ``ProxyCommand`` smuggled in with a line break
    would run on this machine); :func:`_directive` writes nothing else.
    """
    q = ssh_value
    lines = [
        _directive("Host", q(name), indent=""),
        _directive("HostName", q(data.get("ssh_hostname", name))),
        _directive("Port", q(data.get("ssh_port", 22))),
        _directive("User", q(data.get("ssh_user", "root"))),
        _directive("BatchMode", q("yes")),
    ]
    if data.get("ssh_key"):
        lines += [_directive("IdentityFile", q(data["ssh_key"])),
                  _directive("IdentitiesOnly", q("yes"))]
    if data.get("ssh_known_hosts_file"):
        lines.append(_directive("UserKnownHostsFile", q(data["ssh_known_hosts_file"])))
    strict = data.get("ssh_strict_host_key_checking", "yes")
    lines.append(_directive("StrictHostKeyChecking", q(strict)))
    return "\n".join(lines) + "\n"


def _directive(keyword: str, value: SshValue, indent: str = "  ") -> str:
    """One ssh_config line: a fixed keyword and an emitted value (a raw one is refused).

    Example:
        >>> _directive("Port", ssh_value(22))
        '  Port 22'
        >>> _directive("Port", "22")
        Traceback (most recent call last):
        ...
        TypeError: an ssh_config value must be made by fleet.hostplan.emit.ssh_value, not a raw str
    """
    if not isinstance(value, SshValue):
        raise TypeError(
            f"an ssh_config value must be made by fleet.hostplan.emit.ssh_value, not a raw "
            f"{type(value).__name__}"
        )
    return f"{indent}{keyword} {value.text}"


def ssh_options(data: dict[str, Any]) -> list[str]:
    """The ``ssh`` options every use of a host shares: port, batch mode, host-key checking, key.

    Example:
        >>> ssh_options({"ssh_port": 2222})
        ['-p', '2222', '-o', 'BatchMode=yes', '-o', 'StrictHostKeyChecking=yes']
    """
    options = [
        "-p", str(data.get("ssh_port", 22)),
        "-o", "BatchMode=yes",
        "-o", f"StrictHostKeyChecking={data.get('ssh_strict_host_key_checking', 'yes')}",
    ]
    if data.get("ssh_key"):
        options += ["-i", str(data["ssh_key"]), "-o", "IdentitiesOnly=yes"]
    if data.get("ssh_known_hosts_file"):
        options += ["-o", f"UserKnownHostsFile={data['ssh_known_hosts_file']}"]
    return options


def ssh_destination(data: dict[str, Any]) -> str:
    """``user@host`` of a host's connection data."""
    return f"{data.get('ssh_user', 'root')}@{data.get('ssh_hostname')}"


def ssh_command(data: dict[str, Any], command: str) -> list[str]:
    """The argv of ``ssh`` running ``command`` on a host (via sudo for a non-root user)."""
    if data.get("ssh_user", "root") != "root":
        command = f"sudo -n sh -c {_sh_quote(command)}"
    return ["ssh", *ssh_options(data), ssh_destination(data), command]


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def run(data: dict[str, Any], command: str, stdin: str = "", timeout: float = 300):
    """Run ``command`` on the host; return the CompletedProcess (text)."""
    return subprocess.run(
        ssh_command(data, command),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
