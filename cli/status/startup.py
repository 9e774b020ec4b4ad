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

import re
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

    def to_json(self) -> dict[str, Any]:
        """Plain data (without the raw marks)."""
        data = asdict(self)
        data.pop("marks")
        return data


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
