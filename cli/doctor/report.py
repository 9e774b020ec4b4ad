"""``fleet doctor``'s report: each server's verdict as text or JSON, and the exit status.

Exit status: 0 nothing wrong, 2 a problem was found (its cause named), 1 a server could not be
diagnosed (unreachable, unreadable, or a cause not known) and no problem was named.

Example:
    >>> from fleet.judge.diagnosis import Diagnosis
    >>> exit_status([Diagnosis("h", "a", "ok", "active (running), /health: 200")])
    0
    >>> print(text([Diagnosis("h", "a", "ok", "active (running), /health: 200")]))
    h/a  ok  active (running), /health: 200
    <BLANKLINE>
    fleet doctor only reads: nothing was changed on any host.
"""

from __future__ import annotations

import json

from fleet.judge.diagnosis import OK, PROBLEM, UNKNOWN, Diagnosis

#: The sentence every report ends with.
READ_ONLY = "fleet doctor only reads: nothing was changed on any host."


def exit_status(diagnoses: list[Diagnosis]) -> int:
    """0 nothing wrong, 2 problems named, 1 could not diagnose (and nothing named)."""
    statuses = {d.status for d in diagnoses}
    if PROBLEM in statuses:
        return 2
    return 1 if UNKNOWN in statuses else 0


def text(diagnoses: list[Diagnosis]) -> str:
    """The report a person reads: one block per server, problems with cause, evidence, fix."""
    out = []
    for d in diagnoses:
        head = f"{d.host}/{d.server}  {d.status}"
        if d.signature:
            head += f"  [{d.signature}]"
        out.append(f"{head}  {d.state}")
        if d.status == OK:
            continue
        if d.cause:
            out.append(f"  cause: {d.cause}")
        if d.evidence:
            out.append("  evidence:")
            out += [f"    {line}" for line in d.evidence]
        if d.fix:
            out.append(f"  fix: {d.fix}")
    counts = {s: sum(1 for d in diagnoses if d.status == s) for s in (OK, PROBLEM, UNKNOWN)}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    if len(diagnoses) > 1:
        out.append(f"\n{len(diagnoses)} servers: {summary}")
    out += ["", READ_ONLY]
    return "\n".join(out)


def to_json(diagnoses: list[Diagnosis]) -> str:
    """The report as JSON: ``{"status": "problems", "read_only": true, "servers": [...]}``.

    Example:
        >>> json.loads(to_json([]))["status"]
        'ok'
    """
    status = {0: "ok", 1: "could not diagnose", 2: "problems"}[exit_status(diagnoses)]
    return json.dumps({"status": status, "read_only": True, "note": READ_ONLY,
                       "servers": [d.to_json() for d in diagnoses]}, indent=2)
