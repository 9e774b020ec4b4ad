"""Drive the load: steps of fixed concurrency or Poisson request rate, each after a warm-up.

One asyncio loop in one process (the control machine may be small): aiohttp with keep-alive
connections, request bodies encoded once, no work per chunk beyond parsing it. Every step:

1. **warm-up**: ``warmup`` requests at the step's load, excluded from every figure (connections
   are opened, caches filled);
2. the server's ``/metrics`` is scraped;
3. **measured phase**: ``requests`` requests (or as many as start within ``duration`` seconds),
   closed-loop at ``concurrency`` (a new request as soon as one ends), or open-loop with
   exponential gaps at ``rate`` requests/s (at most ``max_concurrency`` in flight);
4. ``/metrics`` again. Gauges (KV cache usage, queue) and GPUs are sampled throughout.

The measured window runs from the start of the phase to the end of its last request; the
throughputs divide by it.

Example:
    >>> parse_loads("1..16")
    [1, 2, 4, 8, 16]
    >>> parse_loads("1,3,5")
    [1, 3, 5]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from loadgen import servermetrics, trust
from loadgen.client import stream_request
from loadgen.gpu import GpuSampler, summarize_gpus
from loadgen.timing import Prompt, RequestResult, endpoint, request_body


def parse_loads(text: str, integer: bool = True) -> list[Any]:
    """Steps from ``"8"``, a list ``"1,2,4"`` or a doubling ladder ``"1..100"``.

    A ladder doubles from its start and ends exactly at its end (``1..100`` → 1, 2, 4, … 64,
    100). Rates may be fractional (``integer=False``).

    Example:
        >>> parse_loads("1..100")
        [1, 2, 4, 8, 16, 32, 64, 100]
        >>> parse_loads("0.5,1,2", integer=False)
        [0.5, 1.0, 2.0]
    """
    kind: Callable[[str], Any] = int if integer else float
    text = text.strip()
    try:
        if ".." in text:
            low_text, high_text = text.split("..", 1)
            low, high = kind(low_text), kind(high_text)
            if low <= 0 or high < low:
                raise ValueError
            values, value = [], low
            while value < high:
                values.append(value)
                value *= 2
            values.append(high)
        else:
            values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(
            f"{text!r} is not a load: give a number, a list (1,2,4) or a ladder (1..64)"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"{text!r}: loads must be positive")
    return values


@dataclass
class Step:
    """One load step.

    + concurrency: closed loop with this many requests in flight (or)
    + rate: open loop, Poisson arrivals at this many requests/s
    + max_concurrency: cap on requests in flight in rate mode (None: no cap)
    + requests: measured requests (or)
    + duration: seconds during which measured requests start
    + warmup: warm-up requests before the measured phase

    Example:
        >>> Step(concurrency=4, requests=20).label, Step(rate=2.5, duration=30).label
        ('concurrency 4', '2.5 req/s')
        >>> Step(concurrency=4)
        Traceback (most recent call last):
        ...
        ValueError: a step needs a request count or a duration
    """

    concurrency: int | None = None
    rate: float | None = None
    max_concurrency: int | None = None
    requests: int | None = None
    duration: float | None = None
    warmup: int = 0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a step has either a concurrency or a rate")
        if self.requests is None and self.duration is None:
            raise ValueError("a step needs a request count or a duration")

    @property
    def load(self) -> float:
        """The step's load: its concurrency, or its request rate."""
        return self.concurrency if self.concurrency is not None else self.rate or 0.0

    @property
    def label(self) -> str:
        """Human label of the load."""
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}"
        return f"{self.rate:g} req/s"


