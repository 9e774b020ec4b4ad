"""The models of a host plan: what the models deploy installs, from each fleet-file model,
and how deeply a deploy checks an installed one (``--data model_check=quick|deep``).

Example:
    >>> from fleet.spec import Model
    >>> plan = model_plan("tiny", Model(url="http://h/tiny.tar.gz", sha256="a" * 64),
    ...                   secrets=lambda ref: "")
    >>> plan.kind, plan.unpack, plan.id[:4], plan.keep
    ('url', True, 'aaaa', 1)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from fleet.hostplan import ModelInstall
from fleet.paths import model_path
from fleet.spec import Model, SecretRef

#: Names the host-side installer unpacks (keep in step with hostside/fetch_model.py).
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".tzst")


def is_archive(name: str) -> bool:
    """Whether a URL or path names an archive to unpack.

    Example:
        >>> is_archive("https://h/m.tar.zst"), is_archive("/srv/m.gguf")
        (True, False)
    """
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def file_name(source: str) -> str:
    """The name a single file gets inside its version directory (as the installer does).

    Example:
        >>> file_name("https://h/x/model-q4.gguf?download=1")
        'model-q4.gguf'
    """
    path = source.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    name = re.sub(r"[^A-Za-z0-9._-]", "_", path.rsplit("/", 1)[-1]).lstrip(".")
    return name or "model"


def model_plan(name: str, model: Model, secrets: Callable[[SecretRef], str]) -> ModelInstall:
    """What the models deploy needs for one model (the token read through ``secrets``)."""
    source = model.url or model.file or ""
    unpack = (model.unpack if model.unpack is not None else is_archive(source)) if source else None
    return ModelInstall(
        name=name,
        path=model_path(name),
        kind="hf" if model.hf else "file" if model.file else "url",
        url=model.url,
        file=str(Path(model.file).expanduser()) if model.file else None,
        sha256=model.sha256,
        unpack=unpack,
        filename=file_name(source) if source else None,
        hf=model.hf,
        revision=model.revision,
        endpoint=model.endpoint,
        token=secrets(model.token) if model.token is not None else None,
        keep=model.keep,
    )


#: How deeply a deploy checks an installed model: sizes and modification times, or re-hash.
MODEL_CHECKS = ("quick", "deep")


def model_check(value: object) -> str:
    """The ``model_check`` setting (a pyinfra ``--data`` override): ``quick`` when unset.

    Raises ValueError, with the sentence to show, for anything but quick or deep.

    Example:
        >>> model_check(None), model_check("deep")
        ('quick', 'deep')
        >>> model_check("full")
        Traceback (most recent call last):
        ...
        ValueError: model_check must be quick or deep, not 'full'
    """
    check = str(value or "quick")
    if check not in MODEL_CHECKS:
        raise ValueError(f"model_check must be quick or deep, not {check!r}")
    return check
