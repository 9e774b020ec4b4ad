"""An SSH local port forward to a server that listens on its host's loopback only.

vLLM servers of a fleet bind 127.0.0.1 on their host. To reach one from the control machine,
``ssh -N -L 127.0.0.1:LOCAL:127.0.0.1:PORT`` runs with the inventory's connection data (the same
user, port, key, known_hosts and strict host-key checking as every other SSH use of the fleet).
The tunnel is ready when its local port accepts connections; it is closed by the PID we started.

Example:
    >>> argv = forward_argv({"ssh_hostname": "10.0.0.21", "ssh_port": 22,
    ...     "ssh_user": "ubuntu"}, local_port=40001, remote_port=16000)
    >>> argv[argv.index("-L") + 1], argv[-1]
    ('127.0.0.1:40001:127.0.0.1:16000', 'ubuntu@10.0.0.21')
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from typing import Any

from cli.remote import ssh_destination, ssh_options


class TunnelError(RuntimeError):
    """The port forward could not be opened; the message carries ssh's own words."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now.

    Example:
        >>> 1024 <= free_port() <= 65535
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def forward_argv(
    data: dict[str, Any], local_port: int, remote_port: int, remote_host: str = "127.0.0.1"
) -> list[str]:
    """The ``ssh`` argv of a local forward 127.0.0.1:local_port → remote_host:remote_port.

    + data: the host's pyinfra connection data (``ssh_hostname``, ``ssh_port``, ``ssh_user``,
      ``ssh_key``, ``ssh_known_hosts_file``, ``ssh_strict_host_key_checking``)
    + local_port: port on the control machine's loopback
    + remote_port: the server's port on its host
    + remote_host: the address the server listens on, seen from its host
    """
    return [
        "ssh", "-N",
        *ssh_options(data),
        "-o", "ExitOnForwardFailure=yes",
        "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=3",
        "-L", f"127.0.0.1:{local_port}:{f'[{remote_host}]' if ':' in remote_host else remote_host}"
        f":{remote_port}",
        ssh_destination(data),
    ]


class Tunnel:
    """A running ``ssh -N -L`` process; use as a context manager.

    + data: the host's connection data (see :func:`forward_argv`)
    + remote_port: the server's port on its host
    + remote_host: the address the server listens on there

    Example (needs a reachable host, so not run here):
        with Tunnel(data, remote_port=16000) as local_port:
            urllib.request.urlopen(f"http://127.0.0.1:{local_port}/health")
    """

    def __init__(self, data: dict[str, Any], remote_port: int, remote_host: str = "127.0.0.1"):
        self.data = data
        self.remote_port = remote_port
        self.remote_host = remote_host
        self.local_port: int | None = None
        self.process: subprocess.Popen | None = None

    def open(self, timeout: float = 20.0, attempts: int = 3) -> int:
        """Start ssh and wait until the local port accepts connections; return that port."""
        message = ""
        for _ in range(attempts):
            port = free_port()
            self.process = subprocess.Popen(
                forward_argv(self.data, port, self.remote_port, self.remote_host),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    message = (self.process.stderr.read() if self.process.stderr else "").strip()
                    break
                with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", port), timeout=0.5
                ):
                    self.local_port = port
                    return port
                time.sleep(0.05)
            else:
                self.close()
                raise TunnelError(
                    f"ssh port forward to {self.data.get('ssh_hostname')} not ready after "
                    f"{timeout:.0f} s"
                )
            if "forward" not in message.lower() and "bind" not in message.lower():
                break  # not a lost race for the local port: retrying will not help
        self.close()
        raise TunnelError(
            f"ssh port forward to {self.data.get('ssh_hostname')}:{self.remote_port} failed: "
            f"{message or 'ssh exited'}"
        )

    def close(self) -> None:
        """Stop the ssh process we started (SIGTERM, then SIGKILL)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        if process.stderr:
            process.stderr.close()

    def __enter__(self) -> int:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
