"""Hypothesis strategies for fleet files: plausible structures with hostile values in every field,
written out as YAML text (block or flow style), and text- and byte-level damage on top.

The fuzz tests (``tests/unit/fleet/test_fuzz.py``) feed these to :func:`fleet.load.load_text`;
a later test of the render can reuse :func:`fleet_documents` (the data) with :func:`to_yaml`
and compare what the render writes with what the document says.

Example:
    >>> to_yaml({"version": 1, "hosts": {"a": {"address": "10.0.0.1", "gpus": [0, 1]}}})
    'version: 1\\nhosts:\\n  a:\\n    address: "10.0.0.1"\\n    gpus:\\n      - 0\\n      - 1\\n'
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import strategies as st

REVISION = "0123456789abcdef0123456789abcdef01234567"
SHA256 = "0" * 63 + "1"

#: Characters people paste by accident, and ones that end lines or options.
HOSTILE_CHARS = [
    "\x00", "\x1b", "\x7f", "\x85", "\t", "\r", "\n", "\u00a0", "\u200b", "\u200d", "\u202e",
    "\u2028", "\u3000", "\ufeff", "\ufffd", "é", "日", "#", ":", "-", "--", "'", '"', "\\",
    "{", "}",
    "[", "]", "&", "*", "!", "|", ">", "%", "@", "`", ",", "?", "=", "$", ";", " ", "/",
]
#: Whole values that YAML, pydantic or a check may read in a surprising way.
HOSTILE_WORDS = [
    "", "~", "null", "yes", "no", "on", "off", "true", "3.10", "0x1F", "0o17", "1e309", ".nan",
    "-.inf", "1_000", "2001-01-01", "12:30:00", "<<", "=", "!vault", "*a", "&a", "--host",
    "0.0.0.0", "-r https://x", "../../etc/passwd", "/dev/zero", "~root/x", "models", "previous",
    "9" * 25, "9" * 400, "-" + "9" * 30, "x" * 300, "Qwen/Qwen3-8B", "0-1", "128k",
]
NAMES = st.sampled_from(["a", "box", "gpu-1", "m", "chat", "models", "previous", "x.y", "A", "1"])
#: Keys of ``hosts:``: names, and ranges (fleet.spec.hostranges) good and bad — one that makes
#: a name above (gpu-1), counts down, pads unevenly, is huge, is not Ansible's form.
HOST_KEYS = st.one_of(NAMES, st.sampled_from([
    "gpu-[1:3]", "gpu-[01:10:3]", "n[a:c]", "r[1:2]-g[1:2]", "gpu-[3:1]", "gpu-[01:100]",
    "gpu-[]", "gpu-[1-3]", "gpu-[0:999999999]", "[1:2]", "gpu-[A:B]", "gpu-[1:2",
    "gpus", "serving",  # groups of tests/data/inventories/site.ini, for a block's inventory
]))
#: A block's ``inventory`` (from tests/unit/fleet/fuzz.yaml's folder): the test inventories,
#: and paths that must never be read as one.
INVENTORIES = st.sampled_from([
    "../../data/inventories/site.ini", "../../data/inventories/site.yml", "missing.ini",
    "/dev/zero", "/etc/shadow", "~/.ssh/id_ed25519", "/proc/self/environ", "",
])


_HOSTILE = st.lists(st.one_of(
    st.sampled_from(HOSTILE_CHARS), st.sampled_from(HOSTILE_WORDS),
    st.text(max_size=8), st.text(alphabet="abcxyz019.-", min_size=1, max_size=12),
), max_size=5).map("".join)


def hostile_strings() -> st.SearchStrategy[str]:
    """Short strings mixing hostile characters and words with ordinary text."""
    return _HOSTILE


def numbers() -> st.SearchStrategy[Any]:
    """Integers and floats from ordinary to absurd."""
    return _NUMBERS


_NUMBERS = st.one_of(
        st.integers(-5, 70000), st.integers(-(2**70), 2**70), st.integers(-(10**40), 10**40),
        st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, -1, 2**63, 2**64]),
)
_SCALARS = st.one_of(st.none(), st.booleans(), _NUMBERS, hostile_strings())
_JUNK = st.recursive(
    _SCALARS, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(hostile_strings(), inner, max_size=3)
    ), max_leaves=8,
)


def scalars() -> st.SearchStrategy[Any]:
    """Any scalar a YAML file can hold."""
    return _SCALARS


def junk() -> st.SearchStrategy[Any]:
    """Scalars, lists and mappings of them, a little nested."""
    return _JUNK


def either(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the plausible value, sometimes anything."""
    return st.integers(0, 12).flatmap(lambda n: _JUNK if n == 0 else good)


def _optional(draw: Any, out: dict[str, Any], key: str, value: st.SearchStrategy[Any]) -> None:
    if draw(st.booleans()):
        out[key] = draw(either(value))


