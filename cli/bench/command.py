"""``fleet bench``: load-test a server of the fleet (or any OpenAI-compatible URL).

Example:
    $ fleet bench --server sandbox-1/tiny --concurrency 1..16 --slo ttft=500ms,tpot=50ms
    $ fleet bench --url http://127.0.0.1:8000 --rate 1,2,4 --duration 30 --api chat

The parser is built without importing aiohttp or matplotlib, so other commands stay quick:

    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_parser(parser.add_subparsers(), "inventory/sandbox.yaml")
    >>> args = parser.parse_args(["bench", "--url", "http://127.0.0.1:1", "--concurrency", "1,2"])
    >>> [s.concurrency for s in steps_from_args(args)], [s.requests for s in steps_from_args(args)]
    ([1, 2], [10, 10])
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from cli.bench import compare, plancommand
from cli.bench import report as reports
from cli.bench.tunnel import Tunnel, TunnelError
from cli.console import err, out
from cli.inventory import connection_data
from cli.remote import ssh_command
from fleet.hostplan.secrets import read_secret
from fleet.hostplan.tls import trusted_text
from fleet.load import load_fleet
from fleet.planner.endpoints import client_url, served_name
from fleet.planner.reach import server_reach
from fleet.read.problems import FleetError
from fleet.spec.addresses import bracket, is_any, is_loopback, local_address
from fleet.spec.models import Variant
from loadgen import trust
from loadgen.gpu import nvidia_smi_command
from loadgen.prompts import PromptError, load_jsonl, synthetic_prompts
from loadgen.runner import (
    Options,
    Runner,
    Step,
    Target,
    parse_loads,
    served_model,
    server_tokenizer,
)
from loadgen.stats import parse_slo


def add_parser(sub: Any, default_fleet: str) -> None:
    """Add the ``bench`` subcommand to ``fleet``'s subparsers."""
    bench = sub.add_parser(
        "bench",
        help="load-test a server: TTFT, TPOT, ITL, throughput, knee, goodput",
        description="Streamed OpenAI requests against one server, step by step; writes JSON, "
        "CSV and a PNG plot, and prints a summary table. Warm-up requests are excluded.",
    )
    bench.add_argument("fleet", nargs="?", default=default_fleet)
    where = bench.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="HOST/SERVER (or SERVER) of the fleet file")
    where.add_argument("--url", help="base URL of an OpenAI-compatible server instead")
    where.add_argument("--endpoint", help="an endpoint of the fleet file: through its router")
    where.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"),
                       help="what changed between two run directories of --plan")
    bench.add_argument("--model", help="model name (--url; default: the server's first)")
    bench.add_argument("--api-key-env", metavar="VAR",
                       help="environment variable holding the API key (--url)")
    bench.add_argument("--api", choices=["completions", "chat"], default="completions")
    load = bench.add_mutually_exclusive_group()
    load.add_argument("--concurrency", metavar="LOADS",
                      help="closed-loop steps: N, a list 1,2,4 or a ladder 1..64 (default 1..16)")
    load.add_argument("--rate", metavar="LOADS",
                      help="open-loop steps, Poisson arrivals in requests/s: R, a list or a ladder")
    bench.add_argument("--max-concurrency", type=int,
                       help="cap on requests in flight with --rate")
    bench.add_argument("--requests", type=int,
                       help="measured requests per step (default: max(10, 4 × load))")
    bench.add_argument("--duration", type=float, metavar="SECONDS",
                       help="measure each step for this long instead of a request count")
    bench.add_argument("--warmup", type=int,
                       help="warm-up requests per step, excluded (default: the step's concurrency, "
                       "2 with --rate)")
    bench.add_argument("--prompts", metavar="FILE.jsonl",
                       help='prompts, one JSON object a line: {"prompt": …} or {"messages": …}, '
                       'optional "output_tokens"')
    bench.add_argument("--input-len", type=int, default=128,
                       help="input tokens of synthetic prompts (default 128)")
    bench.add_argument("--output-len", type=int, default=64,
                       help="output tokens per request (default 64)")
    bench.add_argument("--num-prompts", type=int, default=64,
                       help="distinct synthetic prompts (default 64)")
    bench.add_argument("--natural-eos", action="store_true",
                       help="let answers end at EOS (default: exactly --output-len tokens)")
    bench.add_argument("--slo", help="SLOs for goodput, e.g. ttft=500ms,tpot=50ms (also itl, e2e)")
    bench.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--extra-body", metavar="JSON",
                       help='more request fields, e.g. \'{"temperature": 0}\'')
    bench.add_argument("--tunnel", choices=["auto", "always", "never"], default="auto",
                       help="SSH port forward to the server (auto: for all but sandbox hosts)")
    bench.add_argument("--out", metavar="DIR",
                       help="where bench.json, bench.csv, bench.png go "
                       "(default bench-results/<time>)")
    bench.add_argument("--no-metrics", action="store_true",
                       help="do not scrape the server's /metrics")
    bench.add_argument("--sample-interval", type=float, default=1.0,
                       help="seconds between /metrics and GPU samples")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    plancommand.add_arguments(bench)
    bench.set_defaults(func=cmd_bench)


