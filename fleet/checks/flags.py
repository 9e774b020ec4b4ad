"""vLLM flags of a server, checked against the flag list of the host's vLLM release.

``fleet/catalog/vllm_flags/<version>.json`` is generated from vLLM's own ``serve`` parser by
``scripts/gen_vllm_flags.py`` and committed, so ``fleet check`` knows every flag of a release
before anything is installed. A host whose release has no list of its own is checked against the
nearest older list; older than every list, its flags are only checked against the table of
removed flags below. :func:`flag_problems` yields the errors; :func:`flag_warnings` says which
list stood in, what only the release's own list could decide, and which flags are deprecated.
The authority stays the vLLM installed on the host: the deploy runs its parser over the final
command line before it writes a unit (``hostside/validate_args.py``).

Example:
    >>> from fleet.spec.models import Server
    >>> args = {"max-model-lenght": 512, "kv-cache-dtype": "fp9", "enforce-eager": "yes"}
    >>> server = Server(model="m", port=8000, args=args)
    >>> for path, message, hint in flag_problems(("hosts", "a", "servers", "s"), server, "0.32.0"):
    ...     print(f"{path[-1]}: {message}; {hint}")
    max-model-lenght: unknown flag of vLLM 0.32.0; did you mean 'max-model-len'?
    kv-cache-dtype: 'fp9' is not a choice of kv-cache-dtype; did you mean 'fp8'? (choices: auto,
        bfloat16, float16, fp8, fp8_ds_mla, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_per_token_head,
        int4_per_token_head, int8_per_token_head, nvfp4, … (19 in all))
    enforce-eager: enforce-eager is a switch and takes no value (got 'yes');
        write enforce-eager: true to turn it on, or no-enforce-eager: true to turn it off
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from fleet.read.problems import Finding, suggest
from fleet.spec.models import RESERVED_ARGS, ArgValue, Server, arg_text, human_int

FLAGS_DIR = Path(__file__).resolve().parents[1] / "catalog" / "vllm_flags"

_VERSION = re.compile(r"([0-9]+)\.([0-9]+)\.([0-9]+)(?:\.([0-9]+))?(?:\.post([0-9]+))?")
#: Choices listed in a hint when there are at most this many.
_LIST_CHOICES = 12


@dataclass(frozen=True)
class Removed:
    """A flag that vLLM no longer has, and what to write instead.

    + replacement: what to do instead (a person's sentence; names the new flag if there is one)
    + since: the first release without the flag, where the source says so
    + source: where that is recorded (vLLM pull request)
    """

    replacement: str
    since: str | None
    source: str


#: Flags that vLLM removed or renamed, looked up when a flag is missing from a release's list
#: (or, for a release without any list, when ``since`` says it is gone). Sources, in vLLM's repo:
#: - disable-log-requests: deprecated by vllm-project/vllm#21739 (request logging is off by
#:   default, --enable-log-requests turns it on), removed by vllm#29402 (meant for v0.12.0;
#:   the generated lists show 0.12.0–0.16.0 still taking it, deprecated, and 0.17.0 without it).
#: - task: replaced by --runner/--convert in vllm#21470; 0.13.0 rejects it (gpustack#3991), and
#:   vLLM's own parser hints "use --runner pooling … --convert embed|classify|reward".
#: - guided-decoding-backend: moved into --structured-outputs-config by vllm#22772; the guided_*
#:   fields were removed for v0.12.0 by vllm#29326.
#: - rope-scaling, rope-theta: removed by vllm#28006 in favour of --hf-overrides.
#: - max-seq-len-to-capture: removed by vllm#25543 (vLLM 0.11.0); CUDA graph capture is sized by
#:   --max-cudagraph-capture-size (vllm#26016).
#: - swap-space: removed by vllm#36216 (V1 has no CPU swap for preemption); absent from 0.18.0
#:   on (unsloth-zoo#1210, which read every release's EngineArgs).
#: - num-scheduler-steps: multi-step scheduling removed with V0 by vllm#22138 / vllm#22779.
#: - use-v2-block-manager: block manager v1 removed and v2 made the default by vllm#8704;
#:   the no-op flag was cleaned up by vllm#13492.
#: - speculative-model, num-speculative-tokens: replaced by --speculative-config (vllm#14434),
#:   the old flags removed by vllm#15466.
#: - enable-reasoning: deprecated by vllm#17452; --reasoning-parser alone enables it, and 0.10.0
#:   rejects the flag (vllm#18538).
#: - disable-mm-preprocessor-cache: replaced by --mm-processor-cache-gb 0 in vllm#22441 (removal
#:   announced for v0.13).
#: Not here, because 0.32.0 still has them (the generated list is the truth): max-log-len,
#: enable-prefix-caching (on by default since the V1 engine; harmless), grpc-port.
REMOVED: dict[str, Removed] = {
    "disable-log-requests": Removed(
        "request logging is off by default now: leave the flag out "
        "(enable-log-requests: true turns logging on)",
        "0.17.0",
        "vllm#29402",
    ),
    "task": Removed(
        "use runner: pooling with convert: embed, classify or reward for pooling models; "
        "generative models need neither",
        "0.13.0",
        "vllm#21470",
    ),
    "guided-decoding-backend": Removed(
        'use structured-outputs-config: \'{"backend": "xgrammar"}\'', "0.12.0", "vllm#22772"
    ),
    "rope-scaling": Removed(
        'use hf-overrides: \'{"rope_scaling": {...}}\'', None, "vllm#28006"
    ),
    "rope-theta": Removed('use hf-overrides: \'{"rope_theta": ...}\'', None, "vllm#28006"),
    "max-seq-len-to-capture": Removed(
        "CUDA graph capture is sized by max-cudagraph-capture-size now", "0.11.0", "vllm#25543"
    ),
    "swap-space": Removed(
        "the V1 engine has no CPU swap space: leave the flag out", "0.18.0", "vllm#36216"
    ),
    "num-scheduler-steps": Removed(
        "multi-step scheduling went with the V0 engine: leave the flag out", None, "vllm#22138"
    ),
    "use-v2-block-manager": Removed(
        "block manager v2 is the only one: leave the flag out", None, "vllm#8704"
    ),
    "speculative-model": Removed(
        'use speculative-config: \'{"model": "...", "num_speculative_tokens": N}\'',
        None,
        "vllm#15466",
    ),
    "num-speculative-tokens": Removed(
        'use speculative-config: \'{"model": "...", "num_speculative_tokens": N}\'',
        None,
        "vllm#15466",
    ),
    "enable-reasoning": Removed(
        "reasoning-parser alone enables reasoning output: leave this flag out",
        "0.10.0",
        "vllm#17452",
    ),
    "disable-mm-preprocessor-cache": Removed(
        "use mm-processor-cache-gb: 0", None, "vllm#22441"
    ),
}


@dataclass(frozen=True)
class Flag:
    """One long option of vLLM's ``serve`` parser, as the generated list records it.

    Example:
        >>> Flag.from_json("enforce-eager", {"takes_value": False, "nargs": 0}).takes_value
        False
    """

    name: str
    takes_value: bool
    nargs: str | int | None = None
    choices: tuple[str, ...] | None = None
    type: str | None = None
    accepts_none: bool = False
    default: str | None = None
    deprecated: bool = False
    help: str = ""
    dest: str = ""
    alias_of: str | None = None
    negates: str | None = None
    short: tuple[str, ...] = ()
    action: str = ""
    engine_choices: tuple[str, ...] | None = None

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> Flag:
        """A flag from its entry in a generated list."""
        choices = data.get("choices")
        return cls(
            name=name,
            takes_value=bool(data["takes_value"]),
            nargs=data.get("nargs"),
            choices=tuple(choices) if choices else None,
            type=data.get("type"),
            accepts_none=bool(data.get("accepts_none")),
            default=data.get("default"),
            deprecated=bool(data.get("deprecated")),
            help=data.get("help") or "",
            dest=data.get("dest") or name.replace("-", "_"),
            alias_of=data.get("alias_of"),
            negates=data.get("negates"),
            short=tuple(data.get("short") or ()),
            action=data.get("action") or "",
            engine_choices=tuple(data["engine_choices"]) if data.get("engine_choices") else None,
        )


@dataclass(frozen=True)
class FlagList:
    """Every long flag of one vLLM release.

    Example:
        >>> flags = load_flag_list("0.32.0")
        >>> flags.version, flags.flags["max-model-len"].takes_value
        ('0.32.0', True)
    """

    version: str
    flags: dict[str, Flag]

    def off_switch(self, name: str) -> str | None:
        """The flag that turns switch ``name`` off (not a hidden, deprecated form), if any.

        Example:
            >>> load_flag_list("0.32.0").off_switch("enable-prefix-caching")
            'no-enable-prefix-caching'
            >>> load_flag_list("0.33.0").off_switch("enable-prefix-caching")
            'disable-prefix-caching'
        """
        return next(
            (n for n, f in self.flags.items() if f.negates == name and not f.deprecated), None
        )

    def by_short(self, word: str) -> Flag | None:
        """The flag whose short form (``tp`` for ``-tp``) is ``word``."""
        return next((f for f in self.flags.values() if word in f.short and not f.alias_of), None)


def release_key(version: str) -> tuple[int, ...]:
    """A release as a sortable tuple; ``.postN`` sorts after its release, a fourth part
    (vLLM's ``0.10.1.1``) after every post release of the three (PEP 440's order).

    Example:
        >>> release_key("0.10.1.1") > release_key("0.10.1.post1") > release_key("0.10.1")
        True
        >>> release_key("0.10.1") > release_key("0.9.2")
        True
    """
    match = _VERSION.fullmatch(version.split("+", 1)[0])
    if not match:
        raise ValueError(f"{version!r} is not a vLLM release like 0.32.0")
    return tuple(int(part or 0) for part in match.groups())


@cache
def known_versions(directory: Path = FLAGS_DIR) -> list[str]:
    """The releases that have a flag list, oldest first.

    Example:
        >>> "0.32.0" in known_versions()
        True
    """
    names = [p.stem for p in directory.glob("*.json") if _VERSION.fullmatch(p.stem)]
    return sorted(names, key=release_key)


@cache
def load_flag_list(version: str, directory: Path = FLAGS_DIR) -> FlagList:
    """The flag list of exactly ``version`` (raises FileNotFoundError without one)."""
    data = json.loads((directory / f"{version}.json").read_text(encoding="utf-8"))
    flags = {name: Flag.from_json(name, entry) for name, entry in data["flags"].items()}
    return FlagList(data.get("vllm_version", version), flags)


def select_flag_list(
    version: str, directory: Path = FLAGS_DIR
) -> tuple[FlagList | None, str | None]:
    """The list that checks a host of ``version``, and a warning when it is not its own.

    Example:
        >>> flags, note = select_flag_list("0.32.0")
        >>> flags.version, note
        ('0.32.0', None)
        >>> flags, note = select_flag_list("0.1.0")
        >>> flags is None, note.startswith("vLLM 0.1.0: no flag list")
        (True, True)
    """
    versions = known_versions(directory)
    if version in versions:
        return load_flag_list(version, directory), None
    older = [v for v in versions if release_key(v) < release_key(version)]
    if not older:
        return None, (
            f"vLLM {version}: no flag list for it or an older release (have: "
            f"{', '.join(versions) or 'none'}); its servers' flags were not validated before "
            "deploy, only against the removed-flags table (the host's vLLM still checks them)"
        )
    nearest = older[-1]
    if nearest == versions[-1]:
        return load_flag_list(nearest, directory), (
            f"vLLM {version} is newer than every flag list; flags were validated with the list "
            f"of {nearest}, the nearest older release and the newest (flags added since are "
            "unknown here: generate its list with scripts/gen_vllm_releases.py)"
        )
    return load_flag_list(nearest, directory), (
        f"vLLM {version}: no flag list of its own; flags were validated with the list of "
        f"{nearest}, the nearest older release (generate one with scripts/gen_vllm_releases.py)"
    )


def flag_problems(path: tuple[str | int, ...], server: Server, version: str) -> Iterator[Finding]:
    """Every error in the ``args`` of ``server`` (at ``path``) for a host of ``version``.

    + path: the server's location, e.g. ``("hosts", "box", "servers", "chat")``
    + server: the validated server
    + version: the host's vLLM release (``host.vllm.version``)

    Each finding points at ``(*path, "args", flag)``, so it is reported on the flag's line.
    """
    for finding, error in _findings(path, server, version):
        if error:
            yield finding


def flag_warnings(path: tuple[str | int, ...], server: Server, version: str) -> Iterator[Finding]:
    """What ``fleet check`` should say but not fail on: which list checked the flags (when it is
    not the release's own), what only the host's own list could decide, deprecated flags.

    Example:
        >>> from fleet.spec.models import Server
        >>> server = Server(model="m", port=8000, args={"max-num-seqs": 4})
        >>> for path, message, _ in flag_warnings(("hosts", "a", "servers", "s"), server, "0.1.0"):
        ...     print(".".join(path), "|", message[:51])
        hosts.a.vllm.version | vLLM 0.1.0: no flag list for it or an older release
    """
    for finding, error in _findings(path, server, version):
        if not error:
            yield finding


def _findings(
    path: tuple[str | int, ...], server: Server, version: str
) -> Iterator[tuple[Finding, bool]]:
    """Every finding about a server's flags, and whether it is an error (else a warning)."""
    if not server.args:
        return
    flags, note = select_flag_list(version)
    if note:
        yield ((*path[:-2], "vllm", "version"), note, None), False
    # With another release's list, a flag or choice it lacks may be new in this release: that is
    # the host's vLLM to decide (the deploy asks it), so those are warnings, not errors.
    exact = note is None
    dests: dict[str, str] = {}
    for key, value in server.args.items():
        where = (*path, "args", key)
        if key in RESERVED_ARGS:
            continue  # spec.py rejects these with their own message
        if flags is None:
            removed = REMOVED.get(key)
            if removed and removed.since and release_key(version) >= release_key(removed.since):
                yield (where, _removed_message(key, removed), removed.replacement), True
            continue
        flag = flags.flags.get(key)
        if flag is None:
            message, hint = _unknown(key, flags)
            if not (exact or key in REMOVED):
                hint = f"{hint}; " if hint else ""
                hint += f"by the {flags.version} list: the host's vLLM {version} decides"
            yield (where, message, hint), exact or key in REMOVED
            continue
        if flag.alias_of:
            yield (
                where,
                f"{key} is vLLM's second name for {flag.alias_of}",
                f"write {flag.alias_of}: the fleet's own checks read that name",
            ), True
            continue
        if flag.deprecated:
            message = f"{key} is deprecated in vLLM {flags.version}"
            yield (where, message, flag.help or None), False
        dest = flag.dest or key
        if dest in dests:
            yield (where, f"{key} sets the same vLLM option as {dests[dest]}", "keep one"), True
        dests.setdefault(dest, key)
        for message, hint, certain in _value_problems(flag, key, value, flags):
            if not (certain or exact):
                hint = f"{hint}; " if hint else ""
                hint += f"by the {flags.version} list: the host's vLLM {version} decides"
            yield (where, message, hint), certain or exact


def _removed_message(key: str, removed: Removed) -> str:
    when = f"in vLLM {removed.since}" if removed.since else "from vLLM"
    return f"{key} was removed {when} ({removed.source})"


def _unknown(key: str, flags: FlagList) -> tuple[str, str | None]:
    """Message and hint for a flag the list does not have."""
    removed = REMOVED.get(key)
    if removed is not None:
        return _removed_message(key, removed), removed.replacement
    newer = [
        v
        for v in known_versions()
        if release_key(v) > release_key(flags.version) and key in load_flag_list(v).flags
    ]
    if newer:
        return (
            f"vLLM {flags.version} has no flag {key} (it appears in {newer[0]})",
            "pin a newer vllm.version, or leave the flag out",
        )
    short = flags.by_short(key)
    if short is not None:
        return (
            f"{key} is the short form of {short.name}; args take long names",
            f"write {short.name}",
        )
    names = [name for name in flags.flags if name not in RESERVED_ARGS and name != "help"]
    hint = suggest(key, names) or "see `vllm serve --help=all` for the flags of this release"
    return f"unknown flag of vLLM {flags.version}", hint


def _example(flag: Flag) -> str:
    """A hint that shows a value this flag takes."""
    if flag.choices:
        return f"give one of: {_choice_list(flag.choices)}"
    if flag.default not in (None, "", "[]", "{}"):
        return f"e.g. {flag.name}: {flag.default} (vLLM's default)"
    if flag.type in ("json", "json_or_str"):
        return f"give a JSON object, e.g. {flag.name}: '{{...}}'"
    return f"give {_type_words(flag.type)}" if flag.type else "give a value"


def _choice_list(choices: tuple[str, ...]) -> str:
    if len(choices) <= _LIST_CHOICES:
        return ", ".join(choices)
    return ", ".join(choices[:_LIST_CHOICES]) + f", … ({len(choices)} in all)"


def _value_problems(
    flag: Flag, key: str, value: ArgValue, flags: FlagList
) -> Iterator[tuple[str, str | None, bool]]:
    """What is wrong with giving ``value`` to ``flag`` (of ``flags``): message, hint, and whether
    it holds in every release (a missing choice may be a new one)."""
    if value is True:
        if flag.takes_value and flag.nargs not in ("?", "*"):
            yield f"{key} takes a value; true would leave it without one", _example(flag), True
        return
    if not flag.takes_value:
        if flag.negates:
            hint = f"write {key}: true to turn {flag.negates} off, or leave it out"
        elif (off := flags.off_switch(key)) is not None:
            hint = f"write {key}: true to turn it on, or {off}: true to turn it off"
        else:
            hint = f"write {key}: true to turn it on, or leave it out"
        yield f"{key} is a switch and takes no value (got {_show(value)})", hint, True
        return
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list):
        if flag.nargs in (None, "?"):
            yield f"{key} takes one value, not a list", _example(flag), True
            return
        if flag.nargs == "+" and not value:
            yield f"{key} needs at least one value", _example(flag), True
            return
        if isinstance(flag.nargs, int) and len(value) != flag.nargs:
            yield f"{key} takes exactly {flag.nargs} values, got {len(value)}", None, True
            return
    for item in items:
        problem = _item_problem(flag, key, item)
        if problem is not None:
            yield problem
            return


def _item_problem(flag: Flag, key: str, item: Any) -> tuple[str, str | None, bool] | None:
    """A problem with one value of a flag that takes values (see _value_problems), or None."""
    if isinstance(item, dict):
        if flag.type in ("json", "json_or_str"):
            return None
        return (
            f"{key} takes {_type_words(flag.type)}, not a mapping",
            "a mapping is for vLLM's JSON-valued flags (speculative-config, hf-overrides, …)",
            True,
        )
    text = _render(item)
    if flag.accepts_none and text in ("", "None"):
        return None
    if flag.choices is not None:
        if text in flag.choices:
            return None
        close = suggest(text, flag.choices)
        listing = f"choices: {_choice_list(flag.choices)}"
        return (
            f"{text!r} is not a choice of {key}",
            f"{close} ({listing})" if close else listing.capitalize(),
            False,
        )
    if flag.engine_choices is not None and text not in flag.engine_choices:
        close = suggest(text, flag.engine_choices)
        listing = f"vLLM's engine knows: {_choice_list(flag.engine_choices)}"
        return (
            f"{text!r} is not a choice of {key}",
            f"{close} ({listing})" if close else listing,
            False,
        )
    if not _type_accepts(flag.type, item, text):
        hint = f"e.g. {key}: {flag.default} (vLLM's default)" if flag.default else None
        return f"{key} takes {_type_words(flag.type)}, not {_show(item)}", hint, True
    return None


def _render(item: Any) -> str:
    """A value as the unit's command line carries it (``fleet.hostplan.render.vllm_args``)."""
    return arg_text(item)


def _show(value: Any) -> str:
    """A value as a person wrote it in YAML."""
    if value is True or value is False:
        return str(value).lower()
    return repr(value) if isinstance(value, str) else str(value)


def _type_accepts(kind: str | None, item: Any, text: str) -> bool:
    """Whether vLLM's argument type ``kind`` would accept ``item`` (given as ``text``)."""
    if isinstance(item, bool) and kind in ("int", "float", "human_readable_int",
                                          "human_readable_int_or_auto"):
        return False
    if kind == "int":
        return _parses(int, text)
    if kind == "float":
        return _parses(float, text) and not math.isnan(float(text))
    if kind == "human_readable_int_or_auto" and (text == "-1" or text.lower() == "auto"):
        return True
    if kind in ("human_readable_int", "human_readable_int_or_auto"):
        return human_int(text) is not None
    if kind == "json" and isinstance(item, str):
        return _is_json(item)
    return True


def _parses(convert: Any, text: str) -> bool:
    try:
        convert(text)
    except (TypeError, ValueError):
        return False
    return True


def _is_json(text: str) -> bool:
    """Whether text is JSON, after vLLM's own expansion of numbers like ``1k``."""
    expanded = re.sub(r"(?<![\w.])\d+(?:\.\d+)?[kKmMgGtT](?![\w.])", "0", text)
    return _parses(json.loads, expanded)


def _type_words(kind: str | None) -> str:
    return {
        "int": "a whole number",
        "float": "a number",
        "human_readable_int": "a whole number (1k, 2M allowed)",
        "human_readable_int_or_auto": "a whole number (1k, 2M allowed) or auto",
        "json": "a JSON object",
        "json_or_str": "a string or a JSON object",
        "str": "a string",
    }.get(kind or "", f"a value of type {kind}")
