"""The pinned stack under vLLM, typed (:class:`fleet.hostplan.types.StackPlan`): NVIDIA driver,
fabric
manager, persistence, CUDA, CPU governor, open-file limit — what the GPU-stack deploys apply and
``fleet drift`` checks.

Nothing here touches a host: package names that depend on the distribution are decided by
:func:`driver_layout` from the facts that the deploy (``deploys/nvidia.py``) and ``fleet drift``
read, so both decide them by this one rule.

Example:
    >>> from fleet.spec.models import Host
    >>> host = Host.model_validate({"address": "x", "gpus": {"count": 2},
    ...     "os": {"nvidia": {"driver": "535"}, "cuda": "12.8", "cpu_governor": "performance"},
    ...     "vllm": {"version": "0.11.0", "variant": "cu129"}})
    >>> plan = stack_plan(host)
    >>> plan.nvidia.branch, plan.cuda.package, plan.governor.name
    (535, 'cuda-toolkit-12-8', 'performance')
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from fleet.catalog.paths import (
    CUDA_PROFILE,
    GOVERNOR_UNIT,
    NOFILE_DROPIN,
    NOUVEAU_BLACKLIST,
    NVIDIA_KEYRING,
    NVIDIA_PREFERENCES,
    NVIDIA_SOURCES,
    PERSISTENCED_DROPIN,
    UNIT_DIR,
    cuda_home,
)
from fleet.hostplan import emit
from fleet.hostplan.templating import render
from fleet.hostplan.types import (
    CudaStack,
    DeclaredGpus,
    GovernorUnit,
    NofileLimit,
    NvidiaStack,
    StackPlan,
)
from fleet.spec.models import Host, Nvidia

#: Where the kernel offers each CPU's frequency governor.
GOVERNOR_FILES = "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"


def governor_command(governor: str) -> list[str]:
    """The command line that sets ``governor`` on every CPU (a shell loop over the kernel's
    files; the governor shell-quoted in it, the whole script one systemd word).

    Example:
        >>> governor_command("performance")[-1]
        'for f in /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor; do echo performance > "$f"; done'
    """  # noqa: E501
    script = f'for f in {GOVERNOR_FILES}; do echo {shlex.quote(governor)} > "$f"; done'
    return ["/bin/sh", "-c", script]


def driver_matches(declared: str, installed: str | None) -> bool:
    """Whether an installed driver version satisfies a declared branch or version.

    Example:
        >>> driver_matches("570", "570.172.08"), driver_matches("570.172.08", "570.172.08")
        (True, True)
        >>> driver_matches("570", "575.51.03"), driver_matches("535.216.03", "535.230.02")
        (False, False)
    """
    if not installed:
        return False
    return installed == declared or installed.startswith(declared + ".")


def upstream_version(package_version: str | None) -> str | None:
    """A Debian package version without epoch and revision: ``1:535.216.03-1`` → ``535.216.03``.

    Example:
        >>> upstream_version("535.216.03-0ubuntu1"), upstream_version(None)
        ('535.216.03', None)
    """
    if package_version is None:
        return None
    return package_version.split(":", 1)[-1].rsplit("-", 1)[0]


#: NVIDIA's names for its repository folders, by (distribution, major, minor), and for
#: architectures by dpkg's names.
REPO_DISTROS = {("Ubuntu", 22, 4): "ubuntu2204", ("Ubuntu", 24, 4): "ubuntu2404",
                ("Debian", 12, None): "debian12"}  # fmt: skip
REPO_ARCHS = {"amd64": "x86_64", "arm64": "sbsa"}


def repo_distro(name: str | None, major: int | None, minor: int | None) -> str:
    """NVIDIA's repository folder for a distribution; ValueError for one that is not supported.

    Example:
        >>> repo_distro("Ubuntu", 24, 4), repo_distro("Debian", 12, 7)
        ('ubuntu2404', 'debian12')
    """
    for (want_name, want_major, want_minor), folder in REPO_DISTROS.items():
        if name == want_name and major == want_major and want_minor in (None, minor):
            return folder
    raise ValueError(
        f"{name} {major}.{minor or 0} is not supported for the NVIDIA stack; vllm-fleet installs "
        "it on Ubuntu 22.04, Ubuntu 24.04 and Debian 12"
    )


def repo_arch(arch: str | None) -> str:
    """NVIDIA's repository folder for a dpkg architecture; ValueError for an unknown one.

    Example:
        >>> repo_arch("amd64")
        'x86_64'
    """
    if arch not in REPO_ARCHS:
        raise ValueError(
            f"architecture {arch!r} has no NVIDIA repository vllm-fleet knows "
            f"({', '.join(REPO_ARCHS)} do)"
        )
    return REPO_ARCHS[arch]


@dataclass(frozen=True)
class DriverPackages:
    """The packages that make up the driver on one distribution.

    + packages: installed at one upstream version, then held (fabric manager last, if any)
    + probe: the one whose version is "the driver"
    """

    packages: tuple[str, ...]
    probe: str

    @property
    def fabric_manager(self) -> str | None:
        """The fabric manager's package, or None without one.

        Example:
            >>> DriverPackages(("nvidia-driver-570", "nvidia-fabricmanager-570"),
            ...                "nvidia-driver-570").fabric_manager
            'nvidia-fabricmanager-570'
        """
        return next((p for p in self.packages if p.startswith("nvidia-fabricmanager")), None)

    @property
    def driver_parts(self) -> tuple[str, ...]:
        """The packages of the driver itself (the fabric manager left out)."""
        return tuple(p for p in self.packages if p != self.fabric_manager)


def _ubuntu_packages(branch: int, fabric_manager: bool) -> DriverPackages:
    packages = [f"nvidia-driver-{branch}"]
    if fabric_manager:
        packages.append(f"nvidia-fabricmanager-{branch}")
    return DriverPackages(tuple(packages), packages[0])


def _debian_packages(branch: int, fabric_manager: bool, source: str) -> DriverPackages:
    if source == "distro" and (branch != 535 or fabric_manager):
        raise ValueError(
            "Debian 12's own archive has driver 535 only, and no fabric manager; declare "
            'driver "535" without fabric manager, or use source: nvidia'
        )
    packages = ["nvidia-driver", "nvidia-smi", "nvidia-kernel-dkms", "libcuda1",
                "nvidia-persistenced"]  # fmt: skip
    if fabric_manager:
        packages.append(f"nvidia-fabricmanager-{branch}")
    return DriverPackages(tuple(packages), "nvidia-driver")


def driver_packages(distro: str, branch: int, fabric_manager: bool, source: str) -> DriverPackages:
    """The packages that make up the driver on a distribution.

    Ubuntu names the driver by branch (``nvidia-driver-570``); NVIDIA's Debian 12 repository
    has one ``nvidia-driver`` for every branch, with its parts as separate packages. The fabric
    manager is ``nvidia-fabricmanager-<branch>`` on both.

    Example:
        >>> driver_packages("ubuntu2404", 570, True, "nvidia").packages
        ('nvidia-driver-570', 'nvidia-fabricmanager-570')
        >>> driver_packages("debian12", 535, False, "nvidia").probe
        'nvidia-driver'
    """
    if distro.startswith("ubuntu"):
        return _ubuntu_packages(branch, fabric_manager)
    return _debian_packages(branch, fabric_manager, source)


def repo_url(nvidia: NvidiaStack, distro: str, arch: str) -> str:
    """The URL of one distribution's folder of the repository (with a final slash).

    Example:
        >>> from dataclasses import replace
        >>> nvidia = replace(nvidia_stack(Nvidia(driver="570")),
        ...                  repository="https://example.test/repos")
        >>> repo_url(nvidia, "debian12", "x86_64")
        'https://example.test/repos/debian12/x86_64/'
    """
    return f"{nvidia.repository}/{distro}/{arch}/"


def source_text(nvidia: NvidiaStack, distro: str, arch: str) -> str:
    """The apt source of NVIDIA's repository, trusting its own key only (signed-by)."""
    keyring = emit.apt_word(nvidia.keyring, option=True)
    url = emit.apt_word(repo_url(nvidia, distro, arch))
    return (
        "# Managed by vllm-fleet: NVIDIA's CUDA repository, trusted for its own key only.\n"
        f"deb [signed-by={keyring}] {url} /\n"
    )


