#!/usr/bin/env python3
"""Generate ``fleet/catalog/vllm_defaults.json``: the defaults the planner takes per vLLM release,
read from each release's own source (never guessed).

Each argument is ``VERSION=PATH``, PATH a folder holding a release's ``vllm/`` package (its
Python files unpacked from the published wheel: ``pip download --no-deps --only-binary :all:
vllm==VERSION`` then ``unzip WHEEL 'vllm/*.py'``; or an installed site-packages), or
``VERSION=FLAGS.json``, a flag list of ``fleet/catalog/vllm_flags/`` (its parser's defaults). Read:

- ``gpu_memory_utilization``: the default of ``CacheConfig`` (``vllm/config/cache.py``, or
  ``vllm/config.py`` before 0.10) or of ``EngineArgs`` (``vllm/engine/arg_utils.py``, ≤ 0.7);
- ``engine``: V1 when ``VLLM_USE_V1`` defaults to "1" in ``vllm/envs.py`` (or the variable is
  gone: V0 removed), else V0;
- ``max_num_seqs``: an integer default of ``EngineArgs.max_num_seqs`` (V0 releases: 256), else
  None (the release decides by usage context and GPU, as :func:`fleet.planner.fit.batch_defaults`).

Example::

    $ python scripts/gen_vllm_defaults.py 0.6.4.post1=/tmp/vllm-src/0.6.4.post1 \\
          0.32.0=.venv-vllm/lib/python3.11/site-packages 0.33.0=fleet/catalog/vllm_flags/0.33.0.json
    wrote fleet/catalog/vllm_defaults.json (3 releases)
"""

from __future__ import annotations

import ast
import json
import re
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fleet" / "catalog" / "vllm_defaults.json"
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
    if args:
        classes = batch_classes(args[0])
        if classes:
            entry["batch_classes"] = classes
            entry["batch_classes_from"] = "vllm/engine/arg_utils.py: the device_memory chain"
        chunked = chunked_prefill(args[0])
        if chunked:
            entry["chunked_prefill"] = chunked
            entry["chunked_prefill_from"] = ("vllm/engine/arg_utils.py: if "
                                             "self.enable_chunked_prefill is None")
    graphs = cuda_graphs(package)
    if graphs:
        entry["cuda_graphs"] = graphs
    wheel = package / "WHEEL-SOURCE"
    if wheel.is_file():
        name, digest = wheel.read_text().split()[:2]
        entry["wheel"] = name
        entry["wheel_sha256"] = digest.removeprefix("sha256=")
    return entry


def _int_of(node: ast.expr) -> int | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, int) else None


def _server_value(node: ast.expr) -> int | None:
    """The ``UsageContext.OPENAI_API_SERVER`` value of a dict literal."""
    if not isinstance(node, ast.Dict):
        return None
    for key, value in zip(node.keys, node.values, strict=False):
        if key is not None and ast.unparse(key).endswith("OPENAI_API_SERVER"):
            return _int_of(value)
    return None


def _class_of(test: ast.expr | None) -> dict:
    """``device_memory >= 70 * GiB_bytes and "a100" not in device_name`` → the class."""
    entry: dict = {"min_memory_gib": 0, "not_named": []}
    if test is None:
        return entry
    for node in ast.walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and \
                ast.unparse(node.right) == "GiB_bytes" and _int_of(node.left) is not None:
            entry["min_memory_gib"] = _int_of(node.left)
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.NotIn) and \
                isinstance(node.left, ast.Constant):
            entry["not_named"].append(node.left.value)
    return entry


def _branch(body: list[ast.stmt], test: ast.expr | None) -> dict:
    entry = _class_of(test)
    for statement in body:
        if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value is not None:
            target = statement.targets[0] if isinstance(statement, ast.Assign) else statement.target
            name = ast.unparse(target)
            if name in ("default_max_num_batched_tokens", "default_max_num_seqs"):
                entry[name.removeprefix("default_")] = _server_value(statement.value)
    return entry


