"""The run directory of ``fleet bench --plan``: JSON, CSV, PNGs and a report to read.

One directory per run::

    results.json            everything: the plan, each server's stages, the mixed groups
    baseline.csv            one row per server (stage 0)
    ladder.csv              one row per server and load (stage 1; the bench's CSV columns)
    soak.csv                one row per server and window of time (stage 2)
    mixed.csv               one row per server of each group: solo, shared, their ratio
    ladder-HOST-SERVER.png  latency–concurrency curves and throughput, the knee marked
    soak-HOST-SERVER.png    latency, throughput, errors and memory over the soak
    mixed-N.png             each server's TTFT, TPOT and tokens/s alone and shared
    report.md               what a person reads, top to bottom, with the PNGs

Example:
    >>> slug("box/chat"), ms(12.345), ratio(1.234), ratio(None)
    ('box-chat', '12.3 ms', '×1.23', '—')
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

from cli.bench import report as reports
from cli.bench.stages import DRIFT_LIMIT, ERROR_RATE_LIMIT, MEMORY_GROWTH_LIMIT

#: What the markdown calls each stage.
TITLES = {"baseline": "Stage 0 — baseline", "ladder": "Stage 1 — the concurrency ladder",
          "soak": "Stage 2 — soak at the knee",
          "mixed": "Stage 3 — servers sharing a GPU (or a cpu host's cores)"}


def slug(name: str) -> str:
    """A file-name part from a server's name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "server"


def ms(value: float | None) -> str:
    """Milliseconds for a person."""
    if value is None:
        return "—"
    return f"{value:,.1f} ms" if value >= 1 else f"{value:.2f} ms"


def ratio(value: float | None) -> str:
    """A ratio for a person (×1.23)."""
    return "—" if value is None else f"×{value:.2f}"


def pct(value: float | None) -> str:
    """A ratio as a change in percent (+23 %), for sharing costs and drift."""
    if value is None:
        return "—"
    change = round((value - 1) * 100)
    return "±0 %" if change == 0 else f"{change:+d} %"


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        fields: list[str] = []
        for row in rows:
            fields += [k for k in row if k not in fields]
        writer = csv.DictWriter(handle, fieldnames=fields or ["server"])
        writer.writeheader()
        writer.writerows(rows)