def _default_requests(load: float) -> int:
    return max(10, math.ceil(4 * load))


def steps_from_args(args: argparse.Namespace) -> list[Any]:
    """The load steps the options ask for (raises ValueError on a bad value)."""
    if args.requests is not None and args.requests < 1:
        raise ValueError("--requests must be at least 1")
    if args.duration is not None and args.duration <= 0:
        raise ValueError("--duration must be positive")
    if args.warmup is not None and args.warmup < 0:
        raise ValueError("--warmup cannot be negative")
    steps = []
    if args.rate:
        for rate in parse_loads(args.rate, integer=False):
            steps.append(Step(
                rate=rate,
                max_concurrency=args.max_concurrency,
                requests=None if args.duration else args.requests or _default_requests(rate),
                duration=args.duration,
                warmup=2 if args.warmup is None else args.warmup,
            ))
        return steps
    for concurrency in parse_loads(args.concurrency or "1..16"):
        steps.append(Step(
            concurrency=concurrency,
            requests=None if args.duration else args.requests or _default_requests(concurrency),
            duration=args.duration,
            warmup=concurrency if args.warmup is None else args.warmup,
        ))
    return steps


@dataclass
class Resolved:
    """A target with what the command needs around it: notes, GPU argv, its fleet host."""

    base_url: str
    model: str | None
    api_key: str | None = field(default=None, repr=False)
    name: str = ""
    gpu_argv: list[str] | None = None
    notes: list[str] = field(default_factory=list)
    tunnel: Any = None
    ca_pem: str = field(default="", repr=False)
    tls_name: str = ""

    def target(self, api: str) -> Target:
        """The load generator's target: its URL, model, key, and https trust (a TLS server's
        CA from the fleet file, checked for the name its certificate covers)."""
        return Target(self.base_url, self.model or "", api, self.api_key, self.name,
                      ca_pem=self.ca_pem, tls_name=self.tls_name)


class BenchError(Exception):
    """The benchmark cannot start; the message says why."""


@contextlib.contextmanager
def resolve_target(args: argparse.Namespace) -> Iterator[Resolved]:
    """The server to load, from ``--url`` or the fleet file (opening an SSH tunnel if needed)."""
    if args.url:
        key = None
        if args.api_key_env:
            key = os.environ.get(args.api_key_env)
            if not key:
                raise BenchError(f"environment variable {args.api_key_env} is not set")
        yield Resolved(
            base_url=args.url.rstrip("/").removesuffix("/v1"),
            model=args.model,
            api_key=key,
            name=args.url,
            notes=["no fleet host (--url): no GPU sampling"],
        )
        return

    try:
        fleet = load_fleet(args.fleet)
    except FleetError as error:
        raise BenchError(
            f"{args.fleet}: invalid\n" + "\n".join(f"  {p}" for p in error.problems)
        ) from None
    if getattr(args, "endpoint", None):
        with _endpoint_target(args, fleet) as resolved:
            yield resolved
        return
    matches = [
        (host_name, server_name)
        for host_name, host in fleet.hosts.items()
        for server_name in host.servers
        if args.server in (f"{host_name}/{server_name}", server_name)
    ]
    if not matches:
        raise BenchError(f"no server {args.server!r} in {args.fleet}")
    if len(matches) > 1:
        raise BenchError(
            f"{args.server!r} names several servers; say which: "
            + ", ".join(f"{h}/{s}" for h, s in matches)
        )
    host_name, server_name = matches[0]
    host = fleet.hosts[host_name]
    server = host.servers[server_name]
    try:
        data = connection_data(host_name, host, str(args.fleet))
        key = read_secret(server.api_key) if server.api_key is not None else None
    except FleetError as error:
        raise BenchError("\n".join(str(p) for p in error.problems)) from None
    except ValueError as error:
        raise BenchError(f"{host_name}/{server_name}: API key: {error}") from None
    reach = server_reach(server, host.address)
    resolved = Resolved(
        base_url="",
        model=server.served_name,
        api_key=key,
        name=f"{host_name}/{server_name}",
    )
    if server.tls is not None:  # its CA, read here as fleet check reads it; its certificate's name
        try:
            resolved.ca_pem = trusted_text(server.tls, read_secret)
        except ValueError as error:
            raise BenchError(f"{host_name}/{server_name}: tls: {error}") from None
        resolved.tls_name = reach.tls_name
        resolved.notes.append(f"https trusting the CA of the fleet file's tls, for the name "
                              f"{reach.tls_name}")
    if host.vllm.variant is Variant.cpu:
        resolved.notes.append(f"{host_name} is a cpu host: no GPU sampling")
    else:
        resolved.gpu_argv = ssh_command(data, nvidia_smi_command(
            max(100, int(args.sample_interval * 1000))))
    use_tunnel = args.tunnel == "always" or (args.tunnel == "auto" and not host.is_sandbox)
    if not use_tunnel:
        if not host.is_sandbox:
            resolved.notes.append("--tunnel never: connecting to the host's address directly")
        # from the control machine: where it listens (a sandbox shares this machine's network),
        # or the host's address for every interface
        resolved.base_url = reach.url if host.is_sandbox else reach.at(
            host.address if is_any(server.host) else server.host).url
        yield resolved
        return
    tunnel = Tunnel(data, remote_port=reach.port, remote_host=reach.address)
    try:
        local = tunnel.open()
    except TunnelError as error:
        raise BenchError(str(error)) from None
    resolved.tunnel = tunnel
    resolved.base_url = f"{reach.scheme}://127.0.0.1:{local}"
    resolved.notes.append(f"through an SSH port forward 127.0.0.1:{local} → {host_name}:"
                          f"{server.port}")
    try:
        yield resolved
    finally:
        tunnel.close()


