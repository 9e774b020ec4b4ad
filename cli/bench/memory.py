"""A server's memory during a soak: its systemd unit's memory, sampled over SSH.

The unit's cgroup holds every process of the server (vLLM's API server and its engine core),
so its memory is theirs together. One shell loop runs on the host over SSH for the whole soak
and prints ``KIND BYTES`` a line, each timestamped on arrival; the kind says what was read:

- ``anon``: cgroup v2 ``memory.stat`` anonymous memory (resident memory without the page cache
  of the model files the server read);
- ``total_rss``: the same from cgroup v1's memory controller;
- ``proc_rss``: no memory controller for the unit (cgroup v1 inside a container): the
  ``VmRSS`` of every process whose ``/proc/PID/cgroup`` names the unit's cgroup, added up
  (shared pages counted once per process); shell builtins only, no process started per sample.

When the host cannot be reached that way, the soak falls back to the server's own
``process_resident_memory_bytes`` on ``/metrics`` (the API server process only), and the report
says which it had.

Example:
    >>> parse_sample("anon 123456\\n"), parse_sample("[N/A]") is None
    (('anon', 123456), True)
    >>> KINDS["proc_rss"]
    "the RSS of the unit's processes added up"
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time

#: What each kind of sample measures, for the report.
KINDS = {
    "anon": "the unit's cgroup: anonymous memory of all its processes",
    "total_rss": "the unit's cgroup (v1): RSS of all its processes",
    "proc_rss": "the RSS of the unit's processes added up",
}

_LOOP = """cg=$(systemctl show -p ControlGroup --value {unit}) && [ -n "$cg" ] || exit 1
while :; do
  if [ -r "/sys/fs/cgroup$cg/memory.stat" ]; then
    awk '$1 == "anon" {{print "anon", $2}}' "/sys/fs/cgroup$cg/memory.stat"
  elif [ -r "/sys/fs/cgroup/memory$cg/memory.stat" ]; then
    awk '$1 == "total_rss" {{print "total_rss", $2}}' "/sys/fs/cgroup/memory$cg/memory.stat"
  else
    s=0 n=0
    for f in /proc/[0-9]*/cgroup; do
      while IFS=: read -r _ _ path; do
        case "$path" in *"$cg")
          n=$((n + 1))
          while read -r k v _; do
            [ "$k" = VmRSS: ] && s=$((s + v))
          done 2>/dev/null < "${{f%cgroup}}status"
          break;;
        esac
      done 2>/dev/null < "$f"
    done
    [ "$n" -gt 0 ] && echo "proc_rss $((s * 1024))" || echo "no process in $cg" >&2
  fi
  sleep {interval:g}
done"""


def cgroup_memory_command(unit: str, interval: float) -> str:
    """The shell loop that prints a unit's memory (``KIND BYTES``) every ``interval`` seconds.

    Example:
        >>> cgroup_memory_command("vllm-chat.service", 2).splitlines()[0]
        'cg=$(systemctl show -p ControlGroup --value vllm-chat.service) && [ -n "$cg" ] || exit 1'
    """
    return _LOOP.format(unit=shlex.quote(unit), interval=max(0.2, interval))


def parse_sample(line: str) -> tuple[str, int] | None:
    """One sample line as ``(kind, bytes)``, or None for anything else."""
    parts = line.split()
    if len(parts) != 2 or parts[0] not in KINDS or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


class MemorySampler:
    """Runs a command printing byte counts (over SSH) and keeps its timestamped samples.

    + argv: the command, e.g. ``ssh_command(data, cgroup_memory_command(unit, 5))``

    Example (needs a host, so not run here):
        sampler = MemorySampler(argv); await sampler.start(); …; await sampler.stop()
        sampler.kind, sampler.samples  # → 'anon', [(perf_counter, bytes), …]
    """

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.samples: list[tuple[float, int]] = []
        self.kind: str | None = None
        self.error = ""
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None

    async def start(self) -> None:
        """Start the command and read its lines in the background."""
        self._process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read())

    async def first_sample(self, timeout: float) -> bool:
        """Wait until the first sample arrived (the ssh connection is up), the command ended,
        or ``timeout`` seconds passed; whether a sample is in."""
        end = time.perf_counter() + timeout
        while not self.samples and time.perf_counter() < end:
            if self._process is None or self._process.returncode is not None:
                break
            await asyncio.sleep(0.1)
        return bool(self.samples)

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        async for raw in self._process.stdout:
            sample = parse_sample(raw.decode(errors="replace"))
            if sample is not None:
                self.kind = sample[0]
                self.samples.append((time.perf_counter(), sample[1]))
        if self._process.stderr is not None:
            self.error = (await self._process.stderr.read()).decode(errors="replace").strip()

    async def stop(self) -> None:
        """Stop the command we started and its reader."""
        process = self._process
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 5)
            except asyncio.TimeoutError:
                process.kill()
                await process.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._reader, 5)
