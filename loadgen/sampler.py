"""A command on a host (over SSH) printing one sample a line, read in the background.

:class:`LineSampler` starts the command, timestamps each line it prints on arrival
(``time.perf_counter``), keeps the lines its :meth:`~LineSampler.parse` hook accepts, and stops
the command it started. The GPU sampler (:mod:`loadgen.gpu`, nvidia-smi) and the memory sampler
of `fleet bench --plan`'s soak (a cgroup loop) are its two kinds.

Example:
    >>> import asyncio, sys
    >>> class Numbers(LineSampler):
    ...     def parse(self, line):
    ...         return int(line) if line.strip().isdigit() else None
    >>> async def main():
    ...     s = Numbers([sys.executable, "-c", "print(1); print('x'); print(2)"])
    ...     await s.start(); await s.first_sample(5); await s.stop()
    ...     return [v for _, v in s.samples]
    >>> asyncio.run(main())
    [1, 2]
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any


class LineSampler:
    """Runs ``argv`` and keeps ``(perf_counter time, sample)`` for every line that
    :meth:`parse` turns into a sample; ``error`` holds what the command printed on stderr.

    + argv: the command, e.g. ``cli.remote.ssh_command(data, "nvidia-smi … -lms 1000")``
    """

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.samples: list[tuple[float, Any]] = []
        self.error = ""
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None

    def parse(self, line: str) -> Any:
        """One printed line as a sample, or None to skip it (the subclass's hook)."""
        raise NotImplementedError

    async def start(self) -> None:
        """Start the command and read its lines in the background."""
        self._process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        async for raw in self._process.stdout:
            sample = self.parse(raw.decode(errors="replace"))
            if sample is not None:
                self.samples.append((time.perf_counter(), sample))
        if self._process.stderr is not None:
            self.error = (await self._process.stderr.read()).decode(errors="replace").strip()

    async def first_sample(self, timeout: float) -> bool:
        """Wait until the first sample arrived (the ssh connection is up), the command ended,
        or ``timeout`` seconds passed; whether a sample is in."""
        end = time.perf_counter() + timeout
        while not self.samples and time.perf_counter() < end:
            if self._process is None or self._process.returncode is not None:
                break
            await asyncio.sleep(0.1)
        return bool(self.samples)

    async def ended(self, timeout: float) -> bool:
        """Wait until the command ended by itself and every line it printed was read, or
        ``timeout`` seconds passed; whether it ended."""
        if self._reader is None:
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        return self._reader.done()

    def window(self, start: float, end: float) -> list[tuple[float, Any]]:
        """The samples taken between two perf_counter times."""
        return [(t, s) for t, s in self.samples if start <= t <= end]

    async def stop(self) -> None:
        """Stop the command we started (its ssh process) and the reader."""
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
