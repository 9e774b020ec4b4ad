"""Build the STAND-IN NVIDIA apt repository that the GPU-stack tests deploy from.

NVIDIA's packages and GPUs cannot exist on a test machine, so this builds packages with the
names and versions that NVIDIA's CUDA repository for Debian 12 carries (``nvidia-driver``,
``nvidia-smi``, ``nvidia-kernel-dkms``, ``libcuda1``, ``nvidia-persistenced`` at
``<driver>-1``; ``nvidia-fabricmanager-<branch>`` at exactly the driver's version;
``cuda-toolkit-12-x``), whose contents are small stand-ins: ``nvidia-smi`` prints the formats
captured from real GPUs for the GPUs that the sandbox host declares, the daemons behave like
the real ones where the deploy can tell (forking, persistence mode, fabric manager refusing a
driver of another version). Every package says STAND-IN in its description.

The repository is laid out like NVIDIA's (``<base>/debian12/x86_64/`` with ``Packages``,
``InRelease`` and the key as ``<last 8 hex of its fingerprint>.pub``) and signed with a
throwaway key made for each build.

Example:
    repo = build(Path("/tmp/standin"))
    repo.fingerprint            # the throwaway key, for the fleet file's repository_key
    # → 'C0FFEE…'
    modelserver.start(repo.root, port=18410)    # then repository: http://127.0.0.1:18410
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

FILES = Path(__file__).resolve().parent / "files"
DISTRO = "debian12"
ARCH = "x86_64"
DEB_ARCH = "amd64"
#: Driver versions by branch, oldest first (real releases of those branches).
DRIVERS = {"535": ["535.216.03", "535.230.02"], "570": ["570.133.20", "570.172.08"]}
#: The CUDA version each branch's nvidia-smi reports.
DRIVER_CUDA = {"535": "12.2", "570": "12.8"}
#: CUDA toolkits: release → (package version, nvcc version, nvcc build date).
TOOLKITS = {
    "12.2": ("12.2.2-1", "12.2.140", "Tue_Aug_15_22:02:13_PDT_2023"),
    "12.8": ("12.8.1-1", "12.8.93", "Fri_Feb_21_20:23:50_PST_2025"),
}
MAINTAINER = "vllm-fleet tests <standin@invalid>"


@dataclass
class Repo:
    """A built stand-in repository.

    + root: serve this folder; the apt source is ``<url>/debian12/x86_64/ /``
    + fingerprint: the throwaway signing key's fingerprint (40 hex digits)
    + packages: ``name=version`` of every package in it
    """

    root: Path
    fingerprint: str
    packages: list[str]


def _deb(out: Path, name: str, version: str, files: dict[str, tuple[str, int]],
         depends: str = "", conflicts: str = "", description: str = "") -> None:
    """Build one package: ``files`` maps absolute paths to (content, mode)."""
    with tempfile.TemporaryDirectory(prefix="standin-deb-") as tmp:
        root = Path(tmp)
        for path, (content, mode) in files.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            target.chmod(mode)
        (root / "DEBIAN").mkdir()
        control = [
            f"Package: {name}",
            f"Version: {version}",
            f"Architecture: {DEB_ARCH}",
            f"Maintainer: {MAINTAINER}",
            "Section: non-free/libs",
            "Priority: optional",
        ]
        if depends:
            control.append(f"Depends: {depends}")
        if conflicts:
            control += [f"Conflicts: {conflicts}", f"Replaces: {conflicts}"]
        control.append(f"Description: STAND-IN {description or name} (vllm-fleet tests)")
        control.append(" Not NVIDIA software: a test double with NVIDIA's package name.")
        (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root),
             str(out / f"{name}_{version}_{DEB_ARCH}.deb")],
            check=True, capture_output=True,
        )  # fmt: skip


def _text(name: str, **values: str) -> str:
    text = (FILES / name).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    return text


def _driver_packages(out: Path, version: str, branch: str) -> list[str]:
    rev = f"{version}-1"
    same = f"(= {rev})"
    smi = _text("nvidia-smi", DRIVER=version, CUDA=DRIVER_CUDA[branch])
    persistenced = _text("nvidia-persistenced", DRIVER=version)
    others = [b for b in DRIVERS if b != branch]
    packages = {
        "nvidia-driver": (
            {"/usr/share/doc/nvidia-driver/STANDIN": (f"stand-in driver {version}\n", 0o644)},
            f"nvidia-smi {same}, nvidia-kernel-dkms {same}, libcuda1 {same}",
            "", "NVIDIA metapackage",
        ),
        "nvidia-smi": ({"/usr/bin/nvidia-smi": (smi, 0o755)}, "python3", "",
                       "NVIDIA System Management Interface"),
        "nvidia-kernel-dkms": (
            {f"/usr/src/nvidia-current-{version}/STANDIN": ("no kernel module here\n", 0o644)},
            "", "", "NVIDIA binary kernel module DKMS source",
        ),
        "libcuda1": ({f"/usr/lib/x86_64-linux-gnu/libcuda.so.{version}": ("", 0o644)}, "", "",
                     "NVIDIA CUDA Driver Library"),
        "nvidia-persistenced": (
            {
                "/usr/bin/nvidia-persistenced": (persistenced, 0o755),
                "/lib/systemd/system/nvidia-persistenced.service": (
                    (FILES / "nvidia-persistenced.service").read_text(), 0o644,
                ),
            },
            "python3", "", "daemon to maintain persistent software state in the NVIDIA driver",
        ),
        f"nvidia-fabricmanager-{branch}": (
            {
                "/usr/bin/nv-fabricmanager": (_text("nv-fabricmanager", DRIVER=version), 0o755),
                "/lib/systemd/system/nvidia-fabricmanager.service": (
                    (FILES / "nvidia-fabricmanager.service").read_text(), 0o644,
                ),
                "/usr/share/nvidia/nvswitch/fabricmanager.cfg": ("# stand-in\n", 0o644),
            },
            "python3", ", ".join(f"nvidia-fabricmanager-{b}" for b in others),
            "Fabric Manager for NVSwitch based systems",
        ),
    }
    built = []
    for name, (files, depends, conflicts, description) in packages.items():
        _deb(out, name, rev, files, depends, conflicts, description)
        built.append(f"{name}={rev}")
    return built


def _toolkit_package(out: Path, release: str) -> str:
    version, nvcc, built_on = TOOLKITS[release]
    name = f"cuda-toolkit-{release.replace('.', '-')}"
    home = f"/usr/local/cuda-{release}"
    files = {
        f"{home}/bin/nvcc": (_text("nvcc", RELEASE=release, NVCC=nvcc, BUILT=built_on), 0o755),
        f"{home}/version.json": (f'{{"cuda": {{"name": "CUDA SDK", "version": "{nvcc}"}}}}\n',
                                 0o644),
    }
    _deb(out, name, version, files, description=f"CUDA Toolkit {release} meta-package")
    return f"{name}={version}"


def _gpg(home: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["gpg", "--batch", "--quiet", "--homedir", str(home), "--passphrase", "",
         "--pinentry-mode", "loopback", *args],
        check=True, capture_output=True, **kwargs,
    )  # fmt: skip


def _packages_index(folder: Path) -> bytes:
    """The ``Packages`` index of every .deb in ``folder`` (what dpkg-scanpackages writes)."""
    stanzas = []
    for deb in sorted(folder.glob("*.deb")):
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True,
                                 capture_output=True, text=True).stdout.rstrip("\n")  # fmt: skip
        data = deb.read_bytes()
        stanzas.append(
            f"{control}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
            f"MD5sum: {hashlib.md5(data).hexdigest()}\n"
            f"SHA1: {hashlib.sha1(data).hexdigest()}\n"
            f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    return "\n".join(stanzas).encode()


def _release(folder: Path) -> str:
    lines = [
        "Origin: vllm-fleet stand-in",
        "Label: NVIDIA CUDA (STAND-IN for tests)",
        f"Architectures: {DEB_ARCH}",
        f"Date: {formatdate(usegmt=True)}",
        "SHA256:",
    ]
    for name in ("Packages", "Packages.gz"):
        data = (folder / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    return "\n".join(lines) + "\n"


def build(dest: Path) -> Repo:
    """Build the repository into ``dest`` (emptied first) and return what tests need.

    + dest: a folder to (re)create; serve it over HTTP on loopback
    """
    if dest.exists():
        shutil.rmtree(dest)
    folder = dest / DISTRO / ARCH
    folder.mkdir(parents=True)
    packages: list[str] = []
    for branch, versions in DRIVERS.items():
        for version in versions:
            packages += _driver_packages(folder, version, branch)
    for release in TOOLKITS:
        packages.append(_toolkit_package(folder, release))
    index = _packages_index(folder)
    (folder / "Packages").write_bytes(index)
    (folder / "Packages.gz").write_bytes(gzip.compress(index, mtime=0))
    (folder / "Release").write_text(_release(folder))
    with tempfile.TemporaryDirectory(prefix="standin-gnupg-") as home:
        _gpg(Path(home), "--quick-gen-key",
             "vllm-fleet STAND-IN NVIDIA repository key (TEST ONLY) <standin@invalid>",
             "ed25519", "sign", "never")  # fmt: skip
        listing = _gpg(Path(home), "--with-colons", "--list-keys", text=True).stdout
        fingerprint = next(
            line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")
        )
        armoured = _gpg(Path(home), "--export", "--armor").stdout
        (folder / f"{fingerprint[-8:].lower()}.pub").write_bytes(armoured)
        _gpg(Path(home), "--clearsign", "-o", str(folder / "InRelease"), str(folder / "Release"))
        _gpg(Path(home), "-abs", "-o", str(folder / "Release.gpg"), str(folder / "Release"))
    return Repo(dest, fingerprint, packages)


if __name__ == "__main__":  # python -m tests.standin_nvidia.build DEST
    import sys

    repo = build(Path(sys.argv[1]))
    print(f"built {len(repo.packages)} stand-in packages in {repo.root}, key {repo.fingerprint}")
