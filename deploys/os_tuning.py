"""OS tuning that every vLLM host gets: kernel parameters (sysctl).

Example:
    from deploys.os_tuning import os_tuning
    os_tuning()
"""

from __future__ import annotations

from io import StringIO

from pyinfra.api import deploy
from pyinfra.operations import files

from deploys.plan import current_plan
from operations.host import sysctl_applied


@deploy("OS tuning")
def os_tuning() -> None:
    """Write the sysctl drop-in and apply what this host's kernel lets us change."""
    plan = current_plan()
    if not plan.sysctl:
        files.file(name="No sysctl drop-in declared", path=plan.sysctl_path, present=False)
        return
    files.put(
        name="Write the sysctl drop-in",
        src=StringIO(plan.sysctl_text),
        dest=plan.sysctl_path,
        user="root",
        group="root",
        mode="644",
    )
    sysctl_applied(name="Apply kernel parameters", values=plan.sysctl)
