"""Read rendered files back the way their consumers read them: systemd unit files (sections,
directives, line continuations, comments), command lines (``ExecStart=``, ``ExecStartPre=``,
``ExecStartPost=``: commands split at a lone ``;``, prefixes, quotes, C escapes, specifiers,
variables), ``Environment=`` assignments, environment files and YAML.

The rules are systemd's (``man systemd.syntax``, ``systemd.service`` "Command lines",
``systemd.exec`` ``Environment=``; the code is ``config_parse()`` in
``src/shared/conf-parser.c``, ``config_parse_exec()`` and ``config_parse_environ()`` in
``src/core/load-fragment.c``, ``extract_first_word()`` in ``src/basic/extract-word.c``,
``cunescape_one()`` in ``src/basic/escape.c`` and ``replace_env_argv()`` in
``src/basic/env-util.c``). Nothing here is shared with the code that renders: a test that reads
a unit back with this module checks the render against systemd's reading, not against itself.

Example:
    >>> unit = parse_unit("[Service]\\nExecStart=/bin/echo 'a b' 50%% $$HOME\\n")
    >>> [c.argv for c in exec_commands(unit.values("ExecStart")[0])]
    [['/bin/echo', 'a b', '50%', '$HOME']]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from hostside import envfile

#: systemd's WHITESPACE.
WHITESPACE = " \t\n\r"
#: The characters that may begin a command line (``man systemd.service``, table 1).
EXEC_PREFIXES = "-@:+!|"
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
                   "v": "\v", "\\": "\\", '"': '"', "'": "'", "s": " "}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ParseError(ValueError):
    """systemd would refuse (or log and ignore) this text."""


@dataclass(frozen=True)
class Directive:
    """One ``KEY=value`` of a unit: its section, key, value (blanks around it dropped) and the
    first line it is on; ``continued``: it was written over more than one line."""

    section: str
    key: str
    value: str
    line: int
    continued: bool = False


@dataclass
class Unit:
    """A unit file (or drop-in) as systemd reads it.

    + directives: in file order; comments: every comment line's text (with its ``#``/``;``);
      sections: the section names in order of appearance.
    """

    directives: list[Directive] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)

    def values(self, key: str, section: str | None = None) -> list[str]:
        """The values of every ``key=`` (in ``section`` if given), in order."""
        return [d.value for d in self.directives
                if d.key == key and (section is None or d.section == section)]

    def directive_keys(self) -> list[tuple[str, str]]:
        """``(section, key)`` of every directive, in order."""
        return [(d.section, d.key) for d in self.directives]


def _odd_backslashes(line: str) -> bool:
    """Whether ``line`` ends in an unescaped backslash (conf-parser.c's ``escaped`` loop)."""
    count = len(line) - len(line.rstrip("\\"))
    return count % 2 == 1


def parse_unit(text: str) -> Unit:
    """A unit file's text, read by ``config_parse``'s rules.

    A line ending in an odd number of backslashes goes on with the next line (the backslash
    becomes a space; comment lines inside a continuation are skipped); blank lines and lines
    whose first non-blank character is ``#`` or ``;`` are comments; ``[Name]`` opens a section;
    everything else is ``KEY=value``, blanks around both dropped.

    Example:
        >>> unit = parse_unit("# c\\n[Unit]\\nA = x \\\\\\n# skipped\\n  y\\n[S]\\nB=\\n")
        >>> [(d.section, d.key, d.value, d.continued) for d in unit.directives]
        [('Unit', 'A', 'x    y', True), ('S', 'B', '', False)]
        >>> unit.comments
        ['# c']
        >>> parse_unit("[Unit]\\nNoEquals\\n")
        Traceback (most recent call last):
        ...
        tests.support.renderparse.ParseError: line 2: missing '=' in 'NoEquals'
    """
    unit = Unit()
    section: str | None = None
    pending: list[str] | None = None
    start = 0
    for number, raw in enumerate(text.split("\n"), 1):
        raw = raw.removesuffix("\r")
        if pending is not None and raw.lstrip(WHITESPACE)[:1] in ("#", ";"):
            continue  # "Comments in continuation lines are ignored"
        if _odd_backslashes(raw):
            piece = raw[:-1] + " "
            if pending is None:
                pending, start = [piece], number
            else:
                pending.append(piece)
            continue
        if pending is not None:
            line, first, continued = "".join(pending) + raw, start, True
            pending = None
        else:
            line, first, continued = raw, number, False
        section = _parse_line(unit, section, line.strip(WHITESPACE), first, continued)
    if pending is not None:
        _parse_line(unit, section, "".join(pending).strip(WHITESPACE), start, True)
    return unit


def _parse_line(unit: Unit, section: str | None, line: str, number: int,
                continued: bool) -> str | None:
    if not line:
        return section
    if line[0] in "#;":
        unit.comments.append(line)
        return section
    if line[0] == "[":
        if not line.endswith("]") or len(line) < 3:
            raise ParseError(f"line {number}: invalid section header {line!r}")
        unit.sections.append(line[1:-1])
        return line[1:-1]
    if "=" not in line:
        raise ParseError(f"line {number}: missing '=' in {line!r}")
    if section is None:
        raise ParseError(f"line {number}: {line!r} before any section")
    key, value = line.split("=", 1)
    unit.directives.append(Directive(section, key.strip(WHITESPACE), value.strip(WHITESPACE),
                                     number, continued))  # fmt: skip
    return section


def parse_dropin_body(text: str, section: str = "Service") -> Unit:
    """A text of directives without a section header (a template included into one), read as
    if it stood in ``section``.

    Example:
        >>> parse_dropin_body("# x\\nUMask=0077\\n").values("UMask")
        ['0077']
    """
    return parse_unit(f"[{section}]\n{text}")


# --------------------------------------------------------------------------------------------
# Words: extract_first_word(EXTRACT_UNQUOTE | EXTRACT_CUNESCAPE)
# --------------------------------------------------------------------------------------------


def _unescape(text: str, at: int) -> tuple[str, int]:
    """The character of the C escape whose letter is ``text[at]``, and the index after it
    (``cunescape_one``: ``\\a \\b \\f \\n \\r \\t \\v \\\\ \\" \\' \\s``, ``\\xNN``, ``\\NNN``
    octal, ``\\uNNNN``, ``\\UNNNNNNNN``; NUL and anything else refused)."""
    char = text[at]
    if char in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[char], at + 1
    digits, base, width = {"x": ("0123456789abcdefABCDEF", 16, 2),
                           "u": ("0123456789abcdefABCDEF", 16, 4),
                           "U": ("0123456789abcdefABCDEF", 16, 8)}.get(char, ("", 0, 0))
    if base:
        part = text[at + 1: at + 1 + width]
        if len(part) != width or any(c not in digits for c in part):
            raise ParseError(f"bad escape \\{char}{part!r}")
        code, end = int(part, base), at + 1 + width
    elif char in "01234567":
        part = text[at: at + 3]
        if len(part) != 3 or any(c not in "01234567" for c in part):
            raise ParseError(f"bad octal escape \\{part}")
        code, end = int(part, 8), at + 3
    else:
        raise ParseError(f"unknown escape \\{char}")
    if code == 0 or code > 0x10FFFF:
        raise ParseError(f"escape \\{text[at:end]} is NUL or out of range")
    return chr(code), end


def next_word(text: str, at: int) -> tuple[str | None, int]:
    """The next word of ``text`` from ``at`` (quotes removed anywhere in it, C escapes
    resolved inside and outside quotes) and the index after it and its trailing blanks; None at
    the end. An unterminated quote or a bad escape is a ParseError.

    Example:
        >>> next_word(' a"b c"\\\\x41 rest', 0)
        ('ab cA', 12)
    """
    size = len(text)
    while at < size and text[at] in WHITESPACE:
        at += 1
    if at >= size:
        return None, at
    out: list[str] = []
    quote: str | None = None
    while at < size:
        char = text[at]
        if quote is None and char in WHITESPACE:
            break
        if char == "\\":
            if at + 1 >= size:
                raise ParseError("a backslash at the end of the value")
            decoded, at = _unescape(text, at + 1)
            out.append(decoded)
        elif quote is None and char in "'\"":
            quote, at = char, at + 1
        elif char == quote:
            quote, at = None, at + 1
        else:
            out.append(char)
            at += 1
    if quote is not None:
        raise ParseError(f"unterminated {quote} quote")
    while at < size and text[at] in WHITESPACE:
        at += 1
    return "".join(out), at


def specifiers(word: str) -> tuple[str, list[str]]:
    """``word`` with ``%%`` resolved to ``%``, and the other specifiers it holds (``%n``…),
    which systemd would replace (they are left in the word as written).

    Example:
        >>> specifiers("50%% of %n%")
        ('50% of %n%', ['%n', '%'])
    """
    out: list[str] = []
    found: list[str] = []
    at = 0
    while at < len(word):
        if word[at] == "%":
            if word[at + 1: at + 2] == "%":
                out.append("%")
                at += 2
                continue
            spec = word[at: at + 2]
            found.append(spec)
            out.append(spec)
            at += len(spec)
            continue
        out.append(word[at])
        at += 1
    return "".join(out), found


def variables(word: str) -> tuple[str, list[str]]:
    """``word`` with ``$$`` resolved to ``$``, and the variables systemd substitutes in it when
    it runs the command: the word ``$NAME`` (split at blanks into words) and ``${NAME}``
    anywhere (they are left in the word as written).

    Example:
        >>> variables("$MAINPID"), variables("a${X}b$$c"), variables("a$NOT")
        (('$MAINPID', ['MAINPID']), ('a${X}b$c', ['X']), ('a$NOT', []))
    """
    whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
    if whole:
        return word, [whole.group(1)]
    out: list[str] = []
    found: list[str] = []
    at = 0
    while at < len(word):
        if word.startswith("$$", at):
            out.append("$")
            at += 2
        elif word.startswith("${", at):
            end = word.find("}", at)
            if end < 0:
                out.append(word[at:])
                break
            found.append(word[at + 2: end])
            out.append(word[at: end + 1])
            at = end + 1
        else:
            out.append(word[at])
            at += 1
    return "".join(out), found


# --------------------------------------------------------------------------------------------
# Command lines
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One command of an ``Exec*=`` line: its prefixes (``+``, ``-``, …), its words (specifiers
    ``%%`` and ``$$`` resolved; other specifiers and variables left as written), and the
    specifiers and variables systemd would substitute."""

    prefixes: str
    argv: list[str]
    specifiers: list[str]
    variables: list[str]

    @property
    def privileged(self) -> bool:
        """Whether it runs with full privileges (``+``; ``!`` and ``!!`` skip the user too)."""
        return "+" in self.prefixes or "!" in self.prefixes


def exec_commands(value: str) -> list[Command]:
    """The commands of an ``ExecStart=``/``ExecStartPre=``/``ExecStartPost=`` value
    (``config_parse_exec``): a word that is exactly ``;`` (unquoted, or the whole first word)
    separates commands, ``\\;`` is the word ``;``; each command's first word may begin with the
    prefixes ``-@:+!|``.

    Example:
        >>> [(c.prefixes, c.argv) for c in exec_commands("+/bin/a x ; -/bin/b \\\\; y;z")]
        [('+', ['/bin/a', 'x']), ('-', ['/bin/b', ';', 'y;z'])]
        >>> exec_commands("")
        []
    """
    commands: list[Command] = []
    at, size = 0, len(value)
    while True:
        first, at = next_word(value, at)
        if first is None:
            return commands
        if first == ";":
            continue
        prefixes = ""
        while first[len(prefixes): len(prefixes) + 1] in tuple(EXEC_PREFIXES):
            prefixes += first[len(prefixes)]
        words = [first[len(prefixes):]]
        separated = False
        while at < size:
            if value[at] == ";" and (at + 1 == size or value[at + 1] in WHITESPACE):
                at += 1
                separated = True
                break
            if value.startswith("\\;", at) and (at + 2 == size or value[at + 2] in WHITESPACE):
                words.append(";")
                at += 2
                while at < size and value[at] in WHITESPACE:
                    at += 1
                continue
            word, at = next_word(value, at)
            if word is None:
                break
            words.append(word)
        argv, found_specs, found_vars = [], [], []
        for word in words:
            word, specs = specifiers(word)
            word, names = variables(word)
            argv.append(word)
            found_specs += specs
            found_vars += names
        commands.append(Command(prefixes, argv, found_specs, found_vars))
        if not separated:
            return commands


# --------------------------------------------------------------------------------------------
# Environment=
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Assignments:
    """What one ``Environment=`` value sets: ``env`` (valid ``NAME=value`` words, in order;
    later ones win), ``invalid`` (words systemd logs and ignores), and the specifiers other than
    ``%%`` it holds."""

    env: dict[str, str]
    invalid: list[str]
    specifiers: list[str]
    count: int


def environment(value: str) -> Assignments:
    """An ``Environment=`` value (``config_parse_environ``): blank-separated words, each
    unquoted with C escapes, specifiers resolved, then ``NAME=value``; no ``$`` expansion.

    Example (``man systemd.exec``)::

        >>> environment('"VAR1=word1 word2" VAR2=word3 "VAR3=$word 5 6"').env
        {'VAR1': 'word1 word2', 'VAR2': 'word3', 'VAR3': '$word 5 6'}
    """
    env: dict[str, str] = {}
    invalid: list[str] = []
    found: list[str] = []
    at, count = 0, 0
    while True:
        word, at = next_word(value, at)
        if word is None:
            return Assignments(env, invalid, found, count)
        count += 1
        word, specs = specifiers(word)
        found += specs
        name, sep, text = word.partition("=")
        if not sep or not _ENV_NAME.fullmatch(name):
            invalid.append(word)
        else:
            env[name] = text


# --------------------------------------------------------------------------------------------
# Other files
# --------------------------------------------------------------------------------------------


def env_file(text: str) -> dict[str, str]:
    """An ``EnvironmentFile=``'s variables, by systemd's rules (:func:`hostside.envfile.loads`,
    the reader the host-side programs use; its own tests check it against systemd's).

    Example:
        >>> env_file('# c\\nA="x \\\\"y\\\\""\\n')
        {'A': 'x "y"'}
    """
    return envfile.loads(text)


def yaml_file(text: str) -> Any:
    """A YAML file as Prometheus and Alertmanager read it (a safe loader: tags refused).

    Example:
        >>> yaml_file("a: [1, '2']\\n")
        {'a': [1, '2']}
    """
    return yaml.safe_load(text)
