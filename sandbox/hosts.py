"""Sandbox hosts: Debian systemd containers on this machine, reached over real SSH.

Tests and the quick start deploy to these hosts exactly as to a remote server. This module is
their lifecycle as callers use it: :func:`up` (preconditions, the base image, stale state
cleaned, ports checked, containers booted until SSH works, all rolled back on a failure),
:func:`down`, :func:`status`, and how to reach a running host (:func:`connection` for pyinfra,
:func:`ssh_argv`). The parts, one job each:

- :mod:`sandbox.image`: the Debian image, built once with ``mmdebstrap`` from the machine's own
  apt sources and CA certificates, cached in ``IMAGE_DIR``;
- :mod:`sandbox.containers`: one host's ``systemd-nspawn`` over an overlay whose upper layer
  (everything a deploy installs) lives under ``SANDBOX_DIR``/<name>/, its own cgroups, stopped
  by PID and thrown away by :func:`down`;
- :mod:`sandbox.state`: what a host left on disk (``state.json``, PID file) and what it says;
- :mod:`sandbox.ports`: the shared network's ports (sshd from 2222 up, declared ones free);
- :mod:`sandbox.keys`: one client key pair and one strict known_hosts file for all hosts;
- :mod:`sandbox.pipbinds`: this machine's pip configuration, bound read-only at its paths;
- :mod:`sandbox.system`: root and tool checks, locks, mounts, commands, :class:`SandboxError`.

Example:
    from sandbox import hosts as sandbox
    [h.state for h in sandbox.up({"gpu-a": [18000], "gpu-b": [18001]})]
    # → ['running', 'running']
    sandbox.connection("gpu-a")["ssh_port"]
    # → 2222
    [h.state for h in sandbox.down(["gpu-a", "gpu-b"])]
    # → ['absent', 'absent']
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from sandbox import containers, image, keys, ports, state, system
from sandbox.state import SandboxHost
from sandbox.system import SandboxError

log = logging.getLogger(__name__)



def up(
    hosts: dict[str, list[int]], seeds: dict[str, dict[str, Path]] | None = None
) -> list[SandboxHost]:
    """Start the given sandbox hosts (idempotent) and return their state once SSH works.

    A running host is left alone; a stopped one (its process gone) is cleaned up and started
    fresh. Before starting, every declared service port and the chosen sshd port must be free;
    a taken port raises :class:`SandboxError` naming the process that holds it.

    + hosts: host name -> its service ports
    + seeds: host name -> folders a host that starts now is born with (path on the host ->
      folder copied there before it boots; e.g. the tests' second vLLM host gets the vLLM venv
      a deploy installed on the first, which its own deploy then finds correct)

    Example:
        up({"gpu-a": [18000, 18001]})
        # → [SandboxHost(name='gpu-a', state='running', ssh_port=2222, pid=4242,
        #                ports=[18000, 18001])]
    """
    for name in hosts:
        state.check_name(name)
    system.require_root()
    system.require_tools("systemd-nspawn", "mmdebstrap", "ssh", "ssh-keygen", "ss")
    containers.require_overlayfs()
    base = image.build_image()
    state.SANDBOX_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    with system.lock(state.SANDBOX_DIR / ".lock"):
        keys.ensure_client_key()
        current = {name: state.host_status(name) for name in hosts}
        for name, host in current.items():
            if host.state == "stopped":
                log.info("%s: stale state (process gone), cleaning up", name)
                containers.teardown(name)
        to_start = {
            n: list(dict.fromkeys(p)) for n, p in hosts.items() if current[n].state != "running"
        }
        if to_start:
            ports.check_ports(to_start)
            started: list[str] = []
            try:
                procs = {}
                reserved = {p for declared in to_start.values() for p in declared}
                for name, declared in to_start.items():
                    started.append(name)
                    procs[name] = containers.start(
                        name, declared, base, reserved, (seeds or {}).get(name)
                    )
                for name, proc in procs.items():
                    containers.wait_ready(name, proc)
                    (state.SANDBOX_DIR / f"{name}.failed.log").unlink(missing_ok=True)
            except BaseException:
                for name in started:
                    console = state.host_dir(name) / "console.log"
                    if console.is_file():
                        shutil.copyfile(console, state.SANDBOX_DIR / f"{name}.failed.log")
                    containers.teardown(name)
                raise
    return status(list(hosts))


def down(names: list[str]) -> list[SandboxHost]:
    """Stop the given sandbox hosts and delete their state (idempotent).

    Only the systemd-nspawn process we started (checked by PID and command line) is signalled:
    SIGTERM (orderly shutdown), SIGKILL after ~15 s; then whatever is left in the host's own
    cgroups is killed, the cgroups removed, the overlay unmounted and the host's folder (with
    everything installed on it) deleted, so the next :func:`up` gives a fresh host.

    + names: host names; absent ones are fine

    Example:
        down(["gpu-a"])
        # → [SandboxHost(name='gpu-a', state='absent', ssh_port=None, pid=None, ports=[])]
    """
    for name in names:
        state.check_name(name)
    system.require_root()
    if state.SANDBOX_DIR.is_dir():
        with system.lock(state.SANDBOX_DIR / ".lock"):
            for name in names:
                containers.teardown(name)
    else:
        for name in names:
            containers.remove_cgroups(name)
    return status(names)


def status(names: list[str]) -> list[SandboxHost]:
    """Report the state of the given sandbox hosts, without changing anything.

    + names: host names

    Example:
        status(["gpu-a", "nope"])
        # → [SandboxHost(name='gpu-a', state='running', ssh_port=2222, pid=4242, ports=[18000]),
        # →  SandboxHost(name='nope', state='absent', ssh_port=None, pid=None, ports=[])]
    """
    for name in names:
        state.check_name(name)
    return [state.host_status(name) for name in names]


def connection(name: str) -> dict | None:
    """pyinfra host data to reach a running sandbox host over SSH, else None.

    + name: host name

    Example:
        connection("gpu-a")
        # → {'ssh_hostname': '127.0.0.1', 'ssh_port': 2222, 'ssh_user': 'root',
        # →  'ssh_key': '/var/lib/vllm-fleet/sandbox/id_ed25519',
        # →  'ssh_known_hosts_file': '/var/lib/vllm-fleet/sandbox/known_hosts',
        # →  'ssh_strict_host_key_checking': 'yes'}
    """
    host = status([name])[0]
    if host.state != "running":
        return None
    return {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": host.ssh_port,
        "ssh_user": "root",
        "ssh_key": str(keys.client_key()),
        "ssh_known_hosts_file": str(keys.known_hosts()),
        "ssh_strict_host_key_checking": "yes",
    }


def ssh_argv(name: str, command: str) -> list[str]:
    """The ``ssh`` command line that runs ``command`` as root on a running sandbox host.

    + name: host name
    + command: shell command to run there

    Example:
        argv = ssh_argv("gpu-a", "hostname")
        subprocess.run(argv, capture_output=True, text=True).stdout
        # → 'gpu-a\\n'
    """
    host = status([name])[0]
    if host.ssh_port is None:
        raise SandboxError(f"sandbox host {name} is absent; start it with `fleet sandbox up`")
    return keys.ssh_argv(host.ssh_port, command)


if __name__ == "__main__":  # manual testing: python -m sandbox.hosts up a=18000,18001 b
    import sys

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    verb, args = sys.argv[1], sys.argv[2:]
    try:
        if verb == "up":
            spec = {}
            for arg in args:
                name, _, ports = arg.partition("=")
                spec[name] = [int(p) for p in ports.split(",") if p]
            result = up(spec)
        elif verb == "down":
            result = down(args or state.list_hosts())
        elif verb == "image":
            print(image.build_image(force="--force" in args))
            sys.exit(0)
        else:
            result = status(args or state.list_hosts())
    except SandboxError as exc:
        sys.exit(f"error: {exc}")
    for h in result:
        print(f"{h.name}\t{h.state}\tssh={h.ssh_port}\tpid={h.pid}\tports={h.ports}")
