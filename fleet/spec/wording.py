"""One pydantic error in a person's words: what is wrong and what to write instead.

Beyond pydantic's own sentence, this names the usual traps of YAML and of pasting: a version
that YAML read as a number (``python: 3.10`` is 3.1), a value that must be text (``"570"``,
``"true"``), a GPU range (``[0-1]``), a command line pasted as ``args``, a Hugging Face id used as
a model key. It never shows a regular expression or a class name.

Example:
    >>> explain({"type": "string_type", "loc": ("os", "python"), "input": 3.1,
    ...          "msg": "Input should be a valid string"}, {("os", "python"): "3.10"})
    ('YAML reads 3.10 as the number 3.1', 'write python: "3.10" (in quotes)')
"""

from __future__ import annotations

import re
import shlex
import types
import typing
import unicodedata
from typing import Any

from pydantic import BaseModel

from fleet.read.problems import Loc, suggest
from fleet.spec.models import UNION_TAGS, Fleet

#: What a name (of a host, server or model) may be, for people.
NAME_RULE = "lowercase letters, digits, '.', '_' and '-', starting with a letter or digit"


def model_at(loc: Loc) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``loc`` (for did-you-mean).

    Example:
        >>> model_at(("hosts", "a", "os")).__name__
        'Os'
    """
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


def _description(loc: Loc) -> str | None:
    """The spec's description of the field at ``loc``."""
    model = model_at(loc[:-1])
    if model is None or not loc or loc[-1] not in model.model_fields:
        return None
    return model.model_fields[loc[-1]].description


def explain(error: dict[str, Any], plain: dict[Loc, str]) -> tuple[str, str | None]:
    """A person's wording of one pydantic error, and a hint.

    ``plain``: the source text of plain scalars that YAML read as numbers or booleans, by path.

    Example:
        >>> explain({"type": "dict_type", "loc": ("hosts", "a", "servers", "s", "args"),
        ...     "input": "--max-model-len 4096 --enforce-eager", "msg": ""}, {})[1]
        'write args: {max-model-len: 4096, enforce-eager: true}'
    """
    kind = error["type"]
    is_key = "[key]" in error["loc"]
    loc = tuple(part for part in error["loc"] if part not in UNION_TAGS and part != "[key]")
    value = error.get("input")
    if kind == "extra_forbidden":
        model = model_at(loc[:-1])
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
    if is_key and kind == "string_pattern_mismatch":
        return _bad_name(loc, str(value))
    if kind == "string_pattern_mismatch":
        described = _description(loc)
        foreign = not_ascii(str(value))
        if foreign:
            return f"{value!r} has the wrong form: {foreign}", (
                f"expected: {described}" if described else "write it in ASCII")
        return f"{value!r} has the wrong form", (f"expected: {described}" if described else None)
    if kind == "string_type":
        return _not_text(loc, value, plain.get(loc), message)
    if loc and loc[-1] == "args" and kind == "dict_type":
        return _pasted_args(value, message)
    gpu_item = len(loc) >= 2 and loc[-2] == "gpus" and isinstance(loc[-1], int)
    if gpu_item and isinstance(value, str) and re.fullmatch(r"\s*\d+\s*-\s*\d+\s*", value):
        first, last = (int(part) for part in value.split("-"))
        listed = ", ".join(str(n) for n in range(first, last + 1)) if last - first < 64 else ""
        return f"{value!r} is not a GPU index", f"list each one: gpus: [{listed or '0, 1, …'}]"
    return message, None


def not_ascii(text: str) -> str | None:
    """The first character of ``text`` that is not ASCII, named (a Cyrillic ``а`` looks like a
    Latin ``a``, and two names that look alike would be two units, two files); None if none is.

    Example:
        >>> not_ascii("chаt")
        "'а' (U+0430 CYRILLIC SMALL LETTER A) at character 3 is not ASCII"
        >>> not_ascii("chat") is None
        True
    """
    for index, char in enumerate(text, start=1):
        if not char.isascii():
            name = unicodedata.name(char, "unnamed")
            return f"{char!r} (U+{ord(char):04X} {name}) at character {index} is not ASCII"
    return None


