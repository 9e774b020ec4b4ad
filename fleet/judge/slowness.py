"""Is a server slower than its last bench, and why (``fleet doctor``'s slow tree).

Pure decisions: the baseline (the server's last archived ``fleet bench`` run), a fresh short
measurement at the same prompt shape, the server's own ``/metrics`` and the host's facts are
gathered elsewhere (``cli/doctor/benchcheck``, ``cli/doctor/gather``) and handed in as plain
data. :func:`slowdown` says whether the server is clearly slower; :func:`causes` names the
likely causes of the field report's slow tree, most likely first, each with its evidence and
fix: requests queueing (prefill blocking, ``max-num-seqs``), P99 far above P50
(``max-num-batched-tokens``), a starved CPU or an idle GPU (CPU, tokenizer, NUMA binding),
neighbours on the same GPU or cores, a model on a network file system.

Example:
    >>> base = {"ttft_ms": {"p50": 10.0}, "tpot_ms": {"p50": 2.0}}
    >>> now = {"ttft_ms": {"p50": 35.0}, "tpot_ms": {"p50": 2.1}}
    >>> [(s["figure"], round(s["ratio"], 1)) for s in slowdown(base, now)]
    [('TTFT P50', 3.5)]
"""

from __future__ import annotations

from typing import Any

#: Fresh ÷ baseline at which a figure is clearly slower: single bench rounds on a busy machine
#: move by 20–50 % (docs/bench.md), so only a doubling counts.
SLOWER = 2.0
#: And by at least this much (ms): the tiny test model's 7 ms TTFT doubles on a loaded 2-core
#: machine without anything being wrong; real models' TTFTs are tens of ms and more.
FLOOR_MS = {"ttft": 10.0, "tpot": 2.0}
#: P99 ÷ P50 of TTFT above which a few requests wait far longer than the rest.
TAIL = 3.0
#: Queue time's share of TTFT above which requests mostly wait for a slot.
QUEUED = 0.3
#: KV cache usage (fraction) below which queueing is not the cache's: the scheduler's limits.
KV_FULL = 0.9
#: Mean GPU utilisation (%) during the measurement below which the GPU is starved.
IDLE_GPU = 50.0
#: File systems that live on the network.
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "sshfs", "ceph",
              "fuse.ceph", "glusterfs", "fuse.glusterfs", "lustre", "9p", "fuse.s3fs",
              "fuse.gcsfuse", "fuse.juicefs", "beegfs", "gpfs", "afs")  # fmt: skip

Cause = tuple[str, list[str], str]


def percentile(figures: dict[str, Any] | None, key: str, q: str = "p50") -> float | None:
    """A step's percentile ``q`` of figure ``key`` (``ttft_ms``, …), None when it has none.

    Example:
        >>> percentile({"ttft_ms": {"p50": 7}}, "ttft_ms"), percentile({}, "tpot_ms")
        (7.0, None)
    """
    value = ((figures or {}).get(key) or {}).get(q)
    return float(value) if isinstance(value, int | float) else None


def measured_on_the_client(baseline: dict[str, Any], fresh: dict[str, Any]) -> bool:
    """Whether a slow TTFT of ``fresh`` is the measuring machine's, not the server's: the server
    served nothing but the round's own requests (its ``/metrics`` difference over the round),
    and its own mean TTFT over them is not slower than ``baseline``'s P50. A CI run caught an
    idle server so: the client's TTFT P50 29 ms (every stream read in one piece: TPOT 0), the
    server's own 3.8 ms, against a baseline of about 9 ms. With a neighbour's load the server
    finishes others' requests too, and a saturated API server is the server's slowness even
    where its engine's TTFT is short (a recorded run: 44 ms seen, 5 ms in the engine, 2 more
    requests finished): not this.

    Example:
        >>> base = {"ttft_ms": {"p50": 9.0}}
        >>> alone = {"requests": 5, "warmup_requests": 1, "ttft_ms": {"p50": 29.0},
        ...          "server": {"ttft": {"mean": 0.0038, "count": 5}, "requests_finished": 5}}
        >>> measured_on_the_client(base, alone)
        True
        >>> busy = {**alone, "server": {**alone["server"], "requests_finished": 8}}
        >>> measured_on_the_client(base, busy), measured_on_the_client(base, {"requests": 5})
        (False, False)
    """
    then = percentile(baseline, "ttft_ms")
    own = (fresh.get("server") or {}).get("ttft") or {}
    mean, count = own.get("mean"), own.get("count")
    if not then or not isinstance(mean, int | float) or not count:
        return False
    return served_others(fresh) is False and mean * 1000 < SLOWER * then


