"""From a failing server's evidence to its most likely cause and the fix (``fleet doctor``).

Pure decisions only: the evidence (the unit's state, its journal, the host's facts, the
planner's budget) is gathered elsewhere (``cli/doctor/gather``) and handed in as plain data.
Each :class:`Signature` names a cause and the log lines that show it; the lines were taken
from real vLLM logs (public issue threads and the CPU build here, ``tests/data/doctor-logs/``).
Facts alone can name a cause too (a port another process holds, a model file the service
user cannot read, a full disk), and they turn a signature's generic advice into numbers.

Example:
    >>> [s.name for s in match("OSError: [Errno 98] Address already in use")]
    ['port-in-use']
    >>> mask("args: Namespace(api_key='s3cret-value', port=1)", ["s3cret-value"])
    "args: Namespace(api_key='***', port=1)"
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from fleet.catalog import releases
from fleet.judge import slowness

#: What a masked secret becomes.
MASK = "***"
#: Restarts since the unit was last started by hand that make a loop.
RESTART_LOOP = 3
#: Free space below which a file system a server writes to counts as full.
DISK_LOW_BYTES = 64 * 1024 * 1024
GiB = 1024**3
MiB = 1024**2


@dataclass(frozen=True)
class Signature:
    """A cause and the log lines that show it.

    + name: short id (``oom-load``), also the name of its test logs
    + title: the cause in words
    + patterns: regular expressions, any of which marks a line as this cause's evidence
    """

    name: str
    title: str
    patterns: tuple[re.Pattern[str], ...]

    def lines(self, text: str) -> list[str]:
        """The lines of ``text`` that show this cause."""
        return [line for line in text.splitlines() if any(p.search(line) for p in self.patterns)]


def _sig(name: str, title: str, *patterns: str) -> Signature:
    return Signature(name, title, tuple(re.compile(p, re.IGNORECASE) for p in patterns))


#: Every signature, the most specific first: a log often shows several (an OOM during graph
#: capture also kills the engine), and the first that matches names the cause.
SIGNATURES: tuple[Signature, ...] = (
    _sig("bad-flag", "a flag the installed vLLM rejects",
         r"error: unrecognized arguments:", r"error: argument --[\w-]+: invalid",
         r"error: argument --[\w-]+: expected"),
    _sig("port-in-use", "the server's port is already in use",
         r"\[Errno 98\] .*address already in use", r"address already in use",
         r"EADDRINUSE"),
    _sig("model-unreadable", "the model's files are not readable by the service user",
         r"PermissionError: \[Errno 13\]", r"Permission denied: '",
         r"OSError: .*(?:Can't load|Incorrect path_or_model_id|not a valid model identifier)"),
    _sig("trust-remote-code", "the model needs trust-remote-code (custom code)",
         r"contains custom code which must be executed",
         r"pass the argument `trust_remote_code=True`", r"set `trust_remote_code=True`"),
    _sig("unsupported-dtype", "a quantization or dtype the release or the card does not support",
         r"quantization method \S+ is not supported", r"Quantization scheme is not supported",
         r"Bfloat16 is only supported on GPUs with compute capability",
         r"Unknown quantization method", r"is not supported for quantization method"),
    _sig("driver-mismatch", "the CUDA build does not match the NVIDIA driver (803/804)",
         r"Error 803", r"Error 804", r"unsupported display driver / cuda driver combination",
         r"forward compatibility was attempted on non supported HW",
         r"driver version is insufficient for CUDA runtime version"),
    _sig("fabric-manager", "the fabric manager is down or off-version (CUDA error 802)",
         r"Error 802", r"system not yet initialized", r"cudaErrorSystemNotReady",
         r"CUDA_ERROR_SYSTEM_NOT_READY"),
    _sig("disk-full", "a file system the server writes to is full",
         r"\[Errno 28\] No space left on device", r"No space left on device",
         r"Not enough disk space"),
    _sig("nccl", "NCCL or Gloo could not connect the server's processes",
         r"NCCL error", r"NCCL WARN", r"ncclInternalError", r"ncclSystemError",
         r"Gloo connectFullMesh failed", r"no socket interface found",
         r"ProcessGroupNCCL.*(?:timeout|Watchdog)"),
    _sig("oom-graph-capture", "out of GPU memory while capturing CUDA graphs",
         r"cuda_graph\.capture_end|capture_end\(\)", r"capture_model\(\)",
         r"cudagraph_memory_estimate|VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS",
         r"during (?:cuda ?graph|cudagraph) capture.*(?:out of memory|OOM)"),
    _sig("oom-load", "out of GPU memory while loading the model",
         r"CUDA out of memory", r"torch\.(?:cuda\.)?OutOfMemoryError",
         r"CUDA error: out of memory",
         r"Free memory on device .* is less than desired GPU memory utilization"),
    _sig("kv-too-small", "the KV cache cannot hold one max-model-len sequence",
         r"larger than the maximum number of tokens that can be stored in KV cache",
         r"KV cache is needed, which is larger than the available KV cache memory",
         r"No available memory for the cache blocks"),
    _sig("engine-dead", "the engine died",
         r"EngineDeadError", r"Engine core proc \S+ died unexpectedly",
         r"Engine core initialization failed", r"Got fatal signal from worker processes"),
)
BY_NAME = {s.name: s for s in SIGNATURES}
#: Which cause wins when several show, the log's and the facts' together: the signatures'
#: order, a damaged model beside an unreadable one, the generic engine death last.
PRIORITY = [s.name for s in SIGNATURES]
PRIORITY.insert(PRIORITY.index("model-unreadable") + 1, "model-damaged")
#: The OOM signatures, told apart by what the log shows: graph capture wins when both match.
_OOM_CAPTURE = BY_NAME["oom-graph-capture"]

#: systemd's own journal line at each start of a unit (``-o cat``): where an invocation begins.
START_LINE = re.compile(r"^(?:Starting|Started) vllm-\S+\.service")


def match(text: str) -> list[Signature]:
    """The signatures whose lines appear in ``text``, most specific first.

    Graph-capture OOM needs an out-of-memory line as well as a capture line (the capture
    messages alone are printed by every healthy start).

    Example:
        >>> [s.name for s in match("Error 803: system has unsupported display driver")]
        ['driver-mismatch']
    """
    found = [s for s in SIGNATURES if s.lines(text)]
    if _OOM_CAPTURE in found and not _out_of_memory(text):
        found.remove(_OOM_CAPTURE)
    return found


def _out_of_memory(text: str) -> bool:
    return bool(re.search(r"out of memory|OutOfMemoryError|Tried to allocate", text, re.I))


def last_start(text: str) -> str:
    """The journal since the unit's last start that left any signature; else all of it.

    A unit restarting in a loop is often mid-start when asked: its newest invocation has no
    error yet, the one before has it.

    Example:
        >>> last_start("Started vllm-a.service\\nOSError: [Errno 98] Address already in use\\n"
        ...            "Started vllm-a.service\\nloading")
        'Started vllm-a.service\\nOSError: [Errno 98] Address already in use'
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if START_LINE.match(line)] or [0]
    ends = [*starts[1:], len(lines)]
    for start, end in reversed(list(zip(starts, ends, strict=True))):
        part = "\n".join(lines[start:end])
        if match(part):
            return part
    return text


