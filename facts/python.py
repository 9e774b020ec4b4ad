"""Facts about Python interpreters on a host: the distro's python3, uv-managed interpreters.

Example:
    >>> ManagedPython().process(["/opt/p/cpython-3.12.12-linux-x86_64-gnu/bin/python3.12"])
    '/opt/p/cpython-3.12.12-linux-x86_64-gnu/bin/python3.12'
    >>> ManagedPython().process([]) is None
    True
"""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand


class ManagedPython(FactBase):
    """Path of a uv-managed interpreter of ``version`` under ``install_dir``; None if absent.

    .. code:: python

        "/opt/vllm-fleet/python/cpython-3.12.12-linux-x86_64-gnu/bin/python3.12"
    """

    def command(self, uv: str, version: str, install_dir: str) -> StringCommand:
        return StringCommand(
            "test -x", QuoteString(uv), "&&",
            f"UV_PYTHON_INSTALL_DIR={install_dir}", QuoteString(uv), "python", "find",
            "--managed-python", "--no-config", QuoteString(version), "2>/dev/null", "||", "true",
        )

    def process(self, output: list[str]) -> str | None:
        lines = [line.strip() for line in output if line.strip()]
        return lines[-1] if lines else None
