"""Placement: which GPUs a server that declares none should use (``fleet plan --place``).

Each server takes on every GPU it uses what :mod:`fleet.planner.fit` says it takes: its budget
(``gpu-memory-utilization`` × the GPU's CUDA total, the release's default when not given) plus
what its process holds outside the budget (CUDA context, NCCL, CUDA graphs before 0.21). A GPU
takes servers while the sum stays below its CUDA total less :data:`HEADROOM_GIB`: placement
never overcommits, and a server that fits nowhere is refused with the room each GPU has left.
Servers that declare ``gpus`` stay where they are and count first; so does memory that other
processes hold, when the GPUs were read from the host (:class:`GpuState`, ``--from-host``).

The order, as people plan by hand ("TP=1 first, TP=2 only on the PIX pair"):

1. **groups** (tensor × pipeline × data parallel > 1 on a host), the largest first, on the free
   GPUs whose slowest link is fastest (NVLink, then one PCIe switch, then more bridges, as
   ``gpus.topology`` says); ties go to GPUs nobody uses yet, then to the lowest indices;
2. **small servers** (those that leave room for another like them: at most half a GPU), the
   largest first, packed onto the fullest GPU they fit on (a GPU already shared, or holding
   other processes' memory), else onto the lowest-numbered empty one;
3. **whole-card servers**, in file order, each on the emptiest GPU (ties: lowest index).

Every choice carries its reason and the alternatives it rejected, with why.

Example:
    >>> from fleet.load import load_text
    >>> text = open("inventory/examples/quad-4090d.yaml").read()
    >>> fleet = load_text(strip_gpus(text), "quad.yaml", capacity=False, unplaced=True)
    >>> {c.server: c.gpus for c in place_fleet(fleet).choices}
    {'router': [0], 'summarize': [0], 'tagger': [0], 'vlm': [1], 'llm': [2], 'guard': [3]}
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field

from fleet.catalog import gpus as gpu_table
from fleet.planner.fit import GiB, cuda_total_bytes, outside_budget, utilization
from fleet.spec.models import Fleet, Host, Server, Variant

MiB = 2**20
#: Left free on every GPU beyond what its servers take in and outside their budgets.
HEADROOM_GIB = 0.5
#: Searched GPU sets per group, at most (every 2-of-8 … 8-of-8 set of an HGX node fits).
MAX_SETS = 20_000
#: Rejected alternatives printed per choice, at most.
MAX_REJECTED = 4


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU, as the host reports it."""

    pid: int
    name: str
    used_mib: int


@dataclass(frozen=True)
class GpuState:
    """One GPU as the host reports it (``nvidia-smi -q -x``): memory in MiB, and its processes.

    The CUDA total that ``gpu-memory-utilization`` is a fraction of is ``total − reserved``
    (H200, driver 580: 143771 − 616 MiB = 139.80 GiB, as cudaMemGetInfo reports).

    Example:
        >>> GpuState(0, "NVIDIA H200", 143771, 616, 1551, 141606).cuda_total_mib
        143155
    """

    index: int
    name: str
    total_mib: int
    reserved_mib: int | None
    used_mib: int
    free_mib: int
    processes: tuple[GpuProcess, ...] = ()

    @property
    def cuda_total_mib(self) -> int:
        """What CUDA reports as total: nvidia-smi's total less the driver's reserve."""
        if self.reserved_mib is None:
            return self.total_mib - round(gpu_table.DRIVER_RESERVED_GIB * 1024)
        return self.total_mib - self.reserved_mib


@dataclass
class Choice:
    """The GPUs chosen for one server, why, and what was rejected."""

    host: str
    server: str
    gpus: list[int]
    reason: str
    rejected: list[str] = field(default_factory=list)


@dataclass
class Refusal:
    """A server that no GPU (or GPU set) has room for."""

    host: str
    server: str
    message: str
    hint: str


