"""The models of a host plan: what the models deploy installs, from each fleet-file model.

Example:
    >>> from fleet.spec import Model
    >>> plan = model_plan("tiny", Model(url="http://h/tiny.tar.gz", sha256="a" * 64),
    ...                   secrets=lambda ref: "")
    >>> plan["kind"], plan["unpack"], plan["id"][:4], plan["keep"]
    ('url', True, 'aaaa', 1)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet.paths import model_path
from fleet.spec import Model, SecretRef

# The installer's own rules, one owner: what it unpacks, the name a single file gets.
from hostside.models.archive import ARCHIVE_SUFFIXES, is_archive
from hostside.models.sources import file_name

__all__ = ["ARCHIVE_SUFFIXES", "file_name", "is_archive", "model_plan"]


def model_plan(name: str, model: Model, secrets: Callable[[SecretRef], str]) -> dict[str, Any]:
    """The plain data the models deploy needs for one model."""
    kind = "hf" if model.hf else "file" if model.file else "url"
    source = model.url or model.file or ""
    local = str(Path(model.file).expanduser()) if model.file else None
    unpack = (model.unpack if model.unpack is not None else is_archive(source)) if source else None
    return {
        "name": name,
        "path": model_path(name),
        "kind": kind,
        "url": model.url,
        "file": local,
        "sha256": model.sha256,
        "unpack": unpack,
        "filename": file_name(source) if source else None,
        "hf": model.hf,
        "revision": model.revision,
        "endpoint": model.endpoint,
        "token": secrets(model.token) if model.token is not None else None,
        "id": model.sha256 or model.revision,
        "keep": model.keep,
        "needs_zstd": bool(unpack) and source.lower().endswith((".zst", ".tzst")),
    }
