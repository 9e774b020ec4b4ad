"""A server's memory during a soak: its systemd unit's anonymous memory, sampled over SSH.

The unit's cgroup holds every process of the server (vLLM's API server and its engine core),
so its ``memory.stat`` ``anon`` is their resident memory without the page cache of the model
files they read. One shell loop runs on the host over SSH for the whole soak and prints one
number a line; each line is timestamped on arrival. When the host cannot be reached that way,
the soak falls back to the server's own ``process_resident_memory_bytes`` on ``/metrics``
(the API server process only), and the report says which it had.

Example:
    >>> print(cgroup_memory_command("vllm-chat.service", 2.0))
    cg=$(systemctl show -p ControlGroup --value vllm-chat.service); while :; do awk '$1 == "anon" {print $2}' "/sys/fs/cgroup$cg/memory.stat" || exit 1; sleep 2; done
    >>> parse_bytes("123456\\n"), parse_bytes("[N/A]") is None
    (123456, True)
"""  # noqa: E501

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time


def cgroup_memory_command(unit: str, interval: float) -> str:
    """The shell loop that prints a unit's anonymous memory (bytes) every ``interval`` seconds."""
    return (f"cg=$(systemctl show -p ControlGroup --value {shlex.quote(unit)}); "
            f"while :; do awk '$1 == \"anon\" {{print $2}}' \"/sys/fs/cgroup$cg/memory.stat\" "
            f"|| exit 1; sleep {max(0.2, interval):g}; done")


def parse_bytes(line: str) -> int | None:
    """One sample line as bytes, or None for anything else."""
    text = line.strip()
    return int(text) if text.isdigit() else None


class MemorySampler:
    """Runs a command printing byte counts (over SSH) and keeps its timestamped samples.

    + argv: the command, e.g. ``ssh_command(data, cgroup_memory_command(unit, 5))``

    Example (needs a host, so not run here):
        sampler = MemorySampler(argv); await sampler.start(); …; await sampler.stop()
        sampler.samples  # → [(perf_counter, bytes), …]
    """

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.samples: list[tuple[float, int]] = []
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

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        async for raw in self._process.stdout:
            value = parse_bytes(raw.decode(errors="replace"))
            if value is not None:
                self.samples.append((time.perf_counter(), value))
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
