"""YAML text → plain data and the position of every key and value, bounded.

The data is built straight from the parser's events (never from ruamel's composer, which recurses
and expands aliases without limit), so that every limit is checked before the work it bounds:
nesting depth, the values that aliases expand to, the digits of a number (before it is
converted). One document only, YAML 1.2 (no ``%YAML 1.1``), no tags but the core ones. Each
problem is a :class:`YamlProblem` with the line, column and path of the field it is in, worded
for a person (what happened, what to write) rather than in the parser's terms.

Example:
    >>> data, positions = read_yaml("a: &x [1, 2]\\nb: *x\\n")
    >>> data, positions.keys[("b",)]
    ({'a': [1, 2], 'b': [1, 2]}, (2, 1))
    >>> read_yaml("python: 3.10\\n")[1].plain[("python",)]
    '3.10'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from ruamel.yaml.resolver import implicit_resolvers
from yaml.error import MarkedYAMLError, YAMLError
from yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    DocumentStartEvent,
    MappingStartEvent,
    ScalarEvent,
    StreamEndEvent,
)

from fleet.read.problems import Loc
from fleet.read.source import TAB_HINT

#: Collections nested deeper than this are refused (a fleet file needs fewer than ten levels).
MAX_DEPTH = 20
#: Values that aliases may expand to, in all (an alias bomb expands to billions).
MAX_ALIAS_VALUES = 10_000
#: Digits of a number (the largest any field takes, 2**64, has 20).
MAX_DIGITS = 20

_CORE = "tag:yaml.org,2002:"
_ALLOWED_TAGS = {f"{_CORE}{name}" for name in ("str", "int", "float", "bool", "null", "map",
                                              "seq")} | {"!"}
#: YAML 1.2's rules for plain scalars, by first character: ruamel's (PyYAML's own are YAML 1.1's,
#: where yes/no are booleans).
_RULES: dict[str, list[tuple[str, re.Pattern[str]]]] = {}
for _versions, _tag, _pattern, _first in implicit_resolvers:
    if (1, 2) in _versions:
        for _char in _first or [""]:
            _RULES.setdefault(_char, []).append((_tag, _pattern))


def _resolve(value: str) -> str:
    """The tag YAML 1.2 gives a plain scalar.

    Example:
        >>> _resolve("3.10"), _resolve("yes"), _resolve("0x1F"), _resolve("")
        ('tag:yaml.org,2002:float', 'tag:yaml.org,2002:str', 'tag:yaml.org,2002:int', \
'tag:yaml.org,2002:null')
    """
    for tag, pattern in _RULES.get(value[:1], ()):
        if pattern.match(value):
            return tag
    return f"{_CORE}str"
#: libyaml's event parser: linear in the input (ruamel's pure-Python scanner is quadratic on long
#: lines and deep flow nesting); PyYAML's pure one where libyaml is missing.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


#: A block scalar's header line with its key on it: ``  topology: |`` (or ``- key: >-  # …``).
_KEYED_HEADER = re.compile(
    r"(?P<lead> *(?:- +)*)[^\s#|>\[\]{},][^#]*?: +(?P<ind>[|>])[+-]?(?: +#.*)? *"
)
#: A key whose value begins as a flow mapping and goes on after it: ``address: {name}.lan``.
_BRACED_START = re.compile(
    r"\s*(?:-\s+)?(?P<key>[^\s#:]+):\s+(?P<value>\{[^{}]*\}[^\s,#}\]][^#]*?)\s*(?:#.*)?"
)
#: Any block scalar header (to skip the content of one).
_ANY_HEADER = re.compile(r".*(?:^|[\s:-])[|>][0-9+-]*(?: +#.*)? *")


def _explicit_indents(text: str) -> tuple[str, set[tuple[int, int]]]:
    """``text`` with an explicit indentation indicator on each keyed block scalar whose first
    line begins with a tab after its indentation, and where those indicators went.

    YAML reads a block scalar's indentation from the spaces of its first line and the tab after
    them as content (a pasted, tab-separated ``nvidia-smi topo -m``); libyaml refuses the tab
    when it detects the indentation itself ("found a tab character where an indentation space
    is expected"), and reads it as YAML does when told: ``topology: |`` becomes ``topology: |2``
    (the content's spaces less the key's column). A tab as indentation is not touched.

    Example:
        >>> _explicit_indents("t: |\\n  \\tGPU0\\n")
        ('t: |2\\n  \\tGPU0\\n', {(0, 3)})
    """
    lines = text.split("\n")
    marks: set[tuple[int, int]] = set()
    block: int | None = None  # the indentation of the header line of the block we are in
    for number, line in enumerate(lines):
        indent = len(line) - len(line.lstrip(" "))
        if block is not None and (not line.strip() or indent > block):
            continue
        block = None
        if not _ANY_HEADER.fullmatch(line):
            continue
        block = indent
        header = _KEYED_HEADER.fullmatch(line)
        following = next((later for later in lines[number + 1 :] if later.strip()), "")
        spaces = len(following) - len(following.lstrip(" "))
        if header is None or following[spaces : spaces + 1] != "\t":
            continue
        step = spaces - len(header["lead"])
        column = header.end("ind")
        if 1 <= step <= 9:
            lines[number] = line[:column] + str(step) + line[column:]
            marks.add((number, column - 1))
    return "\n".join(lines), marks


def _events(text: str) -> Any:
    """The parser events of ``text``."""
    return yaml.parse(text, Loader=_LOADER)


def _read(text: str) -> _Reader:
    """A reader fed every event of ``text``, tabs that begin a block scalar read as YAML reads
    them (:func:`_explicit_indents`); where an indicator would not land on a block scalar
    (a header-like line inside a quoted text), the text is read as written.

    Example:
        >>> _read("t: |\\n  \\tGPU0\\tGPU1\\n  GPU0\\t X \\tNV18\\n").result
        {'t': '\\tGPU0\\tGPU1\\nGPU0\\t X \\tNV18\\n'}
    """
    source, marks = _explicit_indents(text) if "\t" in text else (text, set())
    reader = _Reader(text)
    blocks: set[tuple[int, int]] = set()
    try:
        for event in _events(source):
            if isinstance(event, StreamEndEvent):
                break
            if marks and isinstance(event, ScalarEvent) and event.style in ("|", ">"):
                blocks.add((event.start_mark.line, event.start_mark.column))
            reader.feed(event)
    except MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        if mark is not None and any(line == mark.line for line, _ in marks):
            return _read_as_written(text)  # the complaint is about a line given an indicator
        err.reader = reader  # type: ignore[attr-defined]
        raise  # elsewhere: only header lines changed, so its line and column are as written
    if not marks <= blocks:
        return _read_as_written(text)
    return reader


def _read_as_written(text: str) -> _Reader:
    """A reader fed every event of ``text`` exactly as written."""
    reader = _Reader(text)
    try:
        for event in _events(text):
            if isinstance(event, StreamEndEvent):
                break
            reader.feed(event)
    except MarkedYAMLError as err:
        err.reader = reader  # type: ignore[attr-defined]
        raise
    return reader


@dataclass
class Positions:
    """Source positions (1-based line, column) of keys and values, by path; and the text of
    plain scalars that YAML read as something other than text (``3.10`` → 3.1)."""

    keys: dict[Loc, tuple[int, int]] = field(default_factory=dict)
    values: dict[Loc, tuple[int, int]] = field(default_factory=dict)
    plain: dict[Loc, str] = field(default_factory=dict)

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

    def copy_under(self, copies: dict[Loc, list[Loc]]) -> None:
        """Give every path under each source prefix (and the prefix itself) the same position
        under each of its targets: the hosts a range block makes are where the block is.

        Example:
            >>> p = Positions(keys={("h", "a-[1:2]"): (3, 3), ("h", "a-[1:2]", "x"): (4, 5)})
            >>> p.copy_under({("h", "a-[1:2]"): [("h", "a-1")]})
            >>> p.keys[("h", "a-1", "x")]
            (4, 5)
        """
        lengths = {len(source) for source in copies}
        tables: tuple[dict[Loc, Any], ...] = (self.keys, self.values, self.plain)
        for table in tables:
            added: dict[Loc, Any] = {}
            for path, at in table.items():
                for length in lengths:
                    for target in copies.get(path[:length], ()):
                        added[(*target, *path[length:])] = at
            table.update(added)

    def on_line(self, line: int) -> Loc:
        """The deepest path whose key or value is on ``line`` (``()`` if none is)."""
        found = [p for table in (self.keys, self.values) for p, at in table.items()
                 if at[0] == line]
        return max(found, key=len, default=())


@dataclass(frozen=True)
class YamlProblem(Exception):
    """A problem found while reading YAML: where, in which field, what, and what to write."""

    line: int | None
    column: int | None
    path: Loc
    message: str
    hint: str | None = None

    def __str__(self) -> str:
        return self.message


@dataclass
class _Frame:
    """A collection being built."""

    value: dict[Any, Any] | list[Any]
    path: Loc
    anchor: str | None
    weight: int = 1
    key: Any = None
    has_key: bool = False
    key_lines: dict[Any, int] = field(default_factory=dict)
    merges: list[dict[Any, Any]] = field(default_factory=list)
    merge_at: tuple[int, int] | None = None
    merge_pending: bool = False


class _Reader:
    """Builds data from events; see :func:`read_yaml`."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.positions = Positions()
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.open_anchors: set[str] = set()
        self.stack: list[_Frame] = []
        self.expanded = 0
        self.aliases = 0
        self.documents = 0
        self.result: Any = None

    # --- where we are ----------------------------------------------------------------------

    def child_path(self) -> Loc:
        """The path of the next value: under the pending key, or the next list item."""
        if not self.stack:
            return ()
        top = self.stack[-1]
        if isinstance(top.value, list):
            return (*top.path, len(top.value))
        if top.has_key:
            return (*top.path, top.key)
        return top.path

    def problem(self, mark: Any, message: str, hint: str | None = None,
                path: Loc | None = None) -> YamlProblem:
        line = mark.line + 1 if mark is not None else None
        column = mark.column + 1 if mark is not None else None
        return YamlProblem(line, column, self.child_path() if path is None else path, message,
                           hint)

    # --- events ----------------------------------------------------------------------------

    def feed(self, event: Any) -> None:
        if isinstance(event, DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                raise self.problem(
                    event.start_mark, "a second YAML document starts here",
                    "a fleet file is one document: remove this '---' line and what follows "
                    "(or merge the two), or put the second one in a file of its own", (),
                )
            if event.version is not None and tuple(event.version) != (1, 2):
                raise self._directive(event)
        elif isinstance(event, ScalarEvent):
            self._tag(event)
            value = self._scalar(event)
            plain = not event.style and not isinstance(value, str)
            self.add(value, event, weight=1, plain=event.value if plain else None)
        elif isinstance(event, AliasEvent):
            self._alias(event)
        elif isinstance(event, CollectionStartEvent):
            self._tag(event)
            self._open(event)
        elif isinstance(event, CollectionEndEvent):
            self._close(event)

    def _directive(self, event: Any) -> YamlProblem:
        version = ".".join(str(part) for part in event.version)
        lines = self.text.split("\n")
        line = next((n for n, text in enumerate(lines, 1) if text.startswith("%YAML")), 1)
        return YamlProblem(
            line, 1, (), f"this tool reads YAML 1.2, not {version}",
            "remove the %YAML line (YAML 1.1 would read yes, no, on and off as booleans and "
            "1:30 as the number 90)",
        )

    def _tag(self, event: Any) -> None:
        tag = None if event.tag is None else str(event.tag)
        if tag is None or tag in _ALLOWED_TAGS:
            return
        shown = tag.replace(_CORE, "!!")
        if shown == "!vault":
            raise self.problem(
                event.start_mark, "an Ansible Vault value (!vault) cannot be read here",
                "give the secret as a reference: {env: VARIABLE} or {file: /path/of/the/secret}",
            )
        raise self.problem(
            event.start_mark, f"the YAML tag {shown} is not part of the fleet format",
            "remove it: values are plain text, numbers, true/false, lists and mappings",
        )

    def _scalar(self, event: Any) -> Any:
        value = event.value
        tag = None if event.tag is None else str(event.tag)
        if tag is None or tag == "!":
            if event.style or tag == "!" or not event.implicit[0]:
                return value
            tag = _resolve(value)
        kind = tag.removeprefix(_CORE)
        converted: Any
        if kind == "null":
            converted = None
        elif kind == "bool":
            converted = value.lower() == "true" if value.lower() in ("true", "false") else None
            if converted is None:
                raise self.problem(event.start_mark, f"{value!r} is not true or false")
        elif kind == "int":
            converted = self._int(value, event)
        elif kind == "float":
            converted = self._float(value, event)
        else:  # str, and what YAML 1.2 has no type for (dates: text here, checked by the field)
            return value
        return converted

    def _int(self, value: str, event: Any) -> int:
        text = value.replace("_", "")
        sign = -1 if text.startswith("-") else 1
        text = text.lstrip("+-")
        base = {"0x": 16, "0o": 8, "0b": 2}.get(text[:2].lower(), 10)
        digits = text[2:] if base != 10 else text
        if len(digits) > MAX_DIGITS:
            raise self.problem(
                event.start_mark, f"a number of {len(digits)} digits",
                f"numbers in a fleet file have at most {MAX_DIGITS} digits; write the value "
                "this field needs",
            )
        try:
            return sign * int(digits, base)
        except ValueError:
            raise self.problem(event.start_mark, f"{value!r} is not a whole number") from None

    def _float(self, value: str, event: Any) -> float:
        text = value.replace("_", "").lower()
        if text.lstrip("+-") in (".inf", "inf"):
            return -math.inf if text.startswith("-") else math.inf
        if text.lstrip("+-") in (".nan", "nan"):
            return math.nan
        digits = len(re.sub(r"[^0-9]", "", text.split("e")[0]))
        if digits > 4 * MAX_DIGITS:
            raise self.problem(
                event.start_mark, f"a number of {digits} digits",
                f"numbers in a fleet file have at most {MAX_DIGITS} digits",
            )
        try:
            return float(text)
        except ValueError:
            raise self.problem(event.start_mark, f"{value!r} is not a number") from None

    def _alias(self, event: Any) -> None:
        name = event.anchor
        if name in self.open_anchors:
            raise self.problem(event.start_mark, f"*{name} refers to the value that contains it",
                               "an alias can only repeat a value that is complete above it")
        if name not in self.anchors:
            raise self.problem(event.start_mark, f"*{name} refers to no anchor",
                               f"define it above with &{name}, or write the value itself")
        value, weight = self.anchors[name]
        self.aliases += 1
        self.expanded += weight
        if self.expanded > MAX_ALIAS_VALUES:
            raise self.problem(
                event.start_mark,
                f"{self.aliases} aliases expand to more than {MAX_ALIAS_VALUES} values",
                "write the values out, or repeat less through aliases (an alias bomb?)",
            )
        self.add(value, event, weight=weight, alias=True)

    def _open(self, event: Any) -> None:
        path = self.child_path()
        if self.stack and isinstance(self.stack[-1].value, dict) and not self.stack[-1].has_key:
            raise self.problem(event.start_mark, "a key must be plain text, not a list or mapping",
                               "write the key as a word, then ': ' and the value")
        if len(self.stack) >= MAX_DEPTH:
            raise self.problem(
                event.start_mark, f"nested more than {MAX_DEPTH} levels deep",
                "a fleet file needs fewer than ten levels; close the brackets sooner",
            )
        self._place(path, event)
        value: dict[Any, Any] | list[Any] = {} if isinstance(event, MappingStartEvent) else []
        if event.anchor:
            self.open_anchors.add(event.anchor)
        self.stack.append(_Frame(value, path, event.anchor))

    def _close(self, event: Any) -> None:
        frame = self.stack.pop()
        if isinstance(frame.value, dict) and frame.merges:
            for source in frame.merges:
                for key, value in source.items():
                    if key not in frame.value:
                        frame.value[key] = value
                        if frame.merge_at:
                            self.positions.keys.setdefault((*frame.path, key), frame.merge_at)
        if frame.anchor:
            self.open_anchors.discard(frame.anchor)
            self.anchors[frame.anchor] = (frame.value, frame.weight)
        self._attach(frame.value, frame.weight, event)

    def _place(self, path: Loc, event: Any, scalar: bool = False, value: Any = None) -> None:
        """Record where the value at ``path`` starts (as the key of a mapping, or an item)."""
        mark = event.start_mark
        at = (mark.line + 1, mark.column + 1)
        if not self.stack:
            self.positions.keys[()] = at
            return
        top = self.stack[-1]
        if isinstance(top.value, list) or (top.has_key and scalar and value is not None):
            self.positions.values[path] = at

    def add(self, value: Any, event: Any, weight: int, alias: bool = False,
            plain: str | None = None) -> None:
        """A scalar or an alias's value: a key, a value, an item or the document.

        ``plain``: the text of a plain scalar that YAML read as a number, boolean or null.
        """
        if not self.stack:
            self.result = value
            return
        top = self.stack[-1]
        if isinstance(top.value, dict) and not top.has_key:
            self._key(top, value, event, alias)
            return
        path = self.child_path()
        self._place(path, event, scalar=True, value=value)
        if plain is not None:
            self.positions.plain[path] = plain
        self._attach(value, weight, event)

    def _key(self, top: _Frame, key: Any, event: Any, alias: bool) -> None:
        if isinstance(key, dict | list):
            raise self.problem(event.start_mark, "a key must be plain text, not a list or mapping")
        line = event.start_mark.line + 1
        merge = key == "<<" and not getattr(event, "style", None) and not alias
        top.merge_pending = merge
        if merge:
            top.merge_at = (line, event.start_mark.column + 1)
        elif key in top.value:
            first = top.key_lines.get(key)
            raise YamlProblem(
                line, event.start_mark.column + 1, (*top.path, key),
                f"{key} appears twice in this mapping" + (f" (first on line {first})" if first
                                                           else ""),
                "keep one of them",
            )
        top.key_lines[key] = line
        top.key, top.has_key = key, True
        top.weight += 1
        if not merge:
            self.positions.keys[(*top.path, key)] = (line, event.start_mark.column + 1)

    def _attach(self, value: Any, weight: int, event: Any) -> None:
        if not self.stack:
            self.result = value
            return
        top = self.stack[-1]
        top.weight += weight
        if isinstance(top.value, dict) and top.merge_pending:
            sources = value if isinstance(value, list) else [value]
            if not all(isinstance(source, dict) for source in sources):
                raise self.problem(event.start_mark, "'<<' merges a mapping (or a list of them)",
                                   "write <<: *name, where &name marks a mapping")
            top.merges.extend(sources)
            top.has_key = top.merge_pending = False
            return
        if isinstance(top.value, list):
            top.value.append(value)
        else:
            top.value[top.key] = value
            top.has_key = False


def read_yaml(text: str) -> tuple[Any, Positions]:
    """Plain data (dict, list, str, int, float, bool, None) and positions of one YAML document.

    Raise :class:`YamlProblem` for broken YAML and for what passes a limit.

    Example:
        >>> read_yaml("a: 1\\na: 2\\n")
        Traceback (most recent call last):
        ...
        fleet.read.yamlread.YamlProblem: a appears twice in this mapping (first on line 1)
    """
    try:
        reader = _read(text)
    except MarkedYAMLError as err:
        raise _explain(err, err.reader, text) from None  # type: ignore[attr-defined]
    except YAMLError as err:
        message = f"this is not YAML a fleet file can hold: {err}"
        raise YamlProblem(None, None, (), message) from None
    return reader.result, reader.positions


def _offset(lines: list[str], mark: Any) -> int | None:
    """The index in the text of a parser mark."""
    if mark is None or mark.line >= len(lines):
        return None
    return sum(len(line) + 1 for line in lines[: mark.line]) + mark.column


def _path_of_line(reader: _Reader, lines: list[str], line: int | None) -> Loc:
    """The field of ``line`` as far as the reader got (the scanner reads ahead of the events:
    a key on the broken line may not have reached the reader yet)."""
    if line is None:
        return reader.child_path()
    found = reader.positions.on_line(line)
    if found:
        return found
    top = reader.stack[-1] if reader.stack else None
    text = lines[line - 1] if line <= len(lines) else ""
    key = re.match(r"\s*(?:-\s+)?([A-Za-z0-9_.-]+):(\s|$)", text)
    if top is not None and isinstance(top.value, dict) and not top.has_key and key:
        return (*top.path, key[1])
    return reader.child_path()


def _explain(err: MarkedYAMLError, reader: _Reader, text: str) -> YamlProblem:
    """The parser's complaint in a person's words, at the line where the cause is."""
    problem = (err.problem or "").strip()
    context = (err.context or "").strip()
    mark = err.problem_mark or err.context_mark
    lines = text.split("\n")
    path = _path_of_line(reader, lines, mark.line + 1 if mark is not None else None)

    def at(where: Any, message: str, hint: str | None = None) -> YamlProblem:
        line = where.line + 1 if where is not None else None
        column = where.column + 1 if where is not None else None
        return YamlProblem(line, column, path, message, hint)

    index = _offset(lines, mark)
    if index is not None and text[index : index + 1] == "\t":
        return at(mark, f"a tab at column {mark.column + 1}", TAB_HINT)
    if "maximum nesting depth" in problem:  # libyaml's own limit, met while reading ahead
        path = reader.stack[-1].path if reader.stack else ()
        return at(mark, f"nested more than {MAX_DEPTH} levels deep",
                  "a fleet file needs fewer than ten levels; close the brackets sooner")
    if "quoted scalar" in context and "end of stream" in problem:
        return at(err.context_mark, "the quote opened here is never closed",
                  "close it with the same quote on this line")
    if "mapping values are not allowed" in problem and mark is not None:
        line = lines[mark.line] if mark.line < len(lines) else ""
        key, _, value = line.strip().partition(": ")
        value = value.split(" #")[0].strip()
        if key and value and '"' not in value:
            return at(mark, "a ': ' inside a value starts a second key on the same line",
                      f'quote the value: write {key}: "{value}"')
        return at(mark, "a ': ' here starts a key where a value is expected",
                  "quote the value, or put the key on a line of its own, indented under its "
                  "parent")
    braced = _BRACED_START.fullmatch(lines[mark.line]) if mark is not None and mark.line < len(
        lines) else None
    if braced:
        key = braced["key"]
        if key in path:  # the path ends inside the would-be mapping: name the key itself
            path = path[: len(path) - path[::-1].index(key)]
        return at(mark, "a value beginning with '{' is read as a YAML mapping",
                  f'quote the value: write {key}: "{braced["value"]}"')
    if "flow sequence" in context or "flow mapping" in context:
        opened = err.context_mark
        bracket = "[" if "sequence" in context else "{"
        close = "]" if bracket == "[" else "}"
        where = f" on line {opened.line + 1}" if opened is not None else ""
        return at(mark, f"the '{bracket}' opened{where} is not closed before this point",
                  f"close it with '{close}', and separate items with ', '")
    if "expected key" in problem or "expected <block end>" in problem or (
        "could not find expected ':'" in problem
    ):
        return at(mark, "this line is not indented like the lines around it",
                  "indent a key under its parent by two more spaces than the parent, and "
                  "keys of one mapping by the same amount")
    if "block mapping" in context and "expected" in problem:
        return at(mark, "this line is not indented like the lines around it",
                  "keys of one mapping start in the same column")
    message = problem or context or "this is not valid YAML"
    return at(mark, f"YAML: {message}")


def fields_by_line(text: str) -> Positions:
    """The positions :func:`read_yaml` found in ``text`` up to its first problem, if any (to
    name the field of a line that another check found wrong).

    Example:
        >>> fields_by_line("a:\\n  b: 1\\n  c: [\\n").on_line(2)
        ('a', 'b')
    """
    reader = _Reader(text)
    try:
        for event in _events(text):
            if isinstance(event, StreamEndEvent):
                break
            reader.feed(event)
    except (YAMLError, YamlProblem):
        pass
    return reader.positions