#: Secrets by the shape of the line they sit in (keys printed by vLLM's argument dump, bearer
#: headers, Hugging Face and OpenAI-style tokens).
_SECRET_SHAPES = (
    re.compile(r"((?:api[_-]?key|token|password|secret)['\"]?\s*[:=]\s*[\[(]?\s*['\"]?)"
               r"([^'\",\s)}\]]+)", re.IGNORECASE),
    re.compile(r"(--api-key[= ])(\S+)"),
    re.compile(r"(Bearer\s+)(\S+)", re.IGNORECASE),
    re.compile(r"()\b(hf_[A-Za-z0-9]{16,})"),
    re.compile(r"()\b(sk-[A-Za-z0-9_-]{16,})"),
)


def mask(text: str, secrets: list[str] | tuple[str, ...] = ()) -> str:
    """``text`` with every known secret value and every secret-shaped word replaced by ***.

    + secrets: the fleet's own secret values (API keys, tokens) to remove wherever they appear

    Example:
        >>> mask("Authorization: Bearer abc.def token=xyz", [])
        'Authorization: Bearer *** token=***'
    """
    for secret in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    for shape in _SECRET_SHAPES:
        text = shape.sub(lambda m: m.group(1) + MASK, text)
    return text


@dataclass
class Evidence:
    """What was gathered for one server (plain data; every field may be missing).

    + host, server: where
    + unit: ``systemctl show`` properties (ActiveState, SubState, NRestarts, Result, …)
    + health: HTTP status of /health (None: no answer), ``health_error`` the reason
    + ready: whether a real completion answered (None: not asked), ``ready_error`` why not
    + journal: the unit's journal, bounded and already masked; ``journal_error`` if unreadable
    + port, port_owners: the server's port and who listens on it ({pid, user, process})
    + gpus: the server's GPUs ({index, total_mib, used_mib, free_mib}); ``gpu_apps`` the
      processes on them ({gpu, pid, user, process, used_mib}); ``host_gpus`` every GPU
    + driver, cuda: driver and CUDA versions; ``fabric_manager`` {version, active}
    + model_path, unreadable: files the service user cannot read ({path, owner, mode})
    + disks: file systems the server writes to ({path, free_bytes, total_bytes})
    + plan: the planner's numbers for the server (fleet.planner.fit.ServerPlan as a dict)
    + args: the server's vLLM flags from the fleet file; ``variant`` cpu/cu129/…;
      ``vllm_version`` installed on the host; ``env`` the server's extra environment
    + error: why nothing could be gathered (unreachable host), None otherwise
    + bench: the slow check of a healthy server: ``baseline`` (its last archived bench run's
      single-request figures, with ``run`` and ``started``), ``fresh`` (the same measured now),
      ``metrics_ttft`` (the server's own TTFT since its start, seconds), ``metrics_gauges``
      (its running and waiting requests and KV cache usage just after), ``error``; None when
      it has no archived run
    + cpu_load: {load1, cpus}; ``busy_processes`` the host's busiest ({pid, user, process,
      cpu, own}); ``neighbours`` the fleet's other servers on the same GPUs (or cpu host);
      ``model_fstype``, ``model_mount`` the file system holding the model
    """

    host: str
    server: str
    unit: dict[str, str] = field(default_factory=dict)
    health: int | None = None
    health_error: str | None = None
    ready: bool | None = None
    ready_error: str | None = None
    journal: str = ""
    journal_error: str | None = None
    port: int | None = None
    port_owners: list[dict[str, Any]] = field(default_factory=list)
    own_pids: list[int] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    host_gpus: list[dict[str, Any]] = field(default_factory=list)
    gpu_apps: list[dict[str, Any]] = field(default_factory=list)
    driver: str | None = None
    cuda: str | None = None
    fabric_manager: dict[str, Any] | None = None
    nvswitches: int = 0
    model_path: str | None = None
    model_check: dict[str, Any] | None = None
    unreadable: list[dict[str, Any]] = field(default_factory=list)
    disks: list[dict[str, Any]] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    variant: str = ""
    vllm_version: str | None = None
    user: str = "vllm"
    error: str | None = None
    bench: dict[str, Any] | None = None
    cpu_load: dict[str, Any] | None = None
    busy_processes: list[dict[str, Any]] = field(default_factory=list)
    neighbours: list[str] = field(default_factory=list)
    model_fstype: str | None = None
    model_mount: str | None = None

    @property
    def restarts(self) -> int:
        """systemd's NRestarts (0 when unknown)."""
        value = self.unit.get("NRestarts", "0")
        return int(value) if value.isdigit() else 0

    @property
    def healthy(self) -> bool:
        """Active, answering /health with 200 and a completion (where asked), not restarting."""
        return (self.unit.get("ActiveState") == "active" and self.health == 200
                and self.ready is not False and self.restarts == 0)  # fmt: skip


