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

import shlex

from loadgen.sampler import LineSampler

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


class MemorySampler(LineSampler):
    """Runs a command printing byte counts (over SSH) and keeps its timestamped samples.

    + argv: the command, e.g. ``ssh_command(data, cgroup_memory_command(unit, 5))``

    Example (needs a host, so not run here):
        sampler = MemorySampler(argv); await sampler.start(); …; await sampler.stop()
        sampler.kind, sampler.samples  # → 'anon', [(perf_counter, bytes), …]
    """

    def __init__(self, argv: list[str]):
        super().__init__(argv)
        self.kind: str | None = None

    def parse(self, line: str) -> int | None:
        """A sample line's bytes (:func:`parse_sample`), noting its kind."""
        sample = parse_sample(line)
        if sample is None:
            return None
        self.kind = sample[0]
        return sample[1]
