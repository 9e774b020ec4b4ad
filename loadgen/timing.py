"""What a streamed OpenAI request's figures mean, and the timing of one stream as it arrives.

The metric definitions of the house live here, once: ``fleet bench`` and ``fleet doctor`` time
their requests with them (:mod:`loadgen.client`), and so does the canary gate on a host
(:mod:`hostside.canary`), which is why this module needs only the standard library (it is
uploaded with the host programs that import it: :func:`hostside.program_files`).

Definitions (all times from :func:`time.perf_counter`, taken when the bytes arrive):

- **start**: just before the request is sent (connection setup included, as a user sees it);
- **TTFT**: start → the first SSE chunk that *carries a token*: a completions chunk with a
  ``choices[].text``, a chat chunk whose ``delta`` has ``content``, ``reasoning_content``/
  ``reasoning`` or ``tool_calls``. An *empty* text or content counts too while the choice is
  not finished and (chat) names no role: vLLM streams a chunk for every step that produced
  tokens, with an empty text when the token is part of a character not complete yet (CJK,
  emoji, byte-fallback tokens). A role-only first chunk, an empty delta, a finish-only last
  chunk and the usage chunk carry no token and do not count;
- **ITL**: the gaps between consecutive token-bearing chunks;
- **E2E**: start → the last token-bearing chunk (the answer is complete then);
- **output tokens**: ``usage.completion_tokens`` of the server's usage report
  (``stream_options.include_usage``), never the number of chunks (one chunk may carry several
  tokens). Only when the server sends no usage are chunks counted, and the result says so;
- **TPOT** = (E2E − TTFT) / (output tokens − 1), None for a one-token answer.

A failed request is counted by kind (:data:`ERROR_KINDS`); partial timings it may have
(a TTFT before a stream error) never enter the figures.

Example:
    >>> chunk_has_token({"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    False
    >>> chunk_has_token({"choices": [{"text": " Paris"}]})
    True
    >>> chunk_has_token({"choices": [{"text": "", "finish_reason": None}]})  # part of a character
    True
    >>> r = RequestResult(ok=True, ttft=0.1, e2e=0.5, output_tokens=5)
    >>> round(r.tpot, 3)
    0.1
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

#: Kinds of failure a request can have (``http_<status>`` for any HTTP status other than 200).
ERROR_KINDS = {
    "http_<status>": "the server answered with an HTTP error status",
    "connection_refused": "nothing listens on the server's port",
    "connection_error": "the connection failed otherwise (DNS, reset, unreachable)",
    "certificate": "https: the server's certificate was refused (not signed by the CA trusted, "
    "or not for the name checked)",
    "disconnected": "the server closed the connection mid-stream",
    "timeout": "no complete answer within --timeout",
    "stream_error": "the stream carried an error object",
    "bad_stream": "the stream was not OpenAI-style SSE JSON",
    "no_tokens": "the stream ended without a token-bearing chunk",
}


@dataclass
class Prompt:
    """One request's input: completion text or chat messages, and the output length asked for.

    + text: prompt text (completions; chat wraps it as one user message)
    + messages: chat messages, used as they are (chat only)
    + output_tokens: max_tokens (exact unless --natural-eos)
    + input_tokens: expected input tokens, when known (informational)

    Example:
        >>> Prompt(text="Hello", output_tokens=8).chat_messages()
        [{'role': 'user', 'content': 'Hello'}]
    """

    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    output_tokens: int = 128
    input_tokens: int | None = None

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages of a chat request."""
        if self.messages is not None:
            return self.messages
        return [{"role": "user", "content": self.text or ""}]

    def completion_prompt(self) -> str:
        """The prompt text of a completions request (chat messages joined by newlines)."""
        if self.text is not None:
            return self.text
        return "\n".join(str(m.get("content", "")) for m in self.messages or [])


@dataclass
class RequestResult:
    """The timing and outcome of one request (seconds).

    + ok: a token-bearing answer arrived completely
    + start: perf_counter at send time
    + ttft, e2e: see the module docstring
    + itl: gaps between token-bearing chunks
    + output_tokens, input_tokens: from the usage report (chunk count when it is missing)
    + usage_reported: whether the server sent a usage report
    + chunks: token-bearing chunks received
    + error: failure kind (:data:`ERROR_KINDS`), None when ok
    + detail: the failure's message (first 300 characters)
    + warmup: part of a warm-up phase (excluded from all figures)
    + done: perf_counter when the request was over (success or not)

    Example:
        >>> RequestResult(ok=True, ttft=0.2, e2e=0.2, output_tokens=1).tpot is None
        True
    """

    ok: bool = False
    start: float = 0.0
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int | None = None
    input_tokens: int | None = None
    usage_reported: bool = False
    chunks: int = 0
    error: str | None = None
    detail: str = ""
    warmup: bool = False
    done: float = 0.0

    @property
    def tpot(self) -> float | None:
        """(E2E − TTFT) / (output tokens − 1); None unless at least two tokens came."""
        if not self.ok or self.e2e is None or self.ttft is None or not self.output_tokens:
            return None
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def itl_max(self) -> float | None:
        """The largest gap between token-bearing chunks."""
        return max(self.itl) if self.itl else None

    @property
    def end(self) -> float:
        """perf_counter when the answer was complete (start when it failed early)."""
        return self.start + (self.e2e or 0.0)

    def figures(self) -> dict[str, float | None]:
        """The per-request figures that SLOs are checked against."""
        return {"ttft": self.ttft, "tpot": self.tpot, "itl_max": self.itl_max, "e2e": self.e2e}


