"""``fleet doctor``'s slow check: a server's last archived bench run, and the same measured now.

``fleet bench`` and ``fleet bench --plan`` archive every run in a folder of its own under
``bench-results/`` (``bench.json`` and ``results.json``). :func:`last_baseline` finds the
newest run that measured a server and takes its single-request figures (the plan's stage 0,
or a bench step at concurrency 1) with the prompt shape they were measured at;
:func:`measure` sends a few single requests of that shape now, with the bench's own runner
(warm-up, /metrics difference, GPU samples), and reads the server's own TTFT histogram since
its start, and its gauges just after. A round that is clearly slower than the baseline is
measured again (up to :data:`ROUNDS` in all): a server counts as slower only when every round
is, since one round on a busy machine can catch a passing hiccup while a neighbour's load or a
real regression lasts — unless the server's own figures over the slower round show requests
waiting in its queue (:func:`fleet.judge.slowness.queued_on_the_server`): that is load on the
server, and measuring it twice more would only queue doctor's requests behind it again.
Requests are all it sends: nothing on the host changes.

Example:
    >>> import json, tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "plan-1").mkdir()
    >>> _ = (root / "plan-1" / "results.json").write_text(json.dumps({
    ...     "tool": "fleet bench --plan", "started": "2026-12-01 09:00:00 UTC",
    ...     "config": {"api": "completions", "input_len": 32, "output_len": 16},
    ...     "servers": {"box/chat": {"baseline": {"concurrency": 1, "ok": 5,
    ...                                           "ttft_ms": {"p50": 6.7}}}}}))
    >>> b = last_baseline(root, "box/chat")
    >>> b["ttft_ms"], b["input_len"], b["run"].endswith("plan-1")
    ({'p50': 6.7}, 32, True)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import time
import urllib.request
from pathlib import Path
from typing import Any

from cli.bench import report as reports
from cli.bench.command import BenchError, resolve_target
from fleet.judge.slowness import percentile, queued_on_the_server, slowdown
from loadgen import servermetrics, trust
from loadgen.prompts import PromptError, load_jsonl, synthetic_prompts
from loadgen.runner import Options, Runner, Step, Target, server_tokenizer

#: Where ``fleet bench`` archives its runs unless told otherwise (``--out``).
BENCH_RESULTS = "bench-results"
#: Single requests of the fresh measurement (after one warm-up).
REQUESTS = 5
#: Seconds one of them may take.
TIMEOUT = 120.0
#: Rounds of them at most: a slower round is measured again, and the server counts as slower
#: only when every round is (a CI run caught one round at ×2.8 on an idle server whose own
#: /metrics TTFT was 4 ms: the 2-core machine's scheduler, not the server; with three test
#: streams on two cores, two rounds in a row were caught too).
ROUNDS = 3


def kept_round(baseline: dict[str, Any], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Of the fresh rounds, the one that says the least against the server: a round not
    slower than ``baseline`` if there is one, else the least slow (fewest slower figures, then
    the lowest TTFT P50).

    Example:
        >>> base = {"ttft_ms": {"p50": 10.0}}
        >>> kept_round(base, [{"ttft_ms": {"p50": 29.0}}, {"ttft_ms": {"p50": 11.0}}])
        {'ttft_ms': {'p50': 11.0}}
    """
    return min(rounds, key=lambda r: (len(slowdown(baseline, r)), percentile(r, "ttft_ms") or 0.0))


