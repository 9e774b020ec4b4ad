"""Operations of the NVIDIA stack: the repository key, the pinned driver, holds, fabric manager.

Each reads facts, compares, then yields commands or ``host.noop``.

Example:
    from operations import nvidia
    nvidia.packages_held(name="Hold the driver", packages=["nvidia-driver-570"])
"""

from __future__ import annotations

import json

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from facts.nvidia import OPENPGP_PY, DebPackageStates, FabricManager, KeyringFingerprints
from fleet.hostplan.stack import driver_matches, upstream_version


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
    yield fabric_manager_command("start", package)


def fabric_manager_command(verb: str, package: str) -> StringCommand:
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