#: A diagnosis's status: nothing wrong, a cause named, or a problem whose cause is not known.
OK, PROBLEM, UNKNOWN = "ok", "problem", "unknown"


@dataclass
class Diagnosis:
    """The verdict on one server.

    + status: ``ok``, ``problem`` (cause named) or ``unknown`` (wrong, cause not named, or
      the evidence could not be gathered)
    + signature, cause: the cause's id and a sentence with its numbers
    + evidence: the log lines and facts that show it (masked)
    + fix: what to change, in the fleet file where that is the fix
    + state: what systemd and /health say, in words
    + bench: for the slow check, the baseline and the fresh figures compared (else None)
    """

    host: str
    server: str
    status: str
    state: str
    signature: str | None = None
    cause: str = ""
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    bench: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``fleet doctor --json``."""
        return asdict(self)


def state_words(ev: Evidence) -> str:
    """systemd's and /health's view in a few words.

    Example:
        >>> state_words(Evidence("h", "s", unit={"ActiveState": "activating",
        ...     "SubState": "auto-restart", "NRestarts": "4"}, health_error="refused"))
        'activating (auto-restart), 4 restarts, /health: refused'
    """
    unit = ev.unit
    words = f"{unit.get('ActiveState', '?')} ({unit.get('SubState', '?')})"
    if ev.restarts:
        words += f", {ev.restarts} restart{'s' if ev.restarts != 1 else ''}"
    health = str(ev.health) if ev.health is not None else (ev.health_error or "no answer")
    words += f", /health: {health}"
    if ev.ready is False:
        words += f", completion: {ev.ready_error or 'failed'}"
    return words


def diagnose(ev: Evidence) -> Diagnosis:
    """Name the most likely cause of a server's trouble, with its evidence and fix.

    Example:
        >>> d = diagnose(Evidence("h", "chat", unit={"ActiveState": "failed",
        ...     "SubState": "failed"}, journal="vllm: error: unrecognized arguments: --foo",
        ...     vllm_version="0.32.0"))
        >>> d.signature, d.fix.startswith("remove foo from hosts.h.servers.chat.args")
        ('bad-flag', True)
    """
    state = state_words(ev)
    if ev.error:
        return Diagnosis(ev.host, ev.server, UNKNOWN, "not gathered",
                         cause=f"could not gather evidence: {ev.error}")  # fmt: skip
    if ev.healthy:
        return _slower(ev, state) or Diagnosis(ev.host, ev.server, OK, state + _compared(ev))
    recent = last_start(ev.journal)
    names = {s.name for s in match(recent)} | set(_from_facts(ev))
    for name in sorted(names, key=PRIORITY.index):
        result = _RULES[name](ev, recent)
        if result is not None:
            cause, evidence, fix = result
            restarts = (f" (restarting in a loop: {ev.restarts} restarts)"
                        if ev.restarts >= RESTART_LOOP else "")  # fmt: skip
            return Diagnosis(ev.host, ev.server, PROBLEM, state, name, cause + restarts,
                             evidence, fix)  # fmt: skip
    if ev.restarts >= RESTART_LOOP:
        return Diagnosis(ev.host, ev.server, PROBLEM, state, "restart-loop",
                         f"the unit restarts in a loop ({ev.restarts} restarts) and its log "
                         "names no known cause", _tail(recent),
                         "read the evidence above; `fleet doctor` knows no fix for it")  # fmt: skip
    raw = _tail(recent) if recent.strip() else [f"journal: {ev.journal_error or 'empty'}"]
    return Diagnosis(ev.host, ev.server, UNKNOWN, state,
                     cause="not active or not answering, and no known cause in its log",
                     evidence=raw)  # fmt: skip


def _compared(ev: Evidence) -> str:
    """What the slow check of a healthy server found, in a few words ("" without a bench)."""
    bench = ev.bench or {}
    then = ((bench.get("baseline") or {}).get("ttft_ms") or {}).get("p50")
    now = ((bench.get("fresh") or {}).get("ttft_ms") or {}).get("p50")
    if then is not None and now is not None:
        unconfirmed = [r["ttft_p50_ms"] for r in bench.get("rounds", [])[:-1]
                       if r.get("ttft_p50_ms") is not None]  # fmt: skip
        again = "".join(f"; a first round's {t:,.1f} ms, measured again" for t in unconfirmed[:1])
        return f", TTFT P50 {now:,.1f} ms (its last bench: {then:,.1f} ms{again})"
    return f", slow check: {bench['error']}" if bench.get("error") else ""


def _slower(ev: Evidence, state: str) -> Diagnosis | None:
    """A healthy server clearly slower than its last bench, with the slow tree's causes."""
    bench = ev.bench or {}
    baseline, fresh = bench.get("baseline"), bench.get("fresh")
    if not baseline or not fresh:
        return None
    slower = slowness.slowdown(baseline, fresh)
    if not slower:
        return None
    when = f"{baseline.get('run', '?')}, {baseline.get('started', '?')}"
    figures = "; ".join(f"{s['figure']} {s['now_ms']:,.1f} ms against {s['then_ms']:,.1f} ms "
                        f"(×{s['ratio']:.1f})" for s in slower)  # fmt: skip
    rounds = len(bench.get("rounds") or [1])
    each = f", the least slow of {rounds} rounds" if rounds > 1 else ""
    evidence = [f"{figures} in its last bench ({when}), {fresh.get('ok', '?')} single requests "
                f"of {baseline.get('input_len') or '?'} input and "
                f"{baseline.get('output_len') or '?'} output tokens measured now{each}"]
    found = slowness.causes(ev)
    for title, lines, _ in found:
        evidence += [f"{title.split(' (')[0]}: {line}" for line in lines]
    if found:
        cause = f"slower than its last bench: {figures}; most likely {found[0][0]}"
        fix = found[0][2]
        if len(found) > 1:
            fix += "; then check: " + "; ".join(c[0] for c in found[1:])
    else:
        cause = f"slower than its last bench: {figures}; nothing read here explains it"
        fix = ("compare a fresh `fleet bench --plan` run with the last one (`fleet bench "
               "--compare RUN_A RUN_B`), and check the client's network path")
    return Diagnosis(ev.host, ev.server, PROBLEM, state + ", slower than its last bench",
                     "slower-than-bench", cause, evidence, fix, bench)  # fmt: skip


