"""One sandbox host's container: booted with ``systemd-nspawn`` over an overlay, stopped by PID.

The image is the overlay's lower layer; the upper layer (everything a deploy installs) lives
in the host's folder under :data:`sandbox.state.SANDBOX_DIR` and goes with :func:`teardown`.
Each container gets its own cgroups (:data:`CGROUP_PREFIX` + name) so that stopping it kills
exactly what it started, an sshd drop-in for its port, and this machine's pip configuration.

Example:
    proc = start("gpu-a", [18000], build_image(), reserved=set())
    wait_ready("gpu-a", proc)      # sshd answers and systemd is running (or degraded)
    teardown("gpu-a")              # SIGTERM, SIGKILL after 15 s, cgroups, overlay, folder gone
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

from sandbox import keys, pipbinds, ports, state, system
from sandbox.system import SandboxError

log = logging.getLogger(__name__)

BOOT_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
CGROUP_PREFIX = "vllm-fleet-"
SSHD_DROPIN = "/etc/ssh/sshd_config.d/50-fleet.conf"


def require_overlayfs() -> None:
    """Refuse (after trying ``modprobe overlay``) a kernel without overlayfs."""
    if "overlay" not in Path("/proc/filesystems").read_text().split():
        subprocess.run(["modprobe", "overlay"], capture_output=True)
        if "overlay" not in Path("/proc/filesystems").read_text().split():
            raise SandboxError("the kernel lacks overlayfs: load it with `modprobe overlay`")


def start(
    name: str,
    declared: list[int],
    image: Path,
    reserved: set[int],
    seed: dict[str, Path] | None = None,
) -> subprocess.Popen:
    """Prepare the overlay and cgroups of ``name`` and launch its systemd-nspawn, detached.

    ``reserved``: ports declared by the hosts starting alongside, which sshd must not take.
    ``seed``: folders the host is born with (path on the host → folder linked there, file by
    file, into the upper layer, before it boots), as if an earlier deploy had put them there.
    """
    hdir = state.host_dir(name)
    if any(c in str(hdir) for c in ",:\\ ") or any(c in str(image) for c in ",:\\ "):
        raise SandboxError(
            f"{hdir} or {image} contains one of ', : \\ space', which overlay mount options "
            "cannot carry; set FLEET_SANDBOX_DIR / FLEET_IMAGE_DIR to a plain path"
        )
    taken = set(ports.in_use_by_sandboxes({name})) | reserved
    ssh_port = ports.pick_ssh_port(taken)
    for sub in ("upper", "work", "merged"):
        (hdir / sub).mkdir(parents=True, exist_ok=True)
    for at, source in (seed or {}).items():
        target = hdir / "upper" / Path(at).relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        # hard links: a 3.5 GB venv in a second, no second copy on disk; files are replaced,
        # never written in place, by pip, uv and Python's bytecode cache
        system.run(["cp", "-a", "--link", "--", str(source), str(target)])
    state.write_state(name, ssh_port, declared, image)
    merged = hdir / "merged"
    system.run(
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
    keys.write_known_hosts()

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
        f"--bind-ro={system.esc(sshd)}:{SSHD_DROPIN}",
        *(
            f"--bind-ro={system.esc(src)}:{system.esc(dst)}"
            if ro
            else f"--bind={system.esc(src)}:{system.esc(dst)}"
            for src, dst, ro in pipbinds.pip_binds(image)
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
    state.CHILDREN[proc.pid] = proc
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
    authorized = ssh_dir / "authorized_keys"
    authorized.write_text(keys.client_key().with_suffix(".pub").read_text())
    authorized.chmod(0o600)


def wait_ready(name: str, proc: subprocess.Popen) -> None:
    """Wait until sshd answers and systemd reports running/degraded, over real SSH."""
    port = (state.read_state(name) or {})["ssh_port"]
    logfile = state.host_dir(name) / "console.log"
    deadline = time.monotonic() + BOOT_TIMEOUT_S

    def fail(why: str) -> SandboxError:
        return SandboxError(
            f"sandbox host {name} did not come up: {why}; its console log is kept in "
            f"{state.SANDBOX_DIR / (name + '.failed.log')}, last lines:\n{system.tail(logfile)}"
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
            keys.ssh_argv(port, "systemctl is-system-running --wait"),
            capture_output=True,
            text=True,
            timeout=remaining,
        )
    except subprocess.TimeoutExpired as exc:
        raise fail("systemd did not finish booting in time") from exc
    booted = res.stdout.strip()
    if booted not in ("running", "degraded"):
        raise fail(f"ssh root@127.0.0.1:{port} said {booted!r} {res.stderr.strip()!r}")
    if booted == "degraded":
        log.warning("%s: systemd is degraded (see `systemctl --failed` inside)", name)


def teardown(name: str) -> None:
    """Stop ``name`` by its recorded PID, kill leftovers in its cgroups, remove its state."""
    hdir = state.host_dir(name)
    pid = state.read_pid(name)
    if pid is not None and state.is_our_nspawn(pid, name):
        _signal_and_wait(pid, name, signal.SIGTERM, STOP_TIMEOUT_S)
        if state.is_our_nspawn(pid, name):
            log.warning("%s: no orderly shutdown in %.0f s, killing", name, STOP_TIMEOUT_S)
            _signal_and_wait(pid, name, signal.SIGKILL, 5.0)
    remove_cgroups(name)
    merged = hdir / "merged"
    if any(m["target"] == str(merged) for m in system.mounts()):
        res = subprocess.run(["umount", str(merged)], capture_output=True, text=True)
        if res.returncode != 0:
            raise SandboxError(
                f"cannot unmount {merged}: {res.stderr.strip()}; find its users with "
                f"`fuser -vm {merged}`, stop them, then run down again"
            )
    propagate = Path("/run/systemd/nspawn/propagate") / name
    if propagate.is_dir():
        system.safe_rmtree(propagate)
    if hdir.exists():
        system.safe_rmtree(hdir)
    if state.SANDBOX_DIR.is_dir():
        keys.write_known_hosts()


def _signal_and_wait(pid: int, name: str, sig: int, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while state.is_our_nspawn(pid, name) and time.monotonic() < deadline:
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


def remove_cgroups(name: str) -> None:
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
            state.reap(pid)
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

