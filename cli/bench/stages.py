"""Run the plan's stages (:mod:`cli.bench.plan`) with the bench's own runner, and read them.

Each stage is made of the runner's steps (:meth:`loadgen.runner.Runner.run_step`, so
warm-up, ``/metrics`` differencing, gauge and GPU sampling are the ladder's), on one aiohttp
session for the whole plan:

- baseline: one step at concurrency 1 of ``baseline_requests`` requests;
- ladder: one step per load, the knee by :func:`cli.bench.report.knee`;
- soak: one long step at the knee (the ladder's top load when it never bent), its requests cut
  into windows by start time; the unit's memory (:mod:`cli.bench.memory`) and the GPUs sampled
  throughout;
- mixed: for each group of servers sharing a device, each server alone for ``mixed_duration``,
  then all at once for as long; the cost of sharing is shared ÷ solo.

The pure readings (windows, drift, memory growth, sharing cost) are functions of lists, tested
on their own.

Example:
    >>> drift_ratio([1.0, 1.0, 1.2], [1.5, 1.5])
    1.5
    >>> growth([(0.0, 100.0), (1.0, 100.0), (2.0, 110.0), (3.0, 110.0)])["growth"]
    10.0
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from cli.bench import report as reports
from cli.bench.memory import KINDS, MemorySampler
from cli.bench.plan import Plan
from loadgen import servermetrics
from loadgen.gpu import GpuSampler
from loadgen.runner import NoProgress, Runner, Step, StepRun, parse_loads
from loadgen.stats import percentile
from loadgen.timing import RequestResult

#: A soak is flagged when more than this fraction of its requests failed …
ERROR_RATE_LIMIT = 0.01
#: … when a latency's median in its last quarter is this much above its first quarter's …
DRIFT_LIMIT = 0.20
#: … or when memory grew by more than this fraction from the first quarter to the last.
MEMORY_GROWTH_LIMIT = 0.10
MIB = 1024 * 1024
#: How long the soak waits for the unit's memory sampler to connect before its load starts.
FIRST_SAMPLE_TIMEOUT_S = 15.0


@dataclass
class PlanTarget:
    """One server the plan loads, with its runner and samplers.

    + name: ``HOST/SERVER`` (or the URL)
    + runner: the bench runner aimed at it (its prompts and options)
    + gpu_argv: the nvidia-smi sampling command on its host (None: no GPU)
    + gpus: the GPU indices it runs on (() : all, or none on a cpu host)
    + memory_argv: the command sampling its unit's memory (None: /metrics only)
    + info: what the report says about it (URL, model, API key set or not)
    """

    name: str
    runner: Runner
    gpu_argv: list[str] | None = None
    gpus: tuple[int, ...] = ()
    memory_argv: list[str] | None = None
    info: dict[str, Any] = field(default_factory=dict)


class Prefixed:
    """A progress receiver that names the server and stage before each step's label."""

    def __init__(self, inner: Any, prefix: str):
        self.inner, self.prefix = inner, prefix

    def start_step(self, label: str, total: int | None, seconds: float | None) -> None:
        """Forward with the prefix."""
        self.inner.start_step(f"{self.prefix} {label}", total, seconds)

    def advance(self, result: RequestResult) -> None:
        """Forward."""
        self.inner.advance(result)

    def end_step(self) -> None:
        """Forward."""
        self.inner.end_step()


# ------------------------------------------------------------------ pure readings


def median(values: list[float]) -> float | None:
    """The median, None for no values."""
    return statistics.median(values) if values else None


def drift_ratio(first: list[float], last: list[float]) -> float | None:
    """The median of the last quarter's values over the first quarter's (None if either is empty).

    Example:
        >>> drift_ratio([2.0], [1.0]), drift_ratio([], [1.0]) is None
        (0.5, True)
    """
    a, b = median(first), median(last)
    if a is None or b is None or a <= 0:
        return None
    return b / a


