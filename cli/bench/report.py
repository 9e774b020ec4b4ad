"""Turn step runs into figures, and figures into JSON, CSV, a PNG plot and a summary table.

Per step and per metric (TTFT, TPOT, ITL, E2E; milliseconds): count, mean, min, max, P50, P90,
P95, P99. Throughput: successful requests/s, output tokens/s, total (input + output) tokens/s
over the measured window. Errors by kind. Goodput when SLOs are given. Across steps: the knee
(:func:`loadgen.stats.find_knee` on output tokens/s and P99 E2E).

Example:
    >>> from loadgen.timing import RequestResult
    >>> from loadgen.runner import Step, StepRun
    >>> ok = RequestResult(ok=True, start=0.0, ttft=0.1, e2e=0.5, itl=[0.1] * 4,
    ...                    output_tokens=5, input_tokens=7, usage_reported=True, done=0.5)
    >>> bad = RequestResult(error="http_500", start=0.0, done=0.1)
    >>> r = step_report(StepRun(Step(concurrency=1, requests=2), [ok, bad], [], start=0.0, end=1.0))
    >>> r["ttft_ms"]["mean"], r["tpot_ms"]["p50"], r["errors"], r["output_tokens_per_s"]
    (100.0, 100.0, {'http_500': 1}, 5.0)
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from loadgen.runner import StepRun
from loadgen.stats import PERCENTILES, find_knee, goodput, summarize

#: Metrics reported per step, in milliseconds.
METRICS = ("ttft", "tpot", "itl", "e2e")
_STAT_KEYS = ("mean", *(f"p{q}" for q in PERCENTILES))


def _ms(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        key: (round(value * 1000, 6) if isinstance(value, float) and key != "count" else value)
        for key, value in summary.items()
    }


def step_report(run: StepRun, slo: dict[str, float] | None = None) -> dict[str, Any]:
    """The figures of one step (see the module docstring for the example)."""
    ok = [r for r in run.results if r.ok]
    failed = [r for r in run.results if not r.ok]
    errors: dict[str, int] = {}
    samples: dict[str, str] = {}
    for r in failed:
        kind = r.error or "unknown"
        errors[kind] = errors.get(kind, 0) + 1
        samples.setdefault(kind, r.detail)
    output_tokens = sum(r.output_tokens or 0 for r in ok)
    input_tokens = sum(r.input_tokens or 0 for r in ok)
    seconds = run.seconds
    report: dict[str, Any] = {
        "load": run.step.load,
        "label": run.step.label,
        "concurrency": run.step.concurrency,
        "rate": run.step.rate,
        "requests": len(run.results),
        "ok": len(ok),
        "failed": len(failed),
        "warmup_requests": len(run.warmup),
        "errors": errors,
        "error_samples": samples,
        "seconds": round(seconds, 6),
        "requests_per_s": len(ok) / seconds,
        "output_tokens_per_s": output_tokens / seconds,
        "total_tokens_per_s": (output_tokens + input_tokens) / seconds,
        "output_tokens": output_tokens,
        "input_tokens": input_tokens,
        "usage_missing": sum(1 for r in ok if not r.usage_reported),
        "ttft_ms": _ms(summarize([r.ttft for r in ok if r.ttft is not None])),
        "tpot_ms": _ms(summarize([t for r in ok if (t := r.tpot) is not None])),
        "itl_ms": _ms(summarize([gap for r in ok for gap in r.itl])),
        "e2e_ms": _ms(summarize([r.e2e for r in ok if r.e2e is not None])),
    }
    if slo:
        report["goodput"] = goodput([r.figures() for r in ok], slo, seconds)
        report["goodput"]["fraction_of_sent"] = (
            report["goodput"]["good"] / len(run.results) if run.results else 0.0
        )
    if run.server:
        report["server"] = run.server
    if run.gauges:
        report["server_gauges"] = run.gauges
    if run.gpu is not None:
        report["gpu"] = run.gpu
    return report


def knee(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The knee of a run: the load after which P99 E2E grows faster than output tokens/s.

    Example:
        >>> steps = [{"load": 1, "output_tokens_per_s": 100, "e2e_ms": {"p99": 10}},
        ...          {"load": 2, "output_tokens_per_s": 190, "e2e_ms": {"p99": 11}},
        ...          {"load": 4, "output_tokens_per_s": 200, "e2e_ms": {"p99": 25}}]
        >>> knee(steps)["load"]
        2
    """
    load = find_knee(
        [s["load"] for s in steps],
        [s["output_tokens_per_s"] for s in steps],
        [s["e2e_ms"].get("p99") for s in steps],
    )
    return {
        "load": load,
        "rule": "the last load before P99 E2E latency grows faster than output tokens/s",
        "found": load is not None,
    }


