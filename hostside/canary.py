"""The canary gate of a rollout: is the upgraded replica slower than one on the old configuration?

Runs on the router's host (it reaches every replica) once the first replica of an endpoint is
upgraded and ready, before it goes back into the router. It sends the same prompts (seeded, a
fixed output length: vLLM's ``ignore_eos``) straight to the upgraded replica and to a replica
still on the old configuration, one request at a time, alternating between the two (so that a
slow moment of the host hits both), after one warm-up request each; then it compares their
medians (:func:`verdict`). Standard library only.

The figures are ``fleet bench``'s, by the same code: :mod:`loadgen.timing` times each stream
(**TTFT**: sending the request → the first streamed chunk that carries a token; **TPOT**:
(time of the last token − TTFT) / (output tokens − 1), the tokens counted from the server's
usage report), :mod:`loadgen.prompts` makes the seeded prompts and :mod:`loadgen.stats` takes
the medians; the deploy uploads those modules with this one (:func:`hostside.program_files`).

Prints one line per replica (``canary: HH:MM:SS.mmm LABEL (new|old configuration): TTFT P50 …
ms, TPOT P50 … ms``) and the decision last. Exit status: 0 passed (or skipped: no replica on
the old configuration answers, as on a first deploy); 1 slower beyond a margin; 2 could not
measure (a request failed).

Example:
    python3 canary.py --label tiny/a/tiny-a --new http://127.0.0.1:18401 \\
        --old tiny/b/tiny-b=http://127.0.0.1:18402 --model tiny \\
        --key-file /etc/vllm-fleet/router-tiny.env --requests 8 --input-len 128 --output-len 32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as a file: siblings import as the hostside package (see hostside)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostside import envfile
from hostside.router_workers import stamp
from loadgen.prompts import synthetic_prompts
from loadgen.stats import percentile
from loadgen.timing import Prompt, RequestResult, StreamTimer, endpoint, request_body

#: Seconds one canary request may take.
REQUEST_TIMEOUT = 120


class CanaryError(Exception):
    """A canary request failed; the message says which replica and how."""


@dataclass(frozen=True)
class Figures:
    """One replica's medians, in milliseconds.

    Example:
        >>> Figures(12.0, 4.5).text()
        'TTFT P50 12.0 ms, TPOT P50 4.50 ms'
    """

    ttft_ms: float
    tpot_ms: float

    def text(self) -> str:
        """The figures as the deploy's output shows them."""
        return f"TTFT P50 {self.ttft_ms:.1f} ms, TPOT P50 {self.tpot_ms:.2f} ms"


def _over(new: float, old: float, margin: float, floor_ms: float) -> bool:
    """Slower than ``old`` by more than ``margin`` (a fraction) and by more than the floor."""
    return new > old * (1 + margin) and new - old > floor_ms


def _change(new: float, old: float) -> str:
    """``+12 %``: how ``new`` compares with ``old``."""
    return f"{(new / old - 1) * 100:+.0f} %" if old > 0 else "n/a"


def verdict(
    new: Figures, old: Figures, ttft_margin: float, tpot_margin: float, floor_ms: float
) -> tuple[bool, str]:
    """Did the upgraded replica stay within the margins of the old one? (ok, the words).

    A figure fails when it is slower than the old one's by more than its margin (a fraction:
    0.25 = 25 %) *and* by more than ``floor_ms`` (the noise of a small model's figures).

    Example:
        >>> verdict(Figures(11.0, 5.0), Figures(10.0, 5.0), 0.25, 0.25, 2.0)
        (True, 'passed: TTFT +10 % (margin 25 %), TPOT +0 % (margin 25 %)')
        >>> verdict(Figures(40.0, 5.0), Figures(10.0, 5.0), 0.25, 0.25, 2.0)[1]
        'failed: TTFT P50 40.0 ms against 10.0 ms (+300 %, margin 25 %)'
        >>> verdict(Figures(1.5, 0.2), Figures(1.0, 0.1), 0.25, 0.25, 2.0)[0]  # below the floor
        True
    """
    slower = []
    if _over(new.ttft_ms, old.ttft_ms, ttft_margin, floor_ms):
        slower.append(
            f"TTFT P50 {new.ttft_ms:.1f} ms against {old.ttft_ms:.1f} ms "
            f"({_change(new.ttft_ms, old.ttft_ms)}, margin {ttft_margin * 100:.0f} %)"
        )
    if _over(new.tpot_ms, old.tpot_ms, tpot_margin, floor_ms):
        slower.append(
            f"TPOT P50 {new.tpot_ms:.2f} ms against {old.tpot_ms:.2f} ms "
            f"({_change(new.tpot_ms, old.tpot_ms)}, margin {tpot_margin * 100:.0f} %)"
        )
    if slower:
        return False, "failed: " + "; ".join(slower)
    return True, (
        f"passed: TTFT {_change(new.ttft_ms, old.ttft_ms)} (margin {ttft_margin * 100:.0f} %), "
        f"TPOT {_change(new.tpot_ms, old.tpot_ms)} (margin {tpot_margin * 100:.0f} %)"
    )


