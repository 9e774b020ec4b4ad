r"""Load a fleet file: YAML → merged hosts → validated :class:`fleet.spec.models.Fleet`.

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
import typing
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fleet.checks.crossfield import NO_GPUS, check_capacity, check_fleet, check_warnings
from fleet.checks.localfiles import local_file_problems, local_file_warnings
from fleet.hostplan.secrets import secret_file_findings
from fleet.hostplan.tls import tls_findings
from fleet.planner.replicaset import expand as expand_replicas
from fleet.planner.sizing import resolve_model_files
from fleet.read.bulk import without_gc
from fleet.read.problems import Finding, FleetError, Loc, Problem
from fleet.read.source import (
    MAX_FLEET_BYTES,
    TextProblem,
    blank_strange,
    decode_text,
    read_bounded,
    strange_character,
)
from fleet.read.yamlread import Positions, YamlProblem, fields_by_line, read_yaml
from fleet.spec.hostranges import expand_hosts, fold, is_inventory_block, range_keys
from fleet.spec.models import UNION_TAGS, Fleet
from fleet.spec.wording import explain

#: The largest fleet file read, in bytes: from the time reading it may take
#: (:data:`fleet.read.source.MAX_FLEET_BYTES`, 8 MiB: some 20,000 hosts).
MAX_FILE_BYTES = MAX_FLEET_BYTES
#: The same limit in characters, for text given directly.
MAX_FILE_CHARS = MAX_FILE_BYTES
TOO_LARGE_HINT = ("the limit holds some 20,000 hosts; split a larger fleet into files of one "
                  "site or rack each")


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


def _location(path: Loc, positions: Positions, origin: dict[Loc, Loc]) -> tuple[Loc, Loc]:
    """Map a validated path to where it is written (a host's merged default → defaults.*)."""
    for end in range(len(path), 0, -1):
        if path[:end] in origin:
            return origin[path[:end]] + path[end:], path
    return path, path


def parse_yaml(text: str, file: str) -> tuple[Any, Positions]:
    """Parse YAML text into plain data and its source positions; raise FleetError if broken.

    Control and invisible characters, broken YAML and inputs over a limit (size, nesting,
    aliases, digits) are each one located problem, in the field they are in.

    Example:
        >>> try:
        ...     parse_yaml("a:\\n  b: 1\\n  b: 2\\n", "f.yaml")
        ... except FleetError as err:
        ...     print(err)
        f.yaml:3:3: a.b: b appears twice in this mapping (first on line 2); keep one of them
    """
    if len(text) > MAX_FILE_CHARS:
        message = f"the file is larger than {MAX_FILE_CHARS // 1024} KiB"
        hint = TOO_LARGE_HINT
        raise FleetError([Problem(file, 1, None, (), message, hint)])
    strange = strange_character(text)
    if strange is not None:
        raise FleetError([_text_problem(strange, file, blank_strange(text).replace("\t", " "))])
    try:
        return read_yaml(text)
    except YamlProblem as err:
        raise FleetError([Problem(file, err.line, err.column, err.path, err.message,
                                  err.hint)]) from None


def _text_problem(problem: TextProblem, file: str, readable: str | None) -> Problem:
    """A :class:`TextProblem` located in the field of its line (found in ``readable``)."""
    path: Loc = ()
    if readable is not None and problem.line is not None:
        path = fields_by_line(readable).on_line(problem.line)
    return Problem(file, problem.line, problem.column, path, problem.message, problem.hint)


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
            # Each host's origins apart: dropping one key's looks at that host's only.
            own: dict[Loc, Loc] = {}
            merged["hosts"][name] = _merge(defaults, host, ("defaults",), ("hosts", name), own)
            origin.update(own)
        else:
            merged["hosts"][name] = host
    return merged, origin


def load_text(
    text: str, file: str = "<fleet>", capacity: bool = True, warnings: list[Problem] | None = None,
    unplaced: bool = False,
) -> Fleet:
    """Validate fleet YAML text; raise :class:`FleetError` with every located problem.

    Model config paths are read relative to ``file``'s folder. With ``capacity``, a server
    that :mod:`fleet.planner.fit` finds does not fit is an error too (``fleet plan`` turns it off to
    show the numbers of such a fleet). Warnings do not raise: they are appended to
    ``warnings`` when a list is given (slow GPU links, …). With ``unplaced``, GPU servers
    without ``gpus`` are accepted: :mod:`fleet.planner.placement` chooses them. It runs without the
    cyclic collector (:mod:`fleet.read.bulk`).

    Example:
        >>> load_text("version: 1\\nhosts: {}\\n").hosts
        {}
    """
    with without_gc():
        return _load_text(text, file, capacity, warnings, unplaced)


def _load_text(
    text: str, file: str, capacity: bool, warnings: list[Problem] | None, unplaced: bool
) -> Fleet:
    """:func:`load_text`'s work."""
    raw, positions = parse_yaml(text, file)
    if not isinstance(raw, dict):
        line, column = positions.keys.get((), (1, 1))
        message = "a fleet file is a mapping with version, hosts"
        raise FleetError([Problem(file, line, column, (), message)])
    _env_as_written(raw, positions)
    made_by = _expand_ranges(raw, positions, file)

    def unique(problems: list[Problem]) -> list[Problem]:
        """Each problem once; one for a range block's fault, not one per host."""
        return _unique_of(fold(problems, made_by))

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
            message, hint = explain(error, positions.plain)
            problem = Problem(file, line, column, source, message, hint)
            if loc != full:  # one member of a union ("int", "str", ...): join them below
                alternatives.setdefault(source, []).append(problem)
            else:
                problems.append(problem)
        for members in alternatives.values():
            wanted = dict.fromkeys(m.message.removeprefix("Input should be ") for m in members)
            message = "Input should be " + ", or ".join(wanted)
            problems.append(dataclasses.replace(members[0], message=message))
        raise FleetError(unique(problems)) from None

    def located(findings: typing.Iterable[Finding], severity: str = "error") -> list[Problem]:
        out = []
        for path, message, hint in findings:
            source, _ = _location(path, positions, origin)
            line, column = positions.find(source, value=True)
            out.append(Problem(file, line, column, source, message, hint, severity))
        return out

    replicas = expand_replicas(fleet)
    if replicas.findings:
        raise FleetError(unique(located(replicas.findings)))
    fleet = replicas.fleet
    origin.update(replicas.origin)
    problems = located(resolve_model_files(fleet, Path(file).parent))
    secret_errors, secret_warnings = secret_file_findings(fleet, Path(file))
    problems += located(secret_errors)
    tls_errors, tls_warnings = tls_findings(fleet)
    problems += located(tls_errors)
    problems += located(local_file_problems(fleet))
    problems += located(
        finding for finding in check_fleet(fleet) if not (unplaced and finding[1] == NO_GPUS)
    )
    if capacity and not problems:
        problems += located(check_capacity(fleet))
    if problems:
        raise FleetError(unique(problems))
    if warnings is not None:
        warnings.extend(unique(located([*secret_warnings, *tls_warnings, *check_warnings(fleet),
                                         *local_file_warnings(fleet)], "warning")))
    return fleet


def _env_as_written(raw: dict[str, Any], positions: Positions) -> None:
    """Servers' environment values written as YAML numbers or booleans, as the text written.

    ``OMP_NUM_THREADS: 16`` means the text 16, and ``VLLM_X: 1.10`` the text 1.10 (not the
    number's 1.1): an environment holds only text.

    Example:
        >>> raw, positions = read_yaml("hosts: {a: {servers: {s: {env: {N: 1.10}}}}}")
        >>> _env_as_written(raw, positions)
        >>> raw["hosts"]["a"]["servers"]["s"]["env"]
        {'N': '1.10'}
    """
    hosts = raw.get("hosts")
    for host_name, host in (hosts if isinstance(hosts, dict) else {}).items():
        servers = host.get("servers") if isinstance(host, dict) else None
        for name, server in (servers if isinstance(servers, dict) else {}).items():
            env = server.get("env") if isinstance(server, dict) else None
            for key, value in (env if isinstance(env, dict) else {}).items():
                path = ("hosts", host_name, "servers", name, "env", key)
                if isinstance(value, int | float) and path in positions.plain:
                    env[key] = positions.plain[path]


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


def _expand_ranges(raw: dict[str, Any], positions: Positions, file: str) -> dict[str, str]:
    """Make ``hosts:``'s range keys, and its blocks naming a group of an Ansible inventory,
    into hosts (:mod:`fleet.spec.hostranges`), in ``raw``;
    each made host is located where its block is written. Return each made host's range key;
    raise FleetError, located at the key or its address, for a range that cannot be made."""
    hosts = raw.get("hosts")
    if not isinstance(hosts, dict) or (next(range_keys(hosts), None) is None and not any(
            is_inventory_block(block) for block in hosts.values())):
        return {}
    lines = {key: positions.keys[("hosts", key)][0] for key in hosts
             if ("hosts", key) in positions.keys}
    expanded = expand_hosts(hosts, lines, Path(file).parent)
    if expanded.findings or expanded.elsewhere:
        problems = list(expanded.elsewhere)
        for path, message, hint in expanded.findings:
            line, column = positions.find(path, value=len(path) > 2)
            problems.append(Problem(file, line, column, path, message, hint))
        raise FleetError(_unique_of(problems))
    copies: dict[Loc, list[Loc]] = {}
    for name, key in expanded.made_by.items():
        copies.setdefault(("hosts", key), []).append(("hosts", name))
    positions.copy_under(copies)
    raw["hosts"] = expanded.hosts
    return expanded.made_by


def _unique_of(problems: list[Problem]) -> list[Problem]:
    """Drop repeats (a broken default is reported once, not once per host)."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for problem in problems:
        key = (problem.line, problem.column, problem.path, problem.message)
        if key not in seen:
            seen.add(key)
            out.append(problem)
    return sorted(out, key=lambda p: (p.line or 0, p.column or 0))


def load_fleet(
    path: str | Path, capacity: bool = True, warnings: list[Problem] | None = None,
    unplaced: bool = False,
) -> Fleet:
    """Read and validate a fleet file; raise :class:`FleetError` naming file and line.

    ``capacity``, ``warnings`` and ``unplaced``: as in :func:`load_text`. At most
    :data:`MAX_FILE_BYTES` are read; a file that is not UTF-8 is named by its encoding (UTF-16
    from PowerShell), or by the line of its first byte that is not UTF-8.

    Example:
        >>> found = []
        >>> sorted(load_fleet("inventory/sandbox.yaml", warnings=found).hosts), found
        (['sandbox-1'], [])
    """
    path = Path(path)
    try:
        data = read_bounded(path, MAX_FILE_BYTES, regular=False)
    except OSError as err:
        problem = Problem(str(path), None, None, (), f"cannot read: {err.strerror or err}")
        raise FleetError([problem]) from None
    except TextProblem:  # more than MAX_FILE_BYTES
        message = f"the file is larger than {MAX_FILE_BYTES // 1024} KiB"
        hint = TOO_LARGE_HINT
        raise FleetError([Problem(str(path), 1, None, (), message, hint)]) from None
    try:
        text = decode_text(data)
    except TextProblem as err:
        readable = None
        if err.column is not None:  # a stray byte: find its field in the rest of the text
            readable = blank_strange(data.decode("utf-8", "replace").replace("\ufffd", "?"))
        raise FleetError([_text_problem(err, str(path), readable)]) from None
    return load_text(text, str(path), capacity, warnings, unplaced)
