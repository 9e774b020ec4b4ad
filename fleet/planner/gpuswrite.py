"""Write chosen ``gpus:`` into a fleet file's text, keeping every other byte as it was.

ruamel.yaml's round-trip loader finds each server's mapping and the line and column of its
keys; the edit is then made in the text itself: one ``gpus: [...]`` line after the server's
``model:`` line (block mappings, at the model key's indentation), ``gpus: [...], `` before the
key that follows ``model`` (flow mappings), or the value of an empty ``gpus: []`` replaced.
Dumping ruamel's document instead would rewrite what it does not keep: a block scalar with an
explicit indentation indicator (the H200 example's ``topology: |4``) comes back as ``|2`` with
its lines re-indented. Comments, order, quoting and line ends stay untouched.

Example:
    >>> text = "hosts:\\n  h:\\n    servers:\\n      s:  # the chat server\\n        model: m\\n"
    >>> print(write_gpus(text, {("h", "s"): [0, 1]}), end="")
    hosts:
      h:
        servers:
          s:  # the chat server
            model: m
            gpus: [0, 1]
"""

from __future__ import annotations

import io
import re
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from fleet.spec.hostranges import MAX_HOSTS, RangeProblem, expand_name, range_count, range_keys


class WriteProblem(ValueError):
    """A server whose gpus cannot be written into the text: the person writes them."""


def _flow(indices: list[int]) -> str:
    return "[" + ", ".join(str(i) for i in indices) + "]"


def _offsets(text: str) -> list[int]:
    """The offset where each line starts."""
    starts = [0]
    for match in re.finditer("\n", text):
        starts.append(match.end())
    return starts


def _missing(data: Any, host: str) -> str:
    """Why a host's server is not in the file: not there, or made by a range (whose hosts may
    be placed apart, so no one place in the text is theirs).

    Example:
        >>> _missing({"hosts": {"g-[1:2]": {}}}, "g-2")
        'made by the range g-[1:2]; write its gpus in that block by hand'
    """
    for key in range_keys(data.get("hosts") if isinstance(data, dict) else None):
        try:
            if range_count(key) <= MAX_HOSTS and host in expand_name(key):
                return f"made by the range {key}; write its gpus in that block by hand"
        except RangeProblem:
            continue
    return "not found in the file"


def write_gpus(text: str, chosen: dict[tuple[str, str], list[int]]) -> str:
    """``text`` with ``gpus: [...]`` written for each (host, server) of ``chosen``.

    Raise :class:`WriteProblem` where the text's form leaves no safe place (a ``gpus`` value
    that is not an empty flow list, a flow mapping whose ``model`` is its last key).

    Example:
        >>> write_gpus("hosts: {h: {servers: {s: {model: m, port: 1}}}}\\n", {("h", "s"): [2]})
        'hosts: {h: {servers: {s: {model: m, gpus: [2], port: 1}}}}\\n'
    """
    yaml = YAML(typ="rt")
    data = yaml.load(io.StringIO(text))
    starts = _offsets(text)
    newline = "\r\n" if "\r\n" in text else "\n"
    edits: list[tuple[int, int, str]] = []  # (start offset, end offset, replacement)
    for (host, server), indices in chosen.items():
        try:
            node = data["hosts"][host]["servers"][server]
        except (KeyError, TypeError):
            raise WriteProblem(f"{host}/{server}: {_missing(data, host)}") from None
        if not isinstance(node, CommentedMap):
            raise WriteProblem(f"{host}/{server}: its server entry is not a mapping")
        value = _flow(indices)
        keys = list(node)
        if "gpus" in keys:
            line, column = node.lc.value("gpus")
            start = starts[line] + column
            match = re.match(r"\[[ \t]*\]", text[start:])
            if not match:
                raise WriteProblem(f"{host}/{server}: gpus is given but not as []; edit it there")
            edits.append((start, start + match.end(), value))
            continue
        if "model" not in keys:
            raise WriteProblem(f"{host}/{server}: no model key to write gpus after")
        line, column = node.lc.key("model")
        if node.fa.flow_style():
            after = keys.index("model") + 1
            if after >= len(keys):
                raise WriteProblem(f"{host}/{server}: model is the last key of a flow mapping; "
                                   "write gpus by hand")
            next_line, next_column = node.lc.key(keys[after])
            start = starts[next_line] + next_column
            edits.append((start, start, f"gpus: {value}, "))
            continue
        value_line, _ = node.lc.value("model")
        if value_line != line:
            raise WriteProblem(f"{host}/{server}: model's value is not on its key's line; "
                               "write gpus by hand")
        end = starts[line + 1] if line + 1 < len(starts) else len(text)
        prefix = "" if text[:end].endswith("\n") else newline
        edits.append((end, end, f"{prefix}{' ' * column}gpus: {value}{newline}"))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text