@contextlib.contextmanager
def _endpoint_target(args: argparse.Namespace, fleet: Any) -> Iterator[Resolved]:
    """An endpoint's router as the target (through an SSH port forward where needed)."""
    if args.endpoint not in fleet.endpoints:
        raise BenchError(f"no endpoint {args.endpoint!r} in {args.fleet}"
                         + (f" (endpoints: {', '.join(fleet.endpoints)})" if fleet.endpoints
                            else ""))
    endpoint = fleet.endpoints[args.endpoint]
    host_name, address, port = client_url(fleet, args.endpoint)
    host = fleet.hosts[host_name]
    try:
        data = connection_data(host_name, host, str(args.fleet))
        key = read_secret(endpoint.router.api_key) if endpoint.router.api_key else None
    except FleetError as error:
        raise BenchError("\n".join(str(p) for p in error.problems)) from None
    except ValueError as error:
        raise BenchError(f"endpoint {args.endpoint}: API key: {error}") from None
    resolved = Resolved(base_url=f"http://{bracket(address)}:{port}",
                        model=served_name(fleet, endpoint),
                        api_key=key, name=f"endpoint {args.endpoint}",
                        notes=[f"through the router of endpoint {args.endpoint} on {host_name} "
                               f"({len(endpoint.replicas)} replicas): no GPU sampling"])
    loopback_only = is_loopback(endpoint.router.bind)
    if host.is_sandbox or args.tunnel == "never" or (args.tunnel == "auto" and not loopback_only):
        yield resolved
        return
    tunnel = Tunnel(data, remote_port=port, remote_host=local_address(endpoint.router.bind))
    try:
        local = tunnel.open()
    except TunnelError as error:
        raise BenchError(str(error)) from None
    resolved.base_url = f"http://127.0.0.1:{local}"
    resolved.notes.append(f"through an SSH port forward 127.0.0.1:{local} → {host_name}:{port}")
    try:
        yield resolved
    finally:
        tunnel.close()


class RichProgress:
    """A rich progress bar on stderr: one bar per step, ok and failed counts."""

    def __init__(self) -> None:

        self.progress = Progress(
            TextColumn("{task.description:>24}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[green]{task.fields[ok]} ok[/] [red]{task.fields[failed]} failed[/]"),
            TimeElapsedColumn(),
            console=err,
            refresh_per_second=4,
        )
        self.task: Any = None

    def __enter__(self) -> RichProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start_step(self, label: str, total: int | None, seconds: float | None) -> None:
        """A new bar for a step (no total in duration mode)."""
        self.task = self.progress.add_task(label, total=total, ok=0, failed=0)

    def advance(self, result: Any) -> None:
        """One request done."""
        task = self.progress.tasks[-1]
        if result.ok:
            self.progress.update(self.task, advance=1, ok=task.fields["ok"] + 1)
        else:
            self.progress.update(self.task, advance=1, failed=task.fields["failed"] + 1)

    def end_step(self) -> None:
        """Mark the step's bar finished."""
        task = self.progress.tasks[-1]
        self.progress.update(self.task, total=task.completed)