def served_others(fresh: dict[str, Any]) -> bool | None:
    """Whether the server finished other clients' requests during a round (its
    ``requests_finished`` over the round above the round's own ``requests``: the window holds
    the measured requests, the warm-up is before it); None when the server did not say.

    Example:
        >>> served_others({"requests": 5, "server": {"requests_finished": 8}})
        True
        >>> served_others({"requests": 5, "server": {"requests_finished": 5}})
        False
        >>> served_others({"requests": 5}) is None
        True
    """
    finished = (fresh.get("server") or {}).get("requests_finished")
    if not isinstance(finished, int | float):
        return None
    return finished > int(fresh.get("requests") or 0)


def queued_on_the_server(fresh: dict[str, Any]) -> bool:
    """Whether the server's own figures over a round show other clients' load queueing its
    requests: it finished more requests in the round than the round sent (others were served
    too), and its ``vllm:num_requests_waiting`` gauge was above 0 or its queue time P50 was at
    least :data:`QUEUED` of the round's TTFT P50. A slower round the server says so of is its
    load, not a hiccup of the measuring machine: ``fleet doctor`` measures no more rounds. (Queue
    time alone is not enough: an engine slow to wake on a busy machine queues a lone request.)

    Example:
        >>> busy = {"requests": 5, "server": {"requests_finished": 21},
        ...         "server_gauges": {"waiting": {"max": 12.0}}}
        >>> queued_on_the_server(busy)
        True
        >>> alone = {**busy, "server": {"requests_finished": 5}}
        >>> queued_on_the_server(alone), queued_on_the_server({"ttft_ms": {"p50": 40.0}})
        (False, False)
    """
    if not served_others(fresh):
        return False
    server = fresh.get("server") or {}
    waiting = ((fresh.get("server_gauges") or {}).get("waiting") or {}).get("max")
    if isinstance(waiting, int | float) and waiting > 0:
        return True
    queue = (server.get("queue") or {}).get("p50")
    ttft = percentile(fresh, "ttft_ms")
    return isinstance(queue, int | float) and bool(ttft) and queue * 1000 >= QUEUED * ttft


def slowdown(baseline: dict[str, Any], fresh: dict[str, Any]) -> list[dict[str, Any]]:
    """The figures (TTFT P50, TPOT P50) of ``fresh`` clearly slower than ``baseline``'s; a slow
    TTFT the server's own figures show to be the client's is not
    (:func:`measured_on_the_client`).

    + baseline, fresh: step figures as ``fleet bench`` writes them (``ttft_ms``, ``tpot_ms``
      with ``p50``; ``server``, the server's own figures over the step, where it has them)

    Example:
        >>> slowdown({"ttft_ms": {"p50": 2.0}}, {"ttft_ms": {"p50": 5.0}})  # under the floor
        []
    """
    slower = []
    for key, words in (("ttft", "TTFT P50"), ("tpot", "TPOT P50")):
        then, now = percentile(baseline, f"{key}_ms"), percentile(fresh, f"{key}_ms")
        if key == "ttft" and measured_on_the_client(baseline, fresh):
            continue
        if then and now and now >= SLOWER * then and now - then >= FLOOR_MS[key]:
            slower.append({"figure": words, "then_ms": then, "now_ms": now,
                           "ratio": now / then})  # fmt: skip
    return slower


