"""The NVIDIA driver stack of a GPU host: repository, driver, fabric manager, persistence.

Only hosts that declare ``os.nvidia`` get it. Before anything is installed the deploy refuses
(DeployError) a distribution it does not know, a vLLM build the declared driver cannot run, and
a host whose PCI bus (lspci, not nvidia-smi) does not show the GPUs the fleet file declares.
Package names depend on the distribution: :func:`fleet.stack.driver_packages` (one small
helper per distribution, shared with ``fleet drift``) — Ubuntu's ``nvidia-driver-<branch>``,
Debian 12's ``nvidia-driver`` with its parts, ``nvidia-fabricmanager-<branch>`` on both.

Example:
    from deploys.nvidia import nvidia
    driver_changed = nvidia()     # the driver operation, or None on hosts without NVIDIA
"""

from __future__ import annotations

from io import StringIO
from typing import Any

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
from fleet.stack import driver_layout, driver_matches, pin_text, repo_url, source_text
from operations.nvidia import (
    apt_key_installed,
    driver_installed,
    fabric_manager_command,
    fabric_manager_running,
    packages_held,
)

NOUVEAU_TEXT = (
    "# Managed by vllm-fleet: the NVIDIA driver needs nouveau out of the way.\n"
    "blacklist nouveau\noptions nouveau modeset=0\n"
)


# --------------------------------------------------------------------------------------------
# The deploy
# --------------------------------------------------------------------------------------------


def preflight(stack: dict[str, Any]) -> dict[str, Any]:
    """Refuse what cannot work, before anything is installed; return the host's facts.

    Raises DeployError for: an unsupported distribution or architecture; declared GPUs that
    the PCI bus does not show. (A vLLM build the declared driver cannot run never gets here:
    ``fleet check`` refuses it, and the inventory loads the fleet file through it.)
    """
    nvidia = stack["nvidia"]
    pci = host.get_fact(PciGpus)
    declared = stack["gpus"]["count"]
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


def _repository(nvidia: dict[str, Any], facts: dict[str, Any]) -> list[OperationMeta]:
    if nvidia["source"] != "nvidia":
        files.file(name="No NVIDIA apt source (distro packages)", path=nvidia["sources_path"],
                   present=False)  # fmt: skip
        return []
    base = repo_url(nvidia, facts["distro"], facts["arch"])
    key_op = apt_key_installed(
        name="Install the NVIDIA repository's signing key",
        url=f"{base}{nvidia['repository_key'][-8:].lower()}.pub",
        path=nvidia["keyring"],
        fingerprint=nvidia["repository_key"],
    )
    source_op = files.put(
        name="Add the NVIDIA apt repository",
        src=StringIO(source_text(nvidia, facts["distro"], facts["arch"])),
        dest=nvidia["sources_path"],
        user="root", group="root", mode="644",
    )  # fmt: skip
    return [key_op, source_op]


@deploy("NVIDIA driver stack")
def nvidia() -> OperationMeta | None:
    """Repository, pinned and held driver, nouveau blacklist, fabric manager, persistence.

    Returns the driver operation (its change means a new driver), or None without os.nvidia.
    """
    plan = current_plan()
    stack = plan["stack"]
    nvidia = stack["nvidia"]
    if nvidia is None:
        return None
    facts = preflight(stack)
    repo_ops = _repository(nvidia, facts)
    if repo_ops:
        apt.update(name="Read the NVIDIA repository's package lists", _if=any_changed(*repo_ops))
    files.put(
        name="Pin the NVIDIA driver packages",
        src=StringIO(pin_text(facts["packages"], nvidia["driver"])),
        dest=nvidia["preferences_path"],
        user="root", group="root", mode="644",
    )  # fmt: skip
    blacklist = files.put(
        name="Blacklist nouveau",
        src=StringIO(NOUVEAU_TEXT),
        dest=nvidia["nouveau_path"],
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
        name=f"Install NVIDIA driver {nvidia['driver']}"
        + (" with its fabric manager" if facts["fabric_manager"] else ""),
        declared=nvidia["driver"],
        packages=facts["packages"],
        probe=facts["probe"],
        script=installer,
        origin=facts["origin"],
    )
    packages_held(name="Hold the NVIDIA driver packages", packages=facts["packages"])
    _reboot(nvidia, driver_op)
    if facts["fabric_manager"]:
        systemd.service(name="Enable the fabric manager", service="nvidia-fabricmanager.service",
                        running=None, enabled=True)  # fmt: skip
        server.shell(
            name="Restart the fabric manager with the new driver",
            commands=[fabric_manager_command("restart", facts["packages"][-1])],
            _if=driver_op.did_change,
        )
        fabric_manager_running(name="Start the fabric manager", package=facts["packages"][-1])
    _persistence(nvidia)
    return driver_op


def _reboot_pending(driver: str) -> None:
    logger.warning(
        f"{host.print_prefix}NVIDIA driver {driver} is installed; a REBOOT IS PENDING before it "
        "is loaded (reboot: false in the fleet file, or a container)"
    )


def _reboot(nvidia: dict[str, Any], driver_op: OperationMeta) -> None:
    loaded = host.get_fact(NvidiaDriverLoaded)
    container = host.get_fact(Container)
    if loaded and not driver_matches(nvidia["driver"], loaded["version"]):
        logger.warning(
            f"{host.print_prefix}the loaded NVIDIA driver is {loaded['version']}, the fleet file "
            f"declares {nvidia['driver']}: a reboot is pending"
        )
    if nvidia["reboot"] and container is None:
        server.reboot(name="Reboot into the new NVIDIA driver", _if=driver_op.did_change)
    else:
        python.call(
            name="Report the pending reboot",
            function=_reboot_pending,
            driver=nvidia["driver"],
            _if=driver_op.did_change,
        )


def _persistence(nvidia: dict[str, Any]) -> None:
    unit = "nvidia-persistenced.service"
    if not nvidia["persistence"]:
        dropin = files.file(name="No persistence drop-in (persistence: false)",
                            path=nvidia["persistenced_path"], present=False)  # fmt: skip
        systemd.daemon_reload(name="Reload systemd for persistenced", _if=dropin.did_change)
        return
    dropin = files.put(
        name="Persistence mode through nvidia-persistenced (drop-in)",
        src=StringIO(nvidia["persistenced_text"]),
        dest=nvidia["persistenced_path"],
        user="root", group="root", mode="644",
    )  # fmt: skip
    systemd.daemon_reload(name="Reload systemd for persistenced", _if=dropin.did_change)
    systemd.service(name="Restart nvidia-persistenced (drop-in changed)", service=unit,
                    running=True, restarted=True, _if=dropin.did_change)  # fmt: skip
    systemd.service(name="Enable and start nvidia-persistenced", service=unit, running=True,
                    enabled=True)  # fmt: skip

