"""The models of a host plan: what the models deploy installs, from each fleet-file model,
and how deeply a deploy checks an installed one (``--data model_check=quick|deep``).

Example:
    >>> from fleet.spec.models import Model
    >>> plan = model_plan("tiny", Model(url="http://h/tiny.tar.gz", sha256="a" * 64),
    ...                   secrets=lambda ref: "")
    >>> plan.kind, plan.unpack, plan.id[:4], plan.keep
    ('url', True, 'aaaa', 1)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fleet.catalog.paths import model_path
from fleet.hostplan.types import ModelInstall
from fleet.spec.models import Model, SecretRef

# The installer's own rules, one owner: what it unpacks, the name a single file gets.
from hostside.models.archive import ARCHIVE_SUFFIXES, is_archive
from hostside.models.sources import file_name

__all__ = ["ARCHIVE_SUFFIXES", "file_name", "is_archive", "model_plan"]


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
        retries=model.download.retries,
        retry_wait=model.download.retry_wait,
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
