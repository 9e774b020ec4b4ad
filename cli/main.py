"""The ``fleet`` command: check, plan, render, sandbox, modelserver, verify, complete, bench,
schema.

Example:
    $ fleet check inventory/sandbox.yaml
    inventory/sandbox.yaml: valid — 1 host, 1 server, 1 model
    $ fleet sandbox up
    $ pyinfra -y inventory.py deploy.py
    $ fleet verify
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.table import Table

from cli import remote
from cli.bench.command import add_parser as add_bench_parser
from cli.console import connect, err, out, plural, report
from cli.doctor.command import add_parser as add_doctor_parser
from cli.drift.command import add_parser as add_drift_parser
from cli.inventory import DEFAULT_FLEET, fleet_path
from cli.models import add_parser as add_models_parser
from cli.planplace import cmd_plan_place
from cli.planview import placed_lines, print_table, reasons, tables, write_lines
from cli.status.command import add_parser as add_status_parser
from fleet.hostplan.monitoring import rendered_files
from fleet.hostplan.render import host_plan
from fleet.hostplan.types import plan_of
from fleet.load import load_fleet
from fleet.planner.fit import plan_fleet
from fleet.read.problems import FleetError
from fleet.spec.schema import fleet_schema
from sandbox import hosts as sandbox
from sandbox import modelserver
from sandbox.system import SandboxError

#: The testinfra suite that ``fleet verify`` runs (shipped inside this package).
VERIFY_SUITE = Path(__file__).resolve().parent / "verify_suite"
#: The tiny test model's folder in a checkout (``fleet modelserver``'s default).
TESTMODEL = Path(__file__).resolve().parent.parent / "testmodel"


def _load_or_report(path: str, capacity: bool = True, warnings: list | None = None):
    try:
        return load_fleet(path, capacity=capacity, warnings=warnings)
    except FleetError as error:
        report(path, error)
        return None


def cmd_check(args: argparse.Namespace) -> int:
    """Validate fleet files (capacity included); exit 1 if any is invalid, 0 for warnings."""
    status = 0
    for path in args.files:
        warnings: list = []
        fleet = _load_or_report(path, warnings=warnings)
        if fleet is None:
            status = 1
            continue
        servers = sum(len(h.servers) for h in fleet.hosts.values())
        out.print(
            f"{path}: [green]valid[/] — {plural(len(fleet.hosts), 'host')}, "
            f"{plural(servers, 'server')}, {plural(len(fleet.models), 'model')}"
            + (f", [yellow]{plural(len(warnings), 'warning')}[/]" if warnings else "")
        )
        for warning in warnings:
            err.print(f"  {warning}", markup=False, soft_wrap=True)
    return status


def cmd_plan(args: argparse.Namespace) -> int:
    """Print each server's memory plan; exit 1 if a server or GPU does not fit."""
    if args.write and not args.place:
        err.print("--write writes the gpus that --place chooses: give both", markup=False)
        return 2
    if args.place or args.from_host is not None:
        return cmd_plan_place(args)
    fleet = _load_or_report(args.fleet, capacity=False)
    if fleet is None:
        return 1
    plan = plan_fleet(fleet)
    if args.json:
        write_lines(out, [json.dumps(plan.to_json(), indent=2)])
    else:
        for table in tables(plan):
            print_table(out, table)
        write_lines(out, reasons(plan) + placed_lines(fleet))
    bad = [s for s in plan.servers if s.fits is False] + [g for g in plan.gpus if g.fits is False]
    return 1 if bad else 0


def cmd_render(args: argparse.Namespace) -> int:
    """Print each server's unit and environment file (secrets masked), and the host's
    monitoring files."""
    fleet = _load_or_report(args.fleet)
    if fleet is None:
        return 1
    for name in fleet.hosts:
        if args.host and name != args.host:
            continue
        plan = host_plan(fleet, name, secrets=lambda ref: "********")
        for server in plan.servers:
            if server.ray_head is not None:  # the Ray head the server's unit requires
                out.rule(f"{name}: {server.ray_head.unit_path}")
                out.print(server.ray_head.unit_text, markup=False, soft_wrap=True)
            out.rule(f"{name}: {server.unit_path}")
            out.print(server.unit_text, markup=False, soft_wrap=True)
            out.rule(f"{name}: {server.env_path} (0600)")
            out.print(server.env_text, markup=False, soft_wrap=True)
            for tls_file in server.tls.files if server.tls else ():
                handed = ("the probes' CA file" if tls_file.part == "ca" else
                          f"handed to {server.unit} alone by LoadCredential=tls-{tls_file.part}")
                out.print(f"{tls_file.path} (root, 0600; TLS {tls_file.part}, {handed}; "
                          "content not shown)", markup=False, soft_wrap=True)
        for path, text in rendered_files(plan.monitoring):
            out.rule(f"{name}: {path}")
            out.print(text, markup=False, soft_wrap=True)
        prometheus = plan.monitoring.prometheus if plan.monitoring else None
        for ca in prometheus.ca_files if prometheus else ():
            out.print(f"{ca.path} (root:prometheus, 0640; the CA Prometheus trusts for "
                      f"{ca.server}; content not shown)", markup=False, soft_wrap=True)
        for router in plan.routers:
            out.rule(f"{name}: {router.unit_path} (endpoint {router.endpoint})")
            out.print(router.unit_text, markup=False, soft_wrap=True)
    return 0


