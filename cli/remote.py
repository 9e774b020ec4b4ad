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

from fleet.paths import program_command
from fleet.quoting import ssh_config_value

#: The request program (hostside/request.py, uploaded by the services deploy) as a shell command:
#: a JSON payload {port, path, body, auth, env_file} on stdin, {"status", "body"} on stdout; the
#: API key is read on the host from the server's environment file, never put on a command line.
REQUEST_COMMAND = shlex.join(program_command("request"))


def ssh_config_entry(name: str, data: dict[str, Any]) -> str:
    """One ``Host`` block of an ssh_config for a host's pyinfra connection data.

    Every value goes through :func:`fleet.quoting.ssh_config_value`, which refuses what could
    start another directive (a ``ProxyCommand`` smuggled in with a line break would run on this
    machine).
    """
    q = ssh_config_value
    lines = [
        f"Host {q(name)}",
        f"  HostName {q(data.get('ssh_hostname', name))}",
        f"  Port {q(data.get('ssh_port', 22))}",
        f"  User {q(data.get('ssh_user', 'root'))}",
        "  BatchMode yes",
    ]
    if data.get("ssh_key"):
        lines += [f"  IdentityFile {q(data['ssh_key'])}", "  IdentitiesOnly yes"]
    if data.get("ssh_known_hosts_file"):
        lines.append(f"  UserKnownHostsFile {q(data['ssh_known_hosts_file'])}")
    strict = data.get("ssh_strict_host_key_checking", "yes")
    lines.append(f"  StrictHostKeyChecking {q(strict)}")
    return "\n".join(lines) + "\n"


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