def timed(lines: list[tuple[float, bytes]], start: float) -> tuple[float, float]:
    """(TTFT, TPOT) in seconds from a completion stream's ``(arrival time, line)`` pairs, timed
    as ``fleet bench`` times it (:class:`loadgen.timing.StreamTimer`).

    Example:
        >>> stream = [(1.1, b'data: {"choices": [{"text": "a"}]}'),
        ...           (1.5, b'data: {"choices": [{"text": "b"}]}'),
        ...           (1.6, b'data: {"choices": [], "usage": {"completion_tokens": 5}}'),
        ...           (1.6, b'data: [DONE]')]
        >>> [round(x, 3) for x in timed(stream, 1.0)]
        [0.1, 0.1]
    """
    timer = StreamTimer(RequestResult(start=start))
    for at, raw in lines:
        line = raw.strip()
        if line.startswith(b"data:") and not timer.data(line[5:].strip(), at):
            raise CanaryError(f"the stream carried an error: {timer.result.detail}")
    result = timer.finish()
    if not result.ok:
        raise CanaryError(result.detail)
    if result.ttft is None or result.tpot is None:
        raise CanaryError(f"{result.output_tokens} output token: no time per output token")
    return result.ttft, result.tpot


def one_request(url: str, model: str, prompt: str, output_len: int, key: str | None):
    """One streamed completion against ``url``: (TTFT, TPOT) in seconds."""
    body = request_body(
        "completions", model, Prompt(text=prompt, output_tokens=output_len), fixed_output=True,
        extra={"min_tokens": output_len, "temperature": 0},
    )
    request = urllib.request.Request(
        endpoint(url, "completions"), data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as reply:
            lines = [(time.perf_counter(), line) for line in iter(reply.readline, b"")]
    except urllib.error.HTTPError as error:
        text = error.read(200).decode(errors="replace")
        raise CanaryError(f"HTTP {error.code}: {text}") from error
    except (urllib.error.URLError, OSError) as error:
        raise CanaryError(str(error)) from error
    try:
        return timed(lines, start)
    except ValueError as error:
        raise CanaryError(f"not an OpenAI stream: {error}") from error


def answers(url: str) -> bool:
    """Whether a vLLM server answers ``/health`` at ``url``."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _median(values: list[float]) -> float:
    """The P50 of ``fleet bench`` (:func:`loadgen.stats.percentile`); ``values`` not empty."""
    value = percentile(values, 50)
    assert value is not None
    return value


def measure(
    targets: dict[str, str], model: str, texts: list[str], output_len: int, key: str | None
) -> dict[str, Figures]:
    """Medians per target (label → url): one warm-up request each, then every prompt to each
    target in turn (alternating). Raises :class:`CanaryError` naming the target that failed."""
    samples: dict[str, list[tuple[float, float]]] = {label: [] for label in targets}
    for index, text in enumerate([texts[0], *texts]):
        for label, url in targets.items():
            try:
                figures = one_request(url, model, text, output_len, key)
            except CanaryError as error:
                raise CanaryError(f"{label}: {error}") from error
            if index:  # the first round warms both up
                samples[label].append(figures)
    return {
        label: Figures(
            _median([t for t, _ in pairs]) * 1000, _median([p for _, p in pairs]) * 1000
        )
        for label, pairs in samples.items()
    }


def main(argv: list[str] | None = None) -> int:
    """Measure both replicas and decide; see the module's exit statuses."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--label", required=True, help="the upgraded replica (ENDPOINT/HOST/…)")
    parser.add_argument("--new", required=True, help="its URL as this host reaches it")
    parser.add_argument(
        "--old",
        action="append",
        default=[],
        metavar="LABEL=URL",
        help="replicas still on the old configuration (the first answering one)",
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--key-file", default="")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ttft-margin", type=float, default=0.25)
    parser.add_argument("--tpot-margin", type=float, default=0.25)
    parser.add_argument("--floor-ms", type=float, default=2.0)
    args = parser.parse_args(argv)
    old = next((pair.split("=", 1) for pair in args.old if answers(pair.split("=", 1)[1])), None)
    if old is None:
        print(
            f"canary: {stamp()} {args.label}: skipped: no replica on the old configuration "
            "answers (a first deploy): nothing to compare with"
        )
        return 0
    old_label, old_url = old
    key = envfile.read_value(args.key_file, "VLLM_API_KEY") if args.key_file else None
    texts = [
        p.text or ""
        for p in synthetic_prompts(args.requests, args.input_len, args.output_len, args.seed)
    ]
    print(
        f"canary: {stamp()} {args.label}: measuring it against {old_label} "
        f"({args.requests} requests each, {args.input_len} words in, {args.output_len} "
        "tokens out)",
        flush=True,
    )
    targets = {args.label: args.new, old_label: old_url}
    try:
        figures = measure(targets, args.model, texts, args.output_len, key)
    except CanaryError as error:
        print(f"canary: {stamp()} {args.label}: failed: could not measure: {error}")
        return 2
    new, before = figures[args.label], figures[old_label]
    print(f"canary: {stamp()} {args.label} (new configuration): {new.text()}")
    print(f"canary: {stamp()} {old_label} (old configuration): {before.text()}")
    ok, words = verdict(new, before, args.ttft_margin, args.tpot_margin, args.floor_ms)
    print(f"canary: {stamp()} {args.label}: {words}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