def _tail(text: str, lines: int = 12) -> list[str]:
    return [line for line in text.splitlines() if line.strip()][-lines:]


def _from_facts(ev: Evidence) -> list[str]:
    """Causes the facts show even where the log does not (or could not be read)."""
    names = []
    if _foreign_owners(ev):
        names.append("port-in-use")
    if ev.unreadable:
        names.append("model-unreadable")
    if ev.model_check and ev.model_check.get("ok") is False:
        names.append("model-damaged")
    if any(d.get("free_bytes") is not None and d["free_bytes"] < DISK_LOW_BYTES for d in ev.disks):
        names.append("disk-full")
    fm = ev.fabric_manager
    if ev.nvswitches and fm and (fm.get("active") != "active" or fm.get("version") != ev.driver):
        names.append("fabric-manager")
    return names


Result = tuple[str, list[str], str] | None


def _where(ev: Evidence) -> str:
    return f"hosts.{ev.host}.servers.{ev.server}"


def _first(sig: str, text: str, n: int = 3) -> list[str]:
    return [line.strip() for line in BY_NAME[sig].lines(text)][:n]


def _bad_flag(ev: Evidence, text: str) -> Result:
    lines = _first("bad-flag", text)
    if not lines:
        return None
    flags = re.findall(r"--([\w-]+)", " ".join(lines))
    flags = [f for f in dict.fromkeys(flags)]
    release = ev.vllm_version or "installed"
    known = [f for f in flags if f in ev.args]
    what = ", ".join(flags) or "a flag"
    fix = (f"remove {', '.join(known or flags)} from {_where(ev)}.args (vLLM {release} on the "
           "host does not accept it), or pin the vLLM release that has it; `fleet check` "
           "validates flags against the release the fleet file pins") if flags else (
           f"correct the flag in {_where(ev)}.args")  # fmt: skip
    return f"vLLM {release} rejects {what}", lines, fix


