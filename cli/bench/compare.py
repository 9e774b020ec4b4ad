"""``fleet bench --compare RUN_A RUN_B``: what changed between two ``--plan`` run directories.

For every server both runs measured, the figures of each stage side by side with B ÷ A:
baseline TTFT and TPOT, the knee and the peak throughput, each ladder load both runs had, the
soak's error rate, drift and memory growth, and what sharing a GPU cost. A change is marked
worse or better when it moves more than :data:`NOISE` (on a busy machine one run's ±10 % is
noise) in the direction that hurts or helps: higher latency and errors hurt, higher
throughput and a later knee help.

Example:
    >>> a = {"servers": {"h/s": {"baseline": {"ttft_ms": {"p50": 10.0}, "tpot_ms": {},
    ...      "output_tokens_per_s": 5.0}}}, "mixed": []}
    >>> b = {"servers": {"h/s": {"baseline": {"ttft_ms": {"p50": 13.0}, "tpot_ms": {},
    ...      "output_tokens_per_s": 5.0}}}, "mixed": []}
    >>> [(r["figure"], r["ratio"], r["verdict"]) for r in compare_runs(a, b)][:1]
    [('TTFT P50 (ms)', 1.3, 'worse')]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from cli.console import err, out

#: Changes within this fraction are not called worse or better.
NOISE = 0.10


class RunError(Exception):
    """A run directory that cannot be read; the message says which and why."""


def load_run(path: str) -> dict[str, Any]:
    """The results of a ``--plan`` run directory (or its results.json).

    Example:
        >>> load_run("/nonexistent")
        Traceback (most recent call last):
        ...
        cli.bench.compare.RunError: /nonexistent: no such run directory
    """
    where = Path(path)
    file = where / "results.json" if where.is_dir() else where
    if not where.exists():
        raise RunError(f"{path}: no such run directory")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunError(f"{path}: no results.json; give a directory that `fleet bench --plan` "
                       "wrote") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RunError(f"{file}: cannot read it: {error}") from None
    except json.JSONDecodeError as error:
        raise RunError(f"{file}:{error.lineno}:{error.colno}: not JSON ({error.msg})") from None
    if not isinstance(data, dict) or data.get("tool") != "fleet bench --plan":
        raise RunError(f"{file}: not the results of `fleet bench --plan` (a plain `fleet "
                       "bench` run has bench.json; compare --plan runs)")
    return data


def _row(server: str, stage: str, figure: str, a: Any, b: Any, higher_is: str) -> dict:
    ratio = b / a if isinstance(a, int | float) and isinstance(b, int | float) and a else None
    verdict = "same"
    if a is None and b is None:
        verdict = "same"
    elif a is None or b is None:
        verdict = "—"
    elif ratio is None:
        verdict = "same" if a == b else ("worse" if (b > a) == (higher_is == "worse")
                                         else "better")
    elif abs(ratio - 1) > NOISE:
        verdict = "worse" if (ratio > 1) == (higher_is == "worse") else "better"
    return {"server": server, "stage": stage, "figure": figure, "a": a, "b": b,
            "ratio": round(ratio, 4) if ratio is not None else None, "verdict": verdict}


def _step_rows(server: str, stage: str, a: dict, b: dict) -> list[dict]:
    return [
        _row(server, stage, "TTFT P50 (ms)", a["ttft_ms"].get("p50"), b["ttft_ms"].get("p50"),
             "worse"),
        _row(server, stage, "TTFT P99 (ms)", a["ttft_ms"].get("p99"), b["ttft_ms"].get("p99"),
             "worse"),
        _row(server, stage, "TPOT P50 (ms)", a["tpot_ms"].get("p50"), b["tpot_ms"].get("p50"),
             "worse"),
        _row(server, stage, "output tokens/s", a["output_tokens_per_s"],
             b["output_tokens_per_s"], "better"),
    ]


def compare_runs(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure both runs have: server, stage, figure, A, B, B ÷ A, verdict."""
    rows: list[dict[str, Any]] = []
    for name in [n for n in a["servers"] if n in b["servers"]]:
        sa, sb = a["servers"][name], b["servers"][name]
        if sa.get("baseline") and sb.get("baseline"):
            rows += [r for r in _step_rows(name, "baseline", sa["baseline"], sb["baseline"])
                     if "P99" not in r["figure"]]
        if sa.get("ladder") and sb.get("ladder"):
            la, lb = sa["ladder"], sb["ladder"]
            rows.append(_row(name, "ladder", "knee (concurrency)", la["knee"]["load"],
                             lb["knee"]["load"], "better"))
            rows.append(_row(name, "ladder", "peak output tokens/s",
                             max((s["output_tokens_per_s"] for s in la["steps"]), default=None),
                             max((s["output_tokens_per_s"] for s in lb["steps"]), default=None),
                             "better"))
            by_load = {s["load"]: s for s in lb["steps"]}
            for step in la["steps"]:
                if step["load"] in by_load:
                    rows += _step_rows(name, f"ladder c={step['load']:g}", step,
                                       by_load[step["load"]])
        if sa.get("soak") and sb.get("soak"):
            ka, kb = sa["soak"], sb["soak"]
            rows.append(_row(name, "soak", "error rate", ka["error_rate"], kb["error_rate"],
                             "worse"))
            for key in ("ttft_p50", "tpot_p50"):
                rows.append(_row(name, "soak", f"{key.split('_')[0].upper()} drift (last ÷ "
                                 "first quarter)", ka["drift"][key], kb["drift"][key], "worse"))
            ma, mb = ka["memory"]["mib"], kb["memory"]["mib"]
            rows.append(_row(name, "soak", "memory growth (MiB)", ma and ma["growth"],
                             mb and mb["growth"], "worse"))
            rows += [r for r in _step_rows(name, "soak", ka["step"], kb["step"])
                     if "P99" not in r["figure"]]
    groups_b = {tuple(g["servers"]): g for g in b.get("mixed", [])}
    for group in a.get("mixed", []):
        other = groups_b.get(tuple(group["servers"]))
        if other is None:
            continue
        for name in group["servers"]:
            ca, cb = group["cost"][name], other["cost"][name]
            rows.append(_row(name, "mixed", "sharing: TTFT P50 ×", ca["ttft_p50"],
                             cb["ttft_p50"], "worse"))
            rows.append(_row(name, "mixed", "sharing: TPOT P50 ×", ca["tpot_p50"],
                             cb["tpot_p50"], "worse"))
            rows.append(_row(name, "mixed", "sharing: tokens/s ×", ca["output_tokens_per_s"],
                             cb["output_tokens_per_s"], "better"))
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return str(value)


