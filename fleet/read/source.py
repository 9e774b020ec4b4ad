"""Bytes in, text out, bounded: read a file of limited size, detect its encoding, find characters
that do not belong in a config file (controls, invisible spaces) and say which and where.

The fleet loader (:mod:`fleet.load`) and the model-file reader (:mod:`fleet.planner.sizing`) read
through
:func:`read_bounded`, so that no path (``/dev/zero``, a FIFO, a huge file) can make them read
without end. Problems come back as :class:`TextProblem` (line, column, message, hint) for the
caller to locate.

Example:
    >>> decode_text("a: 1\\n".encode("utf-16"))
    Traceback (most recent call last):
    ...
    fleet.read.source.TextProblem: the file is UTF-16 (little-endian, with a byte-order mark)
    >>> strange_character("a:\\u00a0b\\n")
    TextProblem(line=1, column=3, message='a no-break space (U+00A0) at column 3, invisible in \
most editors', hint='replace it with a plain space (or delete it)')
"""

from __future__ import annotations

import os
import re
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path

#: How fast a fleet file is read (its characters checked by :func:`strange_character`, its YAML
#: events by :func:`fleet.read.yamlread.read_yaml`), in bytes of CPU time per second: 1.8–2.3 MB/s
#: measured on benchmarks/fleet_scale.py's 10,000-host file (4.1 MB), the lower end taken.
PARSE_BYTES_PER_S = 1_800_000
#: Seconds that reading the largest fleet file may take: a sixth of the 30 s that ``fleet
#: check`` may spend on it in all (issue 21's goal for 10,000 hosts, which take 2.3 s of it).
PARSE_BUDGET_S = 5
#: The largest fleet file read: the budget at that speed, 9 MB, rounded down to 8 MiB — about
#: 20,000 hosts of benchmarks/fleet_scale.py's (410 bytes each, two servers on most), which
#: ``fleet check`` holds in about 700 MB (366 MB at 10,000 hosts).
MAX_FLEET_BYTES = min(PARSE_BUDGET_S * PARSE_BYTES_PER_S, 8 << 20)

#: The first bytes of a Git LFS pointer file (what a clone without ``git lfs`` leaves).
LFS_POINTER = b"version https://git-lfs.github.com/spec/"

_BOMS = [
    (b"\x00\x00\xfe\xff", "UTF-32 (big-endian, with a byte-order mark)"),
    (b"\xff\xfe\x00\x00", "UTF-32 (little-endian, with a byte-order mark)"),
    (b"\xfe\xff", "UTF-16 (big-endian, with a byte-order mark)"),
    (b"\xff\xfe", "UTF-16 (little-endian, with a byte-order mark)"),
]
#: A line that starts a block scalar (``key: |``, ``- >-``).
_BLOCK_HEADER = re.compile(r"(^|[\s:-])[|>][0-9+-]*\s*$")
#: What to do about a tab.
TAB_HINT = "YAML separates and indents with spaces only: replace the tab with spaces"
_SAVE_AS_UTF8 = (
    "save it as UTF-8: in PowerShell, Get-Content FILE | Set-Content -Encoding utf8 FILE "
    "(Windows PowerShell's '>' and Out-File write UTF-16); in an editor, 'Save with encoding: "
    "UTF-8'; or iconv -f utf-16 -t utf-8"
)
#: Names for the characters people paste most often (unicodedata's for the rest).
_NAMES = {
    "\t": "tab", "\u00a0": "no-break space", "\u200b": "zero-width space",
    "\u200c": "zero-width non-joiner", "\u200d": "zero-width joiner", "\u2060": "word joiner",
    "\ufeff": "zero-width no-break space (a byte-order mark)", "\u00ad": "soft hyphen",
    "\x00": "NUL", "\x07": "bell", "\x08": "backspace", "\x0b": "vertical tab",
    "\x0c": "form feed", "\x1b": "escape", "\x7f": "delete", "\x85": "next line",
}


@dataclass(frozen=True)
class TextProblem(Exception):
    """A problem with a file's bytes or characters, at a 1-based line and column."""

    message: str
    line: int | None = None
    column: int | None = None
    hint: str | None = None

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return (f"TextProblem(line={self.line}, column={self.column}, message={self.message!r}, "
                f"hint={self.hint!r})")


