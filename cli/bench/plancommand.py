"""``fleet bench --plan [FILE]``: the staged load test of one server, a GPU's or a host's.

Example:
    $ fleet bench --plan --server quad-4090d --gpu 0          # the default plan, 30 min soaks
    $ fleet bench --plan my-plan.yaml --server quad-4090d/chat --soak 2h
    $ fleet bench --plan --url http://127.0.0.1:8000 --stages 0,1 --concurrency 1..32

The command resolves each server as ``fleet bench --server`` does (its port, model, API key,
an SSH port forward where needed), runs :class:`cli.bench.stages.PlanRun` and writes the run
directory (:mod:`cli.bench.runreport`). The helpers of :mod:`cli.bench.command` that it needs
are handed to :func:`cmd_plan` by that module, so the two do not import each other.

    >>> shares([Chosen("h", "a", (0,)), Chosen("h", "b", (0, 1))])
    'GPUs 0, 1'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cli.bench.memory import cgroup_memory_command
from cli.bench.plan import (
    Chosen,
    Plan,
    PlanError,
    choose_servers,
    load_plan,
    parse_span,
    sharing_groups,
    stages_from_text,
)
from cli.bench.runreport import summary_lines, write_run
from cli.bench.stages import PlanRun, PlanTarget
from cli.console import err, out
from cli.inventory import connection_data
from cli.remote import ssh_command
from fleet.catalog.paths import unit_name
from fleet.load import load_fleet
from fleet.read.problems import FleetError
from loadgen.prompts import PromptError
from loadgen.runner import Options, Runner, parse_loads, served_model
from loadgen.stats import parse_slo


def add_arguments(bench: Any) -> None:
    """The options of the staged plan, on ``fleet bench``'s parser."""
    bench.add_argument("--plan", nargs="?", const="", metavar="PLAN.yaml",
                       help="run the staged load test (baseline, ladder, soak at the knee, "
                       "servers sharing a GPU at once), from a plan file or the default plan; "
                       "--server may name a whole host")
    bench.add_argument("--gpu", type=int, metavar="N",
                       help="--plan with --server HOST: only the servers on GPU N")
    bench.add_argument("--stages", metavar="LIST",
                       help="--plan: the stages to run, by name or number "
                       "(baseline,ladder,soak,mixed or 0,1,2,3; default all)")
    bench.add_argument("--soak", metavar="DURATION",
                       help="--plan: how long the soak runs (default 30m; 90s, 1h30m, …)")
    bench.add_argument("--mixed", metavar="DURATION",
                       help="--plan: how long each solo and shared run of stage 3 lasts "
                       "(default 2m)")


def plan_from_args(args: argparse.Namespace) -> Plan:
    """The plan of the options: a plan file or the default, then the flags over it.

    Raises PlanError (a located problem of the file) or ValueError (a bad flag).

    Example:
        >>> ns = argparse.Namespace(plan="", stages="0,2", soak="5s", mixed=None,
        ...                         concurrency="1,2", requests=None, duration=None)
        >>> p = plan_from_args(ns)
        >>> p.stages, p.soak_duration, p.ladder
        (('baseline', 'soak'), 5.0, '1,2')
    """
    plan = load_plan(args.plan) if args.plan else Plan()
    changes: dict[str, Any] = {}
    for flag, key in (("soak", "soak_duration"), ("mixed", "mixed_duration")):
        value = getattr(args, flag)
        if value is not None:
            try:
                changes[key] = parse_span(value)
            except ValueError as error:
                raise ValueError(f"--{flag}: {error}") from None
    if args.stages:
        changes["stages"] = stages_from_text(args.stages)
    if args.concurrency:
        parse_loads(args.concurrency)
        changes["ladder"] = args.concurrency
    if args.requests is not None:
        if args.requests < 1:
            raise ValueError("--requests must be at least 1")
        changes["ladder_requests"] = args.requests
    if args.duration is not None:
        if args.duration <= 0:
            raise ValueError("--duration must be positive")
        changes["ladder_duration"] = args.duration
    return Plan(**{**plan.__dict__, **changes})


def shares(group: list[Chosen]) -> str:
    """What a group of servers shares, in words."""
    if any(c.cpu for c in group):
        return f"the CPU cores of cpu host {group[0].host}"
    gpus = sorted({g for c in group for g in c.gpus})
    if not gpus or any(not c.gpus for c in group):
        return "every GPU of the host"
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ", ".join(map(str, gpus))


def _chosen(args: argparse.Namespace) -> tuple[list[Chosen], Any]:
    try:
        fleet = load_fleet(args.fleet)
    except FleetError as error:
        raise ValueError(f"{args.fleet}: invalid\n"
                         + "\n".join(f"  {p}" for p in error.problems)) from None
    return choose_servers(fleet, args.server, args.gpu, str(args.fleet)), fleet


