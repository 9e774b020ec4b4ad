r"""Load a fleet file: YAML → merged hosts → validated :class:`fleet.spec.Fleet`.

Every problem comes back as a :class:`Problem` that names the file, line, column, the field's
dotted path and what to do; nothing raises a traceback at the user.

Example:
    >>> sorted(load_fleet("inventory/sandbox.yaml").hosts)
    ['sandbox-1']
    >>> try:
    ...     load_text("version: 2\nhosts: {}\n", "f.yaml")
    ... except FleetError as err:
    ...     print(err)
    f.yaml:1:10: version: Input should be 1; this tool reads fleet format version 1
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.reader import ReaderError

from fleet.checks import check_capacity, check_fleet, check_warnings
from fleet.problems import Finding, FleetError, Loc, Problem, suggest
from fleet.sizing import resolve_model_files
from fleet.spec import UNION_TAGS, Fleet


@dataclass
class Positions:
    """Source positions (1-based line, column) of keys and values, by path."""

    keys: dict[Loc, tuple[int, int]] = field(default_factory=dict)
    values: dict[Loc, tuple[int, int]] = field(default_factory=dict)

    def find(self, path: Loc, value: bool = False) -> tuple[int | None, int | None]:
        """The position of ``path`` (its value's, if asked), or of its nearest located ancestor."""
        for end in range(len(path), -1, -1):
            sub = path[:end]
            first, second = (
                (self.values, self.keys) if value and end == len(path) else (self.keys, self.values)
            )
            if sub in first:
                return first[sub]
            if sub in second:
                return second[sub]
        return None, None


def _collect(node: Any, path: Loc, pos: Positions) -> Any:
    """Turn ruamel's nodes into plain data, recording where each key and item sits."""
    if isinstance(node, CommentedMap):
        out = {}
        for key, value in node.items():
            sub = (*path, key)
            try:
                line, col = node.lc.key(key)
                pos.keys[sub] = (line + 1, col + 1)
                # A nested mapping or list "starts" at its first entry, and an empty value
                # where the next token does: locate those by their key.
                if value is not None and not isinstance(value, CommentedMap | CommentedSeq):
                    vline, vcol = node.lc.value(key)
                    pos.values[sub] = (vline + 1, vcol + 1)
            except (KeyError, TypeError, AttributeError):
                pass
            out[key] = _collect(value, sub, pos)
        return out
    if isinstance(node, CommentedSeq):
        out_list = []
        for index, value in enumerate(node):
            sub = (*path, index)
            try:
                line, col = node.lc.item(index)
                pos.values[sub] = (line + 1, col + 1)
            except (KeyError, TypeError, AttributeError):
                pass
            out_list.append(_collect(value, sub, pos))
        return out_list
    if isinstance(node, str):
        return str(node)
    if isinstance(node, bool):
        return bool(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    return node


def _merge(base: Any, over: Any, base_path: Loc, over_path: Loc, origin: dict[Loc, Loc]) -> Any:
    """Deep-merge ``over`` onto ``base``; record in ``origin`` where merged keys came from."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = {}
        for key, value in base.items():
            out[key] = copy.deepcopy(value)
            _note_origin(value, (*over_path, key), (*base_path, key), origin)
        for key, value in over.items():
            if key in out and isinstance(out[key], dict) and isinstance(value, dict):
                out[key] = _merge(out[key], value, (*base_path, key), (*over_path, key), origin)
                origin.pop((*over_path, key), None)
            else:
                out[key] = value
                _drop_origin((*over_path, key), origin)
        return out
    return over


def _note_origin(value: Any, target: Loc, source: Loc, origin: dict[Loc, Loc]) -> None:
    origin[target] = source
    if isinstance(value, dict):
        for key, sub in value.items():
            _note_origin(sub, (*target, key), (*source, key), origin)


def _drop_origin(target: Loc, origin: dict[Loc, Loc]) -> None:
    for key in [k for k in origin if k[: len(target)] == target]:
        del origin[key]


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``loc`` (for did-you-mean)."""
    current: Any = Fleet
    for part in loc:
        current = _unwrap(current)
        if current is None:
            return None
        if isinstance(current, type) and issubclass(current, BaseModel):
            if part not in current.model_fields:
                return None
            current = current.model_fields[part].annotation
        elif typing.get_origin(current) is dict:
            current = typing.get_args(current)[1]
        elif typing.get_origin(current) is list:
            current = typing.get_args(current)[0]
        else:
            return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional/Annotated; pick the model member of a union."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [
                typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a
                for a in typing.get_args(annotation)
                if a is not type(None)
            ]
            models = [a for a in members if isinstance(a, type) and issubclass(a, BaseModel)]
            if models:
                annotation = models[0]
            elif len(members) == 1:
                annotation = members[0]
            else:
                return annotation
        else:
            return annotation


def _message(error: dict[str, Any]) -> tuple[str, str | None]:
    """A person's wording of one pydantic error, and a hint."""
    kind = error["type"]
    loc = tuple(part for part in error["loc"] if part not in UNION_TAGS)
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        allowed = sorted(model.model_fields) if model else []
        hint = suggest(str(loc[-1]), allowed)
        if hint is None and allowed:
            hint = "allowed keys: " + ", ".join(allowed)
        return "unknown key", hint
    if kind == "missing":
        return "required key is missing", None
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if kind == "literal_error" and loc == ("version",):
        return message, "this tool reads fleet format version 1"
    if kind == "string_pattern_mismatch":
        return f"{error.get('input')!r} has the wrong form ({message})", None
    return message, None


def _location(path: Loc, positions: Positions, origin: dict[Loc, Loc]) -> tuple[Loc, Loc]:
    """Map a validated path to where it is written (a host's merged default → defaults.*)."""
    for end in range(len(path), 0, -1):
        if path[:end] in origin:
            return origin[path[:end]] + path[end:], path
    return path, path


def parse_yaml(text: str, file: str) -> tuple[Any, Positions]:
    """Parse YAML text into plain data and its source positions; raise FleetError if broken."""
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    try:
        node = yaml.load(text)
    except MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else None
        column = mark.column + 1 if mark else None
        what = (err.problem or err.context or "invalid YAML").strip()
        raise FleetError([Problem(file, line, column, (), f"YAML: {what}")]) from None
    except ReaderError as err:
        if not isinstance(err.character, int) or not 0 <= err.position <= len(text):
            raise FleetError([Problem(file, None, None, (), f"YAML: {err}")]) from None
        before = text[: err.position]
        line, column = before.count("\n") + 1, err.position - before.rfind("\n")
        what = f"YAML: unacceptable character #x{err.character:04x}: {err.reason}"
        raise FleetError([Problem(file, line, column, (), what)]) from None
    except YAMLError as err:
        raise FleetError([Problem(file, None, None, (), f"YAML: {err}")]) from None
    positions = Positions()
    if isinstance(node, CommentedMap | CommentedSeq):
        positions.keys[()] = (node.lc.line + 1, node.lc.col + 1)
    return _collect(node, (), positions), positions


def merge_defaults(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[Loc, Loc]]:
    """Merge ``defaults`` into every host; return the data and where merged keys came from."""
    origin: dict[Loc, Loc] = {}
    defaults = raw.get("defaults")
    hosts = raw.get("hosts")
    if not isinstance(defaults, dict) or not isinstance(hosts, dict):
        return raw, origin
    merged = dict(raw)
    merged["hosts"] = {}
    for name, host in hosts.items():
        if isinstance(host, dict):
            merged["hosts"][name] = _merge(defaults, host, ("defaults",), ("hosts", name), origin)
        else:
            merged["hosts"][name] = host
    return merged, origin


def load_text(text: str, file: str = "<fleet>", capacity: bool = True) -> Fleet:
    """Validate fleet YAML text; raise :class:`FleetError` with every located problem.

    Model config paths are read relative to ``file``'s folder. With ``capacity``, a server
    that :mod:`fleet.plan` finds does not fit is an error too (``fleet plan`` turns it off to
    show the numbers of such a fleet). Warnings do not raise: :func:`fleet_warnings` has them.

    Example:
        >>> load_text("version: 1\\nhosts: {}\\n").hosts
        {}
    """
    raw, positions = parse_yaml(text, file)
    if not isinstance(raw, dict):
        line, column = positions.keys.get((), (1, 1))
        message = "a fleet file is a mapping with version, hosts"
        raise FleetError([Problem(file, line, column, (), message)])
    merged, origin = merge_defaults(raw)
    try:
        fleet = Fleet.model_validate(merged)
    except ValidationError as err:
        problems = []
        alternatives: dict[Loc, list[Problem]] = {}
        for error in err.errors():
            # A bad dict key is reported at the key itself, without pydantic's "[key]" marker.
            full = tuple(part for part in error["loc"] if part not in ("[key]", *UNION_TAGS))
            loc = _data_loc(full, merged)
            source, _ = _location(loc, positions, origin)
            line, column = positions.find(source, value=error["type"] != "extra_forbidden")
            message, hint = _message(error)
            problem = Problem(file, line, column, source, message, hint)
            if loc != full:  # one member of a union ("int", "str", ...): join them below
                alternatives.setdefault(source, []).append(problem)
            else:
                problems.append(problem)
        for members in alternatives.values():
            wanted = dict.fromkeys(m.message.removeprefix("Input should be ") for m in members)
            message = "Input should be " + ", or ".join(wanted)
            problems.append(dataclasses.replace(members[0], message=message))
        raise FleetError(_unique(problems)) from None

    def located(findings: typing.Iterable[Finding], severity: str = "error") -> list[Problem]:
        out = []
        for path, message, hint in findings:
            source, _ = _location(path, positions, origin)
            line, column = positions.find(source, value=True)
            out.append(Problem(file, line, column, source, message, hint, severity))
        return out

    problems = located(resolve_model_files(fleet, Path(file).parent))
    problems += located(check_fleet(fleet))
    if capacity and not problems:
        problems += located(check_capacity(fleet))
    if problems:
        raise FleetError(_unique(problems))
    fleet._warnings = _unique(located(check_warnings(fleet), "warning"))
    return fleet


def fleet_warnings(fleet: Fleet) -> list[Problem]:
    """The located warnings found when ``fleet`` was loaded (slow GPU links, …).

    Example:
        >>> fleet_warnings(load_fleet("inventory/sandbox.yaml"))
        []
    """
    return list(fleet._warnings)


def _data_loc(loc: Loc, data: Any) -> Loc:
    """The part of a pydantic ``loc`` that exists in ``data``: drops union member tags."""
    for end, part in enumerate(loc):
        in_list = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if in_list or (isinstance(data, dict) and part in data):
            data = data[part]
        elif isinstance(data, dict) and end == len(loc) - 1:
            return loc  # a missing key
        else:
            return loc[:end]
    return loc


def _unique(problems: list[Problem]) -> list[Problem]:
    """Drop repeats (a broken default is reported once, not once per host)."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for problem in problems:
        key = (problem.line, problem.column, problem.path, problem.message)
        if key not in seen:
            seen.add(key)
            out.append(problem)
    return sorted(out, key=lambda p: (p.line or 0, p.column or 0))


def load_fleet(path: str | Path, capacity: bool = True) -> Fleet:
    """Read and validate a fleet file; raise :class:`FleetError` naming file and line.

    ``capacity``: as in :func:`load_text`.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        problem = Problem(str(path), None, None, (), f"cannot read: {err.strerror}")
        raise FleetError([problem]) from None
    except UnicodeDecodeError:
        raise FleetError([Problem(str(path), None, None, (), "not UTF-8 text")]) from None
    return load_text(text, str(path), capacity)
