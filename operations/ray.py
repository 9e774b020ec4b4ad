"""Ray in the vLLM venv, for servers across hosts over Ray: installed only when its version
differs (vLLM's wheels do not depend on Ray; ``fleet/catalog/ray.py`` says which one each release
runs
on).

Example:
    from operations.ray import ray_installed
    ray_installed(name="Install Ray", venv="/opt/vllm-fleet/venv",
                  requirement="ray[cgraph]==2.48.0")
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from facts.vllm import VenvPackages


def requirement_parts(requirement: str) -> tuple[str, str]:
    """A pinned requirement's distribution name and version.

    Example:
        >>> requirement_parts("ray[cgraph]==2.48.0")
        ('ray', '2.48.0')
    """
    name, _, version = requirement.partition("==")
    return name.split("[", 1)[0].lower(), version


@operation()
def ray_installed(venv: str, requirement: str, extra_index_url: str | None = None):
    """Install the pinned Ray into the venv beside vLLM (nothing when that version is there).

    + venv: the virtualenv's path (vLLM installed in it)
    + requirement: pinned pip requirement, e.g. ``ray[cgraph]==2.48.0``
    + extra_index_url: the index of the CUDA builds of torch (pip resolves Ray against it)

    **Example:**

    .. code:: python

        ops.ray_installed(venv="/opt/vllm-fleet/venv", requirement="ray==2.48.0")
    """
    name, version = requirement_parts(requirement)
    facts = host.get_fact(VenvPackages, venv=venv) or {"packages": {}}
    have = facts["packages"].get(name)
    if have == version:
        host.noop(f"{name} {have} is installed in {venv}")
        return
    extra = ["--extra-index-url", QuoteString(extra_index_url)] if extra_index_url else []
    yield StringCommand(
        QuoteString(f"{venv}/bin/pip"), "install", "--no-input", "--disable-pip-version-check",
        *extra, QuoteString(requirement),
    )
