"""GPU metrics for the node exporter's textfile collector, from ``nvidia-smi`` queries.

Debian 12's prometheus-node-exporter-collectors has no NVIDIA collector, so this program is
vllm-fleet's: every ``--interval`` seconds it asks ``nvidia-smi --query-gpu`` for each GPU's
utilisation, memory, temperature and power, and writes them in Prometheus's text format to
``--out`` (written beside it, then renamed: the collector never reads half a file). A failed
query writes ``vllm_fleet_gpu_query_success 0``, so the failure is itself a series. Runs as
``vllm-fleet-gpu-metrics.service``; standard library only.

Example:
    python3 gpu_metrics.py --out /var/lib/prometheus/node-exporter/vllm_fleet_gpu.prom --once
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

#: The nvidia-smi fields asked for, in order.
FIELDS = (
    "index", "uuid", "name", "utilization.gpu", "memory.used", "memory.total",
    "temperature.gpu", "power.draw", "power.limit",
)  # fmt: skip
MIB = 1024 * 1024
#: Series written: name, help, type, the field it comes from, factor.
SERIES = (
    ("vllm_fleet_gpu_utilization_percent", "GPU utilisation (nvidia-smi utilization.gpu).",
     "utilization.gpu", 1),
    ("vllm_fleet_gpu_memory_used_bytes", "GPU memory used (nvidia-smi memory.used).",
     "memory.used", MIB),
    ("vllm_fleet_gpu_memory_total_bytes", "GPU memory in total (nvidia-smi memory.total).",
     "memory.total", MIB),
    ("vllm_fleet_gpu_temperature_celsius", "GPU temperature (nvidia-smi temperature.gpu).",
     "temperature.gpu", 1),
    ("vllm_fleet_gpu_power_watts", "GPU power draw (nvidia-smi power.draw).", "power.draw", 1),
    ("vllm_fleet_gpu_power_limit_watts", "GPU power limit (nvidia-smi power.limit).",
     "power.limit", 1),
)  # fmt: skip


def query_command(nvidia_smi: str = "nvidia-smi") -> list[str]:
    """The nvidia-smi command line this program runs."""
    return [nvidia_smi, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"]


def number(text: str) -> float | None:
    """A field's value, or None for what nvidia-smi prints when it has none.

    Example:
        >>> number("61"), number("[N/A]"), number("N/A"), number("Not Supported")
        (61.0, None, None, None)
    """
    try:
        return float(text.strip())
    except ValueError:
        return None


def parse(text: str) -> list[dict[str, str]]:
    """The rows of ``nvidia-smi --query-gpu=… --format=csv,noheader,nounits``.

    Example:
        >>> parse("0, GPU-6fd2, NVIDIA H200, 87, 1551, 143771, 41, 118.52, 700.00\\n")[0]["name"]
        'NVIDIA H200'
    """
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) < len(FIELDS):
            continue
        # a name with a comma in it: everything between uuid and the numeric fields
        extra = len(cells) - len(FIELDS)
        name = ", ".join(cells[2 : 3 + extra])
        cells = [cells[0], cells[1], name, *cells[3 + extra :]]
        rows.append(dict(zip(FIELDS, cells, strict=True)))
    return rows


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def exposition(rows: list[dict[str, str]] | None) -> str:
    """The textfile's content; ``None`` rows: the query failed.

    Example:
        >>> print(exposition(parse("0, GPU-a, NVIDIA L4, 7, 100, 200, 40, 20.5, 72.00")), end="")
        ... # doctest: +ELLIPSIS
        # HELP vllm_fleet_gpu_query_success Whether the last nvidia-smi query answered.
        # TYPE vllm_fleet_gpu_query_success gauge
        vllm_fleet_gpu_query_success 1
        # HELP vllm_fleet_gpu_utilization_percent GPU utilisation (nvidia-smi utilization.gpu).
        # TYPE vllm_fleet_gpu_utilization_percent gauge
        vllm_fleet_gpu_utilization_percent{gpu="0",uuid="GPU-a",gpu_name="NVIDIA L4"} 7
        ...
        vllm_fleet_gpu_power_limit_watts{gpu="0",uuid="GPU-a",gpu_name="NVIDIA L4"} 72
    """
    lines = [
        "# HELP vllm_fleet_gpu_query_success Whether the last nvidia-smi query answered.",
        "# TYPE vllm_fleet_gpu_query_success gauge",
        f"vllm_fleet_gpu_query_success {0 if rows is None else 1}",
    ]
    for name, help_text, source, factor in SERIES:
        samples = []
        for row in rows or []:
            value = number(row[source])
            if value is None:
                continue
            labels = (f'gpu="{_label(row["index"])}",uuid="{_label(row["uuid"])}",'
                      f'gpu_name="{_label(row["name"])}"')  # fmt: skip
            scaled = value * factor
            text = str(int(scaled)) if scaled.is_integer() else repr(scaled)
            samples.append(f"{name}{{{labels}}} {text}")
        if samples:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", *samples]
    return "\n".join(lines) + "\n"


def query(nvidia_smi: str = "nvidia-smi", timeout: float = 10) -> list[dict[str, str]] | None:
    """The GPUs' rows, or None when nvidia-smi fails or is missing."""
    try:
        done = subprocess.run(query_command(nvidia_smi), capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return parse(done.stdout)


def write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole: a temporary file beside it, then a rename."""
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(partial, 0o644)
    os.replace(partial, path)


def main(argv: list[str] | None = None) -> int:
    """Query and write once (``--once``) or forever."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="the .prom file to write")
    parser.add_argument("--interval", type=float, default=15, help="seconds between queries")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi to run")
    parser.add_argument("--once", action="store_true", help="query once and exit")
    args = parser.parse_args(argv)
    while True:
        rows = query(args.nvidia_smi)
        write(args.out, exposition(rows))
        if args.once:
            return 0 if rows is not None else 1
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
