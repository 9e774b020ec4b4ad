"""Sandbox hosts: Debian systemd containers on this machine, reached over real SSH.

Tests and the quick start deploy to these hosts exactly as to a remote server. One Debian root
filesystem (the *image*) is built once with ``mmdebstrap`` from the machine's own Debian apt
sources and cached in :data:`IMAGE_DIR`. Each host boots that image with ``systemd-nspawn``
through an on-disk overlay whose upper layer (everything a deploy installs) lives under
:data:`SANDBOX_DIR`/<name>/ and is thrown away by :func:`down`.

Hosts share the machine's network: each one gets its own sshd port on 127.0.0.1 (from 2222 up)
and declares its service ports, which must be free. One client key pair and one known_hosts
file (seeded from the image's host keys, strict checking on) serve all hosts. The host's pip
configuration (config files, find-links folders, ``file://`` indexes, constraint files) is bound
read-only at the same paths, the way real sites reach an internal mirror; the host's CA
certificates are copied into the image at build time.

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

import configparser
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)

#: Per-host state (overlay upper/work dirs, console log, PID file) and the client key pair.
SANDBOX_DIR = Path(os.environ.get("FLEET_SANDBOX_DIR", "/var/lib/vllm-fleet/sandbox"))
#: Cached base image(s), one folder per recipe hash.
IMAGE_DIR = Path(os.environ.get("FLEET_IMAGE_DIR", "/var/cache/vllm-fleet/images"))

#: Debian release of the image.
SUITE = "bookworm"
#: Packages on top of ``--variant=minbase``: what a minimal cloud server has, nothing more
#: (deploys install the rest through apt, as on a real host).
IMAGE_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "sudo",
    "iproute2",
    "curl",
    "ca-certificates",
)
#: Units that make no sense in a container or would race a deploy for the dpkg lock.
MASKED_UNITS = (
    "console-getty.service",
    "getty@.service",
    "systemd-networkd-wait-online.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
)
#: Bump when the build steps below change in a way the other recipe inputs do not show.
RECIPE_VERSION = 1

SSH_PORT_FIRST = 2222
SSH_PORT_LAST = 2999
BOOT_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
CGROUP_PREFIX = "vllm-fleet-"
SSHD_DROPIN = "/etc/ssh/sshd_config.d/50-fleet.conf"

_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9._-]{0,46}[a-z0-9])?")
_PEM_RE = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)
_TOOLS = {  # binary -> Debian package that provides it
    "systemd-nspawn": "systemd-container",
    "mmdebstrap": "mmdebstrap",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "ss": "iproute2",
}
#: Nspawn processes started by this Python process, kept so that they can be reaped.
_CHILDREN: dict[int, subprocess.Popen] = {}


class SandboxError(Exception):
    """A sandbox operation failed; the message says what to do about it."""


@dataclass
class SandboxHost:
    """The state of one sandbox host.

    + name: host name (also the container's hostname and machine name)
    + state: ``"running"``, ``"stopped"`` (state left behind, process gone) or ``"absent"``
    + ssh_port: sshd port on 127.0.0.1, None when absent
    + pid: PID of the systemd-nspawn process we started, None unless running
    + ports: service ports declared for the host (informational)

    Example:
        SandboxHost("gpu-a", "running", 2222, 4242, [18000])
        # → SandboxHost(name='gpu-a', state='running', ssh_port=2222, pid=4242, ports=[18000])
    """

    name: str
    state: str
    ssh_port: int | None
    pid: int | None
    ports: list[int] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def build_image(*, force: bool = False) -> Path:
    """Build the base image if it is missing, or its recipe changed, and return its folder.

    The recipe hash covers the package list, masked units, the Debian apt sources and the host's
    CA certificates, so any change there yields a new image folder; older ones stay until no
    sandbox uses them (remove them by hand). Takes ~30 s when it builds.

    + force: rebuild even if an image with the current recipe exists (refused while in use)

    Example:
        build_image()
        # → PosixPath('/var/cache/vllm-fleet/images/debian-bookworm-3f2a9c01d4e5')
    """
    _require_root()
    _require_tools("mmdebstrap")
    recipe = _recipe()
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    image = IMAGE_DIR / f"debian-{SUITE}-{digest}"
    IMAGE_DIR.mkdir(parents=True, exist_ok=True)
    with _lock(IMAGE_DIR / ".lock"):
        if image.is_dir() and not force:
            return image
        if image.is_dir():
            users = _overlays_using(image)
            if users:
                raise SandboxError(
                    f"image {image} is in use by {len(users)} sandbox overlay(s) "
                    f"({', '.join(users)}); run `fleet sandbox down` first, then rebuild"
                )
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".build-{digest}-", dir=IMAGE_DIR))
        try:
            _mmdebstrap(tmp, recipe)
            _customize_image(tmp)
            if image.is_dir():
                old = Path(tempfile.mkdtemp(prefix=f".old-{digest}-", dir=IMAGE_DIR))
                image.rename(old / "root")
                _safe_rmtree(old)
            tmp.rename(image)
        except BaseException:
            _safe_rmtree(tmp)
            raise
        (IMAGE_DIR / f"{image.name}.recipe.json").write_text(json.dumps(recipe, indent=2))
        log.info("built %s in %.1f s", image, time.monotonic() - started)
        return image


def up(hosts: dict[str, list[int]]) -> list[SandboxHost]:
    """Start the given sandbox hosts (idempotent) and return their state once SSH works.

    A running host is left alone; a stopped one (its process gone) is cleaned up and started
    fresh. Before starting, every declared service port and the chosen sshd port must be free;
    a taken port raises :class:`SandboxError` naming the process that holds it.

    + hosts: host name -> its service ports

    Example:
        up({"gpu-a": [18000, 18001]})
        # → [SandboxHost(name='gpu-a', state='running', ssh_port=2222, pid=4242,
        #                ports=[18000, 18001])]
    """
    for name in hosts:
        _check_name(name)
    _require_root()
    _require_tools("systemd-nspawn", "mmdebstrap", "ssh", "ssh-keygen", "ss")
    _require_overlayfs()
    image = build_image()
    SANDBOX_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _lock(SANDBOX_DIR / ".lock"):
        _ensure_client_key()
        current = {name: _status_one(name) for name in hosts}
        for name, host in current.items():
            if host.state == "stopped":
                log.info("%s: stale state (process gone), cleaning up", name)
                _teardown(name)
        to_start = {
            n: list(dict.fromkeys(p)) for n, p in hosts.items() if current[n].state != "running"
        }
        if to_start:
            _check_ports(to_start)
            started: list[str] = []
            try:
                procs = {}
                reserved = {p for ports in to_start.values() for p in ports}
                for name, ports in to_start.items():
                    started.append(name)
                    procs[name] = _start(name, ports, image, reserved)
                for name, proc in procs.items():
                    _wait_ready(name, proc)
                    (SANDBOX_DIR / f"{name}.failed.log").unlink(missing_ok=True)
            except BaseException:
                for name in started:
                    console = _host_dir(name) / "console.log"
                    if console.is_file():
                        shutil.copyfile(console, SANDBOX_DIR / f"{name}.failed.log")
                    _teardown(name)
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
        _check_name(name)
    _require_root()
    if SANDBOX_DIR.is_dir():
        with _lock(SANDBOX_DIR / ".lock"):
            for name in names:
                _teardown(name)
    else:
        for name in names:
            _remove_cgroups(name)
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
        _check_name(name)
    return [_status_one(name) for name in names]


def list_hosts() -> list[str]:
    """Names of the sandbox hosts that have state under :data:`SANDBOX_DIR`, sorted.

    Example:
        list_hosts()
        # → ['gpu-a', 'gpu-b']
    """
    if not SANDBOX_DIR.is_dir():
        return []
    return sorted(p.parent.name for p in SANDBOX_DIR.glob("*/state.json"))


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
        "ssh_key": str(SANDBOX_DIR / "id_ed25519"),
        "ssh_known_hosts_file": str(SANDBOX_DIR / "known_hosts"),
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
    return _ssh_argv(host.ssh_port, command)


# --------------------------------------------------------------------------------------------
# Preconditions
# --------------------------------------------------------------------------------------------


def _check_name(name: str) -> None:
    if not _NAME_RE.fullmatch(name) or ".." in name:
        raise SandboxError(
            f"invalid sandbox host name {name!r}: use lowercase letters, digits, '-', '.', '_' "
            "(at most 48, starting and ending with a letter or digit)"
        )


def _require_root() -> None:
    if os.geteuid() != 0:
        raise SandboxError(
            "sandbox hosts need root (overlay mounts, cgroups, systemd-nspawn); run as root, "
            "e.g. `sudo fleet sandbox up`"
        )


def _require_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        packages = " ".join(dict.fromkeys(_TOOLS[t] for t in missing))
        raise SandboxError(
            f"missing {', '.join(missing)}: install with `apt-get install {packages}`"
        )


def _require_overlayfs() -> None:
    if "overlay" not in Path("/proc/filesystems").read_text().split():
        subprocess.run(["modprobe", "overlay"], capture_output=True)
        if "overlay" not in Path("/proc/filesystems").read_text().split():
            raise SandboxError("the kernel lacks overlayfs: load it with `modprobe overlay`")


# --------------------------------------------------------------------------------------------
# Image
# --------------------------------------------------------------------------------------------


def _recipe() -> dict:
    """Everything the image depends on; its hash names the image folder."""
    ca = hashlib.sha256()
    for pem in _host_ca_certs():
        ca.update(pem.encode())
    return {
        "version": RECIPE_VERSION,
        "suite": SUITE,
        "packages": list(IMAGE_PACKAGES),
        "masked": list(MASKED_UNITS),
        "sources": _debian_sources(),
        "host_ca_sha256": ca.hexdigest(),
    }


def _debian_sources() -> str:
    """The machine's Debian apt sources for :data:`SUITE`, as deb822 (third-party ones dropped).

    Falls back to deb.debian.org when the machine has none for that release.
    """
    stanzas: list[dict[str, str]] = []
    apt = Path("/etc/apt")
    for path in sorted(apt.glob("sources.list.d/*.sources")):
        for block in re.split(r"\n\s*\n", path.read_text()):
            fields: dict[str, str] = {}
            for line in block.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if fields.get("enabled", "yes").lower() != "no":
                stanzas.append(fields)
    for path in [apt / "sources.list", *sorted(apt.glob("sources.list.d/*.list"))]:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            options = ""
            if len(words) > 1 and words[1].startswith("["):
                end = next(i for i, w in enumerate(words) if w.endswith("]"))
                options = " ".join(words[1 : end + 1]).strip("[]")
                words = [words[0], *words[end + 1 :]]
            if len(words) < 3:
                continue
            stanza = {"types": words[0], "uris": words[1], "suites": words[2]}
            stanza["components"] = " ".join(words[3:])
            match = re.search(r"signed-by=(\S+)", options)
            if match:
                stanza["signed-by"] = match.group(1)
            stanzas.append(stanza)
    out = []
    for s in stanzas:
        host = urlparse(s.get("uris", "").split()[0] if s.get("uris") else "").hostname or ""
        debian = host == "debian.org" or host.endswith(".debian.org")
        debian = debian or "debian-archive-keyring" in s.get("signed-by", "")
        suites = [x for x in s.get("suites", "").split() if x.split("-")[0] == SUITE]
        if not debian or "deb" not in s.get("types", "").split() or not suites:
            continue
        lines = ["Types: deb", f"URIs: {s['uris']}", f"Suites: {' '.join(suites)}"]
        lines.append(f"Components: {s.get('components') or 'main'}")
        if s.get("signed-by"):
            lines.append(f"Signed-By: {s['signed-by']}")
        out.append("\n".join(lines) + "\n")
    if not out:
        out = [
            f"Types: deb\nURIs: http://deb.debian.org/debian\nSuites: {SUITE} {SUITE}-updates\n"
            "Components: main\n",
            f"Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: {SUITE}-security\n"
            "Components: main\n",
        ]
    return "\n".join(out)


def _host_ca_certs() -> list[str]:
    """PEM certificates this machine trusts: its bundle plus /usr/local/share/ca-certificates."""
    paths = [Path("/etc/ssl/certs/ca-certificates.crt")]
    paths += sorted(Path("/usr/local/share/ca-certificates").rglob("*.crt"))
    certs: dict[str, None] = {}
    for path in paths:
        if path.is_file():
            certs.update(dict.fromkeys(_PEM_RE.findall(path.read_text(errors="replace"))))
    return list(certs)


def _mmdebstrap(target: Path, recipe: dict) -> None:
    with tempfile.TemporaryDirectory(prefix="fleet-apt-") as tmp:
        sources = Path(tmp) / "debian.sources"
        sources.write_text(recipe["sources"])
        argv = [
            "mmdebstrap",
            "--mode=root",
            "--variant=minbase",
            f"--include={','.join(recipe['packages'])}",
            SUITE,
            str(target),
            str(sources),
        ]
        logfile = IMAGE_DIR / f"{target.name}.log"
        with logfile.open("w") as out:
            rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            raise SandboxError(
                f"mmdebstrap failed (exit {rc}); last lines of {logfile}:\n{_tail(logfile)}"
            )
        logfile.unlink()


def _customize_image(root: Path) -> None:
    """Host CAs, host keys, ssh enabled, units masked, no host-specific names left."""
    # Certificates this machine trusts that the fresh image lacks (e.g. a TLS-inspecting
    # proxy's CA): copied in, not bound, so that later ca-certificates upgrades work.
    bundle = root / "etc/ssl/certs/ca-certificates.crt"
    have = {re.sub(r"\s", "", c) for c in _PEM_RE.findall(bundle.read_text())}
    extra = [c for c in _host_ca_certs() if re.sub(r"\s", "", c) not in have]
    local = root / "usr/local/share/ca-certificates"
    local.mkdir(parents=True, exist_ok=True)
    for pem in extra:
        name = f"fleet-host-{hashlib.sha256(pem.encode()).hexdigest()[:16]}.crt"
        (local / name).write_text(pem + "\n")
    if extra:
        _run(["chroot", str(root), "update-ca-certificates"])
    _run(["chroot", str(root), "ssh-keygen", "-A"])
    units = root / "etc/systemd/system"
    wants = units / "multi-user.target.wants" / "ssh.service"
    if not wants.is_symlink():
        wants.parent.mkdir(parents=True, exist_ok=True)
        wants.symlink_to("/lib/systemd/system/ssh.service")
    for unit in MASKED_UNITS:
        for link in units.glob(f"*.wants/{unit.replace('@.', '@*.')}"):
            link.unlink()
        target = units / unit
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to("/dev/null")
    # Per-host files, written into each overlay by _start(); the build machine's name must
    # not leak into containers.
    for path in ("etc/hostname", "etc/machine-id"):
        (root / path).write_text("")
    log.info("image: %d extra CA certificate(s) from the host", len(extra))


def _overlays_using(image: Path) -> list[str]:
    return [
        m["target"]
        for m in _mounts()
        if m["fstype"] == "overlay" and f"lowerdir={image}" in m["options"]
    ]


# --------------------------------------------------------------------------------------------
# Per host
# --------------------------------------------------------------------------------------------


def _host_dir(name: str) -> Path:
    return SANDBOX_DIR / name


def _read_state(name: str) -> dict | None:
    try:
        return json.loads((_host_dir(name) / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _read_pid(name: str) -> int | None:
    try:
        return int((_host_dir(name) / "nspawn.pid").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _status_one(name: str) -> SandboxHost:
    if not _host_dir(name).is_dir():
        return SandboxHost(name, "absent", None, None, [])
    state = _read_state(name) or {}
    pid = _read_pid(name)
    running = pid is not None and _is_our_nspawn(pid, name)
    return SandboxHost(
        name,
        "running" if running else "stopped",
        state.get("ssh_port"),
        pid if running else None,
        list(state.get("ports", [])),
    )


def _is_our_nspawn(pid: int, name: str) -> bool:
    """True if ``pid`` is alive and is the systemd-nspawn we started for ``name``."""
    _reap(pid)
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    merged = str(_host_dir(name) / "merged").encode()
    return (
        bool(argv)
        and os.path.basename(argv[0]) == b"systemd-nspawn"
        and f"--machine={name}".encode() in argv
        and b"--directory=" + merged in argv
    )


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is an exited child of this process (else it lingers as a zombie)."""
    proc = _CHILDREN.get(pid)
    if proc is not None:
        if proc.poll() is not None:
            del _CHILDREN[pid]
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _ports_in_use_by_sandboxes(exclude: set[str]) -> dict[int, str]:
    """Ports (ssh and declared) of every sandbox host with state, except ``exclude``."""
    used: dict[int, str] = {}
    for other in list_hosts():
        if other in exclude:
            continue
        state = _read_state(other) or {}
        for port in [state.get("ssh_port"), *state.get("ports", [])]:
            if port:
                used[int(port)] = other
    return used


def _check_ports(hosts: dict[str, list[int]]) -> None:
    """Refuse declared ports that collide with each other, other sandboxes, or live sockets."""
    owners = _ports_in_use_by_sandboxes(set(hosts))
    for name, ports in hosts.items():
        for port in ports:
            if not 1 <= port <= 65535:
                raise SandboxError(f"port {port} for sandbox host {name} is not a valid port")
            if port in owners:
                raise SandboxError(
                    f"port {port} for sandbox host {name} is already declared by sandbox host "
                    f"{owners[port]} (sandbox hosts share this machine's network); pick another"
                )
            owners[port] = name
            if not _port_free(port):
                raise SandboxError(
                    f"port {port} for sandbox host {name} is taken by {_port_owner(port)}; "
                    "stop that process or declare another port"
                )


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _port_owner(port: int) -> str:
    """Who listens on ``port``, from ``ss -ltnp``: e.g. ``python3 (pid 4242)``."""
    out = subprocess.run(
        ["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True
    ).stdout
    found = re.findall(r'\("([^"]+)",pid=(\d+)', out)
    if not found:
        return "another process (ss shows no owner; maybe another network namespace)"
    return ", ".join(f"{cmd} (pid {pid})" for cmd, pid in dict.fromkeys(found))


def _pick_ssh_port(taken: set[int]) -> int:
    for port in range(SSH_PORT_FIRST, SSH_PORT_LAST + 1):
        if port not in taken and _port_free(port):
            return port
    raise SandboxError(
        f"no free sshd port between {SSH_PORT_FIRST} and {SSH_PORT_LAST}; "
        "run `fleet sandbox down` for hosts you no longer need"
    )


def _start(name: str, ports: list[int], image: Path, reserved: set[int]) -> subprocess.Popen:
    """Prepare the overlay and cgroups of ``name`` and launch its systemd-nspawn, detached.

    ``reserved``: ports declared by the hosts starting alongside, which sshd must not take.
    """
    hdir = _host_dir(name)
    if any(c in str(hdir) for c in ",:\\ ") or any(c in str(image) for c in ",:\\ "):
        raise SandboxError(
            f"{hdir} or {image} contains one of ', : \\ space', which overlay mount options "
            "cannot carry; set FLEET_SANDBOX_DIR / FLEET_IMAGE_DIR to a plain path"
        )
    taken = set(_ports_in_use_by_sandboxes({name})) | reserved
    ssh_port = _pick_ssh_port(taken)
    for sub in ("upper", "work", "merged"):
        (hdir / sub).mkdir(parents=True, exist_ok=True)
    (hdir / "state.json").write_text(
        json.dumps({"name": name, "ssh_port": ssh_port, "ports": ports, "image": str(image)})
    )
    merged = hdir / "merged"
    _run(
        [
            "mount", "-t", "overlay", "overlay", "-o",
            f"lowerdir={image},upperdir={hdir / 'upper'},workdir={hdir / 'work'}",
            str(merged),
        ]
    )  # fmt: skip
    _write_host_files(name, merged)
    sshd = hdir / "sshd.conf"
    sshd.write_text(
        "# vllm-fleet sandbox host: one sshd port per host on the shared network\n"
        f"Port {ssh_port}\nListenAddress 127.0.0.1\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
    )
    _write_known_hosts()

    procs_files = []
    for root in _cgroup_roots():
        cg = root / f"{CGROUP_PREFIX}{name}"
        cg.mkdir(exist_ok=True)
        procs_files.append(str(cg / "cgroup.procs"))
    argv = [
        "systemd-nspawn",
        "--boot",
        "--register=no",
        "--keep-unit",
        "--console=read-only",
        "--link-journal=no",
        "--resolv-conf=copy-host",
        f"--directory={merged}",
        f"--machine={name}",
        f"--bind-ro={_esc(sshd)}:{SSHD_DROPIN}",
        *(
            f"--bind-ro={_esc(src)}:{_esc(dst)}" if ro else f"--bind={_esc(src)}:{_esc(dst)}"
            for src, dst, ro in _pip_binds(image)
        ),
    ]
    # The wrapper moves itself into the host's own cgroups, then becomes systemd-nspawn (same
    # PID); without this, containers started from one process would share one cgroup.
    wrapper = (
        f"for g in {' '.join(shlex.quote(p) for p in procs_files)}; do "
        'echo $$ > "$g" || exit 97; done; exec "$@"'
    )
    logfile = (hdir / "console.log").open("ab")
    proc = subprocess.Popen(
        ["sh", "-c", wrapper, "sh", *argv],
        stdin=subprocess.DEVNULL,
        stdout=logfile,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
    )
    logfile.close()
    _CHILDREN[proc.pid] = proc
    (hdir / "nspawn.pid").write_text(f"{proc.pid}\n")
    log.info("%s: started systemd-nspawn pid %d, sshd port %d", name, proc.pid, ssh_port)
    return proc


def _write_host_files(name: str, merged: Path) -> None:
    """Hostname, hosts file and root's authorized_keys, written through the overlay."""
    (merged / "etc/hostname").write_text(f"{name}\n")
    (merged / "etc/hosts").write_text(
        f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    )
    ssh_dir = merged / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    keys = ssh_dir / "authorized_keys"
    keys.write_text((SANDBOX_DIR / "id_ed25519.pub").read_text())
    keys.chmod(0o600)


def _wait_ready(name: str, proc: subprocess.Popen) -> None:
    """Wait until sshd answers and systemd reports running/degraded, over real SSH."""
    port = (_read_state(name) or {})["ssh_port"]
    logfile = _host_dir(name) / "console.log"
    deadline = time.monotonic() + BOOT_TIMEOUT_S

    def fail(why: str) -> SandboxError:
        return SandboxError(
            f"sandbox host {name} did not come up: {why}; its console log is kept in "
            f"{SANDBOX_DIR / (name + '.failed.log')}, last lines:\n{_tail(logfile)}"
        )

    while True:
        if proc.poll() is not None:
            raise fail(f"systemd-nspawn exited with code {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            break
        if time.monotonic() > deadline:
            raise fail(f"sshd did not listen on 127.0.0.1:{port} within {BOOT_TIMEOUT_S:.0f} s")
        time.sleep(0.1)
    remaining = max(5.0, deadline - time.monotonic())
    try:
        res = subprocess.run(
            _ssh_argv(port, "systemctl is-system-running --wait"),
            capture_output=True,
            text=True,
            timeout=remaining,
        )
    except subprocess.TimeoutExpired as exc:
        raise fail("systemd did not finish booting in time") from exc
    state = res.stdout.strip()
    if state not in ("running", "degraded"):
        raise fail(f"ssh root@127.0.0.1:{port} said {state!r} {res.stderr.strip()!r}")
    if state == "degraded":
        log.warning("%s: systemd is degraded (see `systemctl --failed` inside)", name)


def _teardown(name: str) -> None:
    """Stop ``name`` by its recorded PID, kill leftovers in its cgroups, remove its state."""
    hdir = _host_dir(name)
    pid = _read_pid(name)
    if pid is not None and _is_our_nspawn(pid, name):
        _signal_and_wait(pid, name, signal.SIGTERM, STOP_TIMEOUT_S)
        if _is_our_nspawn(pid, name):
            log.warning("%s: no orderly shutdown in %.0f s, killing", name, STOP_TIMEOUT_S)
            _signal_and_wait(pid, name, signal.SIGKILL, 5.0)
    _remove_cgroups(name)
    merged = hdir / "merged"
    if any(m["target"] == str(merged) for m in _mounts()):
        res = subprocess.run(["umount", str(merged)], capture_output=True, text=True)
        if res.returncode != 0:
            raise SandboxError(
                f"cannot unmount {merged}: {res.stderr.strip()}; find its users with "
                f"`fuser -vm {merged}`, stop them, then run down again"
            )
    propagate = Path("/run/systemd/nspawn/propagate") / name
    if propagate.is_dir():
        _safe_rmtree(propagate)
    if hdir.exists():
        _safe_rmtree(hdir)
    if SANDBOX_DIR.is_dir():
        _write_known_hosts()


def _signal_and_wait(pid: int, name: str, sig: int, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while _is_our_nspawn(pid, name) and time.monotonic() < deadline:
        time.sleep(0.05)


def _cgroup_roots() -> list[Path]:
    """Hierarchies to give each host its own cgroup in (hybrid: unified + name=systemd)."""
    base = Path("/sys/fs/cgroup")
    roots = [base / d for d in ("unified", "systemd") if (base / d / "cgroup.procs").exists()]
    if not roots and (base / "cgroup.controllers").exists():
        roots = [base]
    if not roots:
        raise SandboxError("no cgroup hierarchy found under /sys/fs/cgroup (mount cgroup2 there)")
    return roots


def _remove_cgroups(name: str) -> None:
    """Kill every process left in the host's cgroups (ours by construction), then rmdir them."""
    groups = [r / f"{CGROUP_PREFIX}{name}" for r in _cgroup_roots()]
    groups = [g for g in groups if g.is_dir()]
    deadline = time.monotonic() + 10.0
    while groups:
        pids = set()
        for group in groups:
            for procs in group.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _reap(pid)
        remaining = []
        for group in groups:
            for sub in sorted(
                (p for p in group.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
            ):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            try:
                group.rmdir()
            except OSError:
                remaining.append(group)
        groups = remaining
        if groups and time.monotonic() > deadline:
            raise SandboxError(
                f"cannot remove cgroups {', '.join(map(str, groups))}: processes remain "
                f"(pids {sorted(pids)}); check them, then run down again"
            )
        if groups:
            time.sleep(0.1)


# --------------------------------------------------------------------------------------------
# SSH
# --------------------------------------------------------------------------------------------


def _ensure_client_key() -> None:
    key = SANDBOX_DIR / "id_ed25519"
    if not key.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vllm-fleet-sandbox",
              "-f", str(key)])  # fmt: skip
    key.chmod(0o600)


def _write_known_hosts() -> None:
    """One line per sandbox host and host key type, written atomically."""
    lines = []
    for name in list_hosts():
        state = _read_state(name) or {}
        image, port = state.get("image"), state.get("ssh_port")
        if not image or not port:
            continue
        for pub in sorted(Path(image).glob("etc/ssh/ssh_host_*_key.pub")):
            keytype, blob = pub.read_text().split()[:2]
            lines.append(f"[127.0.0.1]:{port} {keytype} {blob}\n")
    tmp = SANDBOX_DIR / ".known_hosts.tmp"
    tmp.write_text("".join(lines))
    tmp.replace(SANDBOX_DIR / "known_hosts")


def _ssh_argv(port: int, command: str) -> list[str]:
    return [
        "ssh", "-F", "none",
        "-i", str(SANDBOX_DIR / "id_ed25519"),
        "-o", "IdentitiesOnly=yes",
        "-o", f"UserKnownHostsFile={SANDBOX_DIR / 'known_hosts'}",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=10",
        "-o", "LogLevel=ERROR",
        "-p", str(port),
        "root@127.0.0.1",
        command,
    ]  # fmt: skip


# --------------------------------------------------------------------------------------------
# pip configuration inherited from the host
# --------------------------------------------------------------------------------------------


def _pip_config_files() -> list[Path]:
    """The pip config files root's pip reads on this machine (global, then user)."""
    xdg_dirs = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    home = Path.home()
    xdg_home = Path(os.environ.get("XDG_CONFIG_HOME", home / ".config"))
    candidates = [Path(d) / "pip/pip.conf" for d in xdg_dirs if d]
    candidates += [Path("/etc/pip.conf"), home / ".pip/pip.conf", xdg_home / "pip/pip.conf"]
    return [p for p in dict.fromkeys(candidates) if p.is_file()]


def _pip_binds(image: Path) -> list[tuple[Path, Path, bool]]:
    """(host path, container path, read-only) for the host's pip config and what it points at.

    Config files and the folders they reference (find-links, roots of ``file://`` indexes,
    constraint/requirement files) are bound at the same path. A file's folder is bound whole
    unless the image has that folder (binding would hide the image's files): then the file
    alone. The host's pip cache is bound read-write when present.

    Example:
        _pip_binds(build_image())
        # → [(PosixPath('/etc/pip.conf'), PosixPath('/etc/pip.conf'), True),
        # →  (PosixPath('/etc/xdg/pip'), PosixPath('/etc/xdg/pip'), True), ...]
    """
    wanted: list[Path] = []

    def file_or_folder(path: Path) -> None:
        folder = path.parent
        in_image = (image / folder.relative_to("/")).exists()
        wanted.append(path if in_image or len(folder.parts) < 3 else folder)

    for conf in _pip_config_files():
        file_or_folder(conf)
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            parser.read(conf)
        except configparser.Error as exc:
            log.warning("ignoring unreadable pip config %s: %s", conf, exc)
            continue
        for section in parser.sections():
            for key, value in parser.items(section):
                key = key.replace("_", "-")
                for item in value.split():
                    path = _local_path(item)
                    if path is None or not path.exists():
                        continue
                    if key in ("index-url", "extra-index-url"):
                        root = path if path.is_dir() else path.parent
                        wanted.append(root.parent if root.name == "simple" else root)
                    elif key == "find-links":
                        wanted.append(path if path.is_dir() else path.parent)
                    elif key in ("constraint", "requirement"):
                        file_or_folder(path)
                    elif (
                        key in ("cert", "client-cert")
                        and not (image / path.relative_to("/")).exists()
                    ):
                        wanted.append(path)
    binds: list[tuple[Path, Path, bool]] = []
    for path in sorted(set(wanted)):
        if any(path.is_relative_to(b) for b, _, _ in binds):
            continue
        binds.append((path, path, True))
    cache = Path.home() / ".cache/pip"
    if cache.is_dir():
        binds.append((cache, Path("/root/.cache/pip"), False))
    return binds


def _local_path(item: str) -> Path | None:
    """An absolute local path from a pip config value (path or file:// URL), else None."""
    if item.startswith("file:"):
        path = unquote(urlparse(item).path)
    elif item.startswith("/"):
        path = item
    else:
        return None
    return Path(os.path.normpath(path))


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _mounts() -> list[dict[str, str]]:
    """This mount namespace's mounts: target, fstype, options (from /proc/self/mountinfo)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        out.append({"target": target, "fstype": rest[0], "options": rest[-1]})
    return out


def _safe_rmtree(path: Path) -> None:
    """rm -r that refuses to descend into anything mounted below ``path``."""
    prefix = str(path).rstrip("/") + "/"
    mounted = [m["target"] for m in _mounts() if (m["target"] + "/").startswith(prefix)]
    if mounted:
        raise SandboxError(
            f"refusing to delete {path}: still mounted there: {', '.join(mounted)}; "
            "unmount them, then retry"
        )
    shutil.rmtree(path, ignore_errors=False)


def _esc(path: Path) -> str:
    """A path for systemd-nspawn's --bind (colons escaped)."""
    return str(path).replace("\\", "\\\\").replace(":", "\\:")


def _run(argv: list[str]) -> None:
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise SandboxError(
            f"`{shlex.join(argv)}` failed (exit {res.returncode}): "
            f"{(res.stderr or res.stdout).strip()}"
        )


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])


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
            result = down(args or list_hosts())
        elif verb == "image":
            print(build_image(force="--force" in args))
            sys.exit(0)
        else:
            result = status(args or list_hosts())
    except SandboxError as exc:
        sys.exit(f"error: {exc}")
    for h in result:
        print(f"{h.name}\t{h.state}\tssh={h.ssh_port}\tpid={h.pid}\tports={h.ports}")