@dataclass
class Placement:
    """What ``fleet plan --place`` found: one choice per placed server, and refusals."""

    choices: list[Choice]
    refused: list[Refusal]
    #: Per host, every GPU as placement left it.
    rooms: dict[str, list[GpuRoom]] = field(default_factory=dict)
    #: Per host with placed servers, one line: its GPUs, links, and how the servers were split.
    summary: dict[str, str] = field(default_factory=dict)

    def gpus_of(self) -> dict[tuple[str, str], list[int]]:
        """``{(host, server): gpus}`` of every choice."""
        return {(c.host, c.server): c.gpus for c in self.choices}


@dataclass
class GpuRoom:
    """A GPU while placing and after: its CUDA total, what is taken (bytes), and by whom."""

    host: str
    index: int
    total: int
    taken: int = 0
    users: list[str] = field(default_factory=list)
    foreign: int = 0

    @property
    def room(self) -> int:
        """Bytes a further server may take, headroom kept."""
        return self.total - self.taken - int(HEADROOM_GIB * GiB)

    @property
    def empty(self) -> bool:
        return not self.users and not self.foreign


def gib(value: float) -> str:
    """Bytes as GiB with two decimals.

    Example:
        >>> gib(3 * 2**29)
        '1.50 GiB'
    """
    return f"{value / GiB:.2f} GiB"


def unplaced(fleet: Fleet) -> list[tuple[str, str]]:
    """(host, server) of every GPU server that declares no GPUs, in file order.

    Example:
        >>> from fleet.load import load_fleet
        >>> unplaced(load_fleet("inventory/examples/quad-4090d.yaml"))
        []
    """
    return [
        (host_name, name)
        for host_name, host in fleet.hosts.items()
        if host.vllm.variant is not Variant.cpu
        for name, server in host.servers.items()
        if not server.gpus
    ]


def demand(host: Host, server: Server, total: int) -> tuple[int, str]:
    """Bytes one server takes on each of its GPUs (of ``total`` CUDA bytes), and how.

    Example:
        >>> h = Host.model_validate({"address": "x", "vllm": {"version": "0.11.0",
        ...     "variant": "cu129"}})
        >>> size, how = demand(h, Server(model="m", port=1, args={
        ...     "gpu-memory-utilization": 0.5}), 20 * GiB)
        >>> gib(size), how
        ('11.00 GiB', 'gpu-memory-utilization 0.5 × 20.00 GiB + 1.00 GiB outside the budget \
(CUDA context 0.50, CUDA graphs 0.50)')
    """
    fraction = utilization(host, server)
    given = "gpu-memory-utilization" in server.args
    outside = outside_budget(host, server)
    extra = int(sum(outside.values()) * GiB)
    word = "gpu-memory-utilization" if given else (
        f"vLLM {host.vllm.version}'s default gpu-memory-utilization"
    )
    parts = ", ".join(f"{cause} {size:.2f}" for cause, size in outside.items())
    how = f"{word} {fraction:g} × {gib(total)} + {gib(extra)} outside the budget ({parts})"
    return int(fraction * total) + extra, how


def _totals(fleet: Fleet, states: dict[str, list[GpuState]]) -> dict[str, list[GpuRoom]]:
    """Every GPU host's GPUs with their CUDA totals (from the host where read), empty."""
    hosts: dict[str, list[GpuRoom]] = {}
    for name, host in fleet.hosts.items():
        if host.vllm.variant is Variant.cpu:
            continue
        if name in states:
            hosts[name] = [
                GpuRoom(name, s.index, s.cuda_total_mib * MiB, taken=s.used_mib * MiB,
                     foreign=s.used_mib * MiB)
                for s in states[name]
            ]
            continue
        memory = host.gpus.total_gib
        if memory is None or not host.gpus.count:
            continue
        hosts[name] = [GpuRoom(name, i, cuda_total_bytes(memory)) for i in range(host.gpus.count)]
    return hosts


def _nodes(host_name: str, server: Server) -> list[str]:
    return [host_name, *dict.fromkeys(server.worker_hosts)]


