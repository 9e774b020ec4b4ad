"""Render every host plan of every correct fleet file in two trees and print what differs.

For a change to the rendering (templates, emitters) that must not change correct files:
``python scripts/render_diff.py /work/wt/base .`` renders ``inventory/*.yaml``,
``inventory/examples/*.yaml`` and ``tests/data/valid/*.yaml`` with each tree's own code
(:func:`fleet.hostplan.render.host_plan`, a fixed stand-in secret, the monitoring files and the
ssh_config entry too) and prints, per host and field, the lines that differ. Exit 1 if any.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

#: Run inside each tree (its own ``fleet`` first on the path): every rendered text, as JSON.
DUMP = r"""
import dataclasses, glob, json, sys
from fleet.load import load_fleet
from fleet.hostplan.render import host_plan
try:
    from fleet.hostplan.monitoring import rendered_files
except ImportError:  # a tree from before fleet/sections/ was split by stage
    from fleet.sections.monitoring import rendered_files
from cli.remote import ssh_config_entry
from cli.inventory import connection_data
out = {}
for f in sorted(glob.glob("inventory/*.yaml") + glob.glob("inventory/examples/*.yaml")
                + glob.glob("tests/data/valid/*.yaml")):
    fleet = load_fleet(f)
    for h in fleet.hosts:
        plan = host_plan(fleet, h, secrets=lambda ref: 'S3cr3t "x" $y %n')
        d = dataclasses.asdict(plan)
        d["_monitoring_files"] = rendered_files(plan.monitoring)
        try:  # a sandbox host has connection data only while it runs
            d["_ssh"] = ssh_config_entry(h, connection_data(h, fleet.hosts[h], f))
        except Exception as error:
            d["_ssh"] = repr(error)
        out[f"{f}:{h}"] = d
json.dump(out, sys.stdout, sort_keys=True, default=repr)
"""


def dump(tree: Path) -> dict[str, Any]:
    """Every host plan of ``tree``'s corpus, rendered by ``tree``'s code."""
    done = subprocess.run([sys.executable, "-c", DUMP], cwd=tree, capture_output=True,
                          text=True, check=False, env={**os.environ, "PYTHONPATH": str(tree)})
    if done.returncode:
        raise SystemExit(f"rendering {tree} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def differences(old: Any, new: Any, path: str = "") -> list[str]:
    """What differs between two dumps, text fields as unified line diffs.

    Example:
        >>> differences({"a": "x\\ny"}, {"a": "x\\nz"})
        ['== /a', '   -y', '   +z']
    """
    if isinstance(old, dict) and isinstance(new, dict):
        return [line for key in sorted(set(old) | set(new))
                for line in differences(old.get(key), new.get(key), f"{path}/{key}")]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [line for index, (a, b) in enumerate(zip(old, new, strict=True))
                for line in differences(a, b, f"{path}/{index}")]
    if old == new:
        return []
    if isinstance(old, str) and isinstance(new, str):
        diff = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
        return [f"== {path}"] + [f"   {line}" for line in diff
                                 if not line.startswith(("---", "+++", "@@"))]
    return [f"== {path}", f"   old: {old!r:.300}", f"   new: {new!r:.300}"]


def main(argv: list[str]) -> int:
    old, new = (Path(arg).resolve() for arg in argv)
    found = differences(dump(old), dump(new))
    print("\n".join(found) if found else "no difference")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
