"""One streamed OpenAI request sent with aiohttp and timed (:mod:`loadgen.timing` says what
each figure means, and times the stream).

A failed request is counted by kind (:data:`~loadgen.timing.ERROR_KINDS`), never raised.

Example (needs a server, so not run here):
    result = await stream_request(session, endpoint(url, "chat"), body, headers, timeout=60)
"""

from __future__ import annotations

import asyncio
import errno
import time
from typing import Any

import aiohttp

from loadgen.timing import RequestResult, StreamTimer
from loadgen.trust import is_certificate_error


def _error_kind(error: BaseException) -> str:
    """The :data:`ERROR_KINDS` kind of an exception raised while requesting."""
    if isinstance(error, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return "timeout"
    if is_certificate_error(error):
        return "certificate"
    if isinstance(error, aiohttp.ClientConnectorError):
        if error.os_error is not None and error.os_error.errno == errno.ECONNREFUSED:
            return "connection_refused"
        return "connection_error"
    if isinstance(error, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return "disconnected"
    if isinstance(error, ConnectionRefusedError):
        return "connection_refused"
    if isinstance(error, aiohttp.ClientError | OSError):
        return "connection_error"
    if isinstance(error, ValueError):
        return "bad_stream"
    return type(error).__name__


async def stream_request(
    session: Any,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout: float,
    warmup: bool = False,
) -> RequestResult:
    """Send one streamed request with an aiohttp session and time it (never raises).

    + session: an ``aiohttp.ClientSession``
    + url: the API endpoint (see :func:`endpoint`)
    + body: the JSON body, already encoded (see :func:`request_body`)
    + headers: request headers (content type, authorization)
    + timeout: seconds for the whole request
    + warmup: mark the result as warm-up

    Example (needs a server, so not run here):
        result = await stream_request(session, url, body, headers, timeout=60)
        result.ok, result.ttft, result.output_tokens
        # → (True, 0.031, 64)
    """
    result = RequestResult(warmup=warmup)
    timer = StreamTimer(result)
    perf = time.perf_counter
    buffer = b""
    result.start = perf()
    try:
        async with session.post(
            url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as response:
            if response.status != 200:
                result.error = f"http_{response.status}"
                result.detail = (await response.text())[:300]
                return result
            async for data in response.content.iter_any():
                now = perf()
                buffer += data
                if b"\n\n" not in buffer and b"\r\n\r\n" not in buffer:
                    continue
                if b"\r" in buffer:
                    buffer = buffer.replace(b"\r\n", b"\n")
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue  # comments (": ping"), event names, ids
                        if not timer.data(line[5:].strip(), now):
                            return result
    except Exception as error:  # every failure is a counted kind, never a crash
        result.error = _error_kind(error)
        result.detail = (str(error) or type(error).__name__)[:300]
        return result
    finally:
        result.done = perf()
    return timer.finish()
