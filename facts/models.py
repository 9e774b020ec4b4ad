"""Facts about installed models: the live version and its check against the manifest.

:class:`ModelCheck` runs the installer's own check on the host (``fetch_model.py check
--json``): quick (every file's size and modification time, every link, nothing added) on every
deploy, or deep (every file re-hashed) for ``fleet drift --deep`` and ``fleet models check
--deep``. The deploys and ``fleet drift`` read the same fact, so they cannot disagree.
:class:`ModelManifest` (the manifest alone) lives in :mod:`facts.vllm` and is re-exported here.

Example:
    >>> ModelCheck().process(['{"name": "tiny", "installed": true, "ok": true, "id": "ab",'
    ...                       ' "problems": []}'])["ok"]
    True
    >>> ModelCheck().process([]) is None
    True
"""

from __future__ import annotations

import json
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.vllm import ModelManifest

__all__ = ["InstalledModels", "ModelCheck", "ModelManifest"]


class ModelCheck(FactBase):
    """The check report of a model's live path; None where the installer is not there yet.

    .. code:: python

        {"name": "tiny", "installed": True, "ok": False, "deep": False, "id": "7bba…",
         "version": "tiny-7bba1c3a1056cbe4", "files": 6, "bytes": 853140,
         "problems": [{"path": "config.json", "problem": "modified after install (mtime)"}]}
    """

    requires_command = "python3"

    def command(
        self, script: str, model: str, models_dir: str, deep: bool = False
    ) -> StringCommand:
        return StringCommand(
            "if", "test", "-f", QuoteString(script), ";", "then",
            "python3", QuoteString(script), "check", "--json",
            "--name", QuoteString(model), "--models-dir", QuoteString(models_dir),
            *(["--deep"] if deep else []), ";", "fi",
        )  # fmt: skip

    def process(self, output: list[str]) -> dict[str, Any] | None:
        text = "\n".join(output).strip()
        if not text:
            return None
        try:
            return json.loads(text.splitlines()[-1])
        except ValueError:
            return {"installed": False, "ok": False, "error": text[-500:], "problems": []}


class InstalledModels(FactBase):
    """Every model installed under the models directory (the installer's ``list``); empty where
    the installer is not there yet.

    .. code:: python

        [{"name": "tiny", "live": "tiny-7bba1c3a1056cbe4", "versions": 2, "bytes": 1706280}]

    Example:
        >>> InstalledModels().process(['[{"name": "tiny", "live": null, "versions": 1,'
        ...                            ' "bytes": 5}]'])[0]["name"]
        'tiny'
        >>> InstalledModels().process([])
        []
    """

    requires_command = "python3"
    default = list

    def command(self, script: str, models_dir: str) -> StringCommand:
        return StringCommand(
            "if", "test", "-f", QuoteString(script), ";", "then",
            "python3", QuoteString(script), "list", "--models-dir", QuoteString(models_dir),
            ";", "fi",
        )  # fmt: skip

    def process(self, output: list[str]) -> list[dict[str, Any]]:
        text = "\n".join(output).strip()
        if not text:
            return []
        return json.loads(text.splitlines()[-1])