def _runs(root: Path) -> list[tuple[float, Path, dict[str, Any]]]:
    """Every readable run under ``root``, newest first (by its file's time)."""
    runs = []
    for path in [*root.glob("*/results.json"), *root.glob("*/bench.json")]:
        try:
            runs.append((path.stat().st_mtime, path, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue
    return sorted(runs, key=lambda r: r[0], reverse=True)


def _single(data: dict[str, Any], name: str) -> dict[str, Any] | None:
    """A run's single-request step of server ``name``, or None."""
    if "servers" in data:
        server = (data.get("servers") or {}).get(name) or {}
        if server.get("baseline"):
            return server["baseline"]
        steps = (server.get("ladder") or {}).get("steps", [])
    else:
        if (data.get("target") or {}).get("name") != name:
            return None
        steps = data.get("steps", [])
    return next((s for s in steps if s.get("concurrency") == 1 and s.get("ok")), None)


def last_baseline(root: str | Path, name: str) -> dict[str, Any] | None:
    """The newest archived single-request figures of server ``name`` (``HOST/SERVER``).

    + root: the folder of bench runs (``bench-results``)

    Returns the step's figures with ``run`` (its folder), ``started``, ``api``, ``input_len``,
    ``output_len``, ``prompts``, ``fixed_output`` and ``seed``; None when no run measured it.
    """
    for mtime, path, data in _runs(Path(root)):
        step = _single(data, name)
        if step is None or not step.get("ok"):
            continue
        config = data.get("config") or {}
        return {**step, "run": str(path.parent), "started": data.get("started")
                or time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(mtime)),
                "api": config.get("api") or (data.get("target") or {}).get("api")
                or "completions",
                "input_len": config.get("input_len"), "output_len": config.get("output_len"),
                "prompts": config.get("prompts", "synthetic"),
                "fixed_output": config.get("fixed_output", True),
                "seed": config.get("seed", 0)}  # fmt: skip
    return None


def _prompts(baseline: dict[str, Any], target: Target) -> list[Any]:
    source = baseline.get("prompts") or "synthetic"
    output_len = int(baseline.get("output_len") or 64)
    if source != "synthetic":
        if not Path(source).is_file():
            raise BenchError(f"its last bench used the prompts of {source}, which is not here")
        return load_jsonl(source, output_len)
    try:
        tokenizer = server_tokenizer(target)
    except OSError as error:  # a refused certificate
        raise BenchError(trust.refusal(error, target.tls_name)) from None
    return synthetic_prompts(16, int(baseline.get("input_len") or 128), output_len,
                             int(baseline.get("seed") or 0), *(tokenizer or ()))  # fmt: skip


def server_now(base_url: str, model: str | None,
               context: ssl.SSLContext | None = None) -> dict[str, Any]:  # fmt: skip
    """The server's ``/metrics`` now: its own TTFT since its start (``ttft``: P50, P99, count;
    seconds) and its gauges (``gauges``: running and waiting requests, KV cache usage);
    ``context``: https trust (:meth:`loadgen.runner.Target.ssl_context`)."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=10,
                                    context=context) as reply:
            scrape = servermetrics.parse_prometheus(reply.read().decode())
    except (OSError, ValueError):
        return {}
    buckets = scrape.buckets(servermetrics.HISTOGRAMS["ttft"], model)
    ttft = None
    if buckets and buckets[-1][1] > 0:
        ttft = {"count": buckets[-1][1],
                "p50": servermetrics.histogram_quantile(0.5, buckets),
                "p99": servermetrics.histogram_quantile(0.99, buckets)}  # fmt: skip
    return {"ttft": ttft, "gauges": servermetrics.gauge_values(scrape, model)}


def measure(fleet_path: str, name: str, baseline: dict[str, Any], requests: int = REQUESTS,
            rounds_at_most: int = ROUNDS) -> dict[str, Any]:
    """The baseline's single requests, sent now to server ``name`` (``HOST/SERVER``, reached
    as ``fleet bench --server`` reaches it: directly on sandbox hosts, else through an SSH
    port forward of the fleet file ``fleet_path``): :func:`measure_target`'s answer."""
    args = argparse.Namespace(url=None, fleet=fleet_path, server=name, tunnel="auto",
                              sample_interval=0.5, api_key_env=None, model=None)  # fmt: skip
    try:
        with resolve_target(args) as resolved:
            target = resolved.target(baseline["api"])
            return measure_target(target, baseline, resolved.gpu_argv, requests, rounds_at_most)
    except (BenchError, OSError, ValueError) as error:
        return {"error": " ".join(str(error).split())[:300]}


def measure_target(target: Target, baseline: dict[str, Any], gpu_argv: list[str] | None = None,
                   requests: int = REQUESTS, rounds_at_most: int = ROUNDS) -> dict[str, Any]:
    """The baseline's single requests, sent now to ``target``: ``{"fresh": figures, "rounds":
    [P50s of each round], "metrics_ttft": …, "metrics_gauges": …}``, or ``{"error": why}``.

    A round clearly slower than ``baseline`` (:func:`fleet.judge.slowness.slowdown`) is measured
    again, up to ``rounds_at_most`` rounds; ``fresh`` is the round :func:`kept_round` keeps.

    Example (sends requests, so not run here):
        measure_target(Target("http://10.0.0.5:8000", "chat", "completions"), baseline)
        # → {"fresh": {"ttft_ms": {"p50": 11.2, …}, …}, "rounds": [{"ttft_p50_ms": 11.2, …}], …}
    """
    try:
        prompts = _prompts(baseline, target)
        options = Options(timeout=TIMEOUT, fixed_output=bool(baseline["fixed_output"]),
                          sample_interval=0.5)  # fmt: skip
        rounds: list[dict[str, Any]] = []
        while len(rounds) < max(1, rounds_at_most):
            # A runner per round: each sends the baseline's prompts from the first one.
            runner = Runner(target, prompts, options, gpu_argv=gpu_argv)
            step = Step(concurrency=1, requests=requests, warmup=1)
            rounds.append(reports.step_report(asyncio.run(runner.run([step]))[0]))
            if not rounds[-1]["ok"] or not slowdown(baseline, rounds[-1]):
                break
            if queued_on_the_server(rounds[-1]):  # the server's own queue: its load, no hiccup
                break
        now = server_now(target.base_url, target.model or None, target.ssl_context())
    except (BenchError, PromptError, OSError, ValueError) as error:
        return {"error": " ".join(str(error).split())[:300]}
    if not rounds[-1]["ok"]:
        return {"error": f"none of {rounds[-1]['requests']} requests succeeded: "
                         f"{rounds[-1]['errors']}"}  # fmt: skip
    fresh = kept_round(baseline, rounds)
    return {"fresh": fresh, "rounds": [{"ttft_p50_ms": percentile(r, "ttft_ms"),
                                        "tpot_p50_ms": percentile(r, "tpot_ms")} for r in rounds],
            "metrics_ttft": now.get("ttft"), "metrics_gauges": now.get("gauges")}  # fmt: skip