def growth(samples: list[tuple[float, float]]) -> dict[str, Any] | None:
    """How a sampled quantity moved over a soak: first, last, max, the growth from the mean of
    the first quarter of samples to the mean of the last, and the least-squares slope per hour.

    + samples: ``(seconds since the soak started, value)``, in time order

    Example:
        >>> g = growth([(0.0, 10.0), (1800.0, 15.0), (3600.0, 20.0)])
        >>> g["first"], g["last"], g["max"], g["slope_per_h"]
        (10.0, 20.0, 20.0, 10.0)
        >>> growth([(0.0, 1.0)]) is None
        True
    """
    if len(samples) < 2:
        return None
    times = [t for t, _ in samples]
    values = [v for _, v in samples]
    quarter = max(1, len(values) // 4)
    head = statistics.fmean(values[:quarter])
    tail = statistics.fmean(values[-quarter:])
    mean_t, mean_v = statistics.fmean(times), statistics.fmean(values)
    spread = sum((t - mean_t) ** 2 for t in times)
    slope = sum((t - mean_t) * (v - mean_v) for t, v in samples) / spread if spread else 0.0
    return {"first": values[0], "last": values[-1], "max": max(values),
            "growth": tail - head, "growth_fraction": (tail - head) / head if head else None,
            "slope_per_h": slope * 3600, "samples": len(values)}


def soak_windows(results: list[RequestResult], start: float, seconds: float, count: int,
                 memory: list[tuple[float, float]] | None = None,
                 gpu_memory: list[tuple[float, float]] | None = None) -> list[dict[str, Any]]:
    """The soak cut into ``count`` windows by request start time: per window the requests, the
    errors by kind, TTFT/TPOT/E2E P50 and P99 (ms), output tokens/s, and the memory samples'
    maximum (MiB).

    + results: the soak's measured requests
    + start: perf_counter of the soak's start; seconds: its length
    + memory, gpu_memory: ``(seconds since start, MiB)`` samples

    Example:
        >>> ok = RequestResult(ok=True, start=0.5, ttft=0.1, e2e=0.3, output_tokens=3)
        >>> bad = RequestResult(error="http_503", start=1.5)
        >>> [(w["ok"], w["failed"], w["ttft_p50_ms"]) for w in soak_windows([ok, bad], 0, 2, 2)]
        [(1, 0, 100.0), (0, 1, None)]
    """
    width = seconds / count
    windows = []
    for index in range(count):
        low, high = index * width, (index + 1) * width
        inside = [r for r in results
                  if low <= r.start - start < high or (index == count - 1
                                                       and r.start - start >= high)]
        ok = [r for r in inside if r.ok]
        errors: dict[str, int] = {}
        for r in inside:
            if not r.ok:
                errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
        window: dict[str, Any] = {
            "start_s": round(low, 3), "end_s": round(high, 3), "requests": len(inside),
            "ok": len(ok), "failed": len(inside) - len(ok), "errors": errors,
            "output_tokens_per_s": sum(r.output_tokens or 0 for r in ok) / width,
        }
        for metric, values in (("ttft", [r.ttft for r in ok if r.ttft is not None]),
                               ("tpot", [t for r in ok if (t := r.tpot) is not None]),
                               ("e2e", [r.e2e for r in ok if r.e2e is not None])):
            for q in (50, 99):
                value = percentile(values, q)
                window[f"{metric}_p{q}_ms"] = round(value * 1000, 3) if value is not None \
                    else None
        for key, samples in (("memory_mib", memory), ("gpu_memory_mib", gpu_memory)):
            here = [v for t, v in samples or () if low <= t < high]
            window[key] = max(here) if here else None
        windows.append(window)
    return windows


def soak_reading(run: StepRun, windows: int, memory: list[tuple[float, float]],
                 memory_source: str | None, gpu_memory: list[tuple[float, float]],
                 slo: dict[str, float] | None = None) -> dict[str, Any]:
    """Everything stage 2 reports about one soak: the step's figures, the windows, error rate,
    drift of each latency's median from the first quarter to the last, memory growth, and
    findings (sentences) where a limit was passed."""
    seconds = run.step.duration or run.seconds
    step = reports.step_report(run, slo)
    results = run.results
    quarter = seconds / 4
    first = [r for r in results if r.ok and r.start - run.start < quarter]
    last = [r for r in results if r.ok and r.start - run.start >= seconds - quarter]
    drift = {
        "ttft_p50": drift_ratio([r.ttft for r in first if r.ttft is not None],
                                [r.ttft for r in last if r.ttft is not None]),
        "tpot_p50": drift_ratio([t for r in first if (t := r.tpot) is not None],
                                [t for r in last if (t := r.tpot) is not None]),
        "e2e_p50": drift_ratio([r.e2e for r in first if r.e2e is not None],
                               [r.e2e for r in last if r.e2e is not None]),
    }
    total = len(results)
    error_rate = (total - step["ok"]) / total if total else None
    memory_growth = growth(memory)
    gpu_growth = growth(gpu_memory)
    findings = []
    if error_rate is not None and error_rate > ERROR_RATE_LIMIT:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(step["errors"].items()))
        findings.append(f"{error_rate:.1%} of the soak's requests failed ({kinds}); more than "
                        f"{ERROR_RATE_LIMIT:.0%}")
    for key, ratio in drift.items():
        if ratio is not None and ratio > 1 + DRIFT_LIMIT:
            findings.append(f"{key.split('_')[0].upper()} P50 rose {ratio - 1:.0%} from the "
                            f"first quarter of the soak to the last (more than {DRIFT_LIMIT:.0%})")
    for what, reading in (("server memory", memory_growth), ("GPU memory", gpu_growth)):
        fraction = reading and reading["growth_fraction"]
        if fraction is not None and fraction > MEMORY_GROWTH_LIMIT:
            findings.append(f"{what} grew {reading['growth']:,.0f} MiB ({fraction:.0%}) from "
                            f"the first quarter of the soak to the last (more than "
                            f"{MEMORY_GROWTH_LIMIT:.0%})")
    return {
        "load": run.step.load,
        "duration_s": seconds,
        "step": step,
        "requests": total,
        "error_rate": error_rate,
        "errors": step["errors"],
        "drift": drift,
        "memory": {"source": memory_source, "mib": memory_growth,
                   "samples": [[round(t, 3), round(v, 3)] for t, v in memory]},
        "gpu_memory": {"mib": gpu_growth,
                       "samples": [[round(t, 3), round(v, 3)] for t, v in gpu_memory]},
        "windows": soak_windows(results, run.start, seconds, windows, memory, gpu_memory),
        "findings": findings,
        "stable": not findings,
    }


