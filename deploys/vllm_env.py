"""Python venv with the pinned vLLM build of the host's variant.

Example:
    from deploys.vllm_env import vllm_env
    venv_changed = vllm_env()
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import apt, pip

from deploys import ops
from deploys.plan import current_plan
from facts.vllm import PythonVersion


@deploy("vLLM environment")
def vllm_env() -> OperationMeta:
    """Install the OS packages vLLM needs, the venv and the pinned vLLM; return the install op."""
    plan = current_plan()
    apt.packages(
        name="Install packages vLLM needs",
        packages=plan["apt_packages"],
        update=True,
        cache_time=24 * 3600,
    )
    wanted = plan["python"]
    have = host.get_fact(PythonVersion)
    if wanted and have and ".".join(have.split(".")[:2]) != wanted:
        raise DeployError(
            f"{host.name}: the fleet file asks for Python {wanted}, but this host's python3 is "
            f"{have}; set os.python to {'.'.join(have.split('.')[:2])} or remove it"
        )
    pip.venv(name="Create the vLLM venv", path=plan["venv"], python="python3")
    return ops.vllm_installed(
        name=f"Install {plan['vllm_package']}",
        venv=plan["venv"],
        requirement=plan["vllm_package"],
        version=plan["vllm_version"],
        remove=plan["pip_remove"],
    )