def _declared(fleet: Fleet, gpus: dict[str, list[GpuRoom]], measured: set[str]) -> None:
    """Count the servers that declare GPUs on every GPU they use (head and worker hosts).

    On a GPU read from the host, memory in use may already be those servers (running): the
    GPU counts the larger of what the host reports in use and what its servers declare.
    """
    declared: dict[tuple[str, int], int] = {}
    for host_name, host in fleet.hosts.items():
        for name, server in host.servers.items():
            for node in _nodes(host_name, server):
                for index in server.gpus:
                    if node not in gpus or index >= len(gpus[node]):
                        continue
                    gpu = gpus[node][index]
                    size, _ = demand(host, server, gpu.total)
                    declared[(node, index)] = declared.get((node, index), 0) + size
                    gpu.users.append(f"{host_name}/{name}" if node != host_name else name)
    for (node, index), size in declared.items():
        gpu = gpus[node][index]
        if node in measured:
            gpu.taken = max(gpu.foreign, size)
            gpu.foreign = max(0, gpu.foreign - size)
        else:
            gpu.taken += size


def _where(gpu: GpuRoom) -> str:
    """What is on a GPU, for a reason."""
    parts = list(gpu.users)
    if gpu.foreign:
        parts.append(f"{gib(gpu.foreign)} of other processes")
    return ", ".join(parts) if parts else "nothing yet"


def _link_words(link: str | None) -> str:
    return "links unknown (no gpus.topology)" if link is None else gpu_table.describe(link)


def _place_group(
    placement: Placement, fleet: Fleet, host_name: str, name: str, server: Server,
    gpus: dict[str, list[GpuRoom]], size: int, read_links: gpu_table.Links | None,
) -> None:
    """A parallel group: the ``size`` GPUs (same indices on every node) with the best link."""
    host = fleet.hosts[host_name]
    nodes = _nodes(host_name, server)
    count = min(len(gpus.get(node, [])) for node in nodes)
    links = host.gpus.links or read_links
    needs = {node: demand(fleet.hosts[host_name], server, gpus[node][0].total) for node in nodes
             if gpus.get(node)}
    if not count or math.comb(count, size) > MAX_SETS or size > count:
        placement.refused.append(Refusal(
            host_name, name, f"needs {size} GPUs on each of {len(nodes)} host(s); "
            f"{count} can be searched",
            "list its gpus by hand",
        ))
        return
    fits, rejected = [], []
    for combo in itertools.combinations(range(count), size):
        short = [
            (node, gpus[node][i]) for node in nodes for i in combo
            if gpus[node][i].room < needs[node][0]
        ]
        link = gpu_table.worst_link(links, list(combo)) if links else None
        label = ",".join(map(str, combo))
        if short:
            node, gpu = short[0]
            where = f"GPU {gpu.index}" + (f" of {node}" if len(nodes) > 1 else "")
            rejected.append((3, label, f"{where} has {gib(max(0, gpu.room))} left "
                             f"({_where(gpu)}), it needs {gib(needs[node][0])}"))
            continue
        used = sum(not gpus[node][i].empty for node in nodes for i in combo)
        fits.append((gpu_table.link_rank(link) if link else 10_000, used, combo, link, label))
    if not fits:
        room = ", ".join(f"GPU {g.index} {gib(max(0, g.room))}" for g in gpus[nodes[0]])
        placement.refused.append(Refusal(
            host_name, name,
            f"needs {size} GPUs with {gib(needs[host_name][0])} each "
            f"({needs[host_name][1]}); no such set has room (left: {room})",
            "lower its gpu-memory-utilization, free GPUs, or add a host",
        ))
        return
    fits.sort(key=lambda f: (f[0], f[1], f[2]))
    rank, used, combo, link, label = fits[0]
    for other_rank, other_used, _, other_link, other_label in fits[1:]:
        if other_rank > rank:
            rejected.append((1, other_label, f"slower link: {_link_words(other_link)}"))
        elif other_used > used:
            rejected.append((2, other_label, "as fast, but shares GPUs with other servers"))
        else:
            rejected.append((2, other_label, "as fast; the lower indices win the tie"))
    rejected.sort(key=lambda r: r[0])
    parallel = f"TP {server.tp} × PP {server.pp}" + (f" × DP {server.dp}" if server.dp > 1
                                                      else "")
    across = f" on each of {len(nodes)} hosts" if len(nodes) > 1 else ""
    reason = (f"{parallel} = {server.gpus_needed} GPUs, {size}{across}, each taking "
              f"{gib(needs[host_name][0])} ({needs[host_name][1]}); GPUs {label}: "
              f"{_link_words(link)}, the fastest set with room")
    for node in nodes:
        for i in combo:
            gpus[node][i].taken += needs[node][0]
            gpus[node][i].users.append(name if node == host_name else f"{host_name}/{name}")
    placement.choices.append(Choice(
        host_name, name, list(combo), reason,
        [f"GPUs {label}: {why}" for _, label, why in rejected[:MAX_REJECTED]]
        + ([f"… {len(rejected) - MAX_REJECTED} more sets"] if len(rejected) > MAX_REJECTED
           else []),
    ))