def build_report(
    runs: list[StepRun],
    target: dict[str, Any],
    config: dict[str, Any],
    slo: dict[str, float] | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """The whole run's report (what ``--json`` writes)."""
    steps = [step_report(run, slo) for run in runs]
    return {
        "tool": "fleet bench",
        "target": target,
        "config": config,
        "slo_s": slo or {},
        "steps": steps,
        "knee": knee(steps) if len(steps) > 1 else {"load": None, "found": False,
                                                      "rule": "needs two steps or more"},
        "notes": list(notes or []),
    }


def csv_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per step (the CSV's rows).

    Example:
        >>> row = csv_rows({"steps": [{"load": 1, "label": "c 1", "requests": 2, "ok": 2,
        ...     "failed": 0, "requests_per_s": 1.0, "output_tokens_per_s": 9.0,
        ...     "total_tokens_per_s": 12.0, "errors": {}, "ttft_ms": {"mean": 5.0}}]})[0]
        >>> row["ttft_mean_ms"], row["errors"]
        (5.0, '')
    """
    rows = []
    for step in report["steps"]:
        row: dict[str, Any] = {
            key: step.get(key)
            for key in ("load", "label", "concurrency", "rate", "requests", "ok", "failed",
                        "requests_per_s", "output_tokens_per_s", "total_tokens_per_s")
        }
        row["errors"] = ";".join(f"{k}={v}" for k, v in sorted(step.get("errors", {}).items()))
        for metric in METRICS:
            summary = step.get(f"{metric}_ms", {})
            for key in _STAT_KEYS:
                row[f"{metric}_{key}_ms"] = summary.get(key)
        good = step.get("goodput")
        row["goodput_requests_per_s"] = good["requests_per_s"] if good else None
        row["goodput_fraction"] = good["fraction"] if good else None
        server = step.get("server", {})
        row["server_ttft_mean_ms"] = _scaled(server.get("ttft", {}).get("mean"))
        row["server_ttft_p99_ms"] = _scaled(server.get("ttft", {}).get("p99"))
        row["server_preemptions"] = server.get("preemptions")
        row["server_kv_cache_usage_max"] = (
            step.get("server_gauges", {}).get("kv_cache_usage", {}).get("max")
        )
        rows.append(row)
    return rows


def _scaled(seconds: float | None) -> float | None:
    return round(seconds * 1000, 6) if seconds is not None else None


def write_json(report: dict[str, Any], path: Path) -> None:
    """Write the report as indented JSON."""
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def write_csv(report: dict[str, Any], path: Path) -> None:
    """Write one row per step."""
    rows = csv_rows(report)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["load"])
        writer.writeheader()
        writer.writerows(rows)


def write_plot(report: dict[str, Any], path: Path) -> None:
    """A PNG: TTFT, TPOT and E2E percentiles, and throughput, against the load (knee marked)."""
    # Imported here, not at the top: matplotlib takes ~0.5 s to import and only --plot needs it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = report["steps"]
    loads = [s["load"] for s in steps]
    rate_mode = bool(steps) and steps[0].get("rate") is not None
    xlabel = "request rate (req/s)" if rate_mode else "concurrency"
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    panels = [("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"), ("e2e", "E2E latency (ms)")]
    for ax, (metric, title) in zip(axes.flat, panels, strict=False):
        for key, style in (("p50", "-o"), ("p90", "--s"), ("p99", ":^")):
            values = [s[f"{metric}_ms"].get(key) for s in steps]
            ax.plot(loads, [v if v is not None else float("nan") for v in values], style,
                    label=key.upper(), markersize=4)
        ax.set_title(title)
        ax.set_ylabel("ms")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes.flat[3]
    ax.plot(loads, [s["output_tokens_per_s"] for s in steps], "-o", color="tab:green",
            label="output tokens/s", markersize=4)
    if any("goodput" in s for s in steps):
        ax.plot(loads, [s["goodput"]["requests_per_s"] * (s["output_tokens"] / s["ok"])
                        if s.get("goodput") and s["ok"] else 0.0 for s in steps],
                "--", color="tab:olive", label="goodput (tokens/s of good requests)")
    ax.set_ylabel("tokens/s")
    ax.set_title("Throughput")
    ax.grid(True, alpha=0.3)
    twin = ax.twinx()
    twin.plot(loads, [s["requests_per_s"] for s in steps], ":s", color="tab:purple",
              label="requests/s", markersize=4)
    twin.set_ylabel("requests/s")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    knee_load = report.get("knee", {}).get("load")
    for ax in axes.flat:
        if knee_load is not None:
            ax.axvline(knee_load, color="tab:red", alpha=0.5, linestyle="--")
        if len(loads) > 2 and loads[-1] / max(loads[0], 1e-9) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(loads, [f"{v:g}" for v in loads])
        ax.minorticks_off()
        ax.set_xlabel(xlabel)
    title = f"fleet bench: {report['target'].get('name') or report['target'].get('url')}"
    if knee_load is not None:
        title += f" — knee at {knee_load:g}"
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def summary_table(report: dict[str, Any]) -> Table:
    """A rich table: one row per step, the client's figures (ms) and the server's beside them."""
    has_slo = bool(report.get("slo_s"))
    has_server = any("server" in s for s in report["steps"])
    name = report["target"].get("name") or report["target"].get("url") or ""
    table = Table(title=f"fleet bench — {name}", title_justify="left", box=box.SIMPLE_HEAD,
                  padding=(0, 1), caption="times in ms; srv = the server's own /metrics",
                  caption_justify="left")
    for header in ("load", "ok", "req/s", "tok/s", "TTFT p50", "p99", "TPOT p50", "p99",
                   "ITL p99", "E2E p99"):
        table.add_column(header, justify="right")
    if has_slo:
        table.add_column("good", justify="right")
    if has_server:
        for header in ("srv TTFT", "preempt", "KV max"):
            table.add_column(header, justify="right")
    table.add_column("errors")
    knee_load = report.get("knee", {}).get("load")
    for s in report["steps"]:
        row = [
            f"{s['load']:g}" + ("◀knee" if s["load"] == knee_load else ""),
            f"{s['ok']}/{s['requests']}",
            _fmt(s["requests_per_s"], 2),
            _fmt(s["output_tokens_per_s"], 0),
            _fmt(s["ttft_ms"].get("p50")),
            _fmt(s["ttft_ms"].get("p99")),
            _fmt(s["tpot_ms"].get("p50"), 2),
            _fmt(s["tpot_ms"].get("p99"), 2),
            _fmt(s["itl_ms"].get("p99"), 2),
            _fmt(s["e2e_ms"].get("p99")),
        ]
        if has_slo:
            row.append(f"{s.get('goodput', {}).get('fraction', 0):.0%}")
        if has_server:
            server = s.get("server", {})
            row.append(_fmt(_scaled(server.get("ttft", {}).get("mean"))))
            row.append(_fmt(server.get("preemptions"), 0))
            kv = s.get("server_gauges", {}).get("kv_cache_usage", {}).get("max")
            row.append(f"{kv:.1%}" if kv is not None else "—")
        row.append(", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items())) or "—")
        table.add_row(*row)
    return table
