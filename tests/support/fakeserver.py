"""A scripted OpenAI-style streaming server whose timing is known: the test target of the bench.

Each request follows a :class:`Script`, taken from the server's default and overridden by the
request's ``model`` name (``"ttft=0.2,itl=0.05,chunks=6"``): a delay before the first token,
a delay between tokens, the number of token-bearing chunks and the tokens in each, a role-only
first chunk and empty chunks that carry no token, tokens whose text is empty (part of a
character, as vLLM streams them), the final usage report, an
HTTP error status, a hang, a stream error object or a dropped connection. With no ``chunks``
the request's ``max_tokens`` decides. ``/metrics`` answers in vLLM's metric names (the TTFT
histogram of what it served, preemptions, KV cache usage, the process's resident memory, which
grows by ``leak_bytes`` a request); ``/tokenize`` and ``/detokenize`` use one token per word.
Servers given one :class:`SharedDevice` behave like vLLM servers sharing a GPU: up to its
``capacity`` requests in flight (all servers together) cost nothing extra, beyond it every
delay stretches in proportion, so throughput saturates there and latency climbs. Used by tests
and by ``benchmarks/bench_client_overhead.py``.

Example:
    >>> Script.parse("ttft=0.2,itl=0.05,chunks=6,usage=0")
    Script(ttft=0.2, itl=0.05, chunks=6, tokens_per_chunk=1, role_chunk=True, empty_chunks=False, blank_tokens=False, usage=False, status=200, hang=0.0, error_after=None, drop_after=None, batch=False, fail_every=None, drift=0.0)

Run one from a shell: ``python -m tests.support.fakeserver --port 18390 --batch``.
"""  # noqa: E501

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

#: Resident memory the fake server reports before any request.
RSS_BYTES = 512 * 1024 * 1024
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0)


@dataclass
class Script:
    """How the server answers one request.

    + ttft: seconds before the first token-bearing chunk
    + itl: seconds between token-bearing chunks
    + chunks: token-bearing chunks (None: max_tokens / tokens_per_chunk)
    + tokens_per_chunk: tokens each chunk stands for (the usage report counts them)
    + role_chunk: chat: send a role-only chunk (empty content) at once
    + empty_chunks: send a chunk that carries no token (chat: an empty delta; completions: no
      choices) before every token-bearing one
    + blank_tokens: the first and every second token-bearing chunk after it have an empty
      text (a token that is part of a character not complete yet)
    + usage: send the usage report when asked for (stream_options.include_usage)
    + status: HTTP status (not 200: an error body, no stream)
    + hang: seconds to wait before answering at all
    + error_after: send an error object after this many token chunks
    + drop_after: close the connection after this many token chunks
    + batch: write the whole stream at once (fast; for client overhead benchmarks)
    + fail_every: answer every Nth request (of the server's) with HTTP 503
    + drift: delays grow by this fraction per second since the server's first request
    """

    ttft: float = 0.0
    itl: float = 0.0
    chunks: int | None = None
    tokens_per_chunk: int = 1
    role_chunk: bool = True
    empty_chunks: bool = False
    blank_tokens: bool = False
    usage: bool = True
    status: int = 200
    hang: float = 0.0
    error_after: int | None = None
    drop_after: int | None = None
    batch: bool = False
    fail_every: int | None = None
    drift: float = 0.0

    @classmethod
    def parse(cls, text: str, base: Script | None = None) -> Script:
        """A script from ``key=value`` pairs, on top of ``base`` (unknown keys are ignored)."""
        script = dataclasses.replace(base or cls())
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        for part in text.split(","):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in types:
                continue
            kind = str(types[key])
            if "bool" in kind:
                setattr(script, key, value.strip() not in ("0", "false", "no"))
            elif "float" in kind:
                setattr(script, key, float(value))
            else:
                setattr(script, key, int(value))
        return script


