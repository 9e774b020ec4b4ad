#!/usr/bin/env python3
"""Generate ``fleet/checks/sysctl_names.txt``: the kernel parameter names `fleet check` knows, each
with
the kind of value it takes (``int``: one integer, ``ints``: several, ``text``: anything else).

Sources, in order:

1. Every file below ``/proc/sys`` of the machine this runs on (``--root``), its kind read from
   its current value: integers separated by blanks are ``int``/``ints``; anything else, an
   unreadable or write-only file, a hexadecimal bitmap (``00000000``) and the names in
   :data:`TEXT` are ``text``. The interface part of ``net.ipv{4,6}.{conf,neigh}.IFNAME.*`` is
   written ``*`` (``all``, ``default``, ``lo``, ``eth0`` … are all interface names there).
2. :data:`DOCUMENTED`: names that the kernel's own documentation lists
   (``Documentation/admin-guide/sysctl/vm.rst`` and ``kernel.rst`` of torvalds/linux) but that
   this machine's kernel does not build (a firecracker kernel without ``CONFIG_MAGIC_SYSRQ``,
   Yama, kexec, …), with their documented kind.

Example::

    $ python scripts/gen_sysctl_names.py            # writes fleet/checks/sysctl_names.txt
    1110 names (1086 from /proc/sys of 6.18.44-fc-v1045, 24 documented)
"""

from __future__ import annotations

import argparse
import os
import platform
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "fleet" / "checks" / "sysctl_names.txt"
_INTERFACE = re.compile(r"(net\.ipv[46]\.(?:conf|neigh))\.[^.]+\.(.+)")
_NUMBER = re.compile(r"-?[0-9]+")

#: Names whose value may read as digits but that take text (names, bitmaps, CPU lists, keys).
TEXT = {
    "kernel.hostname", "kernel.domainname", "kernel.core_pattern", "kernel.modprobe",
    "kernel.poweroff_cmd", "kernel.watchdog_cpumask", "kernel.random.boot_id",
    "kernel.random.uuid", "net.core.flow_limit_cpu_bitmap", "net.core.rps_default_mask",
    "net.core.netdev_rss_key", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_fastopen_key",
    "net.ipv6.conf.*.stable_secret", "net.ipv6.conf.*.token", "kernel.usermodehelper.bset",
    "kernel.usermodehelper.inheritable", "kernel.osrelease", "kernel.version", "kernel.ostype",
    "kernel.arch",
}
#: Write-only files of integers (reading them fails).
WRITE_ONLY_INT = {"vm.compact_memory", "vm.drop_caches", "vm.stat_refresh"}

#: Documented names this kernel lacks: vm.rst's list (torvalds/linux 010e85f9) and kernel.rst.
DOCUMENTED = {
    "vm.block_dump": "int", "vm.highmem_is_dirtyable": "int",
    "vm.memory_failure_early_kill": "int", "vm.memory_failure_recovery": "int",
    "vm.nr_trim_pages": "int", "vm.percpu_pagelist_fraction": "int",
    "kernel.sysrq": "int", "kernel.modprobe": "text", "kernel.modules_disabled": "int",
    "kernel.kexec_load_disabled": "int", "kernel.yama.ptrace_scope": "int",
    "kernel.sched_energy_aware": "int", "kernel.sched_schedstats": "int",
    "kernel.sched_child_runs_first": "int", "kernel.hotplug": "text",
    "kernel.panic_on_stackoverflow": "int", "kernel.stack_erasing": "int",
    "kernel.unprivileged_userns_clone": "int", "kernel.perf_user_access": "int",
    "kernel.sched_util_clamp_max": "int", "kernel.sched_util_clamp_min": "int",
    "kernel.sched_util_clamp_min_rt_default": "int", "kernel.nmi_watchdog": "int",
    "kernel.hung_task_all_cpu_backtrace": "int",
}


def _kind(path: Path, name: str) -> str:
    if name in TEXT:
        return "text"
    if name in WRITE_ONLY_INT:
        return "int"
    try:
        words = path.read_text().split()
    except OSError:
        return "text"
    if not words or not all(_NUMBER.fullmatch(word) for word in words):
        return "text"
    if any(len(word) > 1 and word.startswith("0") for word in words):
        return "text"  # a hexadecimal bitmap such as 00000000
    return "int" if len(words) == 1 else "ints"


def collect(root: Path) -> dict[str, str]:
    """Every name below ``root`` (a ``/proc/sys``) with its kind, interfaces as ``*``."""
    names: dict[str, str] = {}
    for folder, _, files in os.walk(root):
        for file in files:
            path = Path(folder) / file
            name = ".".join(path.relative_to(root).parts)
            name = _INTERFACE.sub(r"\1.*.\2", name)
            kind = _kind(path, name)
            names[name] = kind if names.get(name, kind) == kind else "text"
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/proc/sys"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    found = collect(args.root)
    documented = {k: v for k, v in DOCUMENTED.items() if k not in found}
    names = {**found, **documented}
    header = [
        "# Kernel parameter names that `fleet check` knows, and the kind of value each takes:",
        "#   int: one integer; ints: integers separated by blanks; text: words, lists, bitmaps.",
        "# `*` in net.ipv4/ipv6.conf/neigh.*.NAME stands for any interface (all, default, eth0).",
        f"# Source: /proc/sys of Linux {platform.release()} (Debian 12 userland; the sandbox",
        "# image runs on the same kernel), kinds read from the current values; plus names",
        "# documented in torvalds/linux Documentation/admin-guide/sysctl/vm.rst (010e85f9) and",
        "# kernel.rst that this kernel does not build (sysrq, yama, kexec, ...).",
        "# Generated by scripts/gen_sysctl_names.py; an unknown name is a warning, not an error.",
    ]
    lines = [f"{name} {kind}" for name, kind in sorted(names.items())]
    args.out.write_text("\n".join(header + lines) + "\n")
    print(f"{len(names)} names ({len(found)} from /proc/sys of {platform.release()}, "
          f"{len(documented)} documented)")


if __name__ == "__main__":
    main()