def _place_single(
    placement: Placement, host_name: str, name: str, size: int, how: str,
    gpus: list[GpuRoom], small: bool,
) -> None:
    """One single-GPU server: packed (small) or on a card of its own (the emptiest)."""
    fitting = [g for g in gpus if g.room >= size]
    rejected = [
        f"GPU {g.index}: {gib(max(0, g.room))} left ({_where(g)}), it needs {gib(size)}"
        for g in gpus if g.room < size
    ]
    if not fitting:
        room = ", ".join(f"GPU {g.index} {gib(max(0, g.room))}" for g in gpus)
        placement.refused.append(Refusal(
            host_name, name,
            f"needs {gib(size)} on one GPU ({how}); no GPU has that much left "
            f"(left, {HEADROOM_GIB:g} GiB headroom kept: {room})",
            "lower its gpu-memory-utilization, or give it a GPU of its own",
        ))
        return
    if small:
        shared = [g for g in fitting if not g.empty]
        if shared:
            chosen = min(shared, key=lambda g: (g.room, g.index))
            why = (f"shares GPU {chosen.index} with {_where(chosen)}: the fullest GPU it fits "
                   f"on ({gib(chosen.room)} left before it)")
        else:
            chosen = min(fitting, key=lambda g: g.index)
            why = (f"GPU {chosen.index}, the lowest-numbered empty GPU, opened for small "
                   "servers to share (the others stay whole)")
        rejected += [
            f"GPU {g.index}: " + ("kept whole for servers that need a card of their own"
                                  if g.empty else f"{gib(g.room)} left, less full than "
                                  f"GPU {chosen.index}")
            for g in fitting if g is not chosen
        ]
    else:
        chosen = max(fitting, key=lambda g: (g.room, -g.index))
        why = (f"a card of its own: GPU {chosen.index}, the emptiest "
               f"({gib(chosen.room)} free to place on)")
        rejected += [
            f"GPU {g.index}: " + (f"{gib(g.room)} left ({_where(g)})" if not g.empty
                                  else "as empty; the lower index wins the tie")
            for g in fitting if g is not chosen
        ]
    chosen.taken += size
    chosen.users.append(name)
    placement.choices.append(Choice(
        host_name, name, [chosen.index], f"takes {gib(size)} ({how}); {why}",
        rejected[:MAX_REJECTED]
        + ([f"… {len(rejected) - MAX_REJECTED} more GPUs"] if len(rejected) > MAX_REJECTED
           else []),
    ))


