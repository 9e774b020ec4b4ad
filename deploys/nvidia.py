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

import json
from io import StringIO
from typing import Any

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, deploy, operation
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.deb import DebArch
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt, files, python, server, systemd
from pyinfra.operations.util import any_changed

from deploys.plan import current_plan, upload_script
from facts.gpus import PciGpus
from facts.host import Container
from facts.nvidia import (
    OPENPGP_PY,
    DebPackageStates,
    FabricManager,
    KeyringFingerprints,
    NvidiaDriverLoaded,
)
from fleet.stack import (
    driver_matches,
    driver_packages,
    pin_text,
    repo_arch,
    repo_distro,
    repo_url,
    source_text,
    upstream_version,
)

NOUVEAU_TEXT = (
    "# Managed by vllm-fleet: the NVIDIA driver needs nouveau out of the way.\n"
    "blacklist nouveau\noptions nouveau modeset=0\n"
)


# --------------------------------------------------------------------------------------------
# Distribution helpers
# --------------------------------------------------------------------------------------------


def _packages(facts_distro: dict[str, Any], arch: str | None, nvidia: dict[str, Any],
              fabric_manager: bool) -> dict[str, Any]:
    """Repository folders and driver packages for this host, or a DeployError to act on."""
    try:
        distro = repo_distro(facts_distro.get("name"), facts_distro.get("major"),
                             facts_distro.get("minor"))  # fmt: skip
        packages = driver_packages(distro, nvidia["branch"], fabric_manager, nvidia["source"])
        return {"distro": distro, "arch": repo_arch(arch), **packages}
    except ValueError as error:
        raise DeployError(f"{host.name}: {error}") from None


# --------------------------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------------------------


@operation()
def apt_key_installed(url: str, path: str, fingerprint: str):
    """Install an apt signing key from a URL, refusing it unless its fingerprint is the declared.

    + url: where the key is published (armoured or binary)
    + path: the keyring file that a ``signed-by=`` source names
    + fingerprint: the primary key's fingerprint, 40 hex digits

    **Example:**

    .. code:: python

        apt_key_installed(name="Install NVIDIA's key",
                          url=".../ubuntu2404/x86_64/3bf863cc.pub",
                          path="/etc/apt/keyrings/vllm-fleet-nvidia.gpg",
                          fingerprint="EB693B3035CD5710E231E123A4B469963BF863CC")
    """
    have = host.get_fact(KeyringFingerprints, path=path)
    if have == [fingerprint]:
        host.noop(f"{path} holds key {fingerprint}")
        return
    yield StringCommand(
        "python3", "-c", QuoteString(OPENPGP_PY), "install",
        QuoteString(url), QuoteString(path), QuoteString(fingerprint),
    )  # fmt: skip


@operation()
def driver_installed(declared: str, packages: list[str], probe: str, script: str,
                     unhold: list[str] | None = None, origin: str = ""):
    """Install the NVIDIA driver packages at one version that satisfies ``declared``.

    + declared: a branch (``"570"``) or an exact version (``"570.172.08"``)
    + packages: every package of the driver (fabric manager included), installed together
    + probe: the package whose version is "the driver"
    + script: the host-side installer (nvidia_driver.py), which picks the version at run time
    + unhold: more held packages to release first (the installer releases the driver's own
      and any other branch's fabric manager by itself)
    + origin: take versions only from repositories whose URL contains this (NVIDIA's), so that
      a distribution's own build of the same branch is never picked

    Changes only when a package's version is wrong: the operation's change means "the driver
    changed" (a reboot is due). Holds alone are :func:`packages_held`'s concern.

    **Example:**

    .. code:: python

        driver_installed(name="Install driver 570", declared="570",
                         packages=["nvidia-driver-570", "nvidia-fabricmanager-570"],
                         probe="nvidia-driver-570",
                         script="/usr/local/lib/vllm-fleet/nvidia_driver.py")
    """
    states = host.get_fact(DebPackageStates, packages=sorted(packages))
    driver = upstream_version(states.get(probe, {}).get("version"))
    wrong = [
        p for p in packages
        if p not in states or upstream_version(states[p]["version"]) != driver
    ]  # fmt: skip
    if driver_matches(declared, driver) and not wrong:
        host.noop(f"NVIDIA driver {driver} ({', '.join(packages)}) is installed")
        return
    spec = {"declared": declared, "packages": packages, "probe": probe,
            "unhold": unhold or [], "origin": origin}  # fmt: skip
    yield StringCommand("python3", QuoteString(script), QuoteString(json.dumps(spec)))


