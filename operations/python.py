"""Operations for the venv's interpreter: a uv-managed Python when the distro's doesn't match.

Example:
    from operations import python as python_ops
    python_ops.managed_python(name="Python 3.12", version="3.12", uv_dir="/opt/vllm-fleet/uv",
                              install_dir="/opt/vllm-fleet/python", uv_version="0.13.9")
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from facts.python import ManagedPython
from facts.vllm import VenvPackages


def _minor(version: str | None) -> str | None:
    """``"3.11.2"`` → ``"3.11"``."""
    return ".".join(version.split(".")[:2]) if version else None


@operation()
def managed_python(
    version: str, uv_dir: str, install_dir: str, uv_version: str, mirror: str | None = None
):
    """Install uv (from the host's package index) and a uv-managed CPython ``version``.

    + version: ``"3.12"``
    + uv_dir: a small venv that holds the pinned uv
    + install_dir: where uv keeps managed interpreters (UV_PYTHON_INSTALL_DIR)
    + uv_version: the uv release to pin
    + mirror: a mirror of the interpreter downloads (UV_PYTHON_INSTALL_MIRROR), for sites
      without internet access

    **Example:**

    .. code:: python

        python_ops.managed_python(version="3.12", uv_dir="/opt/vllm-fleet/uv",
                                  install_dir="/opt/vllm-fleet/python", uv_version="0.13.9",
                                  mirror="https://mirror.example/python-build-standalone")
    """
    uv = f"{uv_dir}/bin/uv"
    have_uv = host.get_fact(VenvPackages, venv=uv_dir)
    if have_uv is None or have_uv["packages"].get("uv") != uv_version:
        yield StringCommand("python3", "-m", "venv", QuoteString(uv_dir))
        yield StringCommand(
            QuoteString(f"{uv_dir}/bin/pip"), "install", "--no-input",
            "--disable-pip-version-check", QuoteString(f"uv=={uv_version}"),
        )
    if host.get_fact(ManagedPython, uv=uv, version=version, install_dir=install_dir):
        host.noop(f"a uv-managed Python {version} is installed")
        return
    env = [f"UV_PYTHON_INSTALL_DIR={install_dir}"]
    if mirror:
        env.append(StringCommand("UV_PYTHON_INSTALL_MIRROR=", QuoteString(mirror), _separator=""))
    yield StringCommand(
        *env, QuoteString(uv), "python", "install", "--no-config", QuoteString(version)
    )


@operation()
def venv_ready(venv: str, version: str, interpreter: str):
    """A venv at ``venv`` whose Python is ``version``; rebuilt when the version differs.

    + venv: the venv's path
    + version: the Python version it must have (``"3.11"``)
    + interpreter: a shell word that names the interpreter to create it with (``python3``, or
      ``"$(uv python find 3.12)"``)

    **Example:**

    .. code:: python

        python_ops.venv_ready(venv="/opt/vllm-fleet/venv", version="3.11", interpreter="python3")
    """
    facts = host.get_fact(VenvPackages, venv=venv)
    have = _minor(facts["python"]) if facts else None
    if have == version:
        host.noop(f"the venv {venv} has Python {facts['python']}")
        return
    if facts is not None:
        # Another Python: its compiled packages cannot be reused; start from a clean venv.
        yield StringCommand("rm", "-rf", QuoteString(venv))
    yield StringCommand(interpreter, "-m", "venv", QuoteString(venv))
