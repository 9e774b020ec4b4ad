"""Facts ``fleet doctor`` reads about a failing server: its unit, journal, port, files, disks.

Each only reads, and each is bounded: the journal in lines, bytes and seconds; the file walk in
entries. GPU memory, processes, driver and fabric manager come from :mod:`facts.gpus` and
:mod:`facts.nvidia`; this module adds what those lack.

Example:
    >>> ListeningSockets().process(['LISTEN 0 2048 127.0.0.1:18700 0.0.0.0:* '
    ...     'users:(("python3",pid=4121,fd=3))', '@@ps 4121 aiadm python3'])
    [{'port': 18700, 'address': '127.0.0.1', 'pid': 4121, 'process': 'python3', 'user': 'aiadm'}]
"""

from __future__ import annotations

import json
import re
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.host import SystemctlShow

#: The ``systemctl show`` properties a diagnosis reads.
STATUS_PROPERTIES = ("ActiveState", "SubState", "Result", "NRestarts", "ExecMainStatus",
                     "ExecMainStartTimestamp", "MainPID", "LoadState")  # fmt: skip
#: The last line of :class:`UnitJournal`'s output: journalctl's exit status.
_RC = re.compile(r"^@@rc=(\d+)$")


class UnitStatus(SystemctlShow):
    """State, restarts and main process of systemd units (``systemctl show``).

    .. code:: python

        {"vllm-chat.service": {"ActiveState": "activating", "SubState": "auto-restart",
                               "NRestarts": "4", "Result": "exit-code", "MainPID": "0", …}}
    """

    properties = STATUS_PROPERTIES


class UnitJournal(FactBase):
    """A unit's last journal lines, bounded in lines, bytes and seconds.

    .. code:: python

        {"text": "Started vllm-chat.service …\\nOSError: [Errno 98] …", "rc": 0,
         "truncated": False}
    """

    requires_command = "journalctl"

    @staticmethod
    def default() -> dict[str, Any]:
        return {"text": "", "rc": None, "truncated": False, "error": "journalctl is not there"}

    def command(self, unit: str, lines: int = 2000, max_bytes: int = 262144,
                seconds: int = 10) -> StringCommand:
        return StringCommand(
            "{", "timeout", str(seconds), "journalctl", "--no-pager", "-o", "cat", "-u",
            QuoteString(unit), "-n", str(lines), "2>&1", ";", "echo", '"@@rc=$?"', ";", "}",
            "|", "tail", "-c", str(max_bytes),
        )  # fmt: skip

    def process(self, output: list[str]) -> dict[str, Any]:
        rc = None
        if output and _RC.match(output[-1].strip()):
            rc = int(_RC.match(output[-1].strip()).group(1))  # type: ignore[union-attr]
            output = output[:-1]
        text = "\n".join(output)
        error = None
        if rc not in (0, None):
            error = ("journalctl timed out" if rc == 124 else f"journalctl exited {rc}: "
                     + " ".join(output[-2:])[:300])  # fmt: skip
        elif rc is None:
            error = "journalctl's output was cut"
        return {"text": text, "rc": rc, "truncated": rc is None, "error": error}


def _owners(lines: list[str]) -> dict[int, tuple[str, str]]:
    owners = {}
    for line in lines:
        if line.startswith("@@ps "):
            parts = line.split(None, 3)
            if len(parts) == 4 and parts[1].isdigit():
                owners[int(parts[1])] = (parts[2], parts[3])
    return owners


class ListeningSockets(FactBase):
    """TCP listeners (``ss -Hltnp``) with each process's user (``ps -o user``).

    .. code:: python

        [{"port": 18700, "address": "127.0.0.1", "pid": 4121, "process": "python3",
          "user": "aiadm"}]
    """

    requires_command = "ss"
    default = list

    def command(self) -> str:
        return (
            'out=$(ss -Hltnp 2>/dev/null); printf "%s\\n" "$out"; '
            "for pid in $(printf '%s\\n' \"$out\" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); "
            'do echo "@@ps $pid $(ps -o user= -o comm= -p $pid)"; done'
        )

    def process(self, output: list[str]) -> list[dict[str, Any]]:
        owners = _owners(output)
        result = []
        for line in output:
            fields = line.split()
            if len(fields) < 4 or fields[0] != "LISTEN":
                continue
            address, _, port = fields[3].rpartition(":")
            if not port.isdigit():
                continue
            users = re.findall(r'\("([^"]*)",pid=(\d+)', line) or [("", "")]
            for process, pid in users:
                owner = owners.get(int(pid)) if pid else None
                result.append({
                    "port": int(port), "address": address.strip("[]"),
                    "pid": int(pid) if pid else None, "process": process or None,
                    "user": owner[0] if owner else None,
                })  # fmt: skip
        return result


class ProcessOwners(FactBase):
    """The user and command of each process (``ps -o user= -o comm=``).

    .. code:: python

        {4121: {"user": "aiadm", "process": "python"}}
    """

    default = dict

    def command(self, pids: list[int]) -> str:
        numbers = " ".join(str(int(pid)) for pid in pids) or "0"
        return (f'for pid in {numbers}; do echo "@@ps $pid $(ps -o user= -o comm= -p $pid)"; '
                "done")

    def process(self, output: list[str]) -> dict[int, dict[str, str]]:
        return {pid: {"user": user, "process": process}
                for pid, (user, process) in _owners(output).items()}  # fmt: skip