def _foreign_owners(ev: Evidence) -> list[dict[str, Any]]:
    return [o for o in ev.port_owners if o.get("pid") not in ev.own_pids]


def _port_in_use(ev: Evidence, text: str) -> Result:
    lines = _first("port-in-use", text, 2)
    owners = _foreign_owners(ev)
    facts = [f"port {ev.port} is held by pid {o.get('pid')} (user {o.get('user', '?')}, "
             f"{o.get('process', '?')})" for o in owners]  # fmt: skip
    if not lines and not facts:
        return None
    cause = facts[0] if facts else f"port {ev.port} is already in use by another process"
    fix = (f"stop that process, or give {_where(ev)}.port a free port (the fleet file's other "
           "servers and the host's listeners must not use it)")
    return cause, lines + facts, fix


def _unreadable(ev: Evidence, text: str) -> Result:
    lines = _first("model-unreadable", text, 2)
    facts = [f"{u['path']} ({u.get('owner', '?')}, mode {u.get('mode', '?')}) is not "
             f"{'searchable' if u.get('dir') else 'readable'} by {ev.user}"
             for u in ev.unreadable[:5]]  # fmt: skip
    if not lines and not facts:
        return None
    cause = (f"{len(ev.unreadable)} of the model's paths are not readable by the service user "
             f"{ev.user}" if ev.unreadable else "the service user cannot read a file it needs")
    path = ev.model_path or "the model's folder"
    fix = (f"make the model readable by {ev.user}: `chmod -R a+rX {path}` (vllm-fleet installs "
           "models readable; a hand copy or an archive's own modes break it), then restart")
    return cause, lines + facts, fix


