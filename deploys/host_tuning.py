"""Host tuning under vLLM: the CPU governor (persisted by a oneshot unit) and the open-file
limit of the vLLM units (a prefix drop-in for every ``vllm-*.service``).

Example:
    from deploys.host_tuning import host_tuning
    nofile_changed = host_tuning()
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host, logger
from pyinfra.api import StringCommand, deploy, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, systemd

from deploys.plan import current_plan
from facts.host import CpuGovernor


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


@deploy("Host tuning")
def host_tuning() -> OperationMeta:
    """Governor unit (enabled, applied where possible) and the vLLM units' nofile drop-in.

    Returns the drop-in's operation: vLLM units must restart when it changed.
    """
    plan = current_plan()
    stack = plan["stack"]
    governor = stack["governor"]
    if governor is not None:
        unit_op = files.put(
            name=f"Write {governor['unit']} (CPU governor {governor['name']})",
            src=StringIO(governor["unit_text"]),
            dest=governor["unit_path"],
            user="root", group="root", mode="644",
        )  # fmt: skip
        systemd.daemon_reload(name="Reload systemd for the governor unit", _if=unit_op.did_change)
        systemd.service(
            name=f"Enable {governor['unit']}", service=governor["unit"], running=None, enabled=True
        )
        governor_applied(
            name=f"Apply the {governor['name']} governor",
            governor=governor["name"],
            unit=governor["unit"],
        )
        systemd.service(
            name=f"Re-run {governor['unit']} (it changed)",
            service=governor["unit"],
            running=None,
            command="restart",
            _if=unit_op.did_change,
        )
    nofile = stack["nofile"]
    dropin = files.put(
        name=f"Open-file limit {nofile['value']} for the vLLM units (drop-in)",
        src=StringIO(nofile["text"]),
        dest=nofile["path"],
        user="root", group="root", mode="644",
    )  # fmt: skip
    systemd.daemon_reload(name="Reload systemd for the nofile drop-in", _if=dropin.did_change)
    return dropin