@dataclass
class Target:
    """Where the requests go.

    + base_url: the server's base URL (``http://127.0.0.1:PORT``)
    + model: served model name
    + api: ``completions`` or ``chat``
    + api_key: sent as a bearer token; never printed
    + name: how reports name the server (``HOST/SERVER`` or the URL)
    + ca_pem: https: the only certificates trusted (PEM text; "" for the system's CA store)
    + tls_name: https with ``ca_pem``: the name the certificate must cover, whatever address
      ``base_url`` connects to (an SSH port forward's ``127.0.0.1:LOCAL``)

    Example:
        >>> Target("http://127.0.0.1:1", "tiny", api_key="s3cret")
        Target(base_url='http://127.0.0.1:1', model='tiny', api='completions', name='', tls_name='')
    """

    base_url: str
    model: str
    api: str = "completions"
    api_key: str | None = field(default=None, repr=False)
    name: str = ""
    ca_pem: str = field(default="", repr=False)
    tls_name: str = ""

    def headers(self) -> dict[str, str]:
        """Request headers: JSON, and the bearer token when there is a key."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def ssl_context(self) -> ssl.SSLContext | None:
        """The https context of every request (:func:`loadgen.trust.context`; None: default)."""
        return trust.context(self.ca_pem, self.tls_name)


@dataclass
class Options:
    """How requests are made.

    + timeout: seconds per request
    + fixed_output: ask for exactly the output length (ignore_eos)
    + extra_body: more request fields (temperature, …)
    + seed: seed of the arrival process
    + sample_interval: seconds between gauge (and GPU) samples
    + scrape_metrics: read the server's /metrics
    """

    timeout: float = 600.0
    fixed_output: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    sample_interval: float = 1.0
    scrape_metrics: bool = True


@dataclass
class StepRun:
    """What one step produced: measured results, window, server-side and GPU figures."""

    step: Step
    results: list[RequestResult]
    warmup: list[RequestResult]
    start: float
    end: float
    server: dict[str, Any] = field(default_factory=dict)
    gauges: dict[str, Any] = field(default_factory=dict)
    gpu: dict[str, Any] | None = None

    @property
    def seconds(self) -> float:
        """Length of the measured window."""
        return max(self.end - self.start, 1e-9)


class Progress(Protocol):
    """What the runner reports while it runs (the command shows it as a progress bar)."""

    def start_step(self, label: str, total: int | None, seconds: float | None) -> None: ...

    def advance(self, result: RequestResult) -> None: ...

    def end_step(self) -> None: ...


class NoProgress:
    """A progress sink that shows nothing (the runner's default; quiet stages)."""

    def start_step(self, label: str, total: int | None, seconds: float | None) -> None:
        pass

    def advance(self, result: RequestResult) -> None:
        pass

    def end_step(self) -> None:
        pass


def _get(url: str, headers: dict[str, str], timeout: float = 10.0,
         context: ssl.SSLContext | None = None) -> bytes:  # fmt: skip
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        return response.read()


def _post(url: str, body: dict[str, Any], headers: dict[str, str], timeout: float = 30.0,
          context: ssl.SSLContext | None = None) -> Any:  # fmt: skip
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        return json.loads(response.read())


def served_model(base_url: str, headers: dict[str, str],
                 context: ssl.SSLContext | None = None) -> str:  # fmt: skip
    """The first model a server lists at ``/v1/models`` (for ``--url`` without ``--model``);
    ``context``: https trust (:meth:`Target.ssl_context`)."""
    reply = json.loads(_get(base_url.rstrip("/") + "/v1/models", headers, context=context))
    return reply["data"][0]["id"]


def server_tokenizer(
    target: Target,
) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]] | None:
    """``(tokenize, detokenize)`` through vLLM's ``/tokenize`` and ``/detokenize``, or None.

    None when the server lacks them (not vLLM, or disabled): prompts then count words. A
    refused https certificate is raised (an OSError: :func:`loadgen.trust.is_certificate_error`).
    """
    base = target.base_url.rstrip("/")
    headers = target.headers()
    context = target.ssl_context()

    def tokenize(text: str) -> list[int]:
        body = {"model": target.model, "prompt": text, "add_special_tokens": False}
        return list(_post(base + "/tokenize", body, headers, context=context)["tokens"])

    def detokenize(tokens: list[int]) -> str:
        return str(_post(base + "/detokenize", {"model": target.model, "tokens": tokens},
                         headers, context=context)["prompt"])

    try:
        detokenize(tokenize("hello world"))
    except (OSError, ValueError, KeyError, urllib.error.HTTPError) as error:
        if trust.is_certificate_error(error):  # not a server without /tokenize: said as it is
            raise
        return None
    return tokenize, detokenize