def _sandbox_hosts(fleet) -> dict[str, list[int]]:
    return {
        name: [server.port for server in host.servers.values()]
        for name, host in fleet.hosts.items()
        if host.is_sandbox
    }


def _status_table(hosts) -> Table:
    table = Table("host", "state", "ssh port", "service ports", "pid")
    for host in hosts:
        colour = {"running": "green", "stopped": "yellow"}.get(host.state, "dim")
        table.add_row(
            host.name,
            f"[{colour}]{host.state}[/]",
            str(host.ssh_port or "—"),
            ", ".join(str(p) for p in host.ports) or "—",
            str(host.pid or "—"),
        )
    return table


def cmd_sandbox(args: argparse.Namespace) -> int:
    """Start, stop or show the sandbox hosts of a fleet file."""
    fleet = _load_or_report(args.fleet)
    if fleet is None:
        return 1
    hosts = _sandbox_hosts(fleet)
    if not hosts:
        err.print(f"{args.fleet} has no host with address: sandbox")
        return 1
    try:
        if args.action == "up":
            result = sandbox.up(hosts)
        elif args.action == "down":
            result = sandbox.down(list(hosts))
        else:
            result = sandbox.status(list(hosts))
            for host in result:
                host.ports = hosts.get(host.name, host.ports)
    except SandboxError as error:
        err.print(f"[bold red]sandbox {args.action} failed:[/] {error}", markup=True)
        return 1
    out.print(_status_table(result))
    return 0