@st.composite
def models(draw: Any) -> dict[str, Any]:
    """A model entry: hf with revision, or url/file with sha256, plus optional keys."""
    source = draw(st.sampled_from(["hf", "url", "file"]))
    out: dict[str, Any] = {}
    if source == "hf":
        out["hf"] = draw(either(st.sampled_from(["org/m", "Qwen/Qwen3-8B"])))
        out["revision"] = draw(either(st.just(REVISION)))
    else:
        out[source] = draw(either(st.sampled_from(["https://x.test/m.tar", "/srv/m.tar"])))
        out["sha256"] = draw(either(st.just(SHA256)))
    _optional(draw, out, "config", st.one_of(
        st.sampled_from(["/dev/zero", "../models/qwen3-8b", "/", "~nobody/x", "no-such"]),
        st.fixed_dictionaries({"num_hidden_layers": numbers(), "num_attention_heads": numbers()}),
    ))
    _optional(draw, out, "weights_gib", numbers())
    _optional(draw, out, "keep", numbers())
    _optional(draw, out, "token", st.fixed_dictionaries({"env": hostile_strings()}))
    return out


@st.composite
def servers(draw: Any) -> dict[str, Any]:
    """A server entry with hostile values in any of its keys."""
    out: dict[str, Any] = {"model": draw(either(st.just("m"))),
                           "port": draw(either(st.integers(1, 65535)))}
    _optional(draw, out, "gpus", st.lists(numbers(), max_size=4))
    _optional(draw, out, "host", st.sampled_from(["127.0.0.1", "0.0.0.0", "::1"]))
    _optional(draw, out, "served_model_name", hostile_strings())
    _optional(draw, out, "args", st.dictionaries(
        st.one_of(st.sampled_from(["max-model-len", "tensor-parallel-size", "enforce-eager",
                                   "gpu-memory-utilization", "kv-cache-dtype"]), hostile_strings()),
        st.one_of(scalars(), st.lists(scalars(), max_size=3)), max_size=4,
    ))
    _optional(draw, out, "env", st.dictionaries(hostile_strings(), scalars(), max_size=3))
    _optional(draw, out, "api_key", st.fixed_dictionaries({"env": hostile_strings()}))
    _optional(draw, out, "worker_hosts", st.lists(NAMES, max_size=3))
    return out


@st.composite
def hosts(draw: Any) -> dict[str, Any]:
    """A host entry: address, vllm, optional gpus/os/ssh, servers."""
    variant = draw(st.sampled_from(["cpu", "cu129", "cu130"]))
    out: dict[str, Any] = {
        "address": draw(either(st.sampled_from(["10.0.0.1", "sandbox", "gpu-01.lan",
                                                "10.0.0.1/24", "10.0.0.254/24", "{name}.lan",
                                                "255.255.255.255"]))),
        "vllm": draw(either(st.fixed_dictionaries({
            "version": either(st.sampled_from(["0.11.0", "0.10.1.1", "0.32.0"])),
            "variant": st.just(variant)}))),
    }
    if variant != "cpu" or draw(st.booleans()):
        out["gpus"] = draw(either(st.fixed_dictionaries(
            {"count": either(st.integers(0, 8)), "model": either(st.sampled_from(["L4", "H100"]))},
            optional={"topology": st.dictionaries(st.sampled_from(["0-1", "1-2"]),
                                                  st.sampled_from(["NV4", "PIX", "SYS"]))},
        )))
        out["os"] = draw(either(st.fixed_dictionaries({"nvidia": either(
            st.fixed_dictionaries({"driver": either(st.sampled_from(["570", "580"]))}))},
            optional={"python": hostile_strings(), "cuda": hostile_strings(),
                      "sysctl": st.dictionaries(hostile_strings(), scalars(), max_size=2)})))
    _optional(draw, out, "ssh", st.fixed_dictionaries(
        {}, optional={"user": hostile_strings(), "port": numbers(), "key": hostile_strings()}))
    out["servers"] = draw(st.dictionaries(NAMES, servers(), max_size=2))
    if draw(st.integers(0, 5)) == 0:  # a group of an Ansible inventory, not one host
        out["inventory"] = draw(either(INVENTORIES))
        if draw(st.booleans()):
            del out["address"]
    return out


@st.composite
def fleet_documents(draw: Any) -> dict[str, Any]:
    """A whole fleet document (data, not text): version, optional defaults, models, hosts."""
    doc: dict[str, Any] = {"version": draw(either(st.just(1)))}
    if draw(st.booleans()):
        doc["defaults"] = draw(either(st.fixed_dictionaries({}, optional={
            "vllm": st.fixed_dictionaries({"version": st.just("0.32.0"),
                                           "variant": st.just("cpu")}),
            "ssh": st.fixed_dictionaries({"user": hostile_strings()}),
        })))
    doc["models"] = draw(st.dictionaries(NAMES, models(), max_size=2))
    doc["hosts"] = draw(st.dictionaries(HOST_KEYS, hosts(), min_size=1, max_size=2))
    if draw(st.integers(0, 9)) == 0:
        doc[draw(hostile_strings())] = draw(junk())
    return doc