def pin_text(packages: tuple[str, ...] | list[str], declared: str) -> str:
    """apt preferences that keep the driver packages on the declared branch or version.

    Example:
        >>> print(pin_text(["nvidia-driver-570"], "570"), end="")
        # Managed by vllm-fleet: NVIDIA driver "570" (held as well: apt-mark showhold).
        Package: nvidia-driver-570
        Pin: version 570.*
        Pin-Priority: 1001
    """
    version = emit.apt_word(f"{declared}.*" if declared.count(".") < 2 else f"{declared}-*")
    names = " ".join(emit.apt_word(package).text for package in packages)
    note = emit.comment(f'Managed by vllm-fleet: NVIDIA driver "{declared}" '
                        "(held as well: apt-mark showhold).")
    return f"# {note}\nPackage: {names}\nPin: version {version}\nPin-Priority: 1001\n"


def fabric_manager_wanted(setting: bool | str, nvswitches: Any) -> bool:
    """Whether a host runs the fabric manager: ``auto`` means "where lspci shows NVSwitches".

    Example:
        >>> switch = {"slot": "0000:05:00.0"}
        >>> fabric_manager_wanted("auto", [switch]), fabric_manager_wanted("auto", [])
        (True, False)
        >>> fabric_manager_wanted(False, [{"slot": "0000:05:00.0"}])
        False
    """
    if setting == "auto":
        return bool(nvswitches)
    return bool(setting)


@dataclass(frozen=True)
class DriverLayout(DriverPackages):
    """The driver of one host as its facts decide it (see :func:`driver_layout`).

    + packages, probe: as :class:`DriverPackages`
    + distro, arch: NVIDIA's repository folders (``ubuntu2404``, ``x86_64``)
    + fabric_manager_wanted: whether the host runs the fabric manager
    + origin: the repository apt may take the packages from ("" for distro packages)
    """

    distro: str = ""
    arch: str = ""
    fabric_manager_wanted: bool = False
    origin: str = ""


