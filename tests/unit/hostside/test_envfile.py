"""The one environment-file writer and reader (hostside/envfile.py) against systemd's rules.

Hostile values round-trip through :func:`envfile.dumps` → :func:`envfile.loads`, and each
written line also reads back through an independent parser (POSIX double-quote rules via
``shlex``). The reader is held against the examples of ``man systemd.exec``
(``EnvironmentFile=``). What real systemd reads from a written file is checked on a sandbox
host in tests/e2e/test_lifecycle.py (``systemd-run -p EnvironmentFile=… env``).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from hostside import envfile

HOSTILE = {
    "plain": "sk-abc123",
    "empty": "",
    "double-quote": 'a"b',
    "quoted": '"quoted"',
    "backslash": "a\\b",
    "trailing-backslash": "ab\\",
    "backslash-quote": '\\"',
    "escape-lookalike": "\\n\\t\\$",
    "dollar": "$HOME ${USER} $$",
    "backtick": "`id`",
    "spaces": "a b  c",
    "leading-trailing-spaces": "  padded  ",
    "tab": "a\tb",
    "hash": "#not-a-comment",
    "semicolon": ";also-not",
    "equals": "a=b==c",
    "percent": "50% %h %n",
    "single-quote": "it's",
    "unicode": "日本語 é ключ",
    "everything": ' "\\ $x `y` #z =w %v \'u\' ',
}


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_written_value_reads_back(value: str) -> None:
    assert envfile.loads(envfile.dumps({"VLLM_API_KEY": value})) == {"VLLM_API_KEY": value}


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_written_value_reads_back_with_posix_quoting(value: str) -> None:
    """A second, independent reader of what the writer writes (shell double-quote rules)."""
    line = envfile.dumps({"K": value}).rstrip("\n")
    assert shlex.split(line.partition("=")[2]) == [value]


def test_every_value_of_a_file_reads_back(tmp_path: Path) -> None:
    env = {f"V{i}": value for i, value in enumerate(HOSTILE.values())}
    path = tmp_path / "server.env"
    path.write_text(envfile.dumps(env, comment="a comment # with = signs"), encoding="utf-8")
    assert envfile.read(str(path)) == env


def test_plain_words_stay_bare() -> None:
    assert envfile.dumps({"HF_HUB_OFFLINE": "1", "HOME": "/var/lib/x"}) == (
        "HF_HUB_OFFLINE=1\nHOME=/var/lib/x\n"
    )


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "end\n", "nul\0"])
def test_writer_refuses_what_one_line_cannot_hold(value: str) -> None:
    with pytest.raises(ValueError, match="cannot contain"):
        envfile.quote(value)


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", ""])
def test_writer_refuses_bad_names(name: str) -> None:
    with pytest.raises(ValueError, match="not an environment variable name"):
        envfile.dumps({name: "x"})


#: Text systemd reads, and what it reads from it (man systemd.exec, EnvironmentFile=).
SYSTEMD_READS = {
    "comments": ("# c\n; c\n  # indented\nA=1\n", {"A": "1"}),
    "blank-lines": ("\n\nA=1\n\n", {"A": "1"}),
    "no-equals": ("JUNK\nA=1\n", {"A": "1"}),
    "blanks-around": ("  A  =   x  \n", {"A": "x"}),
    "inner-blanks-kept": ("A=x   y\n", {"A": "x   y"}),
    "unquoted-escape": ("A=a\\ b\\\\c\\$d\n", {"A": "a b\\c$d"}),
    "unquoted-continuation": ("A=one\\\ntwo\n", {"A": "onetwo"}),
    "later-quotes-kept": ('A=x "y"\n', {"A": 'x "y"'}),
    "single-quotes-verbatim": ("A='a \\\" $b'\n", {"A": 'a \\" $b'}),
    "double-quote-escapes": ('A="\\"\\\\\\$\\`"\n', {"A": '"\\$`'}),
    "double-quote-other-backslash": ('A="\\n\\x"\n', {"A": "\\n\\x"}),
    "double-quote-multiline": ('A="one\ntwo"\n', {"A": "one\ntwo"}),
    "blanks-outside-quotes": ('A=  "  x  "   \n', {"A": "  x  "}),
    "empty": ("A=\nB=\"\"\n", {"A": "", "B": ""}),
    "last-wins": ("A=1\nA=2\n", {"A": "2"}),
    "no-final-newline": ("A=1\nB=two words", {"A": "1", "B": "two words"}),
    "no-expansion": ("A=$HOME\nB=\"${A}\"\n", {"A": "$HOME", "B": "${A}"}),
    "hash-inside-value": ("A=x#y\n", {"A": "x#y"}),
    "bad-name-ignored": ("1A=x\nA-B=y\nC=z\n", {"C": "z"}),
}


@pytest.mark.parametrize(("text", "expected"), SYSTEMD_READS.values(), ids=SYSTEMD_READS.keys())
def test_reader_follows_systemd(text: str, expected: dict[str, str]) -> None:
    assert envfile.loads(text) == expected


def test_reading_a_missing_file_is_an_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        envfile.read(str(tmp_path / "absent.env"))
