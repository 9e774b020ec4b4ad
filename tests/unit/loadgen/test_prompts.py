"""A user's JSONL prompts (:mod:`loadgen.prompts`), read with located errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.prompts import PromptError, load_jsonl


def test_jsonl_prompts(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "one", "output_tokens": 5}\n'
        "# a comment\n"
        '{"messages": [{"role": "user", "content": "two"}]}\n'
    )
    prompts = load_jsonl(path, output_len=9)
    assert [(p.text, p.output_tokens) for p in prompts] == [("one", 5), (None, 9)]
    assert prompts[1].chat_messages() == [{"role": "user", "content": "two"}]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "p.jsonl:1: not JSON"),
        ('{"output_tokens": 3}', "exactly one of 'prompt'"),
        ('{"prompt": "x", "output_tokens": 0}', "positive integer"),
        ("[1, 2]", "expected an object"),
    ],
)
def test_bad_jsonl_lines_are_located(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(PromptError, match=message):
        load_jsonl(path, output_len=4)