def driver_layout(nvidia: NvidiaStack, distro: dict[str, Any], arch: str | None,
                  nvswitches: Any) -> DriverLayout:
    """The driver of one host as its facts decide it: NVIDIA's repository folders, the driver
    packages (fabric manager included where wanted), the probe package and the repository
    origin apt may take them from. The deploy installs this and ``fleet drift`` checks it.

    + nvidia: the host plan's ``stack.nvidia``
    + distro: pyinfra's ``LinuxDistribution`` fact (name, major, minor)
    + arch: dpkg's architecture (``DebArch``)
    + nvswitches: the NVSwitches lspci shows (``PciGpus``'s ``nvswitches``)

    Raises ValueError, with a sentence to act on, for a distribution or architecture that
    vllm-fleet does not install the stack on.

    Example:
        >>> from dataclasses import replace
        >>> nvidia = replace(nvidia_stack(Nvidia(driver="570")),
        ...                  repository="https://example.test/repos")
        >>> layout = driver_layout(nvidia, {"name": "Ubuntu", "major": 24, "minor": 4}, "amd64",
        ...                        nvswitches=[{"slot": "0000:05:00.0"}])
        >>> layout.packages, layout.origin
        (('nvidia-driver-570', 'nvidia-fabricmanager-570'), 'https://example.test/repos/ubuntu2404/x86_64')
    """
    fabric_manager = fabric_manager_wanted(nvidia.fabric_manager, nvswitches)
    folder = repo_distro(distro.get("name"), distro.get("major"), distro.get("minor"))
    folder_arch = repo_arch(arch)
    packages = driver_packages(folder, nvidia.branch, fabric_manager, nvidia.source)
    origin = ""
    if nvidia.source == "nvidia":
        origin = repo_url(nvidia, folder, folder_arch).rstrip("/")
    return DriverLayout(packages.packages, packages.probe, distro=folder, arch=folder_arch,
                        fabric_manager_wanted=fabric_manager, origin=origin)  # fmt: skip


#: What the nouveau blacklist (``fleet.catalog.paths.NOUVEAU_BLACKLIST``) holds.
NOUVEAU_TEXT = (
    "# Managed by vllm-fleet: the NVIDIA driver needs nouveau out of the way.\n"
    "blacklist nouveau\noptions nouveau modeset=0\n"
)


def nvidia_stack(nvidia: Nvidia) -> NvidiaStack:
    """The NVIDIA part of a host's stack, with the files the deploy writes for it.

    Example:
        >>> nvidia_stack(Nvidia(driver="535")).sources_path
        '/etc/apt/sources.list.d/vllm-fleet-nvidia.list'
    """
    return NvidiaStack(
        driver=nvidia.driver,
        branch=nvidia.branch,
        persistence=nvidia.persistence,
        fabric_manager=nvidia.fabric_manager,
        source=nvidia.source,
        repository=nvidia.repository,
        repository_key=nvidia.repository_key,
        reboot=nvidia.reboot,
        keyring=NVIDIA_KEYRING,
        sources_path=NVIDIA_SOURCES,
        preferences_path=NVIDIA_PREFERENCES,
        nouveau_path=NOUVEAU_BLACKLIST,
        nouveau_text=NOUVEAU_TEXT,
        persistenced_path=PERSISTENCED_DROPIN,
        persistenced_text=render("nvidia-persistenced.conf.j2"),
    )


def stack_plan(host: Host) -> StackPlan:
    """The stack of one host, typed, for the deploys and for drift."""
    cuda = host.os.cuda
    governor = host.os.cpu_governor
    cuda_stack = None
    if cuda is not None:
        home = cuda_home(cuda)
        cuda_stack = CudaStack(
            version=cuda,
            package=f"cuda-toolkit-{cuda.replace('.', '-')}",
            home=home,
            profile_path=CUDA_PROFILE,
            profile_text=render("cuda-profile.sh.j2", version=emit.comment(cuda),
                                home=emit.shell_word(home)),
        )
    governor_unit = None
    if governor is not None:
        governor_unit = GovernorUnit(
            name=governor.value,
            unit=GOVERNOR_UNIT,
            unit_path=f"{UNIT_DIR}/{GOVERNOR_UNIT}",
            unit_text=render(
                "cpu-governor.service.j2",
                governor_note=emit.comment(governor.value),
                description=emit.text(f"CPU frequency governor {governor.value} (vllm-fleet)"),
                exec_start=emit.command(governor_command(governor.value)),
            ),
        )
    return StackPlan(
        gpus=DeclaredGpus(host.gpus.count, host.gpus.model),
        serves=bool(host.servers),
        nofile=NofileLimit(
            value=host.os.nofile,
            path=NOFILE_DROPIN,
            text=render("vllm-nofile.conf.j2", nofile=emit.setting(host.os.nofile)),
        ),
        nvidia=nvidia_stack(host.os.nvidia) if host.os.nvidia is not None else None,
        cuda=cuda_stack,
        governor=governor_unit,
    )