@operation()
def packages_held(packages: list[str]):
    """Hold installed packages at their version (``apt-mark hold``).

    + packages: package names; they must be installed (or installed earlier in this deploy)

    **Example:**

    .. code:: python

        packages_held(name="Hold the driver", packages=["nvidia-driver-570"])
    """
    states = host.get_fact(DebPackageStates, packages=sorted(packages))
    loose = [p for p in packages if not states.get(p, {}).get("held")]
    if not loose:
        host.noop(f"{', '.join(packages)} are held")
        return
    yield StringCommand("apt-mark", "hold", *[QuoteString(p) for p in loose])


@operation()
def fabric_manager_running(package: str):
    """Start nvidia-fabricmanager if the loaded driver has its exact version; else say why not.

    + package: the fabric manager package (for the message)

    After a driver change, the new driver loads only at the next boot; the fabric manager of
    the new version refuses the old driver, so it is left to start at boot (it is enabled).

    **Example:**

    .. code:: python

        fabric_manager_running(name="Start the fabric manager",
                               package="nvidia-fabricmanager-570")
    """
    state = host.get_fact(FabricManager)
    if state["active"] == "active":
        host.noop("nvidia-fabricmanager is running")
        return
    yield _fabric_manager_command("start", package)


def _fabric_manager_command(verb: str, package: str) -> StringCommand:
    """``systemctl VERB`` the fabric manager only if the loaded driver has its exact version."""
    check = (
        "fm=$(nv-fabricmanager --version | grep -o '[0-9][0-9.]*[0-9]' | head -n1); "
        "drv=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null "
        "| head -n1); "
        'if [ -n "$fm" ] && [ "$fm" = "$drv" ]; then '
        f"systemctl {verb} nvidia-fabricmanager.service; "
        f'else echo "{package} $fm waits for the reboot: the loaded driver is ${{drv:-none}}"; fi'
    )
    return StringCommand("sh", "-c", QuoteString(check))


def _reboot_pending(driver: str) -> None:
    logger.warning(
        f"{host.print_prefix}NVIDIA driver {driver} is installed; a REBOOT IS PENDING before it "
        "is loaded (reboot: false in the fleet file, or a container)"
    )


# --------------------------------------------------------------------------------------------
# The deploy
# --------------------------------------------------------------------------------------------


def preflight(stack: dict[str, Any]) -> dict[str, Any]:
    """Refuse what cannot work, before anything is installed; return the host's facts.

    Raises DeployError for: a vLLM build the declared driver cannot run; an unsupported
    distribution or architecture; declared GPUs that the PCI bus does not show.
    """
    nvidia = stack["nvidia"]
    if stack["min_driver"] and nvidia["branch"] < stack["min_driver"]:
        raise DeployError(
            f"{host.name}: driver {nvidia['driver']} cannot run this host's vLLM build (it needs "
            f"driver ≥ {stack['min_driver']}); nothing was installed. Use variant cu129 for "
            "drivers 535/570, or declare a driver ≥ 580"
        )
    pci = host.get_fact(PciGpus)
    declared = stack["gpus"]["count"]
    if declared and len(pci["gpus"]) != declared:
        slots = ", ".join(gpu["slot"] for gpu in pci["gpus"]) or "none"
        raise DeployError(
            f"{host.name}: the fleet file declares {declared} GPUs, but lspci shows "
            f"{len(pci['gpus'])} NVIDIA GPUs ({slots}); fix gpus.count, or check the hardware, "
            "before any driver is installed"
        )
    fabric_manager = nvidia["fabric_manager"]
    if fabric_manager == "auto":
        fabric_manager = bool(pci["nvswitches"])
    facts = _packages(host.get_fact(LinuxDistribution), host.get_fact(DebArch), nvidia,
                      fabric_manager)  # fmt: skip
    facts["fabric_manager"] = fabric_manager
    facts["origin"] = ""
    if nvidia["source"] == "nvidia":
        facts["origin"] = repo_url(nvidia, facts["distro"], facts["arch"]).rstrip("/")
    return facts


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
    installer, _ = upload_script("nvidia_driver.py", "the driver installer")
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
            commands=[_fabric_manager_command("restart", facts["packages"][-1])],
            _if=driver_op.did_change,
        )
        fabric_manager_running(name="Start the fabric manager", package=facts["packages"][-1])
    _persistence(nvidia)
    return driver_op


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