def cmd_plan(args: argparse.Namespace, resolve: Callable[[argparse.Namespace], Any],
             progress_factory: Callable[[], Any], prompts_for: Callable[..., list[Any]]) -> int:
    """Run the plan and write its run directory; exit 2 on bad input, 1 when nothing ran.

    + args: ``fleet bench``'s options
    + resolve: :func:`cli.bench.command.resolve_target` (a server → its URL, key, GPU argv)
    + progress_factory: makes the progress bar (:class:`cli.bench.command.RichProgress`)
    + prompts_for: the prompts of the options for a target (:func:`cli.bench.command._prompts`)

    ``resolve`` raises the command's own BenchError (no tunnel, no such server); the command
    catches it around this call.
    """
    try:
        plan = plan_from_args(args)
        slo = parse_slo(args.slo) if args.slo else None
        extra = json.loads(args.extra_body) if args.extra_body else {}
        if not isinstance(extra, dict):
            raise ValueError("--extra-body must be a JSON object")
        if args.rate:
            raise ValueError("--rate: the plan's ladder is closed-loop; give --concurrency")
        if args.gpu is not None and args.url:
            raise ValueError("--gpu names a GPU of a fleet host: use it with --server HOST")
        chosen, fleet = _chosen(args) if args.server else ([], None)
    except PlanError as error:
        err.print("[bold red]fleet bench --plan:[/] the plan file is not valid", markup=True)
        for problem in error.problems:
            err.print(f"  {problem}", markup=False)
        return 2
    except (ValueError, json.JSONDecodeError) as error:
        err.print(f"[bold red]fleet bench --plan:[/] {error}", markup=True)
        return 2
    groups = [([c.name for c in g], shares(g)) for g in sharing_groups(chosen)]
    out_dir = Path(args.out or f"bench-results/plan-{time.strftime('%Y%m%d-%H%M%S')}")
    options = Options(timeout=args.timeout, fixed_output=not args.natural_eos, extra_body=extra,
                      seed=args.seed, sample_interval=args.sample_interval,
                      scrape_metrics=not args.no_metrics)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    clock = time.perf_counter()
    notes: list[str] = []
    try:
        with contextlib.ExitStack() as stack:
            targets = []
            for item in chosen or [None]:
                one = copy.copy(args)
                if item is not None:
                    one.server = item.name
                targets.append(_target(stack.enter_context(resolve(one)), one, item, fleet,
                                       options, prompts_for, notes))
            progress = None if args.no_progress else progress_factory()
            run = PlanRun(plan, targets, groups, progress, slo,
                          say=lambda line: err.print(line, markup=False))
            with progress or contextlib.nullcontext():
                results = asyncio.run(run.run())
    except ValueError as error:  # a server without models, unreadable prompts
        err.print(f"[bold red]fleet bench --plan:[/] {error}", markup=True)
        return 1
    results = {
        "tool": "fleet bench --plan",
        "started": started,
        "seconds": time.perf_counter() - clock,
        "plan": plan.as_dict(),
        "config": {"api": args.api, "input_len": None if args.prompts else args.input_len,
                   "output_len": args.output_len, "prompts": args.prompts or "synthetic",
                   "fixed_output": not args.natural_eos, "seed": args.seed,
                   "timeout_s": args.timeout, "slo_s": slo or {}},
        **results,
        "notes": notes + results["notes"],
    }
    written = write_run(results, out_dir)
    for line in summary_lines(results):
        out.print(line.replace("**", ""), markup=False)
    for note in results["notes"]:
        out.print(f"note: {note}", markup=False)
    out.print(f"wrote {len(written)} files into {out_dir}; read {out_dir / 'report.md'}",
              markup=False)
    sent = [s for server in results["servers"].values()
            for s in [server.get("baseline"), *((server.get("ladder") or {}).get("steps", [])),
                      (server.get("soak") or {}).get("step")] if s]
    sent += [s for group in results["mixed"] for s in [*group["solo"].values(),
                                                        *group["shared"].values()]]
    return 0 if any(s["ok"] for s in sent) else 1


def _target(resolved: Any, args: argparse.Namespace, item: Chosen | None, fleet: Any,
            options: Options, prompts_for: Callable[..., list[Any]],
            notes: list[str]) -> PlanTarget:
    """One server's runner and samplers, from what ``resolve`` found."""
    target = resolved.target(args.api)
    if not target.model:
        try:
            target.model = served_model(target.base_url, target.headers(), target.ssl_context())
        except (OSError, ValueError, KeyError, IndexError) as error:
            raise ValueError(f"cannot list the models of {target.base_url}: {error}") from None
    here: list[str] = list(resolved.notes)
    try:
        prompts = prompts_for(args, target, here)
    except PromptError as error:
        raise ValueError(str(error)) from None
    notes += [f"{resolved.name}: {n}" for n in here]
    memory_argv = None
    if item is not None and fleet is not None:
        host = fleet.hosts[item.host]
        try:
            data = connection_data(item.host, host, str(args.fleet))
            interval = max(options.sample_interval, 1.0)
            memory_argv = ssh_command(data, cgroup_memory_command(unit_name(item.server),
                                                                  interval))
        except FleetError:
            memory_argv = None
    info = {"name": target.name, "url": target.base_url, "model": target.model,
            "api": target.api, "api_key": "set" if target.api_key else "none"}
    return PlanTarget(name=resolved.name, runner=Runner(target, prompts, options),
                      gpu_argv=resolved.gpu_argv, gpus=item.gpus if item else (),
                      memory_argv=memory_argv, info=info)