class Runner:
    """Runs steps against a target and returns what each produced.

    + target: the server
    + prompts: requests cycle through them in order
    + options: request settings
    + progress: receives progress events (default: none)
    + gpu_argv: a command printing nvidia-smi CSV samples (None: no GPU sampling)

    Example (needs a server, so not run here):
        runs = asyncio.run(Runner(target, prompts).run([Step(concurrency=1, requests=10)]))
        runs[0].results[0].ttft
        # → 0.0213
    """

    def __init__(
        self,
        target: Target,
        prompts: list[Prompt],
        options: Options | None = None,
        progress: Progress | None = None,
        gpu_argv: list[str] | None = None,
    ):
        if not prompts:
            raise ValueError("no prompts")
        self.target = target
        self.options = options or Options()
        self.progress = progress or NoProgress()
        self.gpu_argv = gpu_argv
        self.url = endpoint(target.base_url, target.api)
        self.headers = target.headers()
        self.bodies = [
            json.dumps(
                request_body(target.api, target.model, p, self.options.fixed_output,
                             self.options.extra_body)
            ).encode()
            for p in prompts
        ]
        self._next = 0
        self.notes: list[str] = []
        self.gauge_samples: list[tuple[float, dict[str, float]]] = []
        self.gpu_error = ""
        self._metrics_ok = self.options.scrape_metrics

    def _body(self) -> bytes:
        body = self.bodies[self._next % len(self.bodies)]
        self._next += 1
        return body

    async def _one(self, session: Any, warmup: bool) -> RequestResult:
        result = await stream_request(
            session, self.url, self._body(), self.headers, self.options.timeout, warmup
        )
        self.progress.advance(result)
        return result

    async def _closed(
        self, session: Any, concurrency: int, count: int | None, seconds: float | None,
        warmup: bool = False,
    ) -> list[RequestResult]:
        results: list[RequestResult] = []
        issued = 0
        deadline = time.perf_counter() + seconds if seconds is not None else None

        async def worker() -> None:
            nonlocal issued
            while (count is None or issued < count) and (
                deadline is None or time.perf_counter() < deadline
            ):
                issued += 1
                results.append(await self._one(session, warmup))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return results

    async def _open(
        self, session: Any, rate: float, cap: int | None, count: int | None,
        seconds: float | None, rng: random.Random,
    ) -> list[RequestResult]:
        gate = asyncio.Semaphore(cap) if cap else None
        start = time.perf_counter()
        deadline = start + seconds if seconds is not None else None
        tasks: list[asyncio.Task] = []

        async def gated() -> RequestResult:
            if gate is None:
                return await self._one(session, False)
            async with gate:
                return await self._one(session, False)

        arrival = start
        while count is None or len(tasks) < count:
            arrival += rng.expovariate(rate)
            if deadline is not None and arrival >= deadline:
                break
            delay = arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(gated()))
        return list(await asyncio.gather(*tasks))

    async def _scrape(self, session: Any) -> servermetrics.Scrape | None:
        if not self._metrics_ok:
            return None

        try:
            async with session.get(
                self.target.base_url.rstrip("/") + "/metrics",
                timeout=aiohttp.ClientTimeout(total=10),
            ) as response:
                if response.status != 200:
                    raise OSError(f"HTTP {response.status}")
                return servermetrics.parse_prometheus(await response.text())
        except (OSError, aiohttp.ClientError, asyncio.TimeoutError) as error:
            self._metrics_ok = False
            self.notes.append(f"server /metrics not readable ({error}); no server-side figures")
            return None

    async def _sample_gauges(self, session: Any) -> None:
        """Sample the gauges during a step: soon after it starts, then every interval."""
        await asyncio.sleep(min(0.2, self.options.sample_interval))
        while self._metrics_ok:
            scrape = await self._scrape(session)
            if scrape is not None:
                self.gauge_samples.append(
                    (time.perf_counter(), servermetrics.gauge_values(scrape, self.target.model))
                )
            await asyncio.sleep(self.options.sample_interval)

    async def run_step(self, session: Any, step: Step, rng: random.Random,
                       gpu: GpuSampler | None) -> StepRun:
        """Warm up, then run and measure one step."""
        warm: list[RequestResult] = []
        if step.warmup:
            self.progress.start_step(f"{step.label} (warm-up)", step.warmup, None)
            width = step.concurrency or min(step.warmup, step.max_concurrency or step.warmup)
            warm = await self._closed(session, min(width, step.warmup), step.warmup, None, True)
            self.progress.end_step()
        before = await self._scrape(session)
        self.progress.start_step(step.label, step.requests, step.duration)
        sampler = asyncio.create_task(self._sample_gauges(session)) if before else None
        start = time.perf_counter()
        try:
            if step.concurrency is not None:
                results = await self._closed(session, step.concurrency, step.requests,
                                             step.duration)
            else:
                assert step.rate is not None
                results = await self._open(session, step.rate, step.max_concurrency,
                                           step.requests, step.duration, rng)
        finally:
            if sampler is not None:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
        end = max((r.done for r in results), default=time.perf_counter())
        self.progress.end_step()
        after = await self._scrape(session)
        run = StepRun(step=step, results=results, warmup=warm, start=start, end=end)
        if before is not None and after is not None:
            run.server = servermetrics.step_figures(before, after, self.target.model)
        run.gauges = servermetrics.gauge_summary(
            [g for t, g in self.gauge_samples if start <= t <= end]
        )
        if gpu is not None:
            run.gpu = summarize_gpus(gpu.window(start, end))
        return run

    async def run(self, steps: list[Step]) -> list[StepRun]:
        """Run every step in order; return their results."""
        context = self.target.ssl_context()
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60,
                                         ssl=True if context is None else context)
        runs = []
        rng = random.Random(self.options.seed)
        async with aiohttp.ClientSession(connector=connector) as session:
            gpu = None
            if self.gpu_argv:
                gpu = GpuSampler(self.gpu_argv)
                await gpu.start()
            try:
                for step in steps:
                    runs.append(await self.run_step(session, step, rng, gpu))
            finally:
                if gpu is not None:
                    await gpu.stop()
                    if not gpu.samples:
                        why = gpu.error or "nvidia-smi printed nothing"
                        self.notes.append(f"GPU sampling gave no samples: {why}")
        return runs