def csv_tables(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The rows of each CSV file of the run, by file name.

    Example:
        >>> csv_tables({"servers": {}, "mixed": []})
        {'baseline.csv': [], 'ladder.csv': [], 'soak.csv': [], 'mixed.csv': []}
    """
    baseline, ladder, soak, mixed = [], [], [], []
    for name, server in results["servers"].items():
        if server.get("baseline"):
            for row in reports.csv_rows({"steps": [server["baseline"]]}):
                baseline.append({"server": name, **row})
        if server.get("ladder"):
            knee = server["ladder"]["knee"]["load"]
            for row in reports.csv_rows(server["ladder"]):
                ladder.append({"server": name, **row, "knee": row["load"] == knee})
        if server.get("soak"):
            for window in server["soak"]["windows"]:
                row = {"server": name, "load": server["soak"]["load"], **window}
                row["errors"] = ";".join(f"{k}={v}" for k, v in sorted(window["errors"].items()))
                soak.append(row)
    for index, group in enumerate(results["mixed"], 1):
        for name in group["servers"]:
            solo, shared, cost = group["solo"][name], group["shared"][name], group["cost"][name]
            mixed.append({
                "group": index, "shares": group["shares"], "server": name,
                "load": group["loads"][name],
                "solo_ttft_p50_ms": solo["ttft_ms"].get("p50"),
                "shared_ttft_p50_ms": shared["ttft_ms"].get("p50"),
                "solo_tpot_p50_ms": solo["tpot_ms"].get("p50"),
                "shared_tpot_p50_ms": shared["tpot_ms"].get("p50"),
                "solo_output_tokens_per_s": solo["output_tokens_per_s"],
                "shared_output_tokens_per_s": shared["output_tokens_per_s"],
                **{f"cost_{k}": v for k, v in cost.items()},
                "solo_failed": solo["failed"], "shared_failed": shared["failed"],
            })
    return {"baseline.csv": baseline, "ladder.csv": ladder, "soak.csv": soak,
            "mixed.csv": mixed}


def _pyplot() -> Any:
    # Imported here, not at the top: matplotlib takes ~0.5 s to import and only the PNGs need it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_soak(name: str, soak: dict[str, Any], path: Path) -> None:
    """A PNG of one soak over time: TTFT and TPOT per window, throughput and errors, memory."""
    plt = _pyplot()
    windows = soak["windows"]
    middle = [(w["start_s"] + w["end_s"]) / 2 for w in windows]
    minutes = soak["duration_s"] >= 300
    scale = 60 if minutes else 1
    x = [t / scale for t in middle]
    unit = "min" if minutes else "s"
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)

    def series(key: str) -> list[float]:
        return [w[key] if w[key] is not None else float("nan") for w in windows]

    for ax, metric, title in ((axes[0][0], "ttft", "TTFT (ms)"), (axes[0][1], "tpot",
                                                                    "TPOT (ms)")):
        ax.plot(x, series(f"{metric}_p50_ms"), "-o", markersize=4, label="P50")
        ax.plot(x, series(f"{metric}_p99_ms"), ":^", markersize=4, label="P99")
        drift = soak["drift"].get(f"{metric}_p50")
        ax.set_title(f"{title} — P50 last quarter vs first: {pct(drift)}")
        ax.set_ylabel("ms")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    ax = axes[1][0]
    ax.plot(x, [w["output_tokens_per_s"] for w in windows], "-o", color="tab:green",
            markersize=4, label="output tokens/s")
    ax.set_ylabel("tokens/s")
    ax.set_ylim(bottom=0)
    twin = ax.twinx()
    twin.bar(x, [w["failed"] for w in windows], width=(x[1] - x[0]) * 0.6 if len(x) > 1 else 0.5,
             color="tab:red", alpha=0.4, label="failed requests")
    twin.set_ylabel("failed requests")
    twin.yaxis.get_major_locator().set_params(integer=True)
    twin.set_ylim(bottom=0, top=max(1, *(w["failed"] for w in windows)) * 1.2)
    rate = soak["error_rate"]
    ax.set_title("Throughput and errors — " + ("none failed" if rate == 0 else
                 f"{rate:.1%} failed" if rate is not None else "no requests"))
    lines, more = ax.get_legend_handles_labels(), twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="lower left")
    ax = axes[1][1]
    drawn = False
    for key, label, color in (("memory", "server memory", "tab:blue"),
                              ("gpu_memory", "GPU memory", "tab:orange")):
        samples = soak[key]["samples"]
        if samples:
            ax.plot([t / scale for t, _ in samples], [v for _, v in samples], "-",
                    color=color, label=label)
            drawn = True
    if drawn:
        growth = (soak["memory"]["mib"] or soak["gpu_memory"]["mib"] or {}).get("growth")
        ax.set_title("Memory (MiB)" + (f" — grew {growth:+,.0f} MiB" if growth is not None
                                       else ""))
        ax.legend(fontsize=8, loc="lower right")
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)
        # from 0: a few MiB of noise must not look like a leak (the growth is in the title)
        top = max(v for key in ("memory", "gpu_memory") for _, v in soak[key]["samples"])
        ax.set_ylim(bottom=0, top=top * 1.15)
    else:
        ax.set_title("Memory: no samples")
        ax.text(0.5, 0.5, "no memory samples", ha="center", va="center",
                transform=ax.transAxes, color="gray")
    ax.set_ylabel("MiB")
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel(f"time into the soak ({unit})")
    verdict = "stable" if soak["stable"] else f"{len(soak['findings'])} finding(s)"
    fig.suptitle(f"fleet bench --plan: soak of {name} at concurrency {soak['load']:g}, "
                 f"{soak['duration_s'] / scale:g} {unit} — {verdict}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_mixed(group: dict[str, Any], path: Path) -> None:
    """A PNG of one group of stage 3: each server's TTFT and TPOT P50 and output tokens/s,
    alone beside shared, with the ratio written over the shared bar."""
    plt = _pyplot()
    names = group["servers"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2))
    panels = (("ttft_ms", "p50", "TTFT P50 (ms)", "ttft_p50"),
              ("tpot_ms", "p50", "TPOT P50 (ms)", "tpot_p50"),
              ("output_tokens_per_s", None, "output tokens/s", "output_tokens_per_s"))
    positions = list(range(len(names)))
    for ax, (key, q, title, cost_key) in zip(axes, panels, strict=True):
        def value(report: dict[str, Any], key: str = key, q: str | None = q) -> float:
            figure = report[key] if q is None else report[key].get(q)
            return figure if figure is not None else 0.0

        solo = [value(group["solo"][n]) for n in names]
        shared = [value(group["shared"][n]) for n in names]
        ax.bar([p - 0.2 for p in positions], solo, 0.4, label="alone", color="tab:blue")
        bars = ax.bar([p + 0.2 for p in positions], shared, 0.4, label="shared",
                      color="tab:red")
        for bar, name in zip(bars, names, strict=True):
            ax.annotate(ratio(group["cost"][name][cost_key]),
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_xticks(positions, [n.split("/")[-1] for n in names])
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_ylim(top=max(*solo, *shared, 1e-9) * 1.18)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"fleet bench --plan: {', '.join(names)} alone and at once ({group['shares']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _ladder_report(name: str, server: dict[str, Any]) -> dict[str, Any]:
    return {"steps": server["ladder"]["steps"], "knee": server["ladder"]["knee"],
            "target": {"name": name}}


def write_run(results: dict[str, Any], out: Path) -> list[Path]:
    """Write the whole run directory; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json"]
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    for file, rows in csv_tables(results).items():
        if rows:
            _write_csv(out / file, rows)
            written.append(out / file)
    pictures: dict[str, dict[str, str]] = {}
    for name, server in results["servers"].items():
        pictures[name] = {}
        if server.get("ladder") and server["ladder"]["steps"]:
            path = out / f"ladder-{slug(name)}.png"
            reports.write_plot(_ladder_report(name, server), path)
            pictures[name]["ladder"] = path.name
            written.append(path)
        if server.get("soak"):
            path = out / f"soak-{slug(name)}.png"
            plot_soak(name, server["soak"], path)
            pictures[name]["soak"] = path.name
            written.append(path)
    for index, group in enumerate(results["mixed"], 1):
        path = out / f"mixed-{index}.png"
        plot_mixed(group, path)
        group["png"] = path.name
        written.append(path)
    (out / "report.md").write_text(markdown(results, pictures), encoding="utf-8")
    written.append(out / "report.md")
    return written


def _per_hour(growth: dict[str, Any], seconds: float) -> str:
    """The growth per hour, for soaks long enough (10 minutes) that the rate means something."""
    return f", {growth['slope_per_h']:+,.0f} MiB/h" if seconds >= 600 else ""


def _step_line(step: dict[str, Any]) -> str:
    return (f"TTFT P50 {ms(step['ttft_ms'].get('p50'))} (P99 {ms(step['ttft_ms'].get('p99'))}), "
            f"TPOT P50 {ms(step['tpot_ms'].get('p50'))}, E2E P50 "
            f"{ms(step['e2e_ms'].get('p50'))}, {step['ok']}/{step['requests']} ok")


def summary_lines(results: dict[str, Any]) -> list[str]:
    """The run in a few sentences, one per server and group: what a person wants first."""
    lines = []
    for name, server in results["servers"].items():
        parts = []
        if server.get("baseline"):
            parts.append(f"alone TTFT P50 {ms(server['baseline']['ttft_ms'].get('p50'))}")
        if server.get("ladder"):
            steps, knee = server["ladder"]["steps"], server["ladder"]["knee"]
            best = max(steps, key=lambda s: s["output_tokens_per_s"])
            parts.append(f"knee at concurrency {knee['load']:g}" if knee["found"]
                         else f"no knee up to concurrency {steps[-1]['load']:g}")
            parts.append(f"peak {best['output_tokens_per_s']:,.0f} output tokens/s at "
                         f"{best['load']:g}")
        if server.get("soak"):
            soak = server["soak"]
            parts.append("soak stable" if soak["stable"] else
                         f"soak: {len(soak['findings'])} finding(s)")
        if parts:
            lines.append(f"- **{name}**: " + "; ".join(parts) + ".")
    for group in results["mixed"]:
        for name in group["servers"]:
            cost = group["cost"][name]
            lines.append(f"- **{name}** sharing {group['shares']}: TTFT P50 "
                         f"{pct(cost['ttft_p50'])}, TPOT P50 {pct(cost['tpot_p50'])}, output "
                         f"tokens/s {pct(cost['output_tokens_per_s'])} against alone.")
    return lines


def markdown(results: dict[str, Any], pictures: dict[str, dict[str, str]]) -> str:
    """The report a person reads: the summary first, then each stage, figures and pictures."""
    plan = results["plan"]
    text = [f"# fleet bench --plan — {results['started']}", ""]
    text += [f"Servers: {', '.join(results['servers']) or 'none'}. Stages: "
             f"{', '.join(plan['stages'])}. Requests of {results['config']['input_len']} input "
             f"and {results['config']['output_len']} output tokens "
             f"({results['config']['api']} API). Took {results['seconds']:,.0f} s.", ""]
    text += ["## Summary", "", *summary_lines(results), ""]
    findings = [(n, f) for n, s in results["servers"].items() if s.get("soak")
                for f in s["soak"]["findings"]]
    if findings:
        text += ["**Findings:**", "", *(f"- {n}: {f}" for n, f in findings), ""]
    for name, server in results["servers"].items():
        text += [f"## {name}", ""]
        if server.get("baseline"):
            text += [f"### {TITLES['baseline']}", "",
                     f"{server['baseline']['requests']} requests one at a time: "
                     f"{_step_line(server['baseline'])}.", ""]
        if server.get("ladder"):
            ladder = server["ladder"]
            knee = ladder["knee"]
            text += [f"### {TITLES['ladder']}", "",
                     (f"The knee is at concurrency **{knee['load']:g}**: past it, P99 E2E "
                      "latency grows faster than output tokens/s." if knee["found"] else
                      "No knee: latency never grew faster than throughput on this ladder."), "",
                     "| concurrency | ok | output tok/s | TTFT P50 | TTFT P99 | TPOT P50 | "
                     "E2E P99 | errors |",
                     "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
            for s in ladder["steps"]:
                mark = " ◀ knee" if s["load"] == knee["load"] else ""
                errors = ", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items())) or "—"
                text.append(f"| {s['load']:g}{mark} | {s['ok']}/{s['requests']} | "
                            f"{s['output_tokens_per_s']:,.0f} | {ms(s['ttft_ms'].get('p50'))} | "
                            f"{ms(s['ttft_ms'].get('p99'))} | {ms(s['tpot_ms'].get('p50'))} | "
                            f"{ms(s['e2e_ms'].get('p99'))} | {errors} |")
            text.append("")
            if "ladder" in pictures.get(name, {}):
                text += [f"![ladder of {name}]({pictures[name]['ladder']})", ""]
        if server.get("soak"):
            soak = server["soak"]
            memory = soak["memory"]["mib"]
            gpu = soak["gpu_memory"]["mib"]
            rate = soak["error_rate"]
            text += [f"### {TITLES['soak']}", "",
                     f"Concurrency {soak['load']:g} ({soak['load_from']}) for "
                     f"{soak['duration_s']:g} s: {soak['requests']} requests, "
                     + ("none failed" if rate == 0 else f"{rate:.2%} failed" if rate is not None
                        else "none sent")
                     + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(soak["errors"].items()))
                        + ")" if soak["errors"] else "") + ".", "",
                     f"- latency, last quarter against first: TTFT P50 "
                     f"{pct(soak['drift']['ttft_p50'])}, TPOT P50 {pct(soak['drift']['tpot_p50'])}"
                     f", E2E P50 {pct(soak['drift']['e2e_p50'])};",
                     "- server memory: " + (
                         f"{memory['first']:,.0f} → {memory['last']:,.0f} MiB (peak "
                         f"{memory['max']:,.0f}; {memory['growth']:+,.1f} MiB first quarter to "
                         f"last{_per_hour(memory, soak['duration_s'])}), from "
                         f"{soak['memory']['source']};" if memory else "not sampled;"),
                     "- GPU memory: " + (
                         f"{gpu['first']:,.0f} → {gpu['last']:,.0f} MiB (peak {gpu['max']:,.0f};"
                         f" {gpu['growth']:+,.1f} MiB)." if gpu else "not sampled."), ""]
            text += ([f"**{'Stable' if soak['stable'] else 'Not stable'}**"
                      + (": " + "; ".join(soak["findings"]) + "." if soak["findings"] else
                         f": within the limits of {soak_limits()}."), ""])
            if "soak" in pictures.get(name, {}):
                text += [f"![soak of {name}]({pictures[name]['soak']})", ""]
    if results["mixed"]:
        text += [f"## {TITLES['mixed']}", ""]
        for group in results["mixed"]:
            text += [f"{', '.join(group['servers'])} share {group['shares']}. Each ran alone, "
                     f"then all at once, at the same concurrency for {group['duration_s']:g} s "
                     "each (ratios: shared ÷ alone).", "",
                     "| server | concurrency | TTFT P50 alone → shared | TPOT P50 alone → shared"
                     " | output tok/s alone → shared |", "| --- | ---: | --- | --- | --- |"]
            for name in group["servers"]:
                solo, shared, cost = (group["solo"][name], group["shared"][name],
                                      group["cost"][name])
                text.append(
                    f"| {name} | {group['loads'][name]} | {ms(solo['ttft_ms'].get('p50'))} → "
                    f"{ms(shared['ttft_ms'].get('p50'))} ({pct(cost['ttft_p50'])}) | "
                    f"{ms(solo['tpot_ms'].get('p50'))} → {ms(shared['tpot_ms'].get('p50'))} "
                    f"({pct(cost['tpot_p50'])}) | {solo['output_tokens_per_s']:,.0f} → "
                    f"{shared['output_tokens_per_s']:,.0f} "
                    f"({pct(cost['output_tokens_per_s'])}) |")
            total = group["output_tokens_per_s"]
            text += ["", f"Together they produced {total['shared_sum']:,.0f} output tokens/s, "
                     f"against {total['solo_sum']:,.0f} for their solo runs added up.", ""]
            if group.get("png"):
                text += [f"![{', '.join(group['servers'])} shared]({group['png']})", ""]
    if results["notes"]:
        text += ["## Notes", "", *(f"- {n}" for n in results["notes"]), ""]
    tables = [name for name, rows in csv_tables(results).items() if rows]
    text += ["---", "", f"Files: {', '.join(['results.json (everything)', *tables])}; compare "
             "two runs with `fleet bench --compare RUN_A RUN_B`.", ""]
    return "\n".join(text)


def soak_limits() -> str:
    """The soak's limits in words (those :mod:`cli.bench.stages` applies).

    Example:
        >>> soak_limits()
        '1% errors, 20% latency drift, 10% memory growth'
    """
    return (f"{ERROR_RATE_LIMIT:.0%} errors, {DRIFT_LIMIT:.0%} latency drift, "
            f"{MEMORY_GROWTH_LIMIT:.0%} memory growth")
