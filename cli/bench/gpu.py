"""GPU memory and utilization of the server's host, sampled during a run through nvidia-smi.

One long-lived ``nvidia-smi --query-gpu=… -lms N`` runs on the host over SSH and prints a line
per GPU per interval; each line is timestamped on arrival, so every step takes the samples of
its own time window. Hosts of the ``cpu`` variant have no GPUs: nothing is sampled there, and
the report says so.

Example:
    >>> parse_line("1, 87, 20311, 24564")
    {'gpu': 1, 'util': 87.0, 'mem_used_mib': 20311.0, 'mem_total_mib': 24564.0}
    >>> summarize_gpus([(0.0, parse_line("0, 50, 100, 200")), (1.0, parse_line("0, 70, 150, 200"))])
    {'0': {'util_mean': 60.0, 'util_max': 70.0, 'mem_used_max_mib': 150.0, 'mem_total_mib': 200.0, 'samples': 2}}
"""  # noqa: E501

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

QUERY = "index,utilization.gpu,memory.used,memory.total"


def nvidia_smi_command(interval_ms: int = 1000) -> str:
    """The shell command that samples every GPU each ``interval_ms``.

    Example:
        >>> nvidia_smi_command(500)
        'nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits -lms 500'
    """  # noqa: E501
    return f"nvidia-smi --query-gpu={QUERY} --format=csv,noheader,nounits -lms {int(interval_ms)}"


def parse_line(line: str) -> dict[str, Any] | None:
    """One nvidia-smi CSV line as a sample, or None for anything else ("[N/A]", errors)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 4:
        return None
    try:
        return {"gpu": int(parts[0]), "util": float(parts[1]),
                "mem_used_mib": float(parts[2]), "mem_total_mib": float(parts[3])}
    except ValueError:
        return None


def summarize_gpus(samples: list[tuple[float, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per GPU: mean and max utilization (%), peak memory used and total (MiB)."""
    per: dict[str, list[dict[str, Any]]] = {}
    for _, sample in samples:
        per.setdefault(str(sample["gpu"]), []).append(sample)
    return {
        gpu: {
            "util_mean": sum(s["util"] for s in rows) / len(rows),
            "util_max": max(s["util"] for s in rows),
            "mem_used_max_mib": max(s["mem_used_mib"] for s in rows),
            "mem_total_mib": rows[-1]["mem_total_mib"],
            "samples": len(rows),
        }
        for gpu, rows in sorted(per.items())
    }


class GpuSampler:
    """Runs a sampling command (nvidia-smi over SSH) and keeps its timestamped samples.

    + argv: the command, e.g. ``cli.remote.ssh_command(data, nvidia_smi_command())``

    Example (needs a GPU host, so not run here):
        sampler = GpuSampler(ssh_command(data, nvidia_smi_command()))
        await sampler.start(); ...; await sampler.stop()
        summarize_gpus(sampler.window(t0, t1))
    """

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self.error = ""
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None

    async def start(self) -> None:
        """Start the command and read its lines in the background."""
        self._process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        async for raw in self._process.stdout:
            sample = parse_line(raw.decode(errors="replace"))
            if sample is not None:
                self.samples.append((time.perf_counter(), sample))
        if self._process.stderr is not None:
            self.error = (await self._process.stderr.read()).decode(errors="replace").strip()

    def window(self, start: float, end: float) -> list[tuple[float, dict[str, Any]]]:
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
