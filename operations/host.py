"""Operations of host tuning: kernel parameters and the CPU governor.

Example:
    from operations.host import governor_applied
    governor_applied(name="Apply the governor", governor="performance",
                     unit="vllm-fleet-cpu-governor.service")
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.server import Sysctl

from facts.host import CpuGovernor
from facts.sysctl import SysctlWritable


@operation()
def governor_applied(governor: str, unit: str):
    """Make every CPU run ``governor`` now (through its unit), where the kernel has cpufreq.

    + governor: cpufreq governor name, e.g. ``performance``
    + unit: the oneshot unit that sets it (and sets it again at every boot)

    Without cpufreq (most VMs and containers) nothing can be set: that is reported, not failed.

    **Example:**

    .. code:: python

        governor_applied(name="Apply the governor", governor="performance",
                         unit="vllm-fleet-cpu-governor.service")
    """
    current = host.get_fact(CpuGovernor)
    if not current:
        logger.warning(
            f"{host.print_prefix}CPU governor {governor}: this host has no cpufreq (a VM or a "
            f"container?), nothing to set; {unit} sets it at boot wherever cpufreq exists"
        )
        host.noop(f"no cpufreq: governor {governor} not applicable")
        return
    if set(current) == {governor}:
        host.noop(f"all {current[governor]} CPUs run the {governor} governor")
        return
    yield StringCommand("systemctl", "restart", unit)


@operation()
def sysctl_applied(values: dict[str, int | str]):
    """Set kernel parameters now, where this host allows it; report the others.

    + values: sysctl key → value

    The drop-in file (written separately) applies them at boot; inside a container the
    kernel-global keys are read-only, and that is reported, not failed.

    **Example:**

    .. code:: python

        ops.sysctl_applied(name="Apply sysctl", values={"vm.swappiness": 1})
    """
    keys = sorted(values)
    current = host.get_fact(Sysctl, keys=keys)
    writable = host.get_fact(SysctlWritable, keys=keys)
    for key in keys:
        wanted = values[key]
        have = current.get(key)
        if str(have) == str(wanted):
            host.noop(f"sysctl {key} is {wanted}")
        elif not writable.get(key, False):
            logger.warning(
                f"{host.print_prefix}sysctl {key}: not applicable here (/proc/sys is read-only, "
                f"e.g. in a container); the kernel has {have}, the drop-in asks {wanted}"
            )
        else:
            yield StringCommand("sysctl", "-w", QuoteString(f"{key}={wanted}"))
