#!/usr/bin/env python3
"""Generate ``fleet/vllm_defaults.json``: the defaults the planner takes per vLLM release,
read from each release's own source (never guessed).

Each argument is ``VERSION=PATH``, PATH a folder holding a release's ``vllm/`` package (its
Python files unpacked from the published wheel: ``pip download --no-deps --only-binary :all:
vllm==VERSION`` then ``unzip WHEEL 'vllm/*.py'``; or an installed site-packages), or
``VERSION=FLAGS.json``, a flag list of ``fleet/vllm_flags/`` (its parser's defaults). Read:

- ``gpu_memory_utilization``: the default of ``CacheConfig`` (``vllm/config/cache.py``, or
  ``vllm/config.py`` before 0.10) or of ``EngineArgs`` (``vllm/engine/arg_utils.py``, ≤ 0.7);
- ``engine``: V1 when ``VLLM_USE_V1`` defaults to "1" in ``vllm/envs.py`` (or the variable is
  gone: V0 removed), else V0;
- ``max_num_seqs``: an integer default of ``EngineArgs.max_num_seqs`` (V0 releases: 256), else
  None (the release decides by usage context and GPU, as :func:`fleet.plan.batch_defaults`).

Example::

    $ python scripts/gen_vllm_defaults.py 0.6.4.post1=/tmp/vllm-src/0.6.4.post1 \\
          0.32.0=.venv-vllm/lib/python3.11/site-packages 0.33.0=fleet/vllm_flags/0.33.0.json
    wrote fleet/vllm_defaults.json (3 releases)
"""

from __future__ import annotations

import json
import re
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fleet" / "vllm_defaults.json"
UTILIZATION = re.compile(
    r"^\s+gpu_memory_utilization: float = (?:Field\(default=)?([0-9.]+)", re.M
)
USE_V1 = re.compile(r"\"VLLM_USE_V1\"[^\n]*\n[^\n]*getenv\(\"VLLM_USE_V1\", \"([01])\"\)")
MAX_SEQS = re.compile(r"^\s+max_num_seqs: int = (\d+)", re.M)


def _read(package: Path, *names: str) -> tuple[str, str] | None:
    """The first of ``names`` (relative to vllm/) that exists: (its text, its path)."""
    for name in names:
        path = package / "vllm" / name
        if path.is_file():
            return path.read_text(errors="replace"), f"vllm/{name}"
    return None


def from_source(package: Path) -> dict:
    """The defaults of the release whose ``vllm/`` lies in ``package``."""
    entry: dict = {"from": "source"}
    for name in ("config/cache.py", "config.py", "engine/arg_utils.py"):
        found = _read(package, name)
        if found and (match := UTILIZATION.search(found[0])):
            entry["gpu_memory_utilization"] = float(match[1])
            entry["gpu_memory_utilization_from"] = found[1]
            break
    envs = _read(package, "envs.py")
    use_v1 = USE_V1.search(envs[0]) if envs else None
    entry["engine"] = "V0" if use_v1 and use_v1[1] == "0" else "V1"
    entry["engine_from"] = (
        f'vllm/envs.py: VLLM_USE_V1 defaults to "{use_v1[1]}"' if use_v1
        else "vllm/envs.py: no VLLM_USE_V1 (V0 removed)"
    )
    args = _read(package, "engine/arg_utils.py")
    seqs = MAX_SEQS.search(args[0]) if args else None
    entry["max_num_seqs"] = int(seqs[1]) if seqs else None
    return entry


def from_flags(path: Path) -> dict:
    """The defaults a flag list of ``fleet/vllm_flags/`` recorded from its release's parser."""
    data = json.loads(path.read_text())
    flags = data["flags"]
    seqs = flags.get("max-num-seqs", {}).get("default")
    return {
        "from": f"flag list {path.name} ({data.get('built_from', '?')})",
        "gpu_memory_utilization": float(flags["gpu-memory-utilization"]["default"]),
        "gpu_memory_utilization_from": "the parser's --gpu-memory-utilization default",
        "engine": "V1",
        "engine_from": "V0 was removed in 0.11",
        "max_num_seqs": int(seqs) if seqs not in (None, "None") else None,
    }


def main(argv: list[str]) -> int:
    """Read every ``VERSION=PATH`` given and write the JSON file."""
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    releases = {}
    for arg in argv:
        version, _, where = arg.partition("=")
        path = Path(where)
        releases[version] = from_flags(path) if path.suffix == ".json" else from_source(path)
        if "gpu_memory_utilization" not in releases[version]:
            print(f"{version}: no gpu_memory_utilization default found in {path}", file=sys.stderr)
            return 1

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", v))

    OUT.write_text(json.dumps({
        "generated_by": "scripts/gen_vllm_defaults.py",
        "generated_on": date.today().isoformat(),
        "built_from": "each release's published wheel (pip download --no-deps), its vllm/*.py "
                      "read as text; or its fleet/vllm_flags list",
        "releases": dict(sorted(releases.items(), key=lambda kv: key(kv[0]))),
    }, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)} ({len(releases)} releases)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