def _damaged(ev: Evidence, text: str) -> Result:
    check = ev.model_check or {}
    problems = [f"{p.get('path')}: {p.get('problem')}" for p in check.get("problems", [])][:5]
    if check.get("installed") is False:
        problems.insert(0, "the model is not installed")
    if check.get("error"):
        problems.append(str(check["error"])[:300])
    return ("the model's files differ from its manifest", problems or ["check failed"],
            "deploy again (the deploy reinstalls a model whose files changed); "
            "`fleet models check --deep` re-hashes every file")


def _trust_remote_code(ev: Evidence, text: str) -> Result:
    lines = _first("trust-remote-code", text, 2)
    if not lines:
        return None
    return ("the model's architecture is custom code and the server does not trust it", lines,
            f"add trust-remote-code: true to {_where(ev)}.args (only for a model whose code "
            "you trust), or pin a vLLM release that supports the architecture natively")


def _unsupported(ev: Evidence, text: str) -> Result:
    lines = _first("unsupported-dtype", text, 2)
    if not lines:
        return None
    joined = " ".join(lines)
    if "Bfloat16" in joined:
        fix = f"set dtype: half in {_where(ev)}.args (this card has no bfloat16)"
    else:
        method = re.search(r"quantization method (\S+)", joined)
        cap = re.search(r"Current capability: (\d+)", joined)
        fix = (f"remove quantization{(' ' + method.group(1)) if method else ''} from "
               f"{_where(ev)}.args or serve a model quantised for this card"
               + (f" (compute capability {int(cap.group(1)) / 10:.1f})" if cap else ""))
    return "the release or the card does not support the model's quantization or dtype", lines, fix


def _driver(ev: Evidence, text: str) -> Result:
    lines = _first("driver-mismatch", text, 2)
    if not lines:
        return None
    facts = [f"driver {ev.driver or '?'} (CUDA {ev.cuda or '?'}), vLLM {ev.vllm_version or '?'} "
             f"build {ev.variant or '?'}"]
    fix = ("pin a vLLM build the driver runs: vllm.variant: cu129 for drivers 535/570, cu130 "
           f"only with driver ≥ {releases.MIN_DRIVER_FOR_VARIANT['cu130']} (or move "
           "os.nvidia.driver up); and reboot after a driver change, so that the loaded kernel "
           "module matches the libraries")
    return "the CUDA libraries do not match the loaded NVIDIA driver", lines + facts, fix


def _fabric(ev: Evidence, text: str) -> Result:
    lines = _first("fabric-manager", text, 2)
    fm = ev.fabric_manager or {}
    facts = [f"nvidia-fabricmanager: {fm.get('active') or 'not installed'}, version "
             f"{fm.get('version') or '?'}; driver {ev.driver or '?'}; "
             f"{ev.nvswitches} NVSwitches"] if (fm or ev.nvswitches) else []  # fmt: skip
    if not lines and not facts:
        return None
    fix = ("set os.nvidia.fabric_manager: auto (or true) and deploy: the fabric manager must "
           f"run at exactly the driver's version ({ev.driver or 'the driver'}), both held")
    return "the fabric manager is not running at the driver's version", lines + facts, fix