def read_bounded(path: Path, limit: int, regular: bool = True) -> bytes:
    """At most ``limit`` bytes of ``path``; raise :class:`TextProblem` if it holds more.

    ``regular``: refuse anything but a regular file (a device, FIFO or socket). Raises OSError
    when the file cannot be opened.

    Example:
        >>> read_bounded(Path("/dev/zero"), 10)
        Traceback (most recent call last):
        ...
        fleet.read.source.TextProblem: /dev/zero is not a regular file
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory", str(path))
        if regular and not stat.S_ISREG(mode):
            raise TextProblem(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise TextProblem(f"{path} is larger than {limit // 1024} KiB")
    return data


def lfs_pointer(data: bytes) -> bool:
    """Whether ``data`` is a Git LFS pointer instead of the file it stands for.

    Example:
        >>> lfs_pointer(b"version https://git-lfs.github.com/spec/v1\\noid sha256:ab\\n")
        True
    """
    return data.startswith(LFS_POINTER)


def decode_text(data: bytes) -> str:
    """UTF-8 text of ``data`` (a UTF-8 byte-order mark is dropped); else raise TextProblem
    naming the encoding, or the line and column of the first byte that is not UTF-8.

    Example:
        >>> decode_text(b"a: caf\\xe9\\n")
        Traceback (most recent call last):
        ...
        fleet.read.source.TextProblem: byte 0xe9 is not UTF-8 (é in Latin-1 or Windows-1252?) at
        column 7
    """
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise TextProblem(f"the file is {name}", 1, None, _SAVE_AS_UTF8)
    head = data[:400]
    if b"\x00" in head:
        odd, even = head[1::2].count(0), head[0::2].count(0)
        if odd > len(head) // 4 and even == 0:
            raise TextProblem("the file is UTF-16 (little-endian)", 1, None, _SAVE_AS_UTF8)
        if even > len(head) // 4 and odd == 0:
            raise TextProblem("the file is UTF-16 (big-endian)", 1, None, _SAVE_AS_UTF8)
    data = data.removeprefix(b"\xef\xbb\xbf")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        start = data.rfind(b"\n", 0, err.start) + 1
        column = len(data[start : err.start].decode("utf-8", "replace")) + 1
        byte = data[err.start]
        guess = bytes([byte]).decode("cp1252", "replace")
        latin = f" ({guess} in Latin-1 or Windows-1252?)" if guess.isprintable() else ""
        raise TextProblem(
            f"byte 0x{byte:02x} is not UTF-8{latin} at column {column}", line, column,
            "save the file as UTF-8 (iconv -f latin1 -t utf-8, or 'Save with encoding: UTF-8')",
        ) from None


def describe(char: str) -> str:
    """A person's name for a character, with its code point and an article.

    Example:
        >>> describe("\\u200b")
        'a zero-width space (U+200B)'
    """
    name = _NAMES.get(char) or unicodedata.name(char, "unnamed character").lower()
    if unicodedata.category(char) == "Cc":
        name = f"control character (U+{ord(char):04X}, {_NAMES.get(char, 'control')})"
        return f"a {name}"
    article = "an" if name[0] in "aeiou" else "a"
    return f"{article} {name} (U+{ord(char):04X})"


def _odd(char: str) -> str | None:
    """'control' or 'invisible' for a character that does not belong in a config file."""
    if char in "\t\n\r":
        return None
    category = unicodedata.category(char)
    if category == "Cc" or category == "Cs" or char in "\ufffe\uffff":
        return "control"
    if (category in ("Zs", "Zl", "Zp") and char != " ") or category == "Cf":
        return "invisible"
    return None


def strange_character(text: str) -> TextProblem | None:
    """The first control character anywhere, or invisible character (U+00A0, U+200B, bidi
    controls, …) or tab outside a comment, in ``text``; None if there is none. Tabs are left
    alone inside quotes and block scalars (``|``: a pasted ``nvidia-smi topo -m``).

    Example:
        >>> print(strange_character("a: 1  # non\\u00a0breaking in a comment is fine\\n"))
        None
        >>> strange_character("a:\\tb\\n").message
        'a tab at column 3'
    """
    block: int | None = None  # the indentation of a block scalar's header line
    for number, line in enumerate(text.split("\n"), 1):
        indent = len(line) - len(line.lstrip(" "))
        in_block = block is not None and (not line.strip() or indent > block)
        if not in_block:
            block = None
        if line.isascii() and line.isprintable():
            if not in_block and _BLOCK_HEADER.search(line.split(" #")[0]):
                block = indent
            continue
        quote = None
        comment = False
        for index, char in enumerate(line):
            if char == "\r" and index == len(line) - 1:
                continue
            kind = _odd(char)
            if char == "\t" and not (comment or quote or in_block):
                return TextProblem(f"a tab at column {index + 1}", number, index + 1, TAB_HINT)
            if kind == "control" or (kind == "invisible" and not comment):
                column = index + 1
                if kind == "control":
                    hint = "remove it (terminal colours or a binary paste?)"
                    message = f"{describe(char)} at column {column}"
                else:
                    hint = "replace it with a plain space (or delete it)"
                    message = f"{describe(char)} at column {column}, invisible in most editors"
                return TextProblem(message, number, column, hint)
            if comment or in_block:
                continue
            if quote:
                quote = None if char == quote else quote
            elif char in "'\"" and (index == 0 or line[index - 1] in " \t:[{,-"):
                quote = char
            elif char == "#" and (index == 0 or line[index - 1] in " \t"):
                comment = True
        if not in_block and _BLOCK_HEADER.search(line.split(" #")[0]):
            block = indent
    return None


def blank_strange(text: str) -> str:
    """``text`` with every invisible space replaced by a space and every other control or
    invisible character by ``_`` (same columns), for locating the field a :class:`TextProblem`
    is in.

    Example:
        >>> blank_strange("a:\\u00a0b\\x1b[0m")
        'a: b_[0m'
    """
    return "".join(
        (" " if unicodedata.category(char).startswith("Z") else "_") if _odd(char) else char
        for char in text
    )
