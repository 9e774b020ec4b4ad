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

from typing import Any

from loadgen.sampler import LineSampler

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


class GpuSampler(LineSampler):
    """Runs a sampling command (nvidia-smi over SSH) and keeps its timestamped samples.

    + argv: the command, e.g. ``cli.remote.ssh_command(data, nvidia_smi_command())``

    Example (needs a GPU host, so not run here):
        sampler = GpuSampler(ssh_command(data, nvidia_smi_command()))
        await sampler.start(); ...; await sampler.stop()
        summarize_gpus(sampler.window(t0, t1))
    """

    def parse(self, line: str) -> dict[str, Any] | None:
        """One nvidia-smi CSV line as a sample (:func:`parse_line`)."""
        return parse_line(line)