def sharing_cost(solo: dict[str, Any], shared: dict[str, Any]) -> dict[str, float | None]:
    """What sharing cost one server: shared ÷ solo of TTFT and TPOT P50 and P99 (above 1:
    slower) and of output tokens/s (below 1: less work done).

    Example:
        >>> solo = {"ttft_ms": {"p50": 10, "p99": 20}, "tpot_ms": {"p50": 2, "p99": 3},
        ...         "output_tokens_per_s": 100.0}
        >>> shared = {"ttft_ms": {"p50": 15, "p99": 40}, "tpot_ms": {"p50": 4, "p99": 6},
        ...           "output_tokens_per_s": 60.0}
        >>> sharing_cost(solo, shared)
        {'ttft_p50': 1.5, 'ttft_p99': 2.0, 'tpot_p50': 2.0, 'tpot_p99': 2.0, 'output_tokens_per_s': 0.6}
    """  # noqa: E501
    cost: dict[str, float | None] = {}
    for metric in ("ttft", "tpot"):
        for q in ("p50", "p99"):
            a = solo[f"{metric}_ms"].get(q)
            b = shared[f"{metric}_ms"].get(q)
            cost[f"{metric}_{q}"] = b / a if a and b is not None else None
    a, b = solo["output_tokens_per_s"], shared["output_tokens_per_s"]
    cost["output_tokens_per_s"] = b / a if a else None
    return cost


def knee_load(ladder: dict[str, Any] | None) -> tuple[int | None, str]:
    """The load to soak and mix at from a ladder's reading, and where it came from.

    Example:
        >>> knee_load({"knee": {"load": 4, "found": True}, "steps": [{"load": 8}]})
        (4, 'the knee')
        >>> knee_load({"knee": {"load": None, "found": False}, "steps": [{"load": 8}]})
        (8, 'the top of the ladder: no knee')
        >>> knee_load(None)
        (None, 'no ladder')
    """
    if not ladder or not ladder["steps"]:
        return None, "no ladder"
    if ladder["knee"]["found"]:
        return int(ladder["knee"]["load"]), "the knee"
    return int(ladder["steps"][-1]["load"]), "the top of the ladder: no knee"


# ------------------------------------------------------------------ running


