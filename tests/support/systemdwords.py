"""Read rendered unit text back the way systemd does, for the tests of :mod:`fleet.hostplan.emit`.

Written from systemd's sources (``src/shared/conf-parser.c`` for lines, ``load-fragment.c``
``config_parse_exec`` and ``config_parse_environ`` for the values, ``extract-word.c`` with
``EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE`` for words, ``env-util.c`` ``replace_env_argv`` for ``$``):

- a unit file is lines; blank lines and lines starting with ``#`` or ``;`` are comments; a line
  ending in a backslash is joined to the next with a blank (read conservatively here: a comment
  ending in a backslash swallows the next line too);
- an ``ExecStart*=`` value is one or more commands separated by a word that is an *unquoted*
  ``;``; the first word of each command may carry the prefixes ``-@:+!|`` (read after
  unquoting, so even a quoted first word has them); every word's specifiers (``%x``) are
  expanded after it is extracted (``%%`` is ``%``); at run time a ``$NAME``/``${NAME}`` in a word
  is a variable and ``$$`` is ``$``;
- an ``Environment=`` value is blank-separated words (quotes and C escapes as above, specifiers
  expanded, no ``$``), each ``NAME=value``.

Anything outside what the emitters write (an unknown escape, a specifier, a ``$`` reference other
than ``$MAINPID``) raises :class:`Unexpected`, so that a test fails loudly instead of guessing.

Example:
    >>> commands('+/bin/py -m x "a b" ";" 50%% $$HOME ; -/bin/id')
    [Exec(prefix='+', argv=['/bin/py', '-m', 'x', 'a b', ';', '50%', '$HOME']), Exec(prefix='-', argv=['/bin/id'])]
    >>> environment('"A=x y" B=1')
    {'A': 'x y', 'B': '1'}
"""  # noqa: E501

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIXES = "-@:+!|"
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
            "\\": "\\", '"': '"', "'": "'", "s": " "}  # fmt: skip
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Unexpected(ValueError):
    """The text holds something the emitters never write (and this reader does not model)."""


@dataclass(frozen=True)
class Exec:
    """One command of an ``Exec*=`` line: its prefixes and its argv as the program sees it."""

    prefix: str
    argv: list[str]


def lines(unit_text: str) -> list[tuple[str, str]]:
    """Each directive of a unit file as ``(key, raw value)``, sections as ``("[Name]", "")``.

    Example:
        >>> lines("# c\\n[Service]\\nExecStart=/bin/a \\\\\\n  b\\n")
        [('[Service]', ''), ('ExecStart', '/bin/a    b')]
    """
    found: list[tuple[str, str]] = []
    pending: str | None = None
    for raw in unit_text.split("\n"):
        line = raw
        if pending is not None:
            if line.strip()[:1] in ("#", ";"):
                continue
            line = pending + line
            pending = None
        if _odd_trailing_backslash(line):
            pending = line[:-1] + " "
            continue
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("["):
            found.append((stripped, ""))
            continue
        if "=" not in stripped:
            raise Unexpected(f"a line that is no directive: {stripped!r}")
        key, value = stripped.split("=", 1)
        found.append((key.strip(), value.strip()))
    if pending is not None:
        stripped = pending.strip()
        if stripped and stripped[0] not in "#;":
            key, value = stripped.split("=", 1)
            found.append((key.strip(), value.strip()))
    return found


def _odd_trailing_backslash(line: str) -> bool:
    count = len(line) - len(line.rstrip("\\"))
    return count % 2 == 1


def _words(value: str) -> list[tuple[str, bool]]:
    """``value`` split by extract_first_word (unquote, C unescape): (word, was it a bare ``;``)."""
    words: list[tuple[str, bool]] = []
    index, size = 0, len(value)
    while True:
        while index < size and value[index] in " \t\n\r":
            index += 1
        if index >= size:
            return words
        if value[index] == ";" and (index + 1 == size or value[index + 1] in " \t\n\r"):
            words.append((";", True))
            index += 1
            continue
        if value[index:index + 2] == "\\;" and (index + 2 == size or value[index + 2] in " \t"):
            words.append((";", False))  # systemd's explicit check: a literal ";" word
            index += 2
            continue
        word: list[str] = []
        quote: str | None = None
        while index < size:
            char = value[index]
            if quote is None and char in " \t\n\r":
                break
            if char == "\\":
                if index + 1 >= size:
                    raise Unexpected("a backslash at the end of a value")
                escaped = value[index + 1]
                if escaped == "x":
                    word.append(chr(int(value[index + 2:index + 4], 16)))
                    index += 4
                    continue
                if escaped not in _ESCAPES:
                    raise Unexpected(f"an escape this reader does not model: \\{escaped}")
                word.append(_ESCAPES[escaped])
                index += 2
            elif quote is None and char in "\"'":
                quote = char
                index += 1
            elif char == quote:
                quote = None
                index += 1
            else:
                word.append(char)
                index += 1
        if quote is not None:
            raise Unexpected(f"an unterminated {quote} quote")
        words.append(("".join(word), False))


def specifiers(word: str) -> str:
    """A word after systemd's specifier expansion; :class:`Unexpected` for a real specifier."""
    out: list[str] = []
    index = 0
    while index < len(word):
        if word[index] == "%":
            if word[index + 1:index + 2] != "%":
                raise Unexpected(f"a specifier {word[index:index + 2]!r} in {word!r}")
            out.append("%")
            index += 2
        else:
            out.append(word[index])
            index += 1
    return "".join(out)


def variables(word: str, known: dict[str, str] | None = None) -> str:
    """A word after systemd's run-time ``$`` handling: ``$$`` is ``$``; ``$NAME``/``${NAME}``
    is replaced from ``known`` (default ``MAINPID``), any other reference is :class:`Unexpected`."""
    known = {"MAINPID": "$MAINPID"} if known is None else known
    out: list[str] = []
    index = 0
    while index < len(word):
        if word[index] != "$":
            out.append(word[index])
            index += 1
            continue
        if word[index + 1:index + 2] == "$":
            out.append("$")
            index += 2
            continue
        match = re.match(r"\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*)", word[index + 1:])
        if not match:
            out.append("$")
            index += 1
            continue
        name = match.group(1) or match.group(2)
        if name not in known:
            raise Unexpected(f"a variable reference ${name} in {word!r}")
        out.append(known[name])
        index += 1 + match.end()
    return "".join(out)


def commands(value: str) -> list[Exec]:
    """The commands of an ``Exec*=`` value, as systemd runs them.

    Example:
        >>> commands('/bin/a "x ; +y" \\\\; z')
        [Exec(prefix='', argv=['/bin/a', 'x ; +y', ';', 'z'])]
    """
    found: list[Exec] = []
    current: list[str] = []
    for word, separator in _words(value):
        if separator:
            if current:
                found.append(_command(current))
            current = []
            continue
        current.append(word)
    if current:
        found.append(_command(current))
    return found


def _command(words: list[str]) -> Exec:
    first = words[0]
    prefix = ""
    while first and first[0] in PREFIXES:
        prefix, first = prefix + first[0], first[1:]
    argv = [first, *words[1:]]
    return Exec(prefix=prefix, argv=[variables(specifiers(word)) for word in argv])


def environment(value: str) -> dict[str, str]:
    """The assignments of an ``Environment=`` value, in order."""
    found: dict[str, str] = {}
    for word, _ in _words(value):
        word = specifiers(word)
        name, sep, text = word.partition("=")
        if not sep or not _ENV_NAME.fullmatch(name):
            raise Unexpected(f"not an assignment: {word!r}")
        found[name] = text
    return found
