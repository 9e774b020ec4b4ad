"""Programs that run on the fleet's hosts (Python standard library only; Python ≥ 3.10).

The deploys upload them below ``/usr/local/lib/vllm-fleet/hostside/`` (:mod:`fleet.paths`)
and run them there; this package is their single owner, and the control machine imports the
same modules in its tests.

Example:
    >>> local_path("wait_healthy").name
    'wait_healthy.py'
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def local_path(program: str) -> Path:
    """The file of a host-side program in this package (``fetch_model`` → …/fetch_model.py)."""
    path = PACKAGE_DIR / f"{program}.py"
    if not path.is_file():
        raise ValueError(f"no host-side program {program!r} in {PACKAGE_DIR}")
    return path


def program_source(program: str) -> str:
    """The text of a host-side program, for running it with ``python3 -c`` before anything
    is uploaded (facts read before the deploy's first operation)."""
    return local_path(program).read_text(encoding="utf-8")
