"""Python venv with the pinned vLLM build of the host's variant.

The venv's interpreter is the distro's python3 when it is the declared version (or none is
declared); otherwise a uv-managed CPython of that version. A venv built with another Python is
rebuilt. GPU builds take torch from the index of their CUDA build.

Example:
    from deploys.vllm_env import vllm_env
    venv_changed = vllm_env()
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import apt

from deploys.plan import current_plan
from facts.vllm import PythonVersion
from fleet.catalog.paths import PYTHON_DIR, UV_DIR
from fleet.hostplan.types import HostPlan
from operations.python import managed_python, venv_ready
from operations.ray import ray_installed
from operations.vllm import vllm_installed


def _interpreter(plan: HostPlan) -> tuple[str, str]:
    """The Python version the venv must have, and the shell word naming its interpreter."""
    distro = host.get_fact(PythonVersion)
    if distro is None:
        raise DeployError(
            f"{host.name}: python3 is missing; install the distro's python3 (it runs the "
            "deploy's host-side helpers and creates the venv)"
        )
    distro_minor = ".".join(distro.split(".")[:2])
    wanted = plan.python or distro_minor
    if wanted == distro_minor:
        return wanted, "python3"
    managed_python(
        name=f"Install Python {wanted} (uv-managed; the distro has {distro_minor})",
        version=wanted,
        uv_dir=UV_DIR,
        install_dir=PYTHON_DIR,
        uv_version=plan.uv_version,
        mirror=plan.python_mirror,
    )
    finder = (
        f'"$(UV_PYTHON_INSTALL_DIR={PYTHON_DIR} {UV_DIR}/bin/uv python find --managed-python '
        f'--no-config {wanted})"'
    )
    return wanted, finder


@deploy("vLLM environment")
def vllm_env() -> OperationMeta:
    """Install the OS packages vLLM needs, the venv and the pinned vLLM; return the install op."""
    plan = current_plan()
    apt.packages(
        name="Install packages vLLM needs",
        packages=list(plan.apt_packages),
        update=True,
        cache_time=24 * 3600,
    )
    version, interpreter = _interpreter(plan)
    venv_ready(
        name=f"Create the vLLM venv (Python {version})",
        venv=plan.venv,
        version=version,
        interpreter=interpreter,
    )
    # A rebuilt venv is empty, so the install below changes too: it alone says "vLLM changed".
    installed = vllm_installed(
        name=f"Install {plan.vllm_package}",
        venv=plan.venv,
        requirement=plan.vllm_package,
        version=plan.vllm_version,
        remove=list(plan.pip_remove),
        wheel=plan.vllm_wheel,
        extra_index_url=plan.pip_extra_index,
    )
    if plan.ray_package:  # a member of a server across hosts over Ray (fleet/catalog/ray.py)
        ray_installed(
            name=f"Install {plan.ray_package} (the group's Ray launcher)",
            venv=plan.venv,
            requirement=plan.ray_package,
            extra_index_url=plan.pip_extra_index,
        )
    return installed
