"""Host tuning under vLLM: the CPU governor (persisted by a oneshot unit) and the open-file
limit of the vLLM units (a prefix drop-in for every ``vllm-*.service``).

Example:
    from deploys.host_tuning import host_tuning
    nofile_changed = host_tuning()
"""

from __future__ import annotations

from io import StringIO

from pyinfra.api import deploy
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, systemd

from deploys.plan import current_plan
from operations.host import governor_applied


@deploy("Host tuning")
def host_tuning() -> OperationMeta:
    """Governor unit (enabled, applied where possible) and the vLLM units' nofile drop-in.

    Returns the drop-in's operation: vLLM units must restart when it changed.
    """
    stack = current_plan().stack
    governor = stack.governor
    if governor is not None:
        unit_op = files.put(
            name=f"Write {governor.unit} (CPU governor {governor.name})",
            src=StringIO(governor.unit_text),
            dest=governor.unit_path,
            user="root", group="root", mode="644",
        )  # fmt: skip
        systemd.daemon_reload(name="Reload systemd for the governor unit", _if=unit_op.did_change)
        systemd.service(
            name=f"Enable {governor.unit}", service=governor.unit, running=None, enabled=True
        )
        governor_applied(
            name=f"Apply the {governor.name} governor",
            governor=governor.name,
            unit=governor.unit,
        )
        systemd.service(
            name=f"Re-run {governor.unit} (it changed)",
            service=governor.unit,
            running=None,
            command="restart",
            _if=unit_op.did_change,
        )
    nofile = stack.nofile
    dropin = files.put(
        name=f"Open-file limit {nofile.value} for the vLLM units (drop-in)",
        src=StringIO(nofile.text),
        dest=nofile.path,
        user="root", group="root", mode="644",
    )  # fmt: skip
    systemd.daemon_reload(name="Reload systemd for the nofile drop-in", _if=dropin.did_change)
    return dropin