def cmd_modelserver(args: argparse.Namespace) -> int:
    """Serve model archives on loopback (for the sandbox fleet and tests)."""
    try:
        if args.action == "start":
            pid = modelserver.start(args.dir, port=args.port)
            out.print(f"serving {args.dir} on http://127.0.0.1:{args.port}/ (pid {pid})")
        elif args.action == "stop":
            modelserver.stop(port=args.port)
            out.print(f"model server on port {args.port} stopped")
        else:
            out.print(str(modelserver.status(port=args.port)))
    except (OSError, RuntimeError, ValueError) as error:
        err.print(f"[bold red]modelserver {args.action} failed:[/] {error}")
        return 1
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Run the testinfra suite (cli/verify_suite) against every host of a fleet."""
    hosts = connect(args.fleet)
    if hosts is None:
        return 1
    with tempfile.TemporaryDirectory(prefix="fleet-verify-") as tmp:
        config = Path(tmp) / "ssh_config"
        config.write_text("".join(remote.ssh_config_entry(name, data) for name, data in hosts))
        env = dict(os.environ, FLEET=str(Path(args.fleet).resolve()), FLEET_SSH_CONFIG=str(config))
        argv = [
            sys.executable, "-m", "pytest", str(VERIFY_SUITE),
            "-p", "no:cacheprovider", "--rootdir", str(VERIFY_SUITE),
            "-o", "addopts=", *args.pytest_args,
        ]
        return subprocess.call(argv, env=env, cwd=tmp)




def cmd_complete(args: argparse.Namespace) -> int:
    """Ask a deployed server for a completion (run on its host over SSH) and print it."""
    hosts = connect(args.fleet)
    if hosts is None:
        return 1
    if args.endpoint:
        return _complete_endpoint(args, hosts)
    targets = [
        (name, data, server)
        for name, data in hosts
        for server in plan_of(data).servers
        if args.server in (None, f"{name}/{server.name}", server.name)
    ]
    if not targets:
        err.print(f"no server {args.server!r} in {args.fleet}")
        return 1
    name, data, server = targets[0]
    body = {"model": server.served_name, "prompt": args.prompt, "max_tokens": args.max_tokens}
    payload = {
        "url": server.url,
        "port": server.port,
        "path": "/v1/completions",
        "body": body,
        "env_file": server.env_path,
        **server.reach.trust,
    }
    result = remote.run(data, remote.REQUEST_COMMAND, json.dumps(payload))
    answer = json.loads(result.stdout) if result.returncode == 0 else None
    if answer is None or answer["status"] != 200:
        why = result.stderr.strip() if answer is None else f"HTTP {answer['status']}"
        err.print(f"[bold red]{name}/{server.name} did not answer:[/] {why}")
        return 1
    reply = json.loads(answer["body"])
    text = reply["choices"][0]["text"]
    usage = reply.get("usage", {})
    out.print(f"[bold]{name}/{server.name}[/] ({server.served_name}) answered "
              f"{usage.get('completion_tokens', '?')} tokens:")
    out.print(repr(args.prompt + text), markup=False)
    return 0


def _complete_endpoint(args: argparse.Namespace, hosts) -> int:
    """``fleet complete --endpoint NAME``: one completion through the endpoint's router, made on
    the router's host with the key from its 0600 file there."""
    routers = [
        (name, data, router)
        for name, data in hosts
        for router in plan_of(data).routers
        if router.endpoint == args.endpoint
    ]
    if not routers:
        err.print(f"no endpoint {args.endpoint!r} in {args.fleet}")
        return 1
    name, data, router = routers[0]
    body = {"model": router.served_name, "prompt": args.prompt, "max_tokens": args.max_tokens}
    payload = {"url": router.url, "port": router.port, "path": "/v1/completions", "body": body,
               "env_file": router.env_path}
    result = remote.run(data, remote.REQUEST_COMMAND, json.dumps(payload))
    answer = json.loads(result.stdout) if result.returncode == 0 else None
    if answer is None or answer["status"] != 200:
        why = result.stderr.strip() if answer is None else (
            f"HTTP {answer['status']}: {answer['body'][:300]}")
        err.print(f"[bold red]endpoint {args.endpoint} (router on {name}) did not answer:[/] {why}")
        return 1
    reply = json.loads(answer["body"])
    usage = reply.get("usage", {})
    out.print(f"[bold]endpoint {args.endpoint}[/] ({router.served_name}, router on {name}) "
              f"answered {usage.get('completion_tokens', '?')} tokens:")
    out.print(repr(args.prompt + reply["choices"][0]["text"]), markup=False)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    """Print the fleet file's JSON Schema."""
    out.print(json.dumps(fleet_schema(), indent=2), markup=False, soft_wrap=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fleet``."""
    parser = argparse.ArgumentParser(prog="fleet", description="Declarative vLLM hosts.")
    sub = parser.add_subparsers(dest="command", required=True)
    default = str(fleet_path()) if os.environ.get("FLEET") else DEFAULT_FLEET

    check = sub.add_parser("check", help="validate fleet files")
    check.add_argument("files", nargs="+")
    check.set_defaults(func=cmd_check)

    plan = sub.add_parser("plan", help="memory plan: weights, KV cache, concurrency per server")
    plan.add_argument("fleet", nargs="?", default=default)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("--place", action="store_true",
                      help="choose GPUs for servers that declare none, and say why")
    plan.add_argument("--write", action="store_true",
                      help="with --place: write the chosen gpus into the fleet file")
    plan.add_argument("--from-host", nargs="?", const="", default=None, metavar="HOST",
                      help="read the GPUs of HOST (every GPU host if none is named) over SSH "
                      "and plan against what is free there")
    plan.set_defaults(func=cmd_plan)

    render = sub.add_parser("render", help="print the units and environment files")
    render.add_argument("fleet", nargs="?", default=default)
    render.add_argument("--host")
    render.set_defaults(func=cmd_render)

    sandbox = sub.add_parser("sandbox", help="local systemd containers as hosts")
    sandbox.add_argument("action", choices=["up", "down", "status"])
    sandbox.add_argument("fleet", nargs="?", default=default)
    sandbox.set_defaults(func=cmd_sandbox)

    models = sub.add_parser("modelserver", help="serve model archives on loopback")
    models.add_argument("action", choices=["start", "stop", "status"])
    models.add_argument("--dir", default=str(TESTMODEL))
    models.add_argument("--port", type=int, default=8765)
    models.set_defaults(func=cmd_modelserver)

    verify = sub.add_parser(
        "verify",
        help="run the testinfra suite against the fleet's hosts (extra options go to pytest)",
    )
    verify.add_argument("fleet", nargs="?", default=default)
    verify.set_defaults(func=cmd_verify)

    complete = sub.add_parser("complete", help="ask a deployed server for a completion")
    complete.add_argument("fleet", nargs="?", default=default)
    complete.add_argument("--server", help="HOST/SERVER or SERVER (default: the first)")
    complete.add_argument("--endpoint", help="an endpoint: through its router")
    complete.add_argument("--prompt", default="The capital of France is")
    complete.add_argument("--max-tokens", type=int, default=16)
    complete.set_defaults(func=cmd_complete)

    add_bench_parser(sub, default)
    add_drift_parser(sub, default)
    add_models_parser(sub, default)
    add_status_parser(sub, default)
    add_doctor_parser(sub, default)

    schema = sub.add_parser("schema", help="print the fleet file's JSON Schema")
    schema.set_defaults(func=cmd_schema)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fleet`` console script."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "verify":
        args.pytest_args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
