"""``fleet models``: check, list versions, roll back and prune the models on a fleet's hosts.

It works on the hosts of a fleet file over SSH, with the installer that the deploy put there
(``hostside/fetch_model.py``):

- ``fleet models check [--deep] [HOST [MODEL]]``: the quick check (sizes, modification times of
  every file against the manifest), or with ``--deep`` a re-hash of every file; exit 2 on drift;
- ``fleet models versions HOST MODEL``: the versions kept on the host;
- ``fleet models rollback HOST MODEL [--to ID]``: switch the model back to the previous (or the
  given) version, then restart the servers that use it and check they answer. The fleet file
  still names the newer version: the next deploy switches forward again, unless the fleet file
  is changed back too (which is the declarative rollback: the old version is still on disk,
  so that deploy only switches and restarts, without downloading);
- ``fleet models prune [HOST] [--yes]``: the models on the hosts that the fleet file no longer
  uses, with their size; ``--yes`` removes them. The deploy never deletes model data by
  itself (a model taken out by mistake would cost its whole download again), and the host's
  installer refuses to remove a model that a vLLM unit still names.

Example:
    $ fleet models check --deep sandbox-1
    $ fleet models rollback sandbox-1 tiny-llama
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from typing import Any

from rich.table import Table

from cli import remote
from cli.console import connect, err, out
from fleet.catalog.paths import MODELS_DIR, program_command, remote_program
from fleet.hostplan.types import HostPlan, plan_of
from fleet.planner.fit import gib

INSTALLER = remote_program("fetch_model")


# --------------------------------------------------------------------------------------------
# fleet models
# --------------------------------------------------------------------------------------------


def installer_command(action: str, model: str, *extra: str) -> str:
    """The shell command that runs the host's installer for one model.

    Example:
        >>> installer_command("check", "tiny", "--deep", "--json")
        'python3 /usr/local/lib/vllm-fleet/hostside/fetch_model.py check --name tiny --models-dir /var/lib/vllm-fleet/models --deep --json'
    """  # noqa: E501
    return shlex.join(
        program_command("fetch_model", action, "--name", model, "--models-dir", MODELS_DIR, *extra)
    )


def _targets(hosts: list[tuple[str, dict]], host: str | None, model: str | None):
    for name, data in hosts:
        if host not in (None, name):
            continue
        for entry in plan_of(data).models:
            if model in (None, entry.name):
                yield name, data, entry


def undeclared(installed: list[dict[str, Any]], plan: HostPlan) -> list[dict[str, Any]]:
    """The installed models (installer ``list``) that a host's plan does not use.

    Example:
        >>> from fleet.load import load_fleet
        >>> from fleet.hostplan.render import host_plan
        >>> plan = host_plan(load_fleet("inventory/sandbox.yaml"), "sandbox-1",
        ...                  secrets=lambda ref: "")
        >>> undeclared([{"name": "tiny-llama"}, {"name": "old"}], plan)
        [{'name': 'old'}]
    """
    declared = {model.name for model in plan.models}
    return [model for model in installed if model["name"] not in declared]


def cmd_models(args: argparse.Namespace) -> int:
    """``fleet models check|versions|rollback|prune``."""
    hosts = connect(args.fleet)
    if hosts is None:
        return 1
    if args.action == "prune":
        return _prune(hosts, args.host, args.yes, out, err, remote, Table)
    targets = list(_targets(hosts, args.host, args.model))
    if not targets:
        err.print(f"no model {args.model or ''} on host {args.host or '(any)'} in {args.fleet}")
        return 1
    if args.action == "check":
        return _check(targets, args.deep, out, err, remote, Table)
    if args.host is None or args.model is None:
        err.print(f"fleet models {args.action} needs HOST and MODEL")
        return 1
    name, data, entry = targets[0]
    if args.action == "versions":
        result = remote.run(data, installer_command("versions", entry.name))
        if result.returncode != 0:
            err.print(f"{name}: {result.stderr.strip()}", markup=False)
            return 1
        table = Table("version", "id", "installed", "live")
        for version in json.loads(result.stdout or "[]"):
            table.add_row(version["version"], str(version["id"])[:16],
                          _when(version.get("installed_at")), "●" if version["live"] else "")
        out.print(table)
        return 0
    return _rollback(name, data, entry, args.to, out, err, remote)


def _when(stamp: float | None) -> str:
    if not stamp:
        return "?"
    return datetime.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M")


def _check(targets, deep: bool, out, err, remote, table_class) -> int:
    table = table_class("host", "model", "version", "check", "status", "problems")
    status = 0
    lines: list[str] = []
    for name, data, entry in targets:
        deep_flag = ["--deep"] if deep else []
        result = remote.run(
            data, installer_command("check", entry.name, "--json", *deep_flag),
            timeout=24 * 3600,
        )
        try:
            report = json.loads(result.stdout)
        except ValueError:
            table.add_row(name, entry.name, "?", "?", "[red]error[/]",
                          (result.stderr.strip() or "no answer")[-200:])
            status = max(status, 1)
            continue
        want = (entry.id or "")[:16]
        problems = [f"{p['path']}: {p['problem']}" for p in report["problems"]]
        if report["installed"] and report.get("id") and not report["id"].startswith(want):
            problems.insert(0, f"live version {report['version']}, the fleet file names {want}")
        if not report["installed"]:
            problems = problems or ["not installed"]
        state = "[green]ok[/]" if not problems else "[red]drift[/]"
        if problems:
            status = 2
        table.add_row(name, entry.name, report.get("version") or "—",
                      "deep" if deep else "quick", state, str(len(problems)))
        lines += [f"{name} {entry.name}: {problem}" for problem in problems]
    out.print(table)
    for line in lines:
        out.print(line, markup=False, soft_wrap=True)
    if status == 2:
        err.print("repair: deploy again (a damaged version is downloaded and switched anew; "
                  "after a deep check, deploy with `--data model_check=deep`)")
    return status


def _rollback(name, data, entry, to, out, err, remote) -> int:
    result = remote.run(data, installer_command("rollback", entry.name,
                                                *(["--to", to] if to else [])))
    if result.returncode != 0:
        err.print(f"{name}: {result.stderr.strip()}", markup=False, soft_wrap=True)
        return 1
    out.print(result.stdout.strip(), markup=False)
    plan = plan_of(data)
    servers = plan.servers_of(entry.name)
    python = plan.python_bin
    for server in servers:
        restart = remote.run(data, f"systemctl restart {shlex.quote(server.unit)}",
                             timeout=1800)
        if restart.returncode != 0:
            err.print(f"{name}: restart of {server.unit} failed: {restart.stderr.strip()}",
                      markup=False)
            return 1
        ready = remote.run(
            data,
            shlex.join(program_command("check_ready", "--url", server.url, "--model",
                                       server.served_name, "--env-file", server.env_path,
                                       *server.reach.probe_args, python=python)),
            timeout=900,
        )
        if ready.returncode != 0:
            err.print(f"{name}: {server.unit} restarted but does not answer: "
                      f"{ready.stderr.strip()}", markup=False)
            return 1
        out.print(f"{name}: restarted {server.unit}; it answers a completion")
    out.print(
        f"the fleet file still names {str(entry.id)[:16]} for {entry.name}: the next "
        "deploy switches forward again unless you change it back there too"
    )
    return 0


def _prune(hosts, only: str | None, yes: bool, out, err, remote, table_class) -> int:
    table = table_class("host", "model", "live version", "versions", "size", "action")
    status = 0
    found = 0
    for name, data in hosts:
        if only not in (None, name):
            continue
        listing = remote.run(data, shlex.join(
            program_command("fetch_model", "list", "--models-dir", MODELS_DIR)))
        try:
            models = undeclared(json.loads(listing.stdout), plan_of(data))
        except ValueError:
            err.print(f"{name}: cannot list models: "
                      f"{(listing.stderr.strip() or 'no answer')[-300:]}", markup=False)
            status = 1
            continue
        for model in models:
            found += 1
            action = "kept (dry run)"
            if yes:
                result = remote.run(data, installer_command("remove", model["name"]))
                if result.returncode == 0:
                    action = "removed"
                else:
                    action = "[red]refused[/]"
                    err.print(f"{name}: {result.stderr.strip()}", markup=False, soft_wrap=True)
                    status = 1
            table.add_row(name, model["name"], model.get("live") or "—",
                          str(model["versions"]), gib(model["bytes"]), action)
    if found:
        out.print(table)
        if not yes:
            out.print("not in the fleet file: run again with --yes to remove them")
    elif status == 0:
        out.print("every installed model is in the fleet file: nothing to prune")
    return status


def add_parser(sub: Any, default: str) -> None:
    """Add ``fleet models`` to the ``fleet`` command's subparsers."""
    models = sub.add_parser(
        "models",
        help="check installed models (quick or --deep), list versions, roll back, prune",
    )
    models.add_argument("action", choices=["check", "versions", "rollback", "prune"])
    models.add_argument("host", nargs="?", help="inventory host name (default: all, for check)")
    models.add_argument("model", nargs="?", help="model name (default: all, for check)")
    models.add_argument("--fleet", default=default, help="fleet file")
    models.add_argument("--deep", action="store_true", help="re-hash every file (check)")
    models.add_argument("--to", help="version id prefix to roll back to")
    models.add_argument("--yes", action="store_true",
                        help="prune: remove the models (default: only list them)")
    models.set_defaults(func=cmd_models)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: fleet models ...")
