"""OS tuning that every vLLM host gets: kernel parameters (sysctl).

Before the drop-in is written, a key that this host's kernel does not have (no file below
/proc/sys: a typo such as ``vm.swapiness``, or a module that is not loaded) is refused with
a DeployError naming it. Inside a container a network namespace hides some ``net.*`` keys
that the kernel has: there a missing key that `fleet check` knows is reported, not refused.

Example:
    from deploys.os_tuning import os_tuning
    os_tuning()
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.operations import files

from deploys.plan import current_plan
from facts.host import Container
from facts.sysctl import SysctlMissing, proc_path
from fleet.checks.sysctl_names import closest, kind
from operations.host import sysctl_applied


def preflight(keys: list[str]) -> None:
    """Refuse the keys this host's kernel lacks, before the drop-in is written.

    Raises DeployError naming each missing key, its /proc/sys file and a "did you mean".
    """
    missing = host.get_fact(SysctlMissing, keys=sorted(keys))
    if not missing:
        return
    container = host.get_fact(Container)
    refused = []
    for key in missing:
        if container and kind(key) is not None:
            logger.warning(
                f"{host.print_prefix}sysctl {key}: {proc_path(key)} is not visible in this "
                f"{container} container (its namespace hides it); the drop-in keeps it for "
                "the host's kernel"
            )
            continue
        guess = closest(key)
        refused.append(f"{key} (no {proc_path(key)}" + (f"; {guess}" if guess else "") + ")")
    if refused:
        raise DeployError(
            f"{host.name}: this host's kernel has no sysctl " + ", ".join(refused)
            + "; fix the key in os.sysctl of the fleet file, or load the kernel module that "
            "provides it, before the drop-in is written"
        )


@deploy("OS tuning")
def os_tuning() -> None:
    """Write the sysctl drop-in and apply what this host's kernel lets us change."""
    plan = current_plan()
    if not plan.sysctl:
        files.file(name="No sysctl drop-in declared", path=plan.sysctl_path, present=False)
        return
    preflight(list(plan.sysctl))
    files.put(
        name="Write the sysctl drop-in",
        src=StringIO(plan.sysctl_text),
        dest=plan.sysctl_path,
        user="root",
        group="root",
        mode="644",
    )
    sysctl_applied(name="Apply kernel parameters", values=plan.sysctl)