def _disk(ev: Evidence, text: str) -> Result:
    lines = _first("disk-full", text, 2)
    low = [d for d in ev.disks if d.get("free_bytes") is not None
           and d["free_bytes"] < DISK_LOW_BYTES]  # fmt: skip
    facts = [f"{d['path']}: {_size(d['free_bytes'])} free of {_size(d.get('total_bytes'))} "
             f"(file system at {d.get('mount', '?')})" for d in low]  # fmt: skip
    if not lines and not facts:
        return None
    where = low[0]["path"] if low else "the server's cache and state folders"
    cause = f"{where} is full" if low else "a file system the server writes to is full"
    return cause, lines + facts, (f"free space on the file system holding {where} (or give it "
                                  "a larger one), then restart the server")


def _nccl(ev: Evidence, text: str) -> Result:
    lines = _first("nccl", text, 3)
    if not lines:
        return None
    used = re.findall(r"(?:Bootstrap : Using|NET/Socket : Using \[0\])\s*(\w[\w.-]*):", text)
    facts = [f"NCCL used interface {used[-1]}"] if used else []
    given = ev.env.get("NCCL_SOCKET_IFNAME")
    if given:
        facts.append(f"the server sets NCCL_SOCKET_IFNAME={given}")
    fix = (f"set env NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME in {_where(ev)} to the "
           "interface that connects the hosts (not lo, docker or a VPN interface)"
           + (f"; NCCL picked {used[-1]}" if used else ""))
    return "NCCL/Gloo could not connect the server's processes", lines + facts, fix


def _gpu_facts(ev: Evidence) -> tuple[list[str], float | None]:
    """Free memory of the server's GPUs with their foreign processes; the highest fraction
    of a GPU the server could ask for now."""
    facts, fractions = [], []
    for gpu in ev.gpus:
        total, free = gpu.get("total_mib"), gpu.get("free_mib")
        if not total or free is None:
            continue
        fractions.append(free / total)
        others = [a for a in ev.gpu_apps if a.get("gpu") == gpu.get("index")
                  and a.get("pid") not in ev.own_pids]  # fmt: skip
        held = "; ".join(f"pid {a.get('pid')} (user {a.get('user', '?')}, {a.get('process', '?')})"
                         f" holds {_size((a.get('used_mib') or 0) * MiB)}" for a in others)
        facts.append(f"GPU {gpu.get('index')} has {_size(free * MiB)} free of "
                     f"{_size(total * MiB)}" + (f": {held}" if held else ""))
    return facts, (min(fractions) if fractions else None)


def _other_gpu(ev: Evidence, needed_mib: float) -> int | None:
    mine = {g.get("index") for g in ev.gpus}
    for gpu in ev.host_gpus:
        if gpu.get("index") not in mine and (gpu.get("free_mib") or 0) >= needed_mib:
            return gpu.get("index")
    return None


def _utilization_fix(ev: Evidence, fraction: float | None) -> str:
    plan = ev.plan
    util = plan.get("utilization")
    parts = []
    if fraction is not None and util:
        need = max((g.get("total_mib") or 0) for g in ev.gpus) * util if ev.gpus else 0
        other = _other_gpu(ev, need)
        if other is not None:
            parts.append(f"move this server to GPU {other} ({_where(ev)}.gpus: [{other}])")
        lower = math.floor((fraction - 0.02) * 100) / 100
        if lower > 0:
            parts.append(f"lower gpu-memory-utilization to {lower:.2f}")
    return " or ".join(parts) if parts else "free the GPU, or lower gpu-memory-utilization"