class ReadableAs(FactBase):
    """The paths below ``path`` (and its parent folders) that ``user`` cannot read or enter,
    tested as that user (``runuser -u USER -- test -r``); at most ``limit`` entries walked,
    hidden ones (vllm-fleet's own manifest) left out: vLLM does not read them.

    .. code:: python

        {"exists": True, "user_exists": True,
         "unreadable": [{"path": "/var/lib/…/config.json", "owner": "root:root",
                         "mode": "600", "dir": False}]}
    """

    default = dict

    def command(self, user: str, path: str, limit: int = 300) -> StringCommand:
        script = (
            'u="$1"; p="$2"; n="$3"; '
            'if ! id -u "$u" >/dev/null 2>&1; then echo "@@nouser"; exit 0; fi; '
            'if [ ! -e "$p" ]; then echo "@@missing"; exit 0; fi; '
            'd=$(dirname "$p"); while [ "$d" != "/" ]; do '
            'runuser -u "$u" -- test -x "$d" || echo "@@no d $(stat -c "%U:%G %a" "$d") $d"; '
            'd=$(dirname "$d"); done; '
            'find -L "$p" -maxdepth 4 ! -name ".*" 2>/dev/null | head -n "$n" | '
            'while IFS= read -r f; do '
            'if [ -d "$f" ]; then op=-x; k=d; else op=-r; k=f; fi; '
            'runuser -u "$u" -- test $op "$f" || echo "@@no $k $(stat -L -c "%U:%G %a" "$f") $f"; '
            "done"
        )
        return StringCommand("sh", "-c", QuoteString(script), "sh", QuoteString(user),
                             QuoteString(path), str(int(limit)))  # fmt: skip

    def process(self, output: list[str]) -> dict[str, Any]:
        result: dict[str, Any] = {"exists": True, "user_exists": True, "unreadable": []}
        for line in output:
            if line.strip() == "@@nouser":
                result["user_exists"] = False
            elif line.strip() == "@@missing":
                result["exists"] = False
            elif line.startswith("@@no "):
                parts = line.split(None, 4)
                if len(parts) == 5:
                    _, kind, owner, mode, path = parts
                    result["unreadable"].append(
                        {"path": path, "owner": owner, "mode": mode, "dir": kind == "d"})
        return result


class DiskSpace(FactBase):
    """Free and total bytes of the file system holding each path (``df -P -B1``); a path
    that does not exist yet is looked up through its nearest existing parent.

    .. code:: python

        {"/var/cache/vllm-fleet/servers/chat": {"free_bytes": 0, "total_bytes": 1048576,
                                                "mount": "/var/cache/vllm-fleet/servers/chat"}}
    """

    default = dict

    def command(self, paths: list[str]) -> StringCommand:
        script = (
            'for p in "$@"; do q="$p"; while [ ! -e "$q" ] && [ "$q" != "/" ]; do '
            'q=$(dirname "$q"); done; '
            'echo "@@path $p"; df -P -B1 "$q" 2>&1 | tail -n 1; done'
        )
        return StringCommand("sh", "-c", QuoteString(script), "sh",
                             *[QuoteString(p) for p in paths])  # fmt: skip

    def process(self, output: list[str]) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = {}
        path = None
        for line in output:
            if line.startswith("@@path "):
                path = line[len("@@path "):]
                continue
            fields = line.split()
            if path and len(fields) >= 6 and fields[1].isdigit() and fields[3].isdigit():
                result[path] = {"total_bytes": int(fields[1]), "free_bytes": int(fields[3]),
                                "mount": fields[5]}
            path = None
        return result


class HttpStatus(FactBase):
    """The HTTP status a URL on the host answers (``curl``); None with the error when none.

    .. code:: python

        {"status": 200, "error": None}
    """

    requires_command = "curl"

    @staticmethod
    def default() -> dict[str, Any]:
        return {"status": None, "error": "curl is not installed"}

    def command(self, url: str, seconds: int = 5, cafile: str = "",
                connect_to: str = "") -> StringCommand:
        """``cafile``: https trusting that file alone; ``connect_to``: curl's
        ``NAME:PORT:ADDRESS:PORT``, the URL's name (which the certificate must cover) reached
        at the address the server listens on."""
        tls = ["--cacert", QuoteString(cafile)] if cafile else []
        if connect_to:
            tls += ["--connect-to", QuoteString(connect_to)]
        return StringCommand(
            "curl", "-s", "-o", "/dev/null", "-w", QuoteString("%{http_code}"), *tls,
            "--max-time", str(seconds), QuoteString(url), ";", "echo", '" rc=$?"',
        )  # fmt: skip

    def process(self, output: list[str]) -> dict[str, Any]:
        text = " ".join(output)
        code = re.match(r"^(\d{3})", text)
        rc = re.search(r"rc=(\d+)", text)
        if code and code.group(1) != "000":
            return {"status": int(code.group(1)), "error": None}
        reasons = {"7": "connection refused", "28": "timed out", "52": "empty reply",
                   "35": "TLS handshake failed", "60": "certificate not trusted (or not for "
                   "the name clients use)"}
        number = rc.group(1) if rc else "?"
        return {"status": None, "error": reasons.get(number, f"curl exit {number}")}