def chunk_has_token(data: dict[str, Any]) -> bool:
    """Whether a parsed SSE chunk carries at least one generated token.

    Example:
        >>> chunk_has_token({"choices": [], "usage": {"completion_tokens": 3}})
        False
        >>> chunk_has_token({"choices": [{"delta": {"reasoning_content": "hm"}}]})
        True
        >>> chunk_has_token({"choices": [{"delta": {}, "finish_reason": "stop"}]})
        False
        >>> chunk_has_token({"choices": [{"text": "", "finish_reason": "length"}]})
        False
    """
    for choice in data.get("choices") or ():
        text = choice.get("text")
        if text:
            return True
        delta = choice.get("delta")
        if delta and (
            delta.get("content")
            or delta.get("reasoning_content")
            or delta.get("reasoning")
            or delta.get("tool_calls")
        ):
            return True
        if choice.get("finish_reason") is not None:
            continue  # an empty finish-only chunk: the last token came before it
        if text == "" or (delta and "role" not in delta and delta.get("content") == ""):
            return True  # a token whose text is not complete yet
    return False



class StreamTimer:
    """Times one streamed answer from its SSE ``data:`` payloads, each with its arrival time.

    It fills a :class:`RequestResult` (whose ``start`` is set) by the definitions above: the
    first token-bearing chunk is the TTFT, the gaps between them the ITL, the last one ends the
    E2E, the usage report gives the output tokens.

    Example:
        >>> timer = StreamTimer(RequestResult(start=1.0))
        >>> for at, data in [(1.1, b'{"choices": [{"text": "a"}]}'),
        ...                  (1.5, b'{"choices": [{"text": "b"}]}'),
        ...                  (1.6, b'{"choices": [], "usage": {"completion_tokens": 5}}'),
        ...                  (1.6, b'[DONE]')]:
        ...     assert timer.data(data, at)
        >>> r = timer.finish()
        >>> r.ok, round(r.ttft, 3), round(r.e2e, 3), r.output_tokens, round(r.tpot, 3)
        (True, 0.1, 0.5, 5, 0.1)
        >>> StreamTimer(RequestResult()).finish().error
        'no_tokens'
    """

    __slots__ = ("_last", "result")

    def __init__(self, result: RequestResult):
        self.result = result
        self._last = 0.0

    def data(self, payload: bytes, now: float) -> bool:
        """One ``data:`` payload (``[DONE]`` included) that arrived at ``now``; False when it
        ends the stream with an error (``result.error`` says so). Raises ValueError on a
        payload that is not JSON."""
        if payload == b"[DONE]":
            return True  # a client reads on to the end, so the connection is reused
        chunk = json.loads(payload)
        result = self.result
        if "error" in chunk and not chunk.get("choices"):
            result.error = "stream_error"
            result.detail = json.dumps(chunk["error"])[:300]
            return False
        if chunk_has_token(chunk):
            if result.chunks == 0:
                result.ttft = now - result.start
            else:
                result.itl.append(now - self._last)
            self._last = now
            result.chunks += 1
        usage = chunk.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            result.usage_reported = True
            result.output_tokens = usage["completion_tokens"]
            result.input_tokens = usage.get("prompt_tokens")
        return True

    def finish(self) -> RequestResult:
        """The result once the stream ended: ok with its E2E, or ``no_tokens``."""
        result = self.result
        if result.chunks == 0:
            result.error = "no_tokens"
            result.detail = "the stream ended without a token-bearing chunk"
            return result
        result.ok = True
        result.e2e = self._last - result.start
        if not result.usage_reported:
            result.output_tokens = result.chunks
        return result


def request_body(
    api: str, model: str, prompt: Prompt, fixed_output: bool, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON body of a streamed request.

    + api: ``"completions"`` or ``"chat"``
    + model: the served model name
    + prompt: the input and output length
    + fixed_output: ask for exactly ``output_tokens``: vLLM's ``ignore_eos`` (a ``min_tokens``
      would add a logits processor to every step, a cost ``vllm bench serve`` does not pay;
      pass one with ``extra`` for servers without ``ignore_eos``)
    + extra: more body fields (temperature, …), applied last

    Example:
        >>> body = request_body("chat", "tiny", Prompt(text="Hi", output_tokens=4), True)
        >>> body["max_completion_tokens"], body["ignore_eos"], body["stream_options"]
        (4, True, {'include_usage': True})
    """
    body: dict[str, Any] = {"model": model, "stream": True,
                            "stream_options": {"include_usage": True}}
    if api == "chat":
        body["messages"] = prompt.chat_messages()
        body["max_completion_tokens"] = prompt.output_tokens
    elif api == "completions":
        body["prompt"] = prompt.completion_prompt()
        body["max_tokens"] = prompt.output_tokens
    else:
        raise ValueError(f"unknown API {api!r} (completions or chat)")
    if fixed_output:
        body["ignore_eos"] = True
    body.update(extra or {})
    return body


def endpoint(base_url: str, api: str) -> str:
    """The URL of an API below a server's base URL.

    Example:
        >>> endpoint("http://127.0.0.1:8000", "chat")
        'http://127.0.0.1:8000/v1/chat/completions'
    """
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    return base_url.rstrip("/") + path
