"""Install the declared NVIDIA driver (and fabric manager at exactly its version), then hold them.

Runs on the host (standard library only), called by ``deploys.nvidia.driver_installed`` only
when the installed packages differ from the declaration. The version is chosen here, at run
time, because the repository it comes from may only just have been added:

- an installed driver that satisfies the declaration (branch ``570`` or version ``570.172.08``)
  is kept: a branch means "the newest of the branch when first installed, then held";
- otherwise the newest version of the repository that satisfies it, and that every other
  package (fabric manager included) also has, is installed: one ``apt-get install`` with every
  package at that exact version, so driver and fabric manager move together;
- everything is held afterwards (``apt-mark hold``).

Prints ``driver: OLD -> NEW`` (OLD is ``none`` on a fresh host). Exit 1 with a message saying
what to do when the repository has no matching version.

    nvidia_driver.py '{"declared": "570", "packages": ["nvidia-driver", ...],
                       "probe": "nvidia-driver", "unhold": [...], "origin": URL}'

Example:
    >>> upstream("1:570.172.08-0ubuntu1")
    '570.172.08'
    >>> matches("570", "570.172.08"), matches("570.172.08", "570.172.0")
    (True, False)
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

ENV = dict(os.environ, DEBIAN_FRONTEND="noninteractive")


def upstream(version: str) -> str:
    """A package version without epoch and Debian revision."""
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


def matches(declared: str, version: str) -> bool:
    """Whether an upstream version satisfies a declared branch or version."""
    return version == declared or version.startswith(declared + ".")


def run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, env=ENV)
    if result.returncode != 0:
        sys.exit(f"`{' '.join(argv)}` failed (exit {result.returncode}):\n"
                 f"{(result.stderr or result.stdout).strip()[-3000:]}")
    return result.stdout


def available(package: str, origin: str = "") -> list[str]:
    """Versions the repositories offer for ``package`` (only from URLs containing ``origin``)."""
    out = subprocess.run(["apt-cache", "madison", package], capture_output=True, text=True,
                         env=ENV).stdout
    versions = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and parts[0] == package and origin in parts[2]:
            versions.append(parts[1])
    return list(dict.fromkeys(versions))


def installed(package: str) -> str | None:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version} ${Status}", package],
        capture_output=True, text=True, env=ENV,
    ).stdout.split()  # fmt: skip
    return out[0] if out and out[-1] == "installed" else None


def newest(versions: list[str]) -> str:
    def compare(a: str, b: str) -> int:
        if a == b:
            return 0
        lower = subprocess.run(["dpkg", "--compare-versions", a, "lt", b]).returncode == 0
        return -1 if lower else 1

    return max(versions, key=functools.cmp_to_key(compare))


def main(spec: dict) -> int:
    declared: str = spec["declared"]
    packages: list[str] = spec["packages"]
    run("apt-get", "update", "-q")
    offered = {package: available(package, spec.get("origin", "")) for package in packages}
    current = installed(spec["probe"])
    candidates = {upstream(v) for v in offered[spec["probe"]] if matches(declared, upstream(v))}
    if current and matches(declared, upstream(current)):
        candidates = {upstream(current)}
    usable = [
        v for v in sorted(candidates)
        if all(any(upstream(o) == v for o in offered[p]) for p in packages)
    ]  # fmt: skip
    if not usable:
        listing = "; ".join(
            f"{p}: {', '.join(upstream(v) for v in offered[p]) or 'none'}" for p in packages
        )
        sys.exit(f"no version satisfying driver {declared!r} is offered for all of "
                 f"{', '.join(packages)} (offered: {listing}); check the repository, or declare "
                 "a version it has")
    target = newest(usable)
    exact = [f"{p}={next(v for v in offered[p] if upstream(v) == target)}" for p in packages]
    held = set(run("apt-mark", "showhold").split())
    # another branch's fabric manager conflicts with this one's: release it too
    others = {h for h in held if h.startswith("nvidia-fabricmanager-") and h not in packages}
    unhold = sorted(set(spec.get("unhold", [])) | set(packages) | others)
    if held & set(unhold):
        run("apt-mark", "unhold", *sorted(held & set(unhold)))
    run("apt-get", "install", "-y", "-q", "--allow-downgrades", "--allow-change-held-packages",
        "-o", "Dpkg::Options::=--force-confold", *exact)
    run("apt-mark", "hold", *packages)
    print(f"driver: {upstream(current) if current else 'none'} -> {target} "
          f"({', '.join(exact)}; held)")
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
