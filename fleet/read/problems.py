"""Located problems with a fleet file: :class:`Problem`, :class:`FleetError`, :func:`suggest`.

Every check (structure, cross-field, flags, capacity) reports through these, so that a user
always gets file, line, column, the field and what to write instead.

Example:
    >>> str(Problem("f.yaml", 3, 5, ("hosts", "a", "gpu"), "unknown key", suggest("gpu", ["gpus"])))
    "f.yaml:3:5: hosts.a.gpu: unknown key; did you mean 'gpus'?"
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass

Loc = tuple[str | int, ...]
#: What a check yields before it is located: (path, message, hint).
Finding = tuple[Loc, str, "str | None"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a fleet file, located.

    Example:
        >>> p = Problem("f.yaml", 3, 5, ("hosts", "a", "gpu"), "unknown key", "use 'gpus'")
        >>> str(p)
        "f.yaml:3:5: hosts.a.gpu: unknown key; use 'gpus'"
    """

    file: str
    line: int | None
    column: int | None
    path: Loc
    message: str
    hint: str | None = None
    severity: str = "error"

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        dotted = ".".join(str(p) for p in self.path) or "(file)"
        severity = "warning: " if self.severity == "warning" else ""
        text = f"{where}: {severity}{dotted}: {self.message}"
        if self.hint:
            text += f"; {self.hint}"
        return text


class FleetError(Exception):
    """A fleet file that cannot be used; ``problems`` lists every located error."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def suggest(word: str, choices: typing.Iterable[str]) -> str | None:
    """A "did you mean" hint for ``word`` among ``choices``.

    Example:
        >>> suggest("gpu", ["gpus", "ssh", "servers"])
        "did you mean 'gpus'?"
    """
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None
