"""What the planner knows about GPUs: memory per model, and how GPUs of one host are linked.

The one table of GPU facts (:data:`GPU_MODELS`): names, memory as nvidia-smi and as CUDA
report it, compute capability, NVSwitch boards. Every other module asks it.

Memory is what ``nvidia-smi --query-gpu=name,memory.total`` reports (MiB), not the marketing
number: an L4 is sold as 24 GB and reports 23034 MiB (22.5 GiB), because ECC and the firmware
keep the rest. vLLM's ``gpu-memory-utilization`` is a fraction of the total that CUDA reports
(``cudaMemGetInfo``), which the driver puts a few hundred MiB below nvidia-smi's figure
(measured on an H200, driver 580: 143771 MiB = 140.40 GiB in nvidia-smi, 139.80 GiB through
CUDA); :data:`DRIVER_RESERVED_GIB` is that difference, which :mod:`fleet.planner.fit` subtracts.

Links are the cells of ``nvidia-smi topo -m``: ``NV#`` (# bonded NVLinks), ``PIX`` (at most one
PCIe bridge), ``PXB`` (several PCIe bridges, no host bridge), ``PHB`` (a PCIe host bridge, the
CPU), ``NODE`` (host bridges within one NUMA node), ``SYS`` (across NUMA nodes: SMP interconnect).

Example:
    >>> lookup("NVIDIA GeForce RTX 4090").memory_mib
    24564
    >>> round(lookup("h200").memory_gib, 1)
    140.4
    >>> lookup("A100") is None
    True
    >>> parse_matrix(SAMPLE_TOPO)[(0, 1)]
    'PIX'
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from functools import cache

#: GiB that CUDA does not report as total memory though nvidia-smi counts it: 0.60 on an H200
#: (driver 580, benchmarks/gpu_memory_probe.py); OOM messages of 24 GB cards show 0.3–0.4,
#: of A100 80GB ~0.85. One figure for all models, good to about ±0.3 GiB.
DRIVER_RESERVED_GIB = 0.5


@dataclass(frozen=True)
class GpuModel:
    """One GPU model: its canonical name, other names it goes by, its memory, its CUDA compute
    capability and whether it comes on NVSwitch boards (HGX/DGX: the fabric manager's job).

    + memory_mib: nvidia-smi's memory.total; marketed_gb: the size it is sold as
    + cuda_total_gib: what CUDA reports as its total, where a public vLLM log shows it
    + reserved_mib: nvidia-smi's memory.reserved, where a capture of this project shows it (CUDA's
      total is then memory.total − reserved)
    + cuda_source: where cuda_total_gib or reserved_mib comes from

    Example:
        >>> GpuModel("L4", 23034, 24, capability=(8, 9)).memory_gib
        22.494140625
    """

    name: str
    memory_mib: int
    marketed_gb: int
    aliases: tuple[str, ...] = ()
    capability: tuple[int, int] = (0, 0)
    nvswitch: bool = False
    cuda_total_gib: float | None = None
    reserved_mib: int | None = None
    cuda_source: str = ""

    @property
    def bf16(self) -> bool:
        """bfloat16 needs compute capability 8.0 (Ampere) or newer."""
        return self.capability >= (8, 0)

    @property
    def memory_gib(self) -> float:
        """Memory in GiB as nvidia-smi reports it."""
        return self.memory_mib / 1024


#: nvidia-smi's memory.total per model (MiB), seen on real hosts; the marketed size beside it;
#: CUDA's total where a public log (or this project's capture) shows it.
GPU_MODELS: tuple[GpuModel, ...] = (
    GpuModel(
        "RTX 3090",
        24576,
        24,
        ("GeForce RTX 3090",),
        capability=(8, 6),
        cuda_total_gib=23.58,
        cuda_source="total_gpu_memory=23.58GiB logged by vLLM (vllm#10517, vllm#14447)",
    ),
    GpuModel(
        "RTX 4090",
        24564,
        24,
        ("GeForce RTX 4090",),
        capability=(8, 9),
        cuda_total_gib=23.55,
        cuda_source="total_gpu_memory (23.55GiB) x 0.98 = 23.08GiB logged by vLLM (vllm#13061)",
    ),
    GpuModel("RTX 4090 D", 24564, 24, ("GeForce RTX 4090 D", "RTX 4090D"), capability=(8, 9)),
    GpuModel("RTX 5090", 32607, 32, ("GeForce RTX 5090",), capability=(12, 0)),
    GpuModel("RTX A6000", 49140, 48, capability=(8, 6)),
    GpuModel("RTX 6000 Ada", 49140, 48, ("RTX 6000 Ada Generation",), capability=(8, 9)),
    GpuModel("T4", 15360, 16, ("Tesla T4",), capability=(7, 5)),
    GpuModel("A10", 23028, 24, capability=(8, 6)),
    GpuModel("L4", 23034, 24, capability=(8, 9)),
    GpuModel("L40", 46068, 48, capability=(8, 9)),
    GpuModel(
        "L40S",
        46068,
        48,
        capability=(8, 9),
        cuda_total_gib=44.42,
        cuda_source="total_gpu_memory (44.42GiB) logged by vLLM (vllm#15815)",
    ),
    GpuModel("A40", 46068, 48, capability=(8, 6)),
    GpuModel(
        "A100 40GB",
        40960,
        40,
        ("A100-SXM4-40GB", "A100-PCIE-40GB", "A100 PCIe 40GB"),
        capability=(8, 0),
        nvswitch=True,
    ),
    GpuModel(
        "A100 80GB",
        81920,
        80,
        ("A100-SXM4-80GB", "A100 80GB PCIe", "A100-PCIE-80GB"),
        capability=(8, 0),
        nvswitch=True,
        cuda_total_gib=79.15,
        cuda_source="total_gpu_memory=79.15GiB logged by vLLM (vllm#10533)",
    ),
    GpuModel(
        "H100 SXM",
        81559,
        80,
        ("H100", "H100 80GB HBM3", "H100 SXM5", "H100-SXM5-80GB"),
        capability=(9, 0),
        nvswitch=True,
        cuda_total_gib=79.22,
        cuda_source="total_gpu_memory 79.22GiB logged by vLLM (vllm#10511, vllm#12126)",
    ),
    GpuModel("H100 PCIe", 81559, 80, ("H100 80GB PCIe",), capability=(9, 0)),
    GpuModel("H100 NVL", 95830, 94, capability=(9, 0)),
    GpuModel(
        "H200",
        143771,
        141,
        ("H200 SXM", "H200 SXM 141GB"),
        capability=(9, 0),
        nvswitch=True,
        reserved_mib=616,
        cuda_source="the H200 captured in tests/fixtures/nvidia/h200x1-idle",
    ),
    GpuModel("B200", 183359, 180, capability=(10, 0), nvswitch=True),
)

#: Names that fit several models of different memory: the user must say which.
AMBIGUOUS = {"a100": ("A100 40GB", "A100 80GB")}


def _norm(name: str) -> str:
    """Lower-case, without the vendor prefixes, with one space between words.

    Example:
        >>> _norm("NVIDIA  A100-SXM4-80GB")
        'a100 sxm4 80gb'
    """
    text = re.sub(r"[\s_-]+", " ", name.strip().lower())
    for prefix in ("nvidia ", "geforce ", "tesla "):
        text = text.removeprefix(prefix)
    return text


_BY_NAME = {_norm(alias): gpu for gpu in GPU_MODELS for alias in (gpu.name, *gpu.aliases)}


@cache  # a pure function of the text, called per server and GPU
def lookup(name: str) -> GpuModel | None:
    """The GPU model called ``name`` (case, vendor prefix and dashes do not matter), or None.

    Example:
        >>> lookup("nvidia l40s").name
        'L40S'
    """
    return _BY_NAME.get(_norm(name))


def known_models() -> list[str]:
    """The canonical names of the table, for error messages.

    Example:
        >>> known_models()[:3]
        ['RTX 3090', 'RTX 4090', 'RTX 4090 D']
    """
    return [gpu.name for gpu in GPU_MODELS]


def ambiguous(name: str) -> tuple[str, ...] | None:
    """The models a too-short name could mean (``A100`` → 40GB or 80GB), or None.

    Example:
        >>> ambiguous("NVIDIA A100")
        ('A100 40GB', 'A100 80GB')
    """
    return AMBIGUOUS.get(_norm(name))


# --- topology -------------------------------------------------------------------------------

LINK_PATTERN = r"^(NV\d{1,2}|PIX|PXB|PHB|NODE|SYS|SOC)$"
#: What each link type means, for messages.
LINK_WORDS = {
    "NV": "NVLink",
    "PIX": "one PCIe switch",
    "PXB": "several PCIe bridges",
    "PHB": "a PCIe host bridge (through the CPU)",
    "NODE": "PCIe host bridges within one NUMA node",
    "SYS": "the inter-socket link (across NUMA nodes)",
    "SOC": "the inter-socket link (across NUMA nodes)",
}

Links = dict[tuple[int, int], str]

SAMPLE_TOPO = """\
        GPU0    GPU1    GPU2    GPU3    CPU Affinity    NUMA Affinity
