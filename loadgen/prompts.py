"""Prompts for a benchmark: a synthetic set with controlled lengths, or a user's JSONL file.

**Synthetic**: reproducible text (seeded) drawn from a fixed pool of plain English words.
Against a vLLM server the set is calibrated with its ``/tokenize`` and ``/detokenize``
endpoints: a long text is tokenized once, each prompt is a window of exactly ``input_len``
tokens, turned back into text. Without those endpoints a prompt has ``input_len`` words
(roughly as many tokens); either way the report shows the input tokens the server counted.
The output length is held exact by asking for vLLM's ``ignore_eos``.

**JSONL**: one object per line, ``{"prompt": "...", "output_tokens": 64}`` (vLLM's custom
dataset format) or ``{"messages": [...], "output_tokens": 64}`` for chat; ``output_tokens`` is
optional (default: ``--output-len``). Blank lines and lines starting with ``#`` are skipped.

Example:
    >>> p = synthetic_prompts(3, input_len=5, output_len=16, seed=1)
    >>> len(p), len(p[0].text.split()), p[0].output_tokens
    (3, 5, 16)
    >>> p == synthetic_prompts(3, input_len=5, output_len=16, seed=1)
    True
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from loadgen.timing import Prompt

_WORD_TEXT = (
    "the of and to in is was for on that with as by at from his her an were are which this "
    "be or had not but have its one all their also first new two time more after other into "
    "city year world people state water house river music light field story night market "
    "school garden number paper window family history summer winter station mountain island "
    "letter bridge village forest season engine signal pattern harbor valley travel morning "
    "against between during without under around before through across because however while "
    "small large early later great local short long north south east west open quiet bright "
    "build carry change follow gather help hold keep learn leave move reach return show turn "
    "write read speak listen answer question measure record report result reason method"
)
_WORDS = _WORD_TEXT.split()


class PromptError(ValueError):
    """A prompt file could not be read; the message names the file and line."""


def synthetic_text(words: int, rng: random.Random) -> str:
    """``words`` words from the pool, as one plain sentence-ish text.

    Example:
        >>> synthetic_text(4, random.Random(0))
        'long carry with island'
    """
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def synthetic_prompts(
    count: int,
    input_len: int,
    output_len: int,
    seed: int = 0,
    tokenize: Callable[[str], list[int]] | None = None,
    detokenize: Callable[[list[int]], str] | None = None,
) -> list[Prompt]:
    """``count`` reproducible prompts of ``input_len`` tokens (words without a tokenizer).

    + count: how many distinct prompts (requests cycle through them)
    + input_len: input tokens per prompt
    + output_len: output tokens asked for per request
    + seed: the random seed; the same seed gives the same prompts
    + tokenize, detokenize: the server's tokenizer (vLLM's /tokenize, /detokenize), if any

    Example:
        >>> [p.input_tokens for p in synthetic_prompts(2, input_len=3, output_len=1)]
        [None, None]
    """
    if count < 1 or input_len < 1 or output_len < 1:
        raise ValueError("count, input_len and output_len must be at least 1")
    rng = random.Random(seed)
    if tokenize is None or detokenize is None:
        return [
            Prompt(text=synthetic_text(input_len, rng), output_tokens=output_len)
            for _ in range(count)
        ]
    ids = tokenize(synthetic_text(input_len * 2 + 64, rng))
    while len(ids) < input_len + 1:
        ids = ids + tokenize(synthetic_text(input_len + 64, rng))
    prompts = []
    for _ in range(count):
        offset = rng.randrange(0, len(ids) - input_len + 1)
        window = ids[offset : offset + input_len]
        prompts.append(
            Prompt(text=detokenize(window), output_tokens=output_len, input_tokens=input_len)
        )
    return prompts


def load_jsonl(path: str | Path, output_len: int) -> list[Prompt]:
    """Prompts from a JSONL file (see the module docstring); raise PromptError on bad lines.

    + path: the file
    + output_len: output tokens for lines without ``output_tokens``

    Example:
        >>> import tempfile, os
        >>> f = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
        >>> _ = f.write('{"prompt": "Hi", "output_tokens": 3}\\n\\n{"prompt": "Yo"}\\n')
        >>> f.close()
        >>> [(p.text, p.output_tokens) for p in load_jsonl(f.name, output_len=8)]
        [('Hi', 3), ('Yo', 8)]
        >>> os.unlink(f.name)
    """
    prompts = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise PromptError(f"{path}: cannot read: {err.strerror}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise PromptError(f"{where}: not JSON: {err.msg}") from None
        if not isinstance(item, dict):
            raise PromptError(f"{where}: expected an object with 'prompt' or 'messages'")
        text, messages = item.get("prompt"), item.get("messages")
        if (text is None) == (messages is None):
            raise PromptError(f"{where}: give exactly one of 'prompt' (text) or 'messages'")
        if text is not None and not isinstance(text, str):
            raise PromptError(f"{where}: 'prompt' must be a string")
        if messages is not None and not (
            isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
        ):
            raise PromptError(f"{where}: 'messages' must be a list of objects")
        tokens = item.get("output_tokens", output_len)
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise PromptError(f"{where}: 'output_tokens' must be a positive integer")
        prompts.append(Prompt(text=text, messages=messages, output_tokens=tokens))
    if not prompts:
        raise PromptError(f"{path}: no prompts")
    return prompts