def _arg(args: dict[str, Any], name: str) -> Any:
    return args.get(name, args.get(name.replace("-", "_")))


def _queueing(bench: dict[str, Any], args: dict[str, Any], where: str) -> Cause | None:
    fresh = bench.get("fresh") or {}
    server = fresh.get("server") or {}
    gauges = fresh.get("server_gauges") or {}
    after = bench.get("metrics_gauges") or {}
    queue = (server.get("queue") or {}).get("p50")
    ttft = percentile(fresh, "ttft_ms")

    def most(key: str) -> float | None:
        seen = [v for v in ((gauges.get(key) or {}).get("max"), after.get(key)) if v is not None]
        return max(seen) if seen else None

    waiting, running = most("waiting") or 0, most("running") or 0
    queue_ms = queue * 1000 if isinstance(queue, int | float) else None
    if not waiting and not (queue_ms and ttft and queue_ms >= QUEUED * ttft):
        return None
    evidence = []
    if queue_ms is not None and ttft:
        evidence.append(f"the server's queue time P50 {queue_ms:,.1f} ms of a TTFT P50 of "
                        f"{ttft:,.1f} ms (its /metrics during the measurement)")
    if waiting or running:
        evidence.append(f"requests running up to {running:g}, waiting up to {waiting:g} "
                        "(vllm:num_requests_running / _waiting, during and just after)")
    seqs = _arg(args, "max-num-seqs")
    chunked = _arg(args, "enable-chunked-prefill")
    kv = most("kv_cache_usage")
    if seqs and (running >= int(seqs) or (kv is not None and kv < KV_FULL)):
        seen = (f"{running:g} were running" if running >= int(seqs)
                else f"the KV cache was at most {kv:.0%} used, so not the cache")
        evidence.append(f"max-num-seqs {seqs} reached: at most {seqs} requests run at once and "
                        f"new ones wait for a running one to end ({seen})")
        fix = (f"raise max-num-seqs (now {seqs}) in {where}.args where the KV cache holds "
               "more sequences, or spread the load over more servers")
    elif chunked is False:
        evidence.append("enable-chunked-prefill: false: a long prompt's prefill blocks every "
                        "decode batched with it")
        fix = f"remove enable-chunked-prefill: false from {where}.args (chunked prefill on)"
    else:
        fix = (f"the server is busy with other load: keep chunked prefill on, raise max-num-seqs "
               f"in {where}.args, or spread the load over more servers")
    return "requests wait in the server's queue (prefill blocking or max-num-seqs)", evidence, fix


def _tail(bench: dict[str, Any], args: dict[str, Any], where: str) -> Cause | None:
    evidence = []
    for what, figures, scale in (("the fresh measurement", bench.get("fresh"), 1.0),
                                 ("the server's /metrics since its start",
                                  {"ttft_ms": bench.get("metrics_ttft")}, 1000.0)):
        p50, p99 = percentile(figures, "ttft_ms"), percentile(figures, "ttft_ms", "p99")
        if p50 and p99 and p99 >= TAIL * p50:
            evidence.append(f"TTFT P99 {p99 * scale:,.1f} ms against P50 {p50 * scale:,.1f} ms "
                            f"(×{p99 / p50:.1f}) in {what}")
    if not evidence:
        return None
    tokens = _arg(args, "max-num-batched-tokens")
    now = f" (now {tokens})" if tokens else ""
    return ("a few requests wait far longer than the rest (P99 far above P50)", evidence,
            f"lower max-num-batched-tokens{now} in {where}.args, so that a long prefill is cut "
            "into smaller chunks and the decodes batched with it are not held up")