def _prompts(args: argparse.Namespace, target: Any, notes: list[str]) -> list[Any]:

    if args.prompts:
        return load_jsonl(args.prompts, args.output_len)
    try:
        tokenizer = server_tokenizer(target)
    except OSError as error:  # a refused certificate
        raise BenchError(f"{target.name or target.base_url}: "
                         f"{trust.refusal(error, target.tls_name)}") from None
    if tokenizer is None:
        notes.append("the server has no /tokenize: synthetic prompts have --input-len words, "
                     "not tokens (the input token counts are the server's)")
        return synthetic_prompts(args.num_prompts, args.input_len, args.output_len, args.seed)
    return synthetic_prompts(args.num_prompts, args.input_len, args.output_len, args.seed,
                             *tokenizer)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark; exit 1 if it could not run or every request failed."""
    if args.compare:
        return compare.cmd_compare(*args.compare)
    if args.plan is not None:
        try:
            return plancommand.cmd_plan(args, resolve_target, RichProgress, _prompts)
        except BenchError as error:
            err.print(f"[bold red]fleet bench --plan:[/] {error}", markup=True)
            return 1
    try:
        steps = steps_from_args(args)
        slo = parse_slo(args.slo) if args.slo else None
        extra = json.loads(args.extra_body) if args.extra_body else {}
        if not isinstance(extra, dict):
            raise ValueError("--extra-body must be a JSON object")
    except (ValueError, json.JSONDecodeError) as error:
        err.print(f"[bold red]fleet bench:[/] {error}")
        return 2
    out_dir = Path(args.out or f"bench-results/{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        with resolve_target(args) as resolved:
            target = resolved.target(args.api)
            if not target.model:
                try:
                    target.model = served_model(target.base_url, target.headers(),
                                                target.ssl_context())
                except (OSError, ValueError, KeyError, IndexError) as error:
                    raise BenchError(f"cannot list the models of {target.base_url}: {error}") \
                        from None
            notes = list(resolved.notes)
            try:
                prompts = _prompts(args, target, notes)
            except PromptError as error:
                raise BenchError(str(error)) from None
            options = Options(timeout=args.timeout, fixed_output=not args.natural_eos,
                              extra_body=extra, seed=args.seed,
                              sample_interval=args.sample_interval,
                              scrape_metrics=not args.no_metrics)
            for note in notes:
                err.print(f"[dim]note:[/] {note}")
            progress = None if args.no_progress else RichProgress()
            runner = Runner(target, prompts, options, progress, resolved.gpu_argv)
            with progress or contextlib.nullcontext():
                runs = asyncio.run(runner.run(steps))
            notes += runner.notes
    except BenchError as error:
        err.print(f"[bold red]fleet bench:[/] {error}", markup=True)
        return 1
    config = {
        "api": args.api,
        "steps": [{"label": s.label, "concurrency": s.concurrency, "rate": s.rate,
                   "max_concurrency": s.max_concurrency, "requests": s.requests,
                   "duration_s": s.duration, "warmup": s.warmup} for s in steps],
        "prompts": args.prompts or "synthetic",
        "input_len": None if args.prompts else args.input_len,
        "output_len": args.output_len,
        "fixed_output": not args.natural_eos,
        "seed": args.seed,
        "timeout_s": args.timeout,
    }
    target_info = {"name": target.name, "url": target.base_url, "model": target.model,
                   "api": target.api, "api_key": "set" if target.api_key else "none"}
    result = reports.build_report(runs, target_info, config, slo, notes)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {kind: out_dir / f"bench.{kind}" for kind in ("json", "csv", "png")}
    reports.write_json(result, paths["json"])
    reports.write_csv(result, paths["csv"])
    reports.write_plot(result, paths["png"])
    out.print(reports.summary_table(result))
    knee = result["knee"]
    out.print(f"knee: {knee['load']:g}" if knee["found"] else "knee: not reached")
    for note in notes:
        out.print(f"note: {note}", markup=False)
    out.print("wrote " + ", ".join(str(p) for p in paths.values()), markup=False)
    return 0 if any(s["ok"] for s in result["steps"]) else 1