def _bad_name(loc: Loc, name: str) -> tuple[str, str | None]:
    """A key that is not a name; a Hugging Face id as a model key gets its own hint, a name with
    a character that is not ASCII names it."""
    message = f"{name!r} has the wrong form for a name ({NAME_RULE}; at most 63)"
    foreign = not_ascii(name)
    if foreign:
        return f"{name!r} has the wrong form for a name: {foreign}", (
            f"names are ASCII: {NAME_RULE}")
    if len(loc) == 2 and loc[0] == "models" and "/" in name:
        short = re.sub(r"[^a-z0-9._-]+", "-", name.rsplit("/", 1)[-1].lower()).strip("-._")
        return message, (
            f"a model key is a short name of your own: write {short or 'name'}: "
            f"{{hf: {name}, revision: …}} and refer to it as model: {short or 'name'}"
        )
    return message, None


def _not_text(loc: Loc, value: Any, source: str | None, message: str) -> tuple[str, str | None]:
    """Text was expected: say what YAML read instead, and the quoted form to write."""
    key = str(loc[-1]) if loc else "value"
    if value is None:
        if not source:
            return "no value given, where text is expected", f"write the text after {key}:"
        return (f"YAML reads {source} as no value (null), where text is expected",
                f'write {key}: "{source}" (in quotes)')
    if isinstance(value, bool):
        shown = source if source is not None else str(value).lower()
        return (f"YAML reads {shown} as a boolean, where text is expected",
                f'write {key}: "{shown}" (in quotes)')
    if isinstance(value, int | float):
        shown = source if source is not None else str(value)
        if source is not None and source != str(value):
            return f"YAML reads {source} as the number {value}", (
                f'write {key}: "{shown}" (in quotes)'
            )
        return f"YAML reads {shown} as a number, where text is expected", (
            f'write {key}: "{shown}" (in quotes)'
        )
    if isinstance(value, list | dict):
        kind = "a list" if isinstance(value, list) else "a mapping"
        return f"expected text, not {kind}", None
    return message, None


def _pasted_args(value: Any, message: str) -> tuple[str, str | None]:
    """``args`` given as a command line (a string, or a list of words)."""
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError:
            words = value.split()
    elif isinstance(value, list) and all(isinstance(word, str | int | float) for word in value):
        words = [str(word) for word in value]
    else:
        return message, "args is a mapping of vLLM flags: args: {max-model-len: 4096}"
    flags: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if not word.startswith("--"):
            index += 1
            continue
        name, equals, given = word[2:].partition("=")
        if not equals and index + 1 < len(words) and not words[index + 1].startswith("--"):
            given, index = words[index + 1], index + 1
        flags.append(f"{name}: {given if equals or given else 'true'}")
        index += 1
    mapping = "{" + ", ".join(flags[:8]) + (", …" if len(flags) > 8 else "") + "}"
    return (
        "args is a mapping of vLLM flags (names without the dashes), not a command line",
        f"write args: {mapping if flags else '{max-model-len: 4096}'}",
    )


#: Items of a list named in one message, at most (the rest are counted).
LISTED = 5


def listing(items: typing.Iterable[object], sep: str = ", ", first: int = LISTED) -> str:
    """``items`` joined for a message, the first ``first`` of them and a count of the rest, so
    that a fleet of thousands of hosts still gets a message of one readable line.

    Example:
        >>> listing(["gpu-a", "gpu-b"])
        'gpu-a, gpu-b'
        >>> listing([f"h{i}" for i in range(1, 1001)])
        'h1, h2, h3, h4, h5 … and 995 more'
    """
    shown = [str(item) for item in items]
    if len(shown) <= first:
        return sep.join(shown)
    return sep.join(shown[:first]) + f" … and {len(shown) - first} more"