def place_fleet(
    fleet: Fleet, states: dict[str, list[GpuState]] | None = None,
    links: dict[str, gpu_table.Links] | None = None,
) -> Placement:
    """Choose GPUs for every GPU server of ``fleet`` that declares none.

    + fleet: loaded with ``unplaced=True`` (servers without gpus accepted)
    + states: per host name, its GPUs as read from the host; other hosts use the fleet file's
      ``gpus`` (count, model or memory_gib)
    + links: per host name, links read from the host, for hosts whose file has no topology
    """
    states = states or {}
    placement = Placement([], [])
    gpus = _totals(fleet, states)
    placement.rooms = gpus
    links = links or {}
    _declared(fleet, gpus, set(states))
    todo = unplaced(fleet)
    for host_name, name in todo:
        if host_name not in gpus:
            placement.refused.append(Refusal(
                host_name, name, "the host's GPU memory is unknown",
                "set gpus.count and gpus.model (or memory_gib), or use --from-host",
            ))
    todo = [(h, n) for h, n in todo if h in gpus]
    groups, singles = [], []
    for host_name, name in todo:
        server = fleet.hosts[host_name].servers[name]
        nodes = _nodes(host_name, server)
        missing = [node for node in nodes if node not in gpus]
        if missing:
            placement.refused.append(Refusal(
                host_name, name, f"worker host {missing[0]!r} has no known GPUs",
                "declare its gpus, or list this server's gpus by hand",
            ))
            continue
        size, rest = divmod(server.gpus_needed, len(nodes))
        if rest:
            placement.refused.append(Refusal(
                host_name, name, f"{server.gpus_needed} GPUs do not split evenly over "
                f"{len(nodes)} hosts", "make TP × PP × DP a multiple of the host count",
            ))
        elif size > 1 or len(nodes) > 1:
            groups.append((size, host_name, name, server))
        else:
            singles.append((host_name, name, server))
    for size, host_name, name, server in sorted(groups, key=lambda g: -g[0]):
        _place_group(placement, fleet, host_name, name, server, gpus, size,
                     links.get(host_name))
    small, whole = [], []
    for host_name, name, server in singles:
        total = max(g.total for g in gpus[host_name])
        size, how = demand(fleet.hosts[host_name], server, total)
        (small if size <= total // 2 else whole).append((size, host_name, name, how))
    for size, host_name, name, how in sorted(small, key=lambda s: -s[0]):
        _place_single(placement, host_name, name, size, how, gpus[host_name], small=True)
    for size, host_name, name, how in whole:
        _place_single(placement, host_name, name, size, how, gpus[host_name], small=False)
    order = {key: i for i, key in enumerate(unplaced(fleet))}
    placement.refused.sort(key=lambda r: order.get((r.host, r.server), 0))
    placed_hosts = {c.host for c in placement.choices}
    for host_name in dict.fromkeys(h for h, _ in todo if h in placed_hosts):
        host = fleet.hosts[host_name]
        host_links = host.gpus.links or links.get(host_name)
        placement.summary[host_name] = _summary(
            host_name, gpus[host_name], host_links,
            sum(1 for g in groups if g[1] == host_name),
            sum(1 for s in small if s[1] == host_name),
            sum(1 for w in whole if w[1] == host_name),
        )
    return placement


def _summary(
    host_name: str, gpus: list[GpuRoom], links: gpu_table.Links | None,
    groups: int, small: int, whole: int,
) -> str:
    """One host's placement in a sentence: GPUs, their fastest pair, how servers were split."""
    total = min(g.total for g in gpus)
    text = f"{host_name}: {len(gpus)} GPUs of {gib(total)} CUDA total"
    if links and len(gpus) > 1:
        best = gpu_table.best_set(links, len(gpus), 2)
        kinds = sorted(set(links.values()), key=gpu_table.link_rank)
        if best:
            text += (f"; fastest pair GPUs {best[0][0]},{best[0][1]} "
                     f"({gpu_table.describe(best[1])})")
        if len(kinds) > 1:
            text += f", slowest {gpu_table.describe(kinds[-1])}"
    elif len(gpus) > 1:
        text += "; links unknown (no gpus.topology): groups take the lowest free indices"
    shared = sorted({c for g in gpus if len(g.users) > 1 for c in [g.index]})
    text += (f". {groups} parallel group(s) placed first on the fastest links, then {small} "
             f"small server(s) packed by memory")
    text += f" (sharing GPU {', '.join(map(str, shared))})" if shared else ""
    text += f", then {whole} whole-card server(s) one per GPU"
    if not groups:
        text += "; no server needs more than one GPU, so no link matters"
    return text


def placed(fleet: Fleet, placement: Placement) -> Fleet:
    """A copy of ``fleet`` with the chosen GPUs filled in.

    Example:
        >>> from fleet.load import load_text
        >>> text = strip_gpus(open("inventory/examples/workstation-4090.yaml").read())
        >>> fleet = load_text(text, "ws.yaml", capacity=False, unplaced=True)
        >>> placed(fleet, place_fleet(fleet)).hosts["ws-4090"].servers["chat"].gpus
        [0]
    """
    copy = fleet.model_copy(deep=True)
    for (host, server), indices in placement.gpus_of().items():
        copy.hosts[host].servers[server].gpus = list(indices)
    return copy


_GPUS_LINE = re.compile(r"^([ \t]*)gpus:[ \t]*\[[0-9, \t]*\][ \t]*(#.*)?\n", re.M)


def strip_gpus(text: str) -> str:
    """The fleet text without its servers' one-line ``gpus: [...]`` entries (for tests and
    examples: the host's ``gpus:`` mapping stays).

    Example:
        >>> strip_gpus("servers:\\n  a:\\n    model: m\\n    gpus: [0, 1]\\n    port: 1\\n")
        'servers:\\n  a:\\n    model: m\\n    port: 1\\n'
    """
    return _GPUS_LINE.sub("", text)


def measured(fleet: Fleet, states: dict[str, list[GpuState]]) -> Fleet:
    """A copy of ``fleet`` whose hosts read from the host have their GPUs as measured: the
    count, the model's name where the file gives none, and memory such that the planner's
    CUDA total (:func:`fleet.planner.fit.cuda_total_bytes`) is the host's ``total − reserved``
    (the smallest GPU's, if they differ).

    Example:
        >>> from fleet.load import load_fleet
        >>> f = load_fleet("inventory/examples/workstation-4090.yaml")
        >>> state = GpuState(0, "NVIDIA GeForce RTX 4090", 24564, 380, 410, 23774)
        >>> gpus = measured(f, {"ws-4090": [state]}).hosts["ws-4090"].gpus
        >>> gpus.count, round(cuda_total_bytes(gpus.total_gib) / MiB)
        (1, 24184)
    """
    copy = fleet.model_copy(deep=True)
    for name, gpu_states in states.items():
        host = copy.hosts.get(name)
        if host is None or not gpu_states:
            continue
        smallest = min(s.cuda_total_mib for s in gpu_states)
        host.gpus.count = len(gpu_states)
        host.gpus.memory_gib = smallest / 1024 + gpu_table.DRIVER_RESERVED_GIB
        if host.gpus.model is None:
            host.gpus.model = gpu_states[0].name
    return copy


def measured_sources(states: dict[str, list[GpuState]]) -> dict[str, str]:
    """Where :func:`measured` took each host's CUDA total from, for the plan to say.

    Example:
        >>> found = measured_sources({"box": [GpuState(0, "NVIDIA H200", 143771, 616, 1, 2)]})
        >>> found["box"]
        'measured on the host: nvidia-smi memory.total 143771 MiB − memory.reserved 616 MiB'
    """
    sources = {}
    for name, gpu_states in states.items():
        if not gpu_states:
            continue
        smallest = min(gpu_states, key=lambda s: s.cuda_total_mib)
        reserve = (f"memory.reserved {smallest.reserved_mib} MiB" if smallest.reserved_mib
                   is not None else f"{gpu_table.DRIVER_RESERVED_GIB} GiB (no memory.reserved)")
        sources[name] = (f"measured on the host: nvidia-smi memory.total {smallest.total_mib} "
                         f"MiB − {reserve}")
    return sources


def rooms(
    fleet: Fleet, states: dict[str, list[GpuState]] | None = None
) -> dict[str, list[GpuRoom]]:
    """Per GPU host, each GPU with what its servers (and, read from the host, other processes)
    take, unplaced servers placed: what ``fleet plan --from-host`` checks."""
    return place_fleet(fleet, states).rooms