class PlanRun:
    """Runs a plan against its targets and returns the run's results (JSON data).

    + plan: what to run
    + targets: the servers, in order
    + groups: the names of servers sharing a device, for stage 3 (with what they share)
    + progress: receives progress events (a :class:`cli.bench.command.RichProgress`, or None)
    + slo: SLOs for goodput, as ``fleet bench --slo``
    + say: prints one line of what is happening

    Example (needs servers, so not run here):
        results = asyncio.run(PlanRun(plan, targets, groups).run())
        results["servers"]["box/chat"]["ladder"]["knee"]["load"]  # → 8
    """

    def __init__(self, plan: Plan, targets: list[PlanTarget],
                 groups: list[tuple[list[str], str]] | None = None, progress: Any = None,
                 slo: dict[str, float] | None = None,
                 say: Callable[[str], None] | None = None):
        self.plan = plan
        self.targets = targets
        self.groups = groups or []
        self.progress = progress or NoProgress()
        self.slo = slo
        self.say = say or (lambda line: None)
        self.gpu: dict[tuple[str, ...], GpuSampler] = {}
        self.notes: list[str] = []
        self.rng = random.Random(0)

    async def _step(self, session: Any, target: PlanTarget, step: Step, stage: str,
                    quiet: bool = False) -> StepRun:
        runner = target.runner
        runner.progress = (NoProgress() if quiet
                           else Prefixed(self.progress, f"{target.name} {stage}"))
        gpu = self.gpu.get(tuple(target.gpu_argv)) if target.gpu_argv else None
        return await runner.run_step(session, step, self.rng, gpu)

    async def baseline(self, session: Any, target: PlanTarget) -> dict[str, Any]:
        """Stage 0: single requests, one at a time, after one warm-up request."""
        self.say(f"{target.name}: stage 0, {self.plan.baseline_requests} single requests")
        step = Step(concurrency=1, requests=self.plan.baseline_requests, warmup=1)
        return reports.step_report(await self._step(session, target, step, "baseline"),
                                   self.slo)

    async def ladder(self, session: Any, target: PlanTarget, loads: list[int]) -> dict[str, Any]:
        """Stage 1: the ladder's steps and its knee."""
        self.say(f"{target.name}: stage 1, the ladder {', '.join(map(str, loads))}")
        steps = []
        for load in loads:
            step = Step(concurrency=load, warmup=load, duration=self.plan.ladder_duration,
                        requests=None if self.plan.ladder_duration
                        else self.plan.ladder_requests or max(10, 4 * load))
            steps.append(reports.step_report(await self._step(session, target, step,
                                                              "ladder"), self.slo))
        knee = reports.knee(steps) if len(steps) > 1 else {
            "load": None, "found": False, "rule": "needs two steps or more"}
        return {"steps": steps, "knee": knee}

    async def _rss_from_metrics(self, session: Any, target: PlanTarget, interval: float,
                                into: list[tuple[float, float]]) -> None:
        url = target.runner.target.base_url.rstrip("/") + "/metrics"
        while True:
            with contextlib.suppress(OSError, aiohttp.ClientError, asyncio.TimeoutError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as reply:
                    if reply.status == 200:
                        scrape = servermetrics.parse_prometheus(await reply.text())
                        value = scrape.value("process_resident_memory_bytes")
                        if value is not None:
                            into.append((time.perf_counter(), value))
            await asyncio.sleep(interval)

    async def soak(self, session: Any, target: PlanTarget, load: int,
                   source: str) -> dict[str, Any]:
        """Stage 2: ``load`` held for the soak's duration, memory and GPUs sampled."""
        duration = self.plan.soak_duration
        self.say(f"{target.name}: stage 2, a soak at concurrency {load} ({source}) for "
                 f"{duration:g} s")
        interval = max(target.runner.options.sample_interval, duration / 240)
        sampler = MemorySampler(target.memory_argv) if target.memory_argv else None
        rss: list[tuple[float, float]] = []
        poller = None
        if sampler is not None:
            await sampler.start()
            # Its first sample needs an ssh connection: wait for it, so the soak's memory is
            # read from the soak's first second, not from whenever ssh got there.
            await sampler.first_sample(FIRST_SAMPLE_TIMEOUT_S)
        if target.runner.options.scrape_metrics:
            poller = asyncio.create_task(self._rss_from_metrics(session, target, interval, rss))
        try:
            run = await self._step(session, target, Step(concurrency=load, duration=duration,
                                                         warmup=load), "soak")
        finally:
            if poller is not None:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
            if sampler is not None:
                await sampler.stop()
        source_name = None
        memory: list[tuple[float, float]] = []
        if sampler is not None and sampler.samples:
            source_name = KINDS.get(sampler.kind or "", "the unit's cgroup")
            memory = [(t, v / MIB) for t, v in sampler.samples]
        elif rss:
            source_name = "the server's /metrics process_resident_memory_bytes (API process)"
            memory = [(t, v / MIB) for t, v in rss]
            if sampler is not None:
                self.notes.append(f"{target.name}: the unit's memory could not be sampled "
                                  f"({sampler.error or 'no samples'}); used /metrics instead")
        else:
            self.notes.append(f"{target.name}: no memory samples during the soak")
        memory = [(t - run.start, v) for t, v in memory if run.start <= t <= run.end]
        gpu_memory: list[tuple[float, float]] = []
        gpu = self.gpu.get(tuple(target.gpu_argv)) if target.gpu_argv else None
        if gpu is not None:
            by_time: dict[float, float] = {}
            for t, sample in gpu.window(run.start, run.end):
                if not target.gpus or sample["gpu"] in target.gpus:
                    by_time[t] = sample["mem_used_mib"]
            gpu_memory = [(t - run.start, v) for t, v in sorted(by_time.items())]
        reading = soak_reading(run, self.plan.soak_windows, memory, source_name, gpu_memory,
                               self.slo)
        reading["load_from"] = source
        return reading

    async def mixed(self, session: Any, group: list[PlanTarget], shares: str,
                    loads: dict[str, int]) -> dict[str, Any]:
        """Stage 3: each server of a group alone, then all at once, at the same loads."""
        duration = self.plan.mixed_duration
        names = ", ".join(t.name for t in group)
        solo = {}
        for target in group:
            self.say(f"{target.name}: stage 3, alone at concurrency {loads[target.name]} for "
                     f"{duration:g} s")
            step = Step(concurrency=loads[target.name], duration=duration,
                        warmup=loads[target.name])
            solo[target.name] = reports.step_report(
                await self._step(session, target, step, "solo"), self.slo)
        self.say(f"stage 3: {names} at once for {duration:g} s ({shares})")
        runs = await asyncio.gather(*(
            self._step(session, t, Step(concurrency=loads[t.name], duration=duration,
                                        warmup=loads[t.name]), "shared", quiet=True)
            for t in group))
        shared = {t.name: reports.step_report(run, self.slo)
                  for t, run in zip(group, runs, strict=True)}
        return {
            "servers": [t.name for t in group],
            "shares": shares,
            "duration_s": duration,
            "loads": loads,
            "solo": solo,
            "shared": shared,
            "cost": {name: sharing_cost(solo[name], shared[name]) for name in solo},
            "output_tokens_per_s": {
                "solo_sum": sum(s["output_tokens_per_s"] for s in solo.values()),
                "shared_sum": sum(s["output_tokens_per_s"] for s in shared.values()),
            },
        }

    async def run(self) -> dict[str, Any]:
        """Run every stage of the plan; the results (servers' stages, mixed groups, notes)."""
        plan = self.plan
        loads = [int(v) for v in parse_loads(plan.ladder)]
        servers: dict[str, dict[str, Any]] = {}
        mixed: list[dict[str, Any]] = []
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        async with aiohttp.ClientSession(connector=connector) as session:
            for target in self.targets:
                if target.gpu_argv and tuple(target.gpu_argv) not in self.gpu:
                    sampler = GpuSampler(target.gpu_argv)
                    await sampler.start()
                    self.gpu[tuple(target.gpu_argv)] = sampler
            try:
                for target in self.targets:
                    result: dict[str, Any] = {"target": target.info, "baseline": None,
                                              "ladder": None, "soak": None}
                    servers[target.name] = result
                    if "baseline" in plan.stages:
                        result["baseline"] = await self.baseline(session, target)
                    if "ladder" in plan.stages:
                        result["ladder"] = await self.ladder(session, target, loads)
                    if "soak" in plan.stages:
                        load, source = self._load(plan.soak_concurrency, result["ladder"])
                        result["soak"] = await self.soak(session, target, load, source)
                by_name = {t.name: t for t in self.targets}
                if "mixed" in plan.stages:
                    if not self.groups:
                        self.notes.append("stage 3 skipped: no two of the servers share a GPU "
                                          "(or a cpu host)")
                    for names, shares in self.groups:
                        group_loads = {
                            name: self._load(plan.mixed_concurrency,
                                             servers[name]["ladder"])[0] for name in names}
                        mixed.append(await self.mixed(session, [by_name[n] for n in names],
                                                      shares, group_loads))
            finally:
                for sampler in self.gpu.values():
                    await sampler.stop()
                    if not sampler.samples:
                        self.notes.append("GPU sampling gave no samples: "
                                          + (sampler.error or "nvidia-smi printed nothing"))
        for target in self.targets:
            self.notes += [f"{target.name}: {n}" for n in target.runner.notes]
        return {"servers": servers, "mixed": mixed, "notes": self.notes}

    @staticmethod
    def _load(explicit: int | None, ladder: dict[str, Any] | None) -> tuple[int, str]:
        if explicit is not None:
            return explicit, "the plan"
        load, source = knee_load(ladder)
        if load is None:
            return 1, "concurrency 1: no ladder ran and the plan names no concurrency"
        return load, source