def _chunk(chat: bool, text: str | None, role: bool = False) -> bytes:
    if chat:
        delta: dict[str, Any] = {"content": text or ""}
        if role:
            delta["role"] = "assistant"
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": None}
        obj = "text_completion"
    body = {"id": "fake", "object": obj, "model": "fake", "choices": [choice]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _no_token_chunk(chat: bool) -> bytes:
    """A chunk without a token: an empty chat delta, or a completions chunk with no choice."""
    choices = [{"index": 0, "delta": {}, "finish_reason": None}] if chat else []
    body = {"id": "fake", "object": "chat.completion.chunk" if chat else "text_completion",
            "model": "fake", "choices": choices}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class SharedDevice:
    """A GPU that several fake servers share: delays stretch once too many requests are in flight.

    + capacity: requests in flight (over every server on it) that run at full speed

    Example:
        >>> device = SharedDevice(capacity=4)
        >>> device.enter(); device.enter(); device.stretch()
        1.0
        >>> for _ in range(6): device.enter()
        >>> device.stretch()
        2.0
    """

    def __init__(self, capacity: int = 4):
        self.capacity = capacity
        self.in_flight = 0
        self._lock = threading.Lock()

    def enter(self) -> None:
        """A request starts."""
        with self._lock:
            self.in_flight += 1

    def leave(self) -> None:
        """A request ends."""
        with self._lock:
            self.in_flight -= 1

    def stretch(self) -> float:
        """How much longer every delay is now: 1 up to capacity, then in_flight / capacity."""
        return max(1.0, self.in_flight / self.capacity)


class FakeServer:
    """The server: start it in a background thread (tests) or serve it in the foreground.

    + port: TCP port on 127.0.0.1 (0: a free one; see :attr:`port` once started)
    + script: the default script of every request
    + api_key: the bearer token it requires (None: none)
    + device: the shared GPU it runs on (None: it has one to itself, with no limit)
    + leak_bytes: resident memory it gains per request (``/metrics``)
    + render: answer ``/v1/completions/render`` and ``/v1/chat/completions/render`` with token
      ids, as vLLM ≥ 0.30 does with ``--enable-scale-out``; False: 403, as it does without
    + tls: serve https with this server-side SSL context (as vLLM with ``--ssl-certfile``);
      None: plain http

    Example (starts a real server, so not run here):
        with FakeServer(script=Script(ttft=0.1, itl=0.02)) as server:
            url = f"http://127.0.0.1:{server.port}"
    """

    def __init__(self, port: int = 0, script: Script | None = None,
                 api_key: str | None = None, device: SharedDevice | None = None,
                 leak_bytes: int = 0, render: bool = True, tls: ssl.SSLContext | None = None):
        self.port = port
        self.tls = tls
        self.render = render
        self.render_calls: list[tuple[str, int]] = []
        self.device = device
        self.leak_bytes = leak_bytes
        self._first: float | None = None
        self.script = script or Script()
        self.api_key = api_key
        self.requests = 0
        self.in_flight = 0
        #: other clients' requests its ``vllm:num_requests_waiting`` gauge says wait for a slot
        self.waiting = 0
        #: other clients' requests it finishes for each of ours (``vllm:request_success_total``;
        #: None: the counter is not reported)
        self.others_per_request: int | None = None
        self.ttft_observed: list[float] = []
        #: per request, the perf_counter moments at which each token-bearing chunk was written
        #: (the truth a client's TTFT, ITL and E2E are compared with when it runs in-process)
        self.token_moments: list[list[float]] = []
        self.authorizations: list[str | None] = []
        self._vocab: dict[str, int] = {}
        self._words: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None

    def app(self) -> Any:
        """The aiohttp application."""
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/completions/render", self._render)
        app.router.add_post("/v1/chat/completions/render", self._render)
        app.router.add_post("/detokenize", self._detokenize)
        return app

    async def _health(self, request: Any) -> Any:

        return web.Response(text="")

    async def _models(self, request: Any) -> Any:

        return web.json_response({"object": "list", "data": [{"id": "fake", "root": "fake"}]})

    async def _tokenize(self, request: Any) -> Any:

        body = await request.json()
        tokens = []
        for word in str(body.get("prompt", "")).split():
            if word not in self._vocab:
                self._vocab[word] = len(self._words)
                self._words.append(word)
            tokens.append(self._vocab[word])
        return web.json_response({"count": len(tokens), "tokens": tokens})

    def _ids(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            if word not in self._vocab:
                self._vocab[word] = len(self._words)
                self._words.append(word)
            ids.append(self._vocab[word])
        return ids or [0]

    async def _render(self, request: Any) -> Any:
        """vLLM's render endpoints: the prompt's token ids (a ``GenerateRequest``; a list of
        them for completions), or vLLM's 403 without ``--enable-scale-out``."""
        if not self.render:
            self.render_calls.append((request.path, 403))
            return web.json_response({"error": {"message": "Scale-out endpoints are disabled",
                                                "type": "PermissionDeniedError", "code": 403}},
                                     status=403)
        body = await request.json()
        if request.path == "/v1/chat/completions/render":
            text = " ".join(str(m.get("content", "")) for m in body.get("messages") or [])
        else:
            text = str(body.get("prompt", ""))
        item = {"request_id": f"render-{len(self.render_calls)}", "token_ids": self._ids(text),
                "sampling_params": {"max_tokens": body.get("max_tokens")},
                "model": body.get("model")}
        self.render_calls.append((request.path, 200))
        chat = request.path == "/v1/chat/completions/render"
        return web.json_response(item if chat else [item])

    async def _detokenize(self, request: Any) -> Any:

        body = await request.json()
        return web.json_response({"prompt": " ".join(self._words[t] for t in body["tokens"])})

    async def _metrics(self, request: Any) -> Any:

        lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
        labels = 'engine="0",model_name="fake"'
        for bound in (*TTFT_BUCKETS, float("inf")):
            count = sum(1 for t in self.ttft_observed if t <= bound)
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{le}"}} {count}')
        lines.append(f"vllm:time_to_first_token_seconds_count{{{labels}}} "
                     f"{len(self.ttft_observed)}")
        lines.append(f"vllm:time_to_first_token_seconds_sum{{{labels}}} "
                     f"{sum(self.ttft_observed)}")
        lines.append(f"vllm:num_preemptions_total{{{labels}}} {self.requests // 2}")
        lines.append(f"vllm:kv_cache_usage_perc{{{labels}}} {self.in_flight / 10}")
        lines.append(f"vllm:num_requests_running{{{labels}}} {self.in_flight}")
        lines.append(f"vllm:num_requests_waiting{{{labels}}} {self.waiting}")
        if self.others_per_request is not None:
            finished = self.requests * (1 + self.others_per_request)
            lines.append(f'vllm:request_success_total{{{labels},finished_reason="length"}} '
                         f"{finished}")
        lines.append("# TYPE process_resident_memory_bytes gauge")
        lines.append(f"process_resident_memory_bytes {RSS_BYTES + self.leak_bytes * self.requests}")
        return web.Response(text="\n".join(lines) + "\n")

    async def _complete(self, request: Any) -> Any:

        self.authorizations.append(request.headers.get("Authorization"))
        body = await request.json()
        script = Script.parse(str(body.get("model", "")), self.script)
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        if script.hang:
            await asyncio.sleep(script.hang)
        failing = script.fail_every and (self.requests + 1) % script.fail_every == 0
        if failing:
            self.requests += 1
        if script.status != 200 or failing:
            return web.json_response({"error": {"message": "scripted failure"}},
                                     status=503 if failing else script.status)
        chat = request.path.endswith("/chat/completions")
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        chunks = script.chunks or max(1, max_tokens // script.tokens_per_chunk)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.requests += 1
        self.in_flight += 1
        start = time.perf_counter()
        moments: list[float] = []
        self.token_moments.append(moments)
        if self._first is None:
            self._first = start
        if self.device is not None:
            self.device.enter()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            await response.prepare(request)
            pending: list[bytes] = []

            async def send(data: bytes) -> None:
                if script.batch:
                    pending.append(data)
                else:
                    await response.write(data)

            if chat and script.role_chunk:
                await send(_chunk(chat, "", role=True))
            for index in range(chunks):
                delay = script.ttft if index == 0 else script.itl
                if delay and self.device is not None:
                    delay *= self.device.stretch()
                if delay and script.drift:
                    delay *= 1 + script.drift * (time.perf_counter() - self._first)
                if delay:
                    await asyncio.sleep(delay)
                if script.error_after is not None and index == script.error_after:
                    await send(b'data: {"error": {"message": "scripted", "code": 500}}\n\n')
                    break
                if script.drop_after is not None and index == script.drop_after:
                    if request.transport is not None:
                        request.transport.close()
                    return response
                if script.empty_chunks:
                    await send(_no_token_chunk(chat))
                blank = script.blank_tokens and index % 2 == 0
                moments.append(time.perf_counter())  # before the write: no byte is out yet
                await send(_chunk(chat, "" if blank else f" w{index}"))
                if index == 0:
                    self.ttft_observed.append(time.perf_counter() - start)
            else:
                if include_usage and script.usage:
                    usage = {"prompt_tokens": 7, "completion_tokens":
                             chunks * script.tokens_per_chunk,
                             "total_tokens": 7 + chunks * script.tokens_per_chunk}
                    await send(b"data: " + json.dumps(
                        {"id": "fake", "choices": [], "usage": usage}).encode() + b"\n\n")
            await send(b"data: [DONE]\n\n")
            if pending:
                await response.write(b"".join(pending))
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away (timeouts, dropped connections): not our failure
        finally:
            self.in_flight -= 1
            if self.device is not None:
                self.device.leave()
        return response

    async def start_async(self) -> None:
        """Bind and start serving on the running loop."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, backlog=1024,
                           ssl_context=self.tls)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop_async(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()

    def __enter__(self) -> FakeServer:
        ready = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.start_async())
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self.stop_async())
            self._loop.close()

        self._thread = threading.Thread(target=serve, name="fake-openai-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    @property
    def url(self) -> str:
        """The base URL."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.support.fakeserver --port N [--batch] [--ttft S] [--itl S]``."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.fakeserver")
    parser.add_argument("--port", type=int, default=18390)
    parser.add_argument("--ttft", type=float, default=0.0)
    parser.add_argument("--itl", type=float, default=0.0)
    parser.add_argument("--batch", action="store_true", help="write each stream at once")
    parser.add_argument("--refuse-render", action="store_true",
                        help="answer the render endpoints 403, as vLLM without --enable-scale-out")
    args = parser.parse_args(argv)
    server = FakeServer(args.port, Script(ttft=args.ttft, itl=args.itl, batch=args.batch),
                        render=not args.refuse_render)

    async def forever() -> None:
        await server.start_async()
        print(f"fake OpenAI server on {server.url}", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(forever())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
