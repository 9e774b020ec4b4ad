"""Deploy time and control-machine memory against the number of hosts (issue 26's curve).

For each size N (default 1, 2, 4, 8), N fresh sandbox hosts get the stack-only job of a fleet
file (the hosts declare sysctl settings and no server: OS tuning, host tuning, nothing to
serve), with ``pyinfra -y inventory.py deploy.py``:

- **cold**: the first deploy of the N fresh hosts;
- **no-op**: the same deploy again, nothing changed (0 changes asserted);
- **plain pyinfra**, the baseline in the same run on the same hosts: a role of 9 operations of
  pyinfra's own (a user, folders, files, sysctl lines), run once to converge and timed on its
  no-op run — what pyinfra itself costs per host with nothing to do.

Each run is a child process; its peak resident memory comes from ``os.wait4`` (the control
machine's memory at N hosts). pyinfra connects to every host of a run at once (its
``--parallel`` is left at the default: one greenlet per host), so N hosts share this machine's
2 cores, its sshd processes included (sandbox hosts are containers on it).

Printed per size: cold s, no-op s, plain no-op s, peak MB of each; LAST the ratios:
``ratios noop_vs_plain(1)=… noop(N)/noop(1)=… plain(N)/plain(1)=…``.

    .venv/bin/python benchmarks/deploy_scale.py [SIZES …] [--keep]

Needs root and what the sandbox needs (scripts/install.sh); host names ``scale-01`` …; the hosts
are removed after each size unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox import hosts as sandbox  # noqa: E402

PYINFRA = str(Path(sys.executable).parent / "pyinfra")

#: The plain pyinfra role: 9 operations of pyinfra's own, the kind a hand-written role has.
PLAIN_DEPLOY = '''\
from pyinfra.operations import files, server

server.group(name="group", group="scaleapp", system=True)
server.user(name="user", user="scaleapp", group="scaleapp", system=True, shell="/usr/sbin/nologin")
for sub in ("", "/etc", "/data", "/logs"):
    files.directory(name=f"dir {sub}", path=f"/opt/scaleapp{sub}", user="scaleapp", mode="755")
files.put(name="config", src=__file__, dest="/opt/scaleapp/etc/deploy.py", mode="644")
files.line(name="motd", path="/etc/motd", line="managed by scaleapp")
# kernel settings as lines of a sysctl.d file: a sandbox host (a container) may not write
# /proc/sys, so pyinfra's server.sysctl, which applies them too, fails there
for key, value in (("vm.swappiness", 1), ("net.core.somaxconn", 65535)):
    files.line(name=key, path="/etc/sysctl.d/90-scaleapp.conf", line=f"{key} = {value}")
'''


def fleet_text(names: list[str]) -> str:
    """The stack-only fleet file of hosts ``names``.

    Example:
        >>> print(fleet_text(["scale-01"]).splitlines()[-1])
          scale-01: {address: sandbox}
    """
    hosts = "".join(f"  {name}: {{address: sandbox}}\n" for name in names)
    return ("version: 1\n"
            "defaults:\n"
            "  os:\n"
            "    sysctl: {vm.swappiness: 1, net.core.somaxconn: 65535, fs.file-max: 2097152}\n"
            '  vllm: {version: "0.32.0", variant: cpu}\n'
            "hosts:\n" + hosts)  # fmt: skip


def plain_inventory(names: list[str]) -> str:
    """A pyinfra inventory of the running sandbox hosts ``names``."""
    rows = []
    for name in names:
        data = sandbox.connection(name)
        assert data is not None, f"{name} is not running"
        rows.append((name, data))
    body = ",\n".join(f"    ({name!r}, {data!r})" for name, data in rows)
    return f"hosts = [\n{body},\n]\n"


def run(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Run a child to completion: its wall seconds, peak RSS in MB and output; a failure stops
    the benchmark."""
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
        took = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} … failed ({child.returncode}):\n{text[-3000:]}")
    return took, usage.ru_maxrss / 1024, text


def changes(output: str) -> str:
    """The changed-operation count of a pyinfra run, from its results table.

    Example:
        >>> changes("    Grand total   27   -   -   27"), changes("Grand total  11  3  -  8")
        ('0', '3')
    """
    match = re.search(r"Grand total\s+\d+\s+(\d+|-)", output)
    return "?" if match is None else ("0" if match.group(1) == "-" else match.group(1))


def one_size(size: int, tmp: Path) -> dict[str, float]:
    """Fresh hosts of one size: cold deploy, no-op deploy, plain pyinfra's no-op."""
    names = [f"scale-{i:02d}" for i in range(1, size + 1)]
    sandbox.down(names)
    sandbox.up({name: [] for name in names})
    fleet = tmp / f"fleet-{size}.yaml"
    fleet.write_text(fleet_text(names))
    env = dict(os.environ, FLEET=str(fleet))
    deploy = [PYINFRA, "-y", "inventory.py", "deploy.py"]
    cold, cold_mb, _ = run(deploy, env)
    noop, noop_mb, text = run(deploy, env)
    if changes(text) != "0":
        raise RuntimeError(f"the second deploy of {size} hosts changed {changes(text)}:\n"
                           f"{text[-3000:]}")
    inventory = tmp / f"plain-{size}.py"
    inventory.write_text(plain_inventory(names))
    role = tmp / "plain_deploy.py"
    role.write_text(PLAIN_DEPLOY)
    plain = [PYINFRA, "-y", str(inventory), str(role)]
    run(plain, dict(os.environ))
    plain_noop, plain_mb, text = run(plain, dict(os.environ))
    if changes(text) != "0":
        raise RuntimeError(f"plain pyinfra's second run changed {changes(text)}:\n{text[-2000:]}")
    return {"cold": cold, "noop": noop, "plain": plain_noop, "cold_mb": cold_mb,
            "noop_mb": noop_mb, "plain_mb": plain_mb}  # fmt: skip


def main() -> int:
    """Every size in turn; the table, then the ratios last."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--keep", action="store_true", help="leave the last size's hosts up")
    args = parser.parse_args()
    rows: dict[int, dict[str, float]] = {}
    print(f"{os.cpu_count()} CPUs; pyinfra at its default parallelism (every host at once)")
    print(f"{'hosts':>5} {'cold s':>8} {'no-op s':>8} {'plain s':>8} {'cold MB':>8} "
          f"{'no-op MB':>9} {'plain MB':>9}", flush=True)
    with tempfile.TemporaryDirectory(prefix="deploy-scale-") as tmp:
        for index, size in enumerate(args.sizes):
            try:
                row = rows[size] = one_size(size, Path(tmp))
            finally:
                last = index == len(args.sizes) - 1
                if not (args.keep and last):
                    sandbox.down([f"scale-{i:02d}" for i in range(1, size + 1)])
            print(f"{size:>5} {row['cold']:>8.1f} {row['noop']:>8.2f} {row['plain']:>8.2f} "
                  f"{row['cold_mb']:>8.0f} {row['noop_mb']:>9.0f} {row['plain_mb']:>9.0f}",
                  flush=True)
    first, last = rows[min(rows)], rows[max(rows)]
    print(f"ratios noop_vs_plain({min(rows)})={first['noop'] / first['plain']:.2f} "
          f"noop({max(rows)})/noop({min(rows)})={last['noop'] / first['noop']:.2f} "
          f"plain({max(rows)})/plain({min(rows)})={last['plain'] / first['plain']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
