"""The sandbox hosts' base image: one Debian root filesystem built with ``mmdebstrap``.

Built once from the machine's own Debian apt sources and cached in :data:`IMAGE_DIR`, one
folder per recipe hash (packages, masked units, apt sources, the host's CA certificates), so a
change there yields a new image. The host's CA certificates are copied into the image (not
bound), its host keys generated, sshd enabled and the units a container cannot use masked.

Example:
    build_image()
    # → PosixPath('/var/cache/vllm-fleet/images/debian-bookworm-3f2a9c01d4e5')
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

from sandbox import system
from sandbox.system import SandboxError

log = logging.getLogger(__name__)

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
_PEM_RE = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


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
    system.require_root()
    system.require_tools("mmdebstrap")
    recipe = _recipe()
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    image = IMAGE_DIR / f"debian-{SUITE}-{digest}"
    IMAGE_DIR.mkdir(parents=True, exist_ok=True)
    with system.lock(IMAGE_DIR / ".lock"):
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
                system.safe_rmtree(old)
            tmp.rename(image)
        except BaseException:
            system.safe_rmtree(tmp)
            raise
        (IMAGE_DIR / f"{image.name}.recipe.json").write_text(json.dumps(recipe, indent=2))
        log.info("built %s in %.1f s", image, time.monotonic() - started)
        return image


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
                f"mmdebstrap failed (exit {rc}); last lines of {logfile}:\n{system.tail(logfile)}"
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
        system.run(["chroot", str(root), "update-ca-certificates"])
    system.run(["chroot", str(root), "ssh-keygen", "-A"])
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
    # Per-host files, written into each overlay by containers.start(); the build machine's name
    # must not leak into containers.
    for path in ("etc/hostname", "etc/machine-id"):
        (root / path).write_text("")
    log.info("image: %d extra CA certificate(s) from the host", len(extra))


def _overlays_using(image: Path) -> list[str]:
    return [
        m["target"]
        for m in system.mounts()
        if m["fstype"] == "overlay" and f"lowerdir={image}" in m["options"]
    ]

