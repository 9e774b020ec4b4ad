"""Time to ready, in parts: each start of a server cut into phases from its own log lines.

The lines are the server's journal (``journalctl -o short-iso-precise``: an ISO timestamp
with microseconds, then ``host unit[pid]: message``) or any log whose lines start with such a
timestamp. A start begins at systemd's ``Starting …`` line (or vLLM's banner when the log has
no systemd lines); its phases end at the messages vLLM 0.32 logs (format strings in its own
code, file named beside each marker below):

============================  ===========================================================
phase                         from → to
============================  ===========================================================
process start                 the start → ``Starting to load model`` (imports, config,
                              engine process)
weight loading                → ``Loading weights took`` / ``Model loading took``
compile + profile             → ``Available KV cache memory`` / ``KV cache size:`` (the
                              profile run, where torch.compile runs)
KV cache + warmup             → ``init engine (profile, create kv cache, warmup model)
                              took`` (less the CUDA graph capture)
CUDA graph capture            ``Graph capturing finished in N secs`` (its own figure)
API server                    → ``Application startup complete.``
first completion              → the first ``POST /v1/…`` answered 200
============================  ===========================================================

Every start in the journal is kept, oldest first, so a slow restart after an upgrade shows
beside the fast one before it. A phase whose end marker is missing is None (e.g. the start
is still under way, or ``--enforce-eager`` captured no graph).

Run as a program on the host (standard library only), after the deploy restarted a server and
its first completion came, it records that start: one JSON line appended to the server's
record (so starts outlive the journal's rotation), with the model install that came before it
(download, verify, unpack: the seconds the model installer logged), and prints it:

    python3 startup_phases.py --unit vllm-chat.service --name chat --model tiny \\
        --record /var/lib/vllm-fleet/startups/chat.jsonl \\
        --model-installs /var/lib/vllm-fleet/models/.installs.jsonl

Example:
    >>> lines = [
    ...   "2026-12-01T11:43:43.0+00:00 h systemd[1]: Starting vllm-a.service - vLLM server a",
    ...   "2026-12-01T11:43:50.0+00:00 h python[9]: (Worker pid=9) INFO 12-01 11:43:50 "
    ...   "[cpu_model_runner.py:68] Starting to load model /m...",
    ...   "2026-12-01T11:43:52.5+00:00 h python[9]: INFO:     Application startup complete."]
    >>> start = starts(lines)[0]
    >>> start.phases["process start"], start.total_s, start.phases["weight loading"]
    (7.0, 9.5, None)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s+(.*)$")
_JOURNAL_PREFIX = re.compile(r"^[\w.-]+ [\w@.\-]+(?:\[\d+\])?: (.*)$")

#: Phase names, in order.
PHASES = (
    "process start",
    "weight loading",
    "compile + profile",
    "KV cache + warmup",
    "CUDA graph capture",
    "API server",
    "first completion",
)

#: Markers: name → pattern searched in each message (vLLM 0.32's sources in comments).
MARKERS = {
    "begin_systemd": re.compile(r"^Starting (\S+\.service)\b"),
    "banner": re.compile(r"\[api_utils\.py:\d+\].*\bversion (\S+)"),  # api_utils.py banner
    "weights_start": re.compile(r"Starting to load model"),  # cpu/gpu_model_runner.py
    "weights_end": re.compile(r"Loading weights took|Model loading took"),  # default_loader
    "profile_end": re.compile(r"Available KV cache memory|KV cache size: "),  # gpu_worker,
    # kv_cache_utils.py
    "graphs": re.compile(r"Graph capturing finished in ([\d.]+) secs"),  # gpu_model_runner
    "engine_end": re.compile(r"init engine \(profile, create kv cache, warmup model\) took"),
    "api_ready": re.compile(r"Application startup complete"),  # uvicorn
    "completion": re.compile(r'"POST /v1/(?:chat/)?completions[^"]*" 200'),  # uvicorn access
    "ended": re.compile(r"^(?:Stopped|Deactivated successfully|.*Main process exited)"),
}


@dataclass
class Start:
    """One start of a server, cut into phases.

    + began_at: ISO time of the start; version: vLLM's banner version
    + phases: phase name → seconds (None: its end marker is not in the log)
    + total_s: the start → first completion (or → the API server up, until one came)
    + ready: whether the API server came up
    """

    began_at: str
    version: str | None = None
    phases: dict[str, float | None] = field(default_factory=dict)
    total_s: float | None = None
    ready: bool = False
    marks: dict[str, float] = field(default_factory=dict, repr=False)
    model_install_s: float | None = None
    recorded: bool = False

    def to_json(self) -> dict[str, Any]:
        """Plain data (without the raw marks)."""
        data = asdict(self)
        data.pop("marks")
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Start:
        """A start as :meth:`to_json` wrote it (a line of the deploy's record)."""
        known = {
            name: data[name]
            for name in ("began_at", "version", "phases", "total_s", "ready", "model_install_s")
            if name in data
        }
        return cls(**known, recorded=True)


def split_line(line: str) -> tuple[float, str] | None:
    """``(epoch seconds, message)`` of a timestamped line, or None.

    Example:
        >>> split_line("2026-12-01T11:44:11.5+0000 h python3[7]: INFO: x")
        (1796125451.5, 'INFO: x')
    """
    match = _STAMP.match(line)
    if not match:
        return None
    try:
        when = datetime.fromisoformat(match.group(1)).timestamp()
    except ValueError:
        return None
    message = match.group(2)
    prefixed = _JOURNAL_PREFIX.match(message)
    return when, prefixed.group(1) if prefixed else message


def _span(marks: dict[str, float], start: str, end: str) -> float | None:
    if start in marks and end in marks and marks[end] >= marks[start]:
        return round(marks[end] - marks[start], 2)
    return None


def _finish(start: Start) -> Start:
    marks = start.marks
    graphs = marks.get("graphs_s")
    kv = _span(marks, "profile_end", "engine_end")
    if kv is not None and graphs is not None:
        kv = round(max(kv - graphs, 0.0), 2)
    start.phases = {
        "process start": _span(marks, "begin", "weights_start"),
        "weight loading": _span(marks, "weights_start", "weights_end"),
        "compile + profile": _span(marks, "weights_end", "profile_end"),
        "KV cache + warmup": kv,
        "CUDA graph capture": graphs,
        "API server": _span(marks, "engine_end", "api_ready"),
        "first completion": _span(marks, "api_ready", "completion"),
    }
    start.ready = "api_ready" in marks
    start.total_s = _span(marks, "begin", "completion") or _span(marks, "begin", "api_ready")
    return start


def starts(lines: list[str]) -> list[Start]:
    """Every start in a log, oldest first.

    + lines: journal lines (``short-iso-precise``) or timestamped log lines
    """
    found: list[Start] = []
    current: Start | None = None
    for line in lines:
        parsed = split_line(line)
        if parsed is None:
            continue
        when, message = parsed
        iso = datetime.fromtimestamp(when).astimezone().isoformat(timespec="seconds")
        systemd = MARKERS["begin_systemd"].search(message)
        banner = MARKERS["banner"].search(message)
        if systemd or (banner and (current is None or "banner" in current.marks)):
            if current is not None:
                found.append(_finish(current))
            current = Start(began_at=iso, marks={"begin": when})
        if current is None:
            continue
        marks = current.marks
        if banner and "banner" not in marks:
            marks["banner"] = when
            current.version = banner.group(1)
        for key in ("weights_start", "weights_end", "profile_end", "engine_end", "api_ready"):
            if key not in marks and MARKERS[key].search(message):
                marks[key] = when
        graphs = MARKERS["graphs"].search(message)
        if graphs and "graphs_s" not in marks:
            marks["graphs_s"] = float(graphs.group(1))
        if (
            "api_ready" in marks
            and "completion" not in marks
            and (MARKERS["completion"].search(message))
        ):
            marks["completion"] = when
    if current is not None:
        found.append(_finish(current))
    return found


def merge_recorded(journal: list[Start], recorded: list[str]) -> list[Start]:
    """The journal's starts with the deploy's record: a recorded start the journal no longer
    has (rotated) is kept, one both have takes the record's model install; oldest first.

    Example:
        >>> merge_recorded([Start("2026-12-01T12:00:00+00:00")],
        ...     ['{"began_at": "2026-12-01T11:00:00+00:00", "model_install_s": 3.5}',
        ...      '{"began_at": "2026-12-01T12:00:00+00:00", "model_install_s": 1.0}', 'junk'])
        ... # doctest: +NORMALIZE_WHITESPACE
        [Start(began_at='2026-12-01T11:00:00+00:00', version=None, phases={}, total_s=None,
               ready=False, model_install_s=3.5, recorded=True),
         Start(began_at='2026-12-01T12:00:00+00:00', version=None, phases={}, total_s=None,
               ready=False, model_install_s=1.0, recorded=True)]
    """
    by_time = {start.began_at: start for start in journal}
    for line in recorded:
        try:
            kept = Start.from_json(json.loads(line))
        except (ValueError, TypeError):
            continue
        live = by_time.get(kept.began_at)
        if live is None:
            by_time[kept.began_at] = kept
        else:
            live.model_install_s, live.recorded = kept.model_install_s, True
    return sorted(by_time.values(), key=lambda start: start.began_at)


def model_install_s(lines: list[str], model: str, after: float, before: float) -> float | None:
    """Seconds the model installer took for ``model`` between two times (epoch), summed; None
    when it installed nothing then (the model was already there).

    Example:
        >>> model_install_s(['{"model": "m", "ended_s": 50, "seconds": 4.25}',
        ...                  '{"model": "m", "ended_s": 10, "seconds": 9}'], "m", 20, 60)
        4.25
    """
    total = None
    for line in lines:
        try:
            entry = json.loads(line)
            ended, seconds = float(entry["ended_s"]), float(entry["seconds"])
        except (ValueError, TypeError, KeyError):
            continue
        if entry.get("model") == model and after < ended <= before:
            total = round((total or 0.0) + seconds, 2)
    return total


def _read(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().splitlines()
    except OSError:
        return []


def summary(name: str, start: Start) -> str:
    """The line the deploy prints for a recorded start.

    Example:
        >>> summary("chat", Start("t", phases={"weight loading": 1.5, "API server": None},
        ...         total_s=9.0, ready=True, model_install_s=3.0))
        'chat: ready in 9.0 s (model install 3.0 s before it); weight loading 1.5 s'
    """
    model = (
        f" (model install {start.model_install_s:.1f} s before it)"
        if (start.model_install_s is not None)
        else ""
    )
    ready = (
        f"ready in {start.total_s:.1f} s"
        if start.ready and start.total_s is not None
        else "not ready"
    )
    parts = [f"{phase} {value:.1f} s" for phase, value in start.phases.items() if value is not None]
    return f"{name}: {ready}{model}; " + ", ".join(parts)


def record(unit: str, out: str, model: str | None, installs: str | None) -> Start | None:
    """Append the unit's last start to ``out`` (unless it is there already); the start."""
    journal = subprocess.run(
        ["journalctl", "-u", unit, "-o", "short-iso-precise", "--no-pager", "-n", "20000"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = starts(journal.stdout.splitlines())
    if not found:
        return None
    last = found[-1]
    kept = _read(out)
    if any(f'"began_at": "{last.began_at}"' in line for line in kept):
        return last
    before = found[-2].marks.get("begin", 0.0) if len(found) > 1 else 0.0
    if model and installs:
        last.model_install_s = model_install_s(
            _read(installs), model, before, last.marks.get("begin", 0.0)
        )
    with open(out, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(last.to_json()) + "\n")
    return last


def main(argv: list[str] | None = None) -> int:
    """Record the unit's last start and print it; always 0 (a record that cannot be made is
    said, and never fails the deploy that started the server)."""
    parser = argparse.ArgumentParser(description="Record a vLLM server's last start, in phases.")
    parser.add_argument("--unit", required=True)
    parser.add_argument("--record", required=True, help="the server's JSON-lines record")
    parser.add_argument("--name", help="the server's name, for the printed line")
    parser.add_argument("--model", help="the model the server serves")
    parser.add_argument("--model-installs", help="the model installer's JSON-lines log")
    args = parser.parse_args(argv)
    try:
        start = record(args.unit, args.record, args.model, args.model_installs)
    except OSError as error:
        print(f"{args.name or args.unit}: start not recorded: {error}", flush=True)
        return 0
    if start is None:
        print(f"{args.name or args.unit}: no start in its journal, nothing recorded", flush=True)
        return 0
    print(summary(args.name or args.unit, start), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