class CudaDriverVersion(FactBase):
    """The CUDA version the driver supports, from ``nvidia-smi``'s header ("12.8"); None."""

    requires_command = "nvidia-smi"

    def command(self) -> str:
        return "nvidia-smi 2>/dev/null | head -n 5 || true"

    def process(self, output: list[str]) -> str | None:
        match = re.search(r"CUDA Version:\s*([0-9.]+)", "\n".join(output))
        return match.group(1) if match else None


class GpuFreeMemory(FactBase):
    """Free memory of each GPU in MiB (``nvidia-smi --query-gpu=index,memory.free``).

    .. code:: python

        {0: 9318, 1: 24080}
    """

    requires_command = "nvidia-smi"
    default = dict

    def command(self) -> str:
        return "nvidia-smi --query-gpu=index,memory.free --format=csv,noheader,nounits || true"

    def process(self, output: list[str]) -> dict[int, int]:
        result = {}
        for line in output:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                result[int(parts[0])] = int(parts[1])
        return result


class Completion(FactBase):
    """Whether a server answers a real one-token completion, through the request program the
    deploy uploads (``hostside/request.py``: the API key is read on the host, never sent here).

    .. code:: python

        {"ok": False, "status": 500, "error": "HTTP 500: {\\"error\\": …}"}
    """

    def command(self, program: list[str], payload: str, seconds: int = 30) -> StringCommand:
        return StringCommand(
            "echo", QuoteString(payload), "|", "timeout", str(seconds),
            *[QuoteString(word) for word in program], "2>&1", ";", "echo", '"@@rc=$?"',
        )  # fmt: skip

    def process(self, output: list[str]) -> dict[str, Any]:
        rc = _RC.match(output[-1].strip()) if output else None
        lines = output[:-1] if rc else output
        for line in reversed(lines):
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            status = answer.get("status")
            if status == 200:
                return {"ok": True, "status": 200, "error": None}
            return {"ok": False, "status": status,
                    "error": f"HTTP {status}: {str(answer.get('body', ''))[:200]}"}
        code = rc.group(1) if rc else "?"
        why = "timed out" if code == "124" else " ".join(lines)[-200:] or f"exit {code}"
        return {"ok": False, "status": None, "error": why}


class CpuLoad(FactBase):
    """The host's 1-minute load average and its CPUs (``/proc/loadavg``, ``nproc``).

    .. code:: python

        {"load1": 3.9, "cpus": 2}
    """

    default = dict

    def command(self) -> str:
        return "cat /proc/loadavg; nproc"

    def process(self, output: list[str]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        words = output[0].split() if output else []
        if words and re.fullmatch(r"\d+(?:\.\d+)?", words[0]):
            result["load1"] = float(words[0])
        if len(output) > 1 and output[1].strip().isdigit():
            result["cpus"] = int(output[1].strip())
        return result


class BusyProcesses(FactBase):
    """The host's busiest processes by CPU (``ps``: lifetime average, % of one CPU), with
    their cgroups (to tell a unit's own processes from its neighbours).

    .. code:: python

        [{"pid": 4121, "user": "aiadm", "cpu": 99.5, "process": "python3",
          "cgroup": "0::/user.slice/session-4.scope"}]
    """

    default = list

    def command(self, count: int = 12) -> StringCommand:
        return StringCommand(
            "ps", "-eo", "pid=,user=,pcpu=,comm=,cgroup=", "--sort=-pcpu", "|", "head", "-n",
            str(int(count)),
        )  # fmt: skip

    def process(self, output: list[str]) -> list[dict[str, Any]]:
        result = []
        for line in output:
            parts = line.split(None, 4)
            if len(parts) < 4 or not parts[0].isdigit():
                continue
            try:
                cpu = float(parts[2])
            except ValueError:
                continue
            cgroup = parts[4] if len(parts) == 5 else ""
            result.append({"pid": int(parts[0]), "user": parts[1], "cpu": cpu,
                           "process": parts[3], "cgroup": cgroup})  # fmt: skip
        return result


class MountOf(FactBase):
    """The file system holding a path: its type and mount point (``findmnt -T``).

    .. code:: python

        {"fstype": "nfs4", "target": "/mnt/models"}
    """

    default = dict

    def command(self, path: str) -> StringCommand:
        return StringCommand("findmnt", "-n", "-o", "FSTYPE,TARGET", "-T", QuoteString(path),
                             "||", "true")  # fmt: skip

    def process(self, output: list[str]) -> dict[str, str]:
        for line in output:
            parts = line.split(None, 1)
            if len(parts) == 2:
                return {"fstype": parts[0], "target": parts[1].strip()}
        return {}
