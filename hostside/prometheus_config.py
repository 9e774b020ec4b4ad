"""Put a staged Prometheus configuration in place only if ``promtool check config`` passes.

The deploy uploads the new ``prometheus.yml`` and its rules file into a staging folder; this
program checks them there with the installed promtool (which also checks the rules file the
configuration names, relative to it), and only then copies them over the live ones (each
written beside its target, then renamed); the deploy reloads Prometheus after. A broken
configuration never replaces the working one: the live files stay, the exit status is 1, and
promtool's words go to stderr. Standard library only.

Example:
    python3 prometheus_config.py --staged /var/lib/vllm-fleet/prometheus-staged \\
        --live /etc/prometheus/vllm-fleet --files prometheus.yml fleet-rules.yml
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def check(promtool: str, config: Path) -> subprocess.CompletedProcess:
    """``promtool check config`` on ``config``."""
    return subprocess.run([promtool, "check", "config", str(config)],
                          capture_output=True, text=True, check=False)  # fmt: skip


def install(staged: Path, live: Path, names: list[str]) -> None:
    """Copy ``names`` from ``staged`` into ``live``, each one whole (temporary file + rename)."""
    live.mkdir(parents=True, exist_ok=True)
    for name in names:
        partial = live / f".{name}.new"
        shutil.copyfile(staged / name, partial)
        os.chmod(partial, 0o644)
        os.replace(partial, live / name)


def ready(url: str, timeout: float) -> bool:
    """Whether ``url`` (Prometheus's ``/-/ready``) answers 200 within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    """Check, then install (0); refuse (1) when promtool finds a problem. With ``--ready URL``:
    wait until Prometheus answers there (0) or the time runs out (1)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--staged", type=Path)
    parser.add_argument("--live", type=Path)
    parser.add_argument("--files", nargs="+", help="file names; the first is the configuration")
    parser.add_argument("--promtool", default="/usr/bin/promtool")
    parser.add_argument("--ready", metavar="URL", help="only wait until URL answers 200")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args(argv)
    if args.ready:
        if ready(args.ready, args.timeout):
            return 0
        sys.stderr.write(f"Prometheus did not answer {args.ready} in {args.timeout:.0f} s\n")
        return 1
    if not (args.staged and args.live and args.files):
        parser.error("give --staged, --live and --files (or --ready URL)")
    result = check(args.promtool, args.staged / args.files[0])
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        sys.stderr.write(
            f"promtool refused the new configuration; {args.live} keeps the working one\n"
        )
        return 1
    install(args.staged, args.live, args.files)
    print(f"checked by promtool and installed in {args.live}: {', '.join(args.files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
