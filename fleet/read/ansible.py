"""An Ansible inventory the site already keeps (INI or YAML) → one group's hosts and their
connection variables, each with its line; bounded, and every problem located in that file.

Read: groups (``[gpus]``; YAML ``hosts:``), their child groups (``[gpus:children]``; YAML
``children:``, any depth, a group met twice read once), each host's ``ansible_host``,
``ansible_port`` and ``ansible_user``; the rest (``[gpus:vars]``, other variables) is Ansible's
and left alone. Host patterns with ranges (``gpu-[01:16]``) are kept as written: the caller
makes them into hosts by its own rules.

Example:
    >>> text = "[gpus]\\ngpu-[1:2] ansible_user=ops\\n\\n[all:vars]\\nx=1\\n"
    >>> group_hosts(text, "gpus", yaml_form=False)
    [InventoryHost(pattern='gpu-[1:2]', line=2, variables={'ansible_user': 'ops'})]
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from fleet.read.yamlread import YamlProblem, read_yaml

#: The largest inventory file read: far above any site's (a line a host, 20,000 hosts of 100
#: bytes is 2 MB).
MAX_INVENTORY_BYTES = 4 << 20
#: The variables read; the rest are Ansible's own.
READ_VARIABLES = ("ansible_host", "ansible_port", "ansible_user")
_SECTION = re.compile(r"\[(?P<name>[^\[\]:\s]+)(?::(?P<kind>vars|children))?\]\s*")


@dataclass(frozen=True)
class InventoryHost:
    """One host line (or YAML key) of a group: its pattern, line, and the variables read."""

    pattern: str
    line: int
    variables: dict[str, str] = field(default_factory=dict)


class InventoryProblem(ValueError):
    """A problem with the inventory file, at a line (None: the file as a whole)."""

    def __init__(self, message: str, line: int | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message, self.line, self.hint = message, line, hint


def group_hosts(text: str, group: str, yaml_form: bool) -> list[InventoryHost]:
    """The hosts of ``group`` (with its child groups') in the inventory ``text``, in order, each
    once; InventoryProblem when the group is not there or a line cannot be read.

    Example:
        >>> text = "all:\\n  children:\\n    gpus:\\n      hosts:\\n"
        >>> group_hosts(text + "        a: {ansible_port: 2222}\\n", "gpus", yaml_form=True)
        [InventoryHost(pattern='a', line=5, variables={'ansible_port': '2222'})]
    """
    groups, children = _read_yaml(text) if yaml_form else _read_ini(text)
    if group == "all" and "all" not in groups:  # INI: every group is under all
        groups["all"] = [host for members in groups.values() for host in members]
    if group not in groups and group not in children:
        known = ", ".join(sorted(set(groups) | set(children))[:12]) or "none"
        raise InventoryProblem(f"the inventory has no group {group!r}",
                               hint=f"its groups: {known}")
    out: dict[str, InventoryHost] = {}
    seen: set[str] = set()
    todo = [group]
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        for host in groups.get(name, []):
            out.setdefault(host.pattern, host)
        todo.extend(children.get(name, []))
    return list(out.values())


def _read_ini(text: str) -> tuple[dict[str, list[InventoryHost]], dict[str, list[str]]]:
    """Ansible's INI form: hosts before any section belong to ``ungrouped``."""
    groups: dict[str, list[InventoryHost]] = {"ungrouped": []}
    children: dict[str, list[str]] = {}
    section, kind = "ungrouped", None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            match = _SECTION.fullmatch(line)
            if match is None:
                raise InventoryProblem(f"{line!r} is not a section", number,
                                       "write [group], [group:vars] or [group:children]")
            section, kind = match["name"], match["kind"]
            if kind is None:
                groups.setdefault(section, [])
            elif kind == "children":
                children.setdefault(section, [])
            continue
        if kind == "vars":
            continue
        if kind == "children":
            children[section].append(line.split()[0])
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as error:
            raise InventoryProblem(f"this line cannot be read: {error}", number) from None
        variables = {}
        for word in words[1:]:
            key, equals, value = word.partition("=")
            if not equals:
                raise InventoryProblem(f"{word!r} is not a variable", number,
                                       "write NAME=value after the host")
            if key in READ_VARIABLES:
                variables[key] = value
        groups[section].append(InventoryHost(words[0], number, variables))
    return groups, children


def _read_yaml(text: str) -> tuple[dict[str, list[InventoryHost]], dict[str, list[str]]]:
    """Ansible's YAML form: groups under ``all`` (or at the top), each with ``hosts:`` and
    ``children:``."""
    try:
        data, positions = read_yaml(text)
    except YamlProblem as problem:
        raise InventoryProblem(problem.message, problem.line, problem.hint) from None
    groups: dict[str, list[InventoryHost]] = {}
    children: dict[str, list[str]] = {}

    def visit(name: str, body: Any, path: tuple[Any, ...]) -> None:
        if body is None:
            body = {}
        if not isinstance(body, dict):
            line = positions.find(path)[0]
            raise InventoryProblem(f"group {name} is not a mapping", line,
                                   "write its hosts: and children: under it")
        hosts = body.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise InventoryProblem(f"the hosts of group {name} are not a mapping",
                                   positions.find((*path, "hosts"))[0],
                                   "write each host as a key: gpu-01: {ansible_host: …}")
        members = groups.setdefault(name, [])
        for host, variables in hosts.items():
            line = positions.find((*path, "hosts", host))[0] or 1
            given = variables if isinstance(variables, dict) else {}
            members.append(InventoryHost(str(host), line, {
                key: str(value) for key, value in given.items() if key in READ_VARIABLES}))
        kids = body.get("children") or {}
        if not isinstance(kids, dict):
            raise InventoryProblem(f"the children of group {name} are not a mapping",
                                   positions.find((*path, "children"))[0])
        children.setdefault(name, []).extend(str(kid) for kid in kids)
        for kid, kid_body in kids.items():
            visit(str(kid), kid_body, (*path, "children", kid))

    if not isinstance(data, dict):
        raise InventoryProblem("an Ansible YAML inventory is a mapping of groups", 1)
    for name, body in data.items():
        visit(str(name), body, (name,))
    return groups, children