def _starved(ev: Any, bench: dict[str, Any], where: str) -> Cause | None:
    evidence = []
    gpu = (bench.get("fresh") or {}).get("gpu") or {}
    mine = {str(g.get("index")) for g in ev.gpus} or set(gpu)
    idle = {k: v for k, v in gpu.items() if k in mine and v.get("util_mean") is not None
            and v["util_mean"] < IDLE_GPU}  # fmt: skip
    for index, figures in sorted(idle.items()):
        evidence.append(f"GPU {index} was {figures['util_mean']:.0f} % busy on average during "
                        "the measurement")
    load = ev.cpu_load or {}
    cpus, load1 = load.get("cpus"), load.get("load1")
    busy_cpu = bool(cpus and load1 is not None and load1 > cpus)
    if busy_cpu:
        evidence.append(f"the host's load is {load1:.1f} on {cpus} CPUs (1-minute average)")
    if not idle and not busy_cpu:
        return None
    if idle:
        fix = ("the GPU waits for the CPU side: free CPUs for the server (its tokenizer and API "
               "process), paste `nvidia-smi topo -m` into gpus.topology so that the server is "
               "bound to its GPU's NUMA node, and check the network between client and server")
        return "the GPU is starved (CPU, tokenizer, network or NUMA)", evidence, fix
    device = "its cores" if ev.variant == "cpu" else "the CPU side of the server"
    return (f"the host's CPUs are oversubscribed: the server gets only part of {device}",
            evidence, "stop or move what else runs on the host (see the busiest processes), or "
            f"give {where} a host of its own")


def _neighbours(ev: Any, where: str) -> Cause | None:
    evidence = []
    mine = {g.get("index") for g in ev.gpus}
    for app in ev.gpu_apps:
        if app.get("gpu") in mine and app.get("pid") not in ev.own_pids:
            evidence.append(f"GPU {app.get('gpu')}: pid {app.get('pid')} (user "
                            f"{app.get('user', '?')}, {app.get('process', '?')}) holds "
                            f"{app.get('used_mib') or 0:,} MiB")
    for proc in ev.busy_processes:
        if not proc.get("own") and (proc.get("cpu") or 0) >= 50:
            evidence.append(f"pid {proc.get('pid')} (user {proc.get('user', '?')}, "
                            f"{proc.get('process', '?')}) uses {proc['cpu']:.0f} % of a CPU")
    if ev.neighbours:
        evidence.append(f"{where} shares {'its cores' if ev.variant == 'cpu' else 'its GPUs'} "
                        f"with {', '.join(ev.neighbours)} (the fleet file)")
    if not evidence:
        return None
    return ("other work shares the server's GPU or cores", evidence,
            f"move {where} to a GPU (or host) of its own ({where}.gpus), or the neighbour; "
            "`fleet bench --plan --server HOST --gpu N` measures what the sharing costs")


def _network_disk(ev: Any, where: str) -> Cause | None:
    fstype = ev.model_fstype or ""
    if fstype not in NETWORK_FS:
        return None
    return ("the model is on a network file system", [
        f"{ev.model_path} is on {fstype} (mounted at {ev.model_mount or '?'}): weights "
        "load, and pages evicted from memory come back, over the network"],
        "install models on a local disk: mount one at /var/lib/vllm-fleet/models and "
        "deploy again")  # fmt: skip


def causes(ev: Any) -> list[Cause]:
    """The likely causes of a slower server, most likely first (``ev``: a
    :class:`fleet.judge.diagnosis.Evidence` with its ``bench``).

    Example:
        >>> from fleet.judge.diagnosis import Evidence
        >>> ev = Evidence("h", "s", args={"max-num-seqs": 4}, bench={"fresh": {
        ...     "ttft_ms": {"p50": 80.0}, "server": {"queue": {"p50": 0.07}},
        ...     "server_gauges": {"running": {"max": 4}, "waiting": {"max": 3}}}})
        >>> [c[0].split(" (")[0] for c in causes(ev)]
        ["requests wait in the server's queue"]
    """
    bench = ev.bench or {}
    where = f"hosts.{ev.host}.servers.{ev.server}"
    found = [_queueing(bench, ev.args, where), _tail(bench, ev.args, where),
             _starved(ev, bench, where), _neighbours(ev, where), _network_disk(ev, where)]
    return [c for c in found if c is not None]