GPU0     X      PIX     PXB     PXB     0-31            N/A
GPU1    PIX      X      PXB     PXB     0-31            N/A
GPU2    PXB     PXB      X      PIX     0-31            N/A
GPU3    PXB     PXB     PIX      X      0-31            N/A

Legend:
  X    = Self
"""


def link_rank(link: str) -> int:
    """Lower is faster: NVLink (more links first), then PIX, PXB, PHB, NODE, SYS.

    Example:
        >>> sorted(["SYS", "PIX", "NV4", "NV12"], key=link_rank)
        ['NV12', 'NV4', 'PIX', 'SYS']
    """
    if link.startswith("NV"):
        return 100 - int(link[2:])
    return 1000 + ["PIX", "PXB", "PHB", "NODE", "SYS", "SOC"].index(link)


def describe(link: str) -> str:
    """A link type in words.

    Example:
        >>> describe("NV4")
        'NV4: NVLink'
        >>> describe("PXB")
        'PXB: several PCIe bridges'
    """
    return f"{link}: {LINK_WORDS['NV' if link.startswith('NV') else link]}"


def is_nvlink(link: str) -> bool:
    """Whether a link type is NVLink."""
    return link.startswith("NV")


def parse_matrix(text: str) -> Links:
    """The GPU-to-GPU cells of an ``nvidia-smi topo -m`` matrix; raise ValueError if malformed.

    Columns other than GPUs (NICs, CPU and NUMA affinity) and the legend are ignored.

    Example:
        >>> parse_matrix("  GPU0 GPU1\\nGPU0 X NV4\\nGPU1 NV4 X\\n")
        {(0, 1): 'NV4'}
    """
    lines = [line for line in text.splitlines() if line.strip()]
    header_at = next((i for i, line in enumerate(lines) if re.match(r"^\s*GPU0\b", line)), None)
    if header_at is None:
        raise ValueError("no header row starting with GPU0 (paste `nvidia-smi topo -m`)")
    columns = [word for word in lines[header_at].split() if re.fullmatch(r"GPU\d+", word)]
    count = len(columns)
    if columns != [f"GPU{i}" for i in range(count)]:
        raise ValueError(f"the header's GPU columns are not GPU0…GPU{count - 1} in order")
    links: Links = {}
    rows = 0
    for line in lines[header_at + 1 :]:
        words = line.split()
        match = re.fullmatch(r"GPU(\d+)", words[0])
        if not match:
            if rows:
                break
            continue
        row = int(match[1])
        cells = words[1 : 1 + count]
        if row != rows or len(cells) < count:
            raise ValueError(f"row GPU{row} does not have {count} GPU cells in order")
        for col, cell in enumerate(cells):
            if col == row:
                if cell != "X":
                    raise ValueError(f"GPU{row}'s own cell is {cell!r}, not X")
                continue
            if not re.fullmatch(LINK_PATTERN, cell):
                raise ValueError(f"GPU{row}→GPU{col}: {cell!r} is not a link type")
            pair = (min(row, col), max(row, col))
            if pair in links and links[pair] != cell:
                raise ValueError(f"GPU{row}↔GPU{col} is {links[pair]} one way, {cell} the other")
            links[pair] = cell
        rows += 1
    if rows != count:
        raise ValueError(f"{count} GPU columns but {rows} GPU rows")
    return links


def parse_pairs(pairs: dict[str, str]) -> Links:
    """Per-pair link types ``{"0-1": "PIX", …}`` as a links table; raise ValueError if malformed.

    Example:
        >>> parse_pairs({"1-0": "PIX", "2-3": "NV4"})
        {(0, 1): 'PIX', (2, 3): 'NV4'}
    """
    links: Links = {}
    for key, link in pairs.items():
        match = re.fullmatch(r"(\d+)-(\d+)", key)
        if not match or match[1] == match[2]:
            raise ValueError(f"{key!r} is not a pair of two GPU indices like '0-1'")
        if not re.fullmatch(LINK_PATTERN, link):
            raise ValueError(f"{key}: {link!r} is not a link type (NV#, PIX, PXB, PHB, NODE, SYS)")
        a, b = sorted((int(match[1]), int(match[2])))
        if (a, b) in links:
            raise ValueError(f"the pair {a}-{b} is given twice")
        links[(a, b)] = link
    return links


def worst_link(links: Links, gpus: list[int]) -> str | None:
    """The slowest link among ``gpus`` (None if a pair is not in the table).

    Example:
        >>> worst_link(parse_matrix(SAMPLE_TOPO), [0, 1, 2])
        'PXB'
    """
    worst: str | None = None
    for pair in itertools.combinations(sorted(set(gpus)), 2):
        link = links.get(pair)
        if link is None:
            return None
        if worst is None or link_rank(link) > link_rank(worst):
            worst = link
    return worst


def best_set(links: Links, count: int, size: int) -> tuple[list[int], str] | None:
    """The ``size`` GPUs (of ``count``) whose slowest link is fastest, and that link.

    Ties go to the lowest indices. Searches every combination up to 20,000 of them, which
    covers 8-GPU hosts; None for larger searches or when links are missing.

    Example:
        >>> best_set(parse_matrix(SAMPLE_TOPO), 4, 2)
        ([0, 1], 'PIX')
    """
    if size < 2 or size > count or math.comb(count, size) > 20_000:
        return None
    best: tuple[int, list[int], str] | None = None
    for combo in itertools.combinations(range(count), size):
        link = worst_link(links, list(combo))
        if link is None:
            continue
        if best is None or link_rank(link) < best[0]:
            best = (link_rank(link), list(combo), link)
    return (best[1], best[2]) if best else None
