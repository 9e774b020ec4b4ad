"""Secrets by reference: read on the control machine, only when a host plan is built.

A fleet file names a secret (``{env: NAME}`` or ``{file: PATH}``), never holds it.

Example:
    >>> import os
    >>> from fleet.spec import SecretRef
    >>> os.environ["FLEET_DOCTEST_KEY"] = "sk-test"
    >>> read_secret(SecretRef(env="FLEET_DOCTEST_KEY"))
    'sk-test'
"""

from __future__ import annotations

import os
from pathlib import Path

from fleet.spec import SecretRef


def read_secret(ref: SecretRef) -> str:
    """Resolve a secret reference on the control machine; raise ValueError if it is missing."""
    if ref.env is not None:
        value = os.environ.get(ref.env)
        if not value:
            raise ValueError(f"environment variable {ref.env} is not set")
        return value.strip()
    assert ref.file is not None
    try:
        return Path(ref.file).expanduser().read_text(encoding="utf-8").strip()
    except OSError as err:
        raise ValueError(f"cannot read secret file {ref.file}: {err.strerror}") from None
