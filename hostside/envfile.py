"""systemd environment files (``EnvironmentFile=``): the one writer and the one reader.

The control machine renders every server's environment file with :func:`dumps`
(:mod:`fleet.hostplan.render`); every program that needs a value back on the host (the readiness
check,
the request program behind ``fleet verify`` and ``fleet complete``) reads it with :func:`read`.
Both follow systemd's rules (``man systemd.exec``, ``EnvironmentFile=``; the parser is
``parse_env_file_internal`` in systemd's ``src/basic/env-file.c``):

- empty lines and lines whose first non-blank character is ``#`` or ``;`` are comments;
  blanks around the name and after ``=`` are dropped;
- an unquoted value keeps its inner blanks, drops trailing ones, and ``\\x`` stands for ``x``
  (a backslash at the end of a line continues it);
- a ``'…'`` value is verbatim; in a ``"…"`` value ``\\"``, ``\\\\``, ``\\$`` and ``\\```
  stand for the character, any other backslash is kept as it is;
- no ``$VAR`` expansion, no specifiers (``%``): what is between the quotes is the value.

The writer leaves plain words bare and double-quotes everything else, escaping ``\\`` and
``"`` only; it refuses what a one-line value cannot hold (line breaks, NUL).

Example:
    >>> text = dumps({"HOME": "/var/lib/x", "VLLM_API_KEY": 'a "b" \\\\ $c'})
    >>> print(text, end="")
    HOME=/var/lib/x
    VLLM_API_KEY="a \\"b\\" \\\\ $c"
    >>> loads(text)["VLLM_API_KEY"]
    'a "b" \\\\ $c'
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: Values written bare: nothing systemd's parser treats specially.
_BARE = re.compile(r"[A-Za-z0-9_./:=,+@-]+")
#: What systemd accepts as a variable name (env_name_is_valid).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BLANK = " \t\n\r"
_NEWLINE = "\n\r"
#: Characters a backslash escapes inside double quotes (systemd's SHELL_NEED_ESCAPE).
_DOUBLE_QUOTE_ESCAPES = '"\\`$'


def quote(value: str) -> str:
    """One value as systemd reads it back unchanged; ValueError for line breaks or NUL.

    Example:
        >>> quote("plain-word"), quote("two words"), quote('say "hi" \\\\o/')
        ('plain-word', '"two words"', '"say \\\\"hi\\\\" \\\\\\\\o/"')
    """
    if "\n" in value or "\r" in value:
        raise ValueError("environment values cannot contain newlines")
    if "\0" in value:
        raise ValueError("environment values cannot contain NUL characters")
    if _BARE.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dumps(env: Mapping[str, str], comment: str | None = None) -> str:
    """The text of an environment file: an optional ``#`` comment line, then ``NAME=value``.

    Example:
        >>> dumps({"A": "1", "B": "x y"}, comment="made here")
        '# made here\\nA=1\\nB="x y"\\n'
    """
    lines = [f"# {comment}"] if comment is not None else []
    for name, value in env.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        lines.append(f"{name}={quote(value)}")
    return "".join(line + "\n" for line in lines)


def loads(text: str) -> dict[str, str]:
    """The variables of an environment file's text, as systemd reads them (last one wins).

    Example:
        >>> loads("# c\\n A = x  y  \\nB='$no \\\\ escape'\\nC=\\"q\\\\\\"\\\\n\\"\\n")
        {'A': 'x  y', 'B': '$no \\\\ escape', 'C': 'q"\\\\n'}
    """
    env: dict[str, str] = {}
    state = "pre_key"
    key: list[str] = []
    value: list[str] = []
    key_blank: int | None = None  # where trailing blanks of the name start
    value_blank: int | None = None  # where trailing blanks of an unquoted value start

    def push() -> None:
        name = "".join(key[:key_blank] if key_blank is not None else key)
        text_value = "".join(value[:value_blank] if value_blank is not None else value)
        if _NAME.fullmatch(name):
            env[name] = text_value

    for c in text:
        if state == "pre_key":
            if c in "#;":
                state = "comment"
            elif c not in _BLANK:
                state, key, key_blank = "key", [c], None
        elif state == "key":
            if c in _NEWLINE:
                state = "pre_key"  # a line without "=": ignored
            elif c == "=":
                state, value, value_blank = "pre_value", [], None
            else:
                if c not in _BLANK:
                    key_blank = None
                elif key_blank is None:
                    key_blank = len(key)
                key.append(c)
        elif state == "pre_value":
            if c in _NEWLINE:
                push()
                state = "pre_key"
            elif c == "'":
                state = "single"
            elif c == '"':
                state = "double"
            elif c == "\\":
                state = "value_escape"
            elif c not in _BLANK:
                state = "value"
                value.append(c)
        elif state == "value":
            if c in _NEWLINE:
                push()
                state = "pre_key"
            elif c == "\\":
                state, value_blank = "value_escape", None
            else:
                if c not in _BLANK:
                    value_blank = None
                elif value_blank is None:
                    value_blank = len(value)
                value.append(c)
        elif state == "value_escape":
            state = "value"
            if c not in _NEWLINE:  # backslash-newline continues the line
                value.append(c)
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                value.append(c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                value.append(c)
        elif state == "double_escape":
            state = "double"
            if c in _DOUBLE_QUOTE_ESCAPES:
                value.append(c)
            elif c != "\n":
                value += ["\\", c]
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c in _NEWLINE:
                state = "pre_key"
        elif state == "comment_escape":  # systemd ≥ 254: an escaped newline ends the comment
            state = "pre_key" if c in _NEWLINE else "comment"
    if state not in ("pre_key", "key", "comment", "comment_escape"):
        push()
    return env


def read(path: str) -> dict[str, str]:
    """The variables of the environment file at ``path``; OSError if it cannot be read."""
    with open(path, encoding="utf-8") as handle:
        return loads(handle.read())


def read_value(path: str, name: str) -> str | None:
    """One variable of the environment file at ``path``; None when it is unset or empty, or the
    file cannot be read (a server without an API key has none)."""
    try:
        return read(path).get(name) or None
    except (OSError, UnicodeDecodeError):
        return None