def _oom_load(ev: Evidence, text: str) -> Result:
    lines = _first("oom-load", text, 2)
    if not lines:
        return None
    facts, fraction = _gpu_facts(ev)
    if ev.plan.get("weights_per_gpu_bytes"):
        facts.append(f"planner: weights {_size(ev.plan['weights_per_gpu_bytes'])} per GPU within "
                     f"a budget of {_size(ev.plan.get('budget_bytes'))} "
                     f"({ev.plan.get('utilization')} of the GPU)")
    cause = facts[0] if facts else "the GPU ran out of memory while loading the model"
    return cause, lines + facts, _utilization_fix(ev, fraction)


def _oom_capture(ev: Evidence, text: str) -> Result:
    lines = _first("oom-graph-capture", text, 2) + _first("oom-load", text, 1)
    if not lines:
        return None
    facts, _ = _gpu_facts(ev)
    util = ev.plan.get("utilization")
    lower = f"lower gpu-memory-utilization to {util - 0.03:.2f}" if util else (
        "lower gpu-memory-utilization")
    fix = (f"{lower} in {_where(ev)}.args (CUDA graphs are captured after the KV cache is "
           "allocated), or lower max-num-seqs / cudagraph-capture-sizes, or set "
           "enforce-eager: true (no graphs: slower decoding)")
    cause = "out of GPU memory while capturing CUDA graphs, after the KV cache fit"
    return cause, lines + facts, fix


def _kv(ev: Evidence, text: str) -> Result:
    lines = _first("kv-too-small", text, 2)
    if not lines:
        return None
    joined = " ".join(lines)
    seq = re.search(r"max seq len \((\d+)\)", joined)
    length = seq.group(1) if seq else ev.args.get("max-model-len")
    fits = (re.search(r"estimated maximum model length is (\d+)", joined)
            or re.search(r"stored in KV cache \((\d+)\)", joined))
    largest = int(fits.group(1)) if fits else None
    planned = ev.plan.get("kv_cache_tokens")
    facts = []
    if planned:
        facts.append(f"planner: the KV cache holds {planned:,} tokens "
                     f"(budget {_size(ev.plan.get('kv_budget_bytes'))})")
        largest = largest or planned
    if largest is None:
        fix = f"lower max-model-len in {_where(ev)}.args"
    else:
        fix = f"set max-model-len: {largest} in {_where(ev)}.args (the largest that fits)"
    needed = re.search(r"\(([\d.]+) GiB KV cache is needed", joined)
    if ev.variant == "cpu" and needed:
        fix += f", or vllm.cpu_kvcache_space_gib: {math.ceil(float(needed.group(1)))}"
    elif ev.variant != "cpu":
        fix += ", or raise gpu-memory-utilization"
    cause = (f"max-model-len {int(length):,} does not fit the KV cache" if length
             else "the KV cache cannot hold one max-model-len sequence")
    return cause, lines + facts, fix


def _engine_dead(ev: Evidence, text: str) -> Result:
    lines = _first("engine-dead", text, 2)
    if not lines:
        return None
    before = [line for line in text.splitlines() if re.search(r"Error|error:|Traceback", line)
              and line not in lines][-4:]  # fmt: skip
    return ("the engine died" + (" (its root cause is in the lines before)" if before else ""),
            before + lines, "read the root cause above; if the engine dies at run time under "
            "load, check memory (OOM killer in `journalctl -k`) and the GPU's health")


_RULES = {
    "bad-flag": _bad_flag,
    "port-in-use": _port_in_use,
    "model-unreadable": _unreadable,
    "model-damaged": _damaged,
    "trust-remote-code": _trust_remote_code,
    "unsupported-dtype": _unsupported,
    "driver-mismatch": _driver,
    "fabric-manager": _fabric,
    "disk-full": _disk,
    "nccl": _nccl,
    "oom-graph-capture": _oom_capture,
    "oom-load": _oom_load,
    "kv-too-small": _kv,
    "engine-dead": _engine_dead,
}


def _size(value: float | None) -> str:
    """Bytes in words (GiB above 1 GiB, else MiB).

    Example:
        >>> _size(9.1 * 1024**3), _size(5 * 1024**2), _size(None)
        ('9.1 GiB', '5.0 MiB', '?')
    """
    if value is None:
        return "?"
    return f"{value / GiB:.1f} GiB" if value >= GiB else f"{value / MiB:.1f} MiB"
