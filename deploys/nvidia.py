"""The NVIDIA driver stack of a GPU host: repository, driver, fabric manager, persistence.

Only hosts that declare ``os.nvidia`` get it. Before anything is installed the deploy refuses
(DeployError) a distribution it does not know, a vLLM build the declared driver cannot run, and
a host whose PCI bus (lspci, not nvidia-smi) does not show the GPUs the fleet file declares.
Package names depend on the distribution: :func:`fleet.hostplan.stack.driver_packages` (one small
helper per distribution, shared with ``fleet drift``) — Ubuntu's ``nvidia-driver-<branch>``,
Debian 12's ``nvidia-driver`` with its parts, ``nvidia-fabricmanager-<branch>`` on both.

Example:
    from deploys.nvidia import nvidia
    driver_changed = nvidia()     # the driver operation, or None on hosts without NVIDIA
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.deb import DebArch
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt, files, python, server, systemd
from pyinfra.operations.util import any_changed

from deploys.plan import current_plan, upload_program
from facts.gpus import PciGpus
from facts.host import Container
from facts.nvidia import NvidiaDriverLoaded
from fleet.hostplan.stack import (
    DriverLayout,
    driver_layout,
    driver_matches,
    pin_text,
    repo_url,
    source_text,
)
from fleet.hostplan.types import NvidiaStack, StackPlan
from operations.nvidia import (
    apt_key_installed,
    driver_installed,
    fabric_manager_command,
    fabric_manager_running,
    packages_held,
)

# --------------------------------------------------------------------------------------------
# The deploy
# --------------------------------------------------------------------------------------------


def preflight(stack: StackPlan) -> DriverLayout:
    """Refuse what cannot work, before anything is installed; return the host's driver layout.

    Raises DeployError for: an unsupported distribution or architecture; declared GPUs that
    the PCI bus does not show. (A vLLM build the declared driver cannot run never gets here:
    ``fleet check`` refuses it, and the inventory loads the fleet file through it.)
    """
    nvidia = stack.nvidia
    assert nvidia is not None, "preflight runs only for hosts with os.nvidia"
    pci = host.get_fact(PciGpus)
    declared = stack.gpus.count
    if declared and len(pci["gpus"]) != declared:
        slots = ", ".join(gpu["slot"] for gpu in pci["gpus"]) or "none"
        raise DeployError(
            f"{host.name}: the fleet file declares {declared} GPUs, but lspci shows "
            f"{len(pci['gpus'])} NVIDIA GPUs ({slots}); fix gpus.count, or check the hardware, "
            "before any driver is installed"
        )
    try:
        return driver_layout(nvidia, host.get_fact(LinuxDistribution), host.get_fact(DebArch),
                             pci["nvswitches"])
    except ValueError as error:
        raise DeployError(f"{host.name}: {error}") from None


def _repository(nvidia: NvidiaStack, layout: DriverLayout) -> list[OperationMeta]:
    if nvidia.source != "nvidia":
        files.file(name="No NVIDIA apt source (distro packages)", path=nvidia.sources_path,
                   present=False)  # fmt: skip
        return []
    base = repo_url(nvidia, layout.distro, layout.arch)
    key_op = apt_key_installed(
        name="Install the NVIDIA repository's signing key",
        url=f"{base}{nvidia.repository_key[-8:].lower()}.pub",
        path=nvidia.keyring,
        fingerprint=nvidia.repository_key,
    )
    source_op = files.put(
        name="Add the NVIDIA apt repository",
        src=StringIO(source_text(nvidia, layout.distro, layout.arch)),
        dest=nvidia.sources_path,
        user="root", group="root", mode="644",
    )  # fmt: skip
    return [key_op, source_op]


@deploy("NVIDIA driver stack")
def nvidia() -> OperationMeta | None:
    """Repository, pinned and held driver, nouveau blacklist, fabric manager, persistence.

    Returns the driver operation (its change means a new driver), or None without os.nvidia.
    """
    stack = current_plan().stack
    nvidia = stack.nvidia
    if nvidia is None:
        return None
    layout = preflight(stack)
    repo_ops = _repository(nvidia, layout)
    if repo_ops:
        apt.update(name="Read the NVIDIA repository's package lists", _if=any_changed(*repo_ops))
    files.put(
        name="Pin the NVIDIA driver packages",
        src=StringIO(pin_text(layout.packages, nvidia.driver)),
        dest=nvidia.preferences_path,
        user="root", group="root", mode="644",
    )  # fmt: skip
    blacklist = files.put(
        name="Blacklist nouveau",
        src=StringIO(nvidia.nouveau_text),
        dest=nvidia.nouveau_path,
        user="root", group="root", mode="644",
    )  # fmt: skip
    server.shell(
        name="Rebuild the initramfs without nouveau",
        commands=[
            "if command -v update-initramfs >/dev/null; then update-initramfs -u; "
            "else echo 'no update-initramfs on this host: nothing to rebuild'; fi"
        ],
        _if=blacklist.did_change,
    )
    installer, _ = upload_program("nvidia_driver", "the driver installer")
    driver_op = driver_installed(
        name=f"Install NVIDIA driver {nvidia.driver}"
        + (" with its fabric manager" if layout.fabric_manager_wanted else ""),
        declared=nvidia.driver,
        packages=list(layout.packages),
        probe=layout.probe,
        script=installer,
        origin=layout.origin,
    )
    packages_held(name="Hold the NVIDIA driver packages", packages=list(layout.packages))
    _reboot(nvidia, driver_op)
    if layout.fabric_manager:
        systemd.service(name="Enable the fabric manager", service="nvidia-fabricmanager.service",
                        running=None, enabled=True)  # fmt: skip
        server.shell(
            name="Restart the fabric manager with the new driver",
            commands=[fabric_manager_command("restart", layout.fabric_manager)],
            _if=driver_op.did_change,
        )
        fabric_manager_running(name="Start the fabric manager", package=layout.fabric_manager)
    _persistence(nvidia)
    return driver_op


def _reboot_pending(driver: str) -> None:
    logger.warning(
        f"{host.print_prefix}NVIDIA driver {driver} is installed; a REBOOT IS PENDING before it "
        "is loaded (reboot: false in the fleet file, or a container)"
    )


def _reboot(nvidia: NvidiaStack, driver_op: OperationMeta) -> None:
    loaded = host.get_fact(NvidiaDriverLoaded)
    container = host.get_fact(Container)
    if loaded and not driver_matches(nvidia.driver, loaded["version"]):
        logger.warning(
            f"{host.print_prefix}the loaded NVIDIA driver is {loaded['version']}, the fleet file "
            f"declares {nvidia.driver}: a reboot is pending"
        )
    if nvidia.reboot and container is None:
        server.reboot(name="Reboot into the new NVIDIA driver", _if=driver_op.did_change)
    else:
        python.call(
            name="Report the pending reboot",
            function=_reboot_pending,
            driver=nvidia.driver,
            _if=driver_op.did_change,
        )


def _persistence(nvidia: NvidiaStack) -> None:
    unit = "nvidia-persistenced.service"
    if not nvidia.persistence:
        dropin = files.file(name="No persistence drop-in (persistence: false)",
                            path=nvidia.persistenced_path, present=False)  # fmt: skip
        systemd.daemon_reload(name="Reload systemd for persistenced", _if=dropin.did_change)
        return
    dropin = files.put(
        name="Persistence mode through nvidia-persistenced (drop-in)",
        src=StringIO(nvidia.persistenced_text),
        dest=nvidia.persistenced_path,
        user="root", group="root", mode="644",
    )  # fmt: skip
    systemd.daemon_reload(name="Reload systemd for persistenced", _if=dropin.did_change)
    systemd.service(name="Restart nvidia-persistenced (drop-in changed)", service=unit,
                    running=True, restarted=True, _if=dropin.did_change)  # fmt: skip
    systemd.service(name="Enable and start nvidia-persistenced", service=unit, running=True,
                    enabled=True)  # fmt: skip

