"""The CUDA toolkit of a host: one pinned ``cuda-toolkit-X-Y``, held, on PATH via profile.d.

The toolkit comes from NVIDIA's CUDA repository, which ``deploys.nvidia`` configures; only
hosts that declare ``os.cuda`` get it (``fleet check`` refuses os.cuda without a driver from
that repository, so the deploy does not check it again).

Example:
    from deploys.cuda import cuda
    cuda()
"""

from __future__ import annotations

from io import StringIO

from pyinfra.api import deploy
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import apt, files

from deploys.plan import current_plan
from operations.nvidia import packages_held


@deploy("CUDA toolkit")
def cuda() -> OperationMeta | None:
    """Install and hold the declared toolkit, and put its bin/ on login shells' PATH."""
    toolkit = current_plan().stack.cuda
    if toolkit is None:
        return None
    install = apt.packages(
        name=f"Install {toolkit.package}",
        packages=[toolkit.package],
        no_recommends=True,
    )
    packages_held(name=f"Hold {toolkit.package}", packages=[toolkit.package])
    files.put(
        name=f"Put CUDA {toolkit.version} on PATH (profile.d)",
        src=StringIO(toolkit.profile_text),
        dest=toolkit.profile_path,
        user="root", group="root", mode="644",
    )  # fmt: skip
    return install