_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")


def _scalar(value: Any) -> str:
    """One scalar in YAML: plain where that reads back the same, else JSON's quoted form."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value != value:
            return ".nan"
        if value in (float("inf"), float("-inf")):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in ("null", "true", "false", "y", "n"):
        return text
    return _quoted(text)


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar; characters that are not printable become escapes.

    Example:
        >>> print(_quoted('a"\\x00\\u00a0\\U0001F600'))
        "a\\"\\x00\\xa0😀"
    """
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable() and not (char.isspace() and char != " "):
            out.append(char)
        elif ord(char) < 0x100:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


def to_yaml(value: Any, indent: int = 0, flow: bool = False) -> str:
    """YAML text for data: block style (or flow style, JSON-like, with ``flow``).

    Example:
        >>> to_yaml({"a": [1, "x y"]}, flow=True)
        '{a: [1, "x y"]}\\n'
    """
    if flow:
        return _flow(value) + "\n"
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return "{}\n" if indent == 0 else f"{pad}{{}}\n"
        lines = []
        for key, item in value.items():
            head = f"{pad}{_scalar(key)}:"
            if isinstance(item, dict | list) and item:
                lines.append(head + "\n" + to_yaml(item, indent + 2))
            else:
                lines.append(f"{head} {_flow(item)}\n")
        return "".join(lines)
    if isinstance(value, list):
        if not value:
            return f"{pad}[]\n"
        lines = []
        for item in value:
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}-\n" + to_yaml(item, indent + 2))
            else:
                lines.append(f"{pad}- {_flow(item)}\n")
        return "".join(lines)
    return f"{pad}{_scalar(value)}\n"


def _flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_flow(k)}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return _scalar(value)


@st.composite
def fleet_texts(draw: Any) -> str:
    """Fleet YAML text: a generated document, written out, then perhaps damaged."""
    text = to_yaml(draw(fleet_documents()), flow=draw(st.integers(0, 4)) == 0)
    for _ in range(draw(st.integers(0, 2))):
        text = draw(damaged(text))
    return text


@st.composite
def damaged(draw: Any, text: str) -> str:
    """``text`` with one piece of damage: a hostile character or word spliced in, a line cut,
    repeated or re-indented, a second document, an alias bomb, deep nesting, a huge number."""
    lines = text.split("\n")
    at = draw(st.integers(0, max(len(lines) - 1, 0)))
    line = lines[at]
    kind = draw(st.sampled_from(["char", "word", "cut", "repeat", "indent", "document", "bomb",
                                 "deep", "number", "anchor"]))
    if kind == "char":
        column = draw(st.integers(0, len(line)))
        lines[at] = line[:column] + draw(st.sampled_from(HOSTILE_CHARS)) + line[column:]
    elif kind == "word":
        key = line.split(":")[0]
        lines[at] = f"{key}: {draw(st.sampled_from(HOSTILE_WORDS))}"
    elif kind == "cut":
        lines[at] = line[: draw(st.integers(0, len(line)))]
    elif kind == "repeat":
        lines.insert(at, line)
    elif kind == "indent":
        lines[at] = draw(st.sampled_from([" ", "  ", "\t", "\u00a0"])) + line
    elif kind == "document":
        lines.insert(at, draw(st.sampled_from(["---", "...", "%YAML 1.1", "%TAG ! !x"])))
    elif kind == "bomb":
        levels = draw(st.integers(2, 9))
        bomb = ["x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
        bomb += [f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
        lines[at:at] = bomb
    elif kind == "deep":
        depth = draw(st.sampled_from([19, 20, 21, 50, 1000, 5000]))
        key = line.split(":")[0] or "x"
        lines[at] = f"{key}: " + "[" * depth + "]" * draw(st.sampled_from([0, depth]))
    elif kind == "number":
        key = line.split(":")[0] or "x"
        digits = draw(st.sampled_from([19, 20, 21, 400, 4301, 5000]))
        lines[at] = f"{key}: {draw(st.sampled_from(['', '-', '0x']))}{'7' * digits}"
    else:
        key = line.split(":")[0] or "x"
        lines[at] = f"{key}: " + draw(st.sampled_from(["&a 1", "*a", "*undefined", "&a [*a]",
                                                        "!!binary aGk=", "!vault |", "? [a]"]))
    return "\n".join(lines)


@st.composite
def fleet_bytes(draw: Any) -> bytes:
    """A fleet file's bytes in a hostile encoding (UTF-16 with or without BOM, a UTF-8 BOM,
    Latin-1, raw bytes spliced in)."""
    text = draw(fleet_texts())
    kind = draw(st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be",
                                 "latin-1", "splice"]))
    if kind == "latin-1":
        return text.encode("latin-1", "replace")
    if kind == "splice":
        data = text.encode("utf-8")
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    return text.encode(kind, "surrogatepass")