def batch_classes(text: str) -> list[dict]:
    r"""The API server's batch defaults per GPU class, from arg_utils.py's source, most memory
    first.

    Example:
        >>> code = "\n".join([
        ...     'if device_memory >= 70 * GiB_bytes and "a100" not in device_name:',
        ...     "    default_max_num_batched_tokens = {UsageContext.OPENAI_API_SERVER: 8192}",
        ...     "else:",
        ...     "    default_max_num_batched_tokens = {UsageContext.OPENAI_API_SERVER: 2048}"])
        >>> [(c["min_memory_gib"], c["not_named"], c["max_num_batched_tokens"])
        ...  for c in batch_classes(code)]
        [(70, ['a100'], 8192), (0, [], 2048)]
    """
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.If) and "device_memory" in ast.unparse(node.test)):
            continue
        classes = []
        branch: ast.If | None = node
        while branch is not None:
            classes.append(_branch(branch.body, branch.test))
            rest = branch.orelse
            if len(rest) == 1 and isinstance(rest[0], ast.If):
                branch = rest[0]
            else:
                if rest:
                    classes.append(_branch(rest, None))
                branch = None
        return classes
    return []


def chunked_prefill(text: str) -> list[str]:
    r"""What ``enable_chunked_prefill`` is set to when not given: each expression under an
    ``if self.enable_chunked_prefill is None``, in source order (a name resolved to what it
    was assigned).

    Example:
        >>> chunked_prefill("\n".join(["d = m.is_chunked_prefill_supported",
        ...     "if self.enable_chunked_prefill is None:", "    self.enable_chunked_prefill = d"]))
        ['m.is_chunked_prefill_supported']
    """
    tree = ast.parse(text)
    names = {ast.unparse(n.targets[0]): n.value for n in ast.walk(tree)
             if isinstance(n, ast.Assign) and len(n.targets) == 1}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and \
                ast.unparse(node.test) == "self.enable_chunked_prefill is None":
            for statement in node.body:
                if isinstance(statement, ast.Assign) and \
                        ast.unparse(statement.targets[0]) == "self.enable_chunked_prefill":
                    value = statement.value
                    if isinstance(value, ast.Name) and value.id in names:
                        value = names[value.id]
                    found.append((statement.lineno, ast.unparse(value)))
    return [text for _, text in sorted(found)]


#: The names ``_set_cudagraph_sizes`` builds the capture sizes and their largest size in.
SIZE_NAMES = ("cudagraph_capture_sizes", "cuda_graph_sizes", "batch_size_capture_list")
MAX_NAMES = ("max_graph_size", "max_cudagraph_capture_size", "default_max_graph_size")


def cuda_graphs(package: Path) -> dict | None:
    """The default CUDA graph capture sizes, as ``_set_cudagraph_sizes`` writes them: its
    assignments to the largest size (``max_size``) and to the list (``sizes``), in order,
    without the branches for sizes the user gave or the interactivity mode."""
    for name in ("config/vllm.py", "config/__init__.py", "config.py"):
        found = _read(package, name)
        if not found or "def _set_cudagraph_sizes" not in found[0]:
            continue
        for node in ast.walk(ast.parse(found[0])):
            if not (isinstance(node, ast.FunctionDef) and node.name == "_set_cudagraph_sizes"):
                continue
            sizes, largest = [], []
            for statement in ast.walk(node):
                if not isinstance(statement, ast.Assign | ast.AugAssign):
                    continue
                target = statement.targets[0] if isinstance(statement, ast.Assign) \
                    else statement.target
                value = ast.unparse(statement.value)
                if any(word in value for word in ("interactivity", "dedup", "self.compilation")):
                    continue
                line = (statement.lineno, ("+= " if isinstance(statement, ast.AugAssign)
                                           else "") + value)
                if ast.unparse(target) in SIZE_NAMES and ("range(" in value or "[1, 2, 4]"
                                                          in value):
                    sizes.append(line)
                elif (ast.unparse(target) in MAX_NAMES and "min(" in value) or \
                        ast.unparse(target) == "default_max_graph_size":
                    largest.append(line)
            return {"from": f"{found[1]} _set_cudagraph_sizes",
                    "max_size": [text for _, text in sorted(largest)],
                    "sizes": [text for _, text in sorted(sizes)]}
    return None


def from_flags(path: Path) -> dict:
    """The defaults a flag list of ``fleet/catalog/vllm_flags/`` recorded from its release's
    parser."""
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
                      "read as text; or its fleet/catalog/vllm_flags list",
        "releases": dict(sorted(releases.items(), key=lambda kv: key(kv[0]))),
    }, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)} ({len(releases)} releases)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