def cmd_compare(run_a: str, run_b: str) -> int:
    """Print what changed from ``run_a`` to ``run_b``; exit 2 when a run cannot be read."""
    try:
        a, b = load_run(run_a), load_run(run_b)
    except RunError as error:
        err.print(f"[bold red]fleet bench --compare:[/] {error}", markup=True)
        return 2
    rows = compare_runs(a, b)
    only = sorted(set(a["servers"]) ^ set(b["servers"]))
    table = Table(title=f"fleet bench --compare: A = {run_a} ({a.get('started', '?')}), "
                  f"B = {run_b} ({b.get('started', '?')})", title_justify="left",
                  box=box.SIMPLE_HEAD, caption=f"worse/better: a change of more than "
                  f"{NOISE:.0%} in the direction that hurts/helps", caption_justify="left")
    for header, justify in (("server", "left"), ("stage", "left"), ("figure", "left"),
                            ("A", "right"), ("B", "right"), ("B ÷ A", "right"),
                            ("", "left")):
        table.add_column(header, justify=justify)
    style = {"worse": "red", "better": "green"}
    for row in rows:
        verdict = row["verdict"]
        table.add_row(row["server"], row["stage"], row["figure"], _fmt(row["a"]),
                      _fmt(row["b"]), _fmt(row["ratio"]),
                      f"[{style[verdict]}]{verdict}[/]" if verdict in style else verdict)
    out.print(table)
    for name in only:
        side = "A" if name in a["servers"] else "B"
        out.print(f"note: {name} is only in run {side}", markup=False)
    if not rows:
        out.print("note: the two runs have no figure in common (no server both measured)",
                  markup=False)
    worse = sum(1 for r in rows if r["verdict"] == "worse")
    better = sum(1 for r in rows if r["verdict"] == "better")
    out.print(f"{worse} worse, {better} better, {len(rows) - worse - better} within "
              f"{NOISE:.0%} or not comparable", markup=False)
    return 0
