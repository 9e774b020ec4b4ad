"""NUMA-local serving from the fleet file's topology, and the CPU build's thread binding.

The affinity columns are parsed from real ``nvidia-smi topo -m`` captures (H200 machines,
tests/fixtures/nvidia) and from the HGX example's pasted text (two NUMA nodes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.hostplan.render import host_plan
from fleet.load import load_fleet, load_text
from fleet.planner.numa import Affinity, gpu_affinity
from fleet.read.problems import FleetError

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia"
EXAMPLE = ROOT / "inventory" / "examples" / "h200-pair.yaml"
SHA = "0" * 64


@pytest.mark.parametrize(
    ("capture", "expected"),
    [
        ("h200x1-idle/topo-m.txt", {0: Affinity("0-15", 0)}),
        ("h200x2-idle/topo-m.txt", {0: Affinity("0-31", 0), 1: Affinity("0-31", 0)}),
        ("h200x2-busy/topo-m.pty.txt", {0: Affinity("0-31", 0), 1: Affinity("0-31", 0)}),
    ],
)
def test_affinity_of_real_captures(capture: str, expected: dict) -> None:
    assert gpu_affinity((FIXTURES / capture).read_bytes().decode()) == expected


def hgx_text() -> str:
    fleet = load_fleet(EXAMPLE)
    return fleet.hosts["hgx-h200-01"].gpus.topology


def test_affinity_of_the_pasted_hgx_example() -> None:
    found = gpu_affinity(hgx_text())
    assert {i: a.node for i, a in found.items()} == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1,
                                                     7: 1}  # fmt: skip
    assert found[4].cpus == "56-111,168-223"


def gpu_fleet(servers: str, topology: str | None = None) -> str:
    text = topology if topology is not None else hgx_text()
    block = "\n".join("        " + line for line in text.splitlines())
    return f"""\
version: 1
models:
  m: {{url: "https://models.example/m.tar.gz", sha256: "{SHA}", weights_gib: 1}}
hosts:
  hgx:
    address: 10.0.0.1
    gpus:
      count: 8
      model: "H200"
      topology: |2
{block}
    os: {{nvidia: {{driver: "580"}}}}
    vllm: {{version: "0.32.0", variant: cu130}}
    servers:
{servers}
"""


def unit(text: str, server: str) -> list[str]:
    plan = host_plan(load_text(text, "f.yaml"), "hgx", secrets=lambda ref: "")
    return next(s for s in plan.servers if s.name == server).unit_text.splitlines()


def test_server_on_one_node_is_bound_to_it() -> None:
    lines = unit(gpu_fleet("      b: {model: m, port: 8001, gpus: [4, 5], "
                           "args: {tensor-parallel-size: 2}}"), "b")  # fmt: skip
    assert lines[lines.index("CPUAffinity=56-111,168-223") + 1 :][:2] == [
        "NUMAPolicy=bind",
        "NUMAMask=1",
    ]
    assert "# NUMA-local (from the fleet file's topology): GPUs 4, 5 attach to node 1" in lines


def test_server_across_nodes_is_not_bound_and_warned() -> None:
    text = gpu_fleet("      all: {model: m, port: 8001, gpus: [2, 3, 4, 5], "
                     "args: {tensor-parallel-size: 4}}")  # fmt: skip
    lines = unit(text, "all")
    assert not [line for line in lines if line.startswith(("CPUAffinity", "NUMA"))]
    assert "# NUMA: GPUs 2, 3, 4, 5 span NUMA nodes 0, 1: no CPU or memory binding" in lines
    warnings: list = []
    load_text(text, "f.yaml", warnings=warnings)
    assert any("span NUMA nodes 0, 1" in str(w) and "servers.all.gpus" in str(w)
               for w in warnings)  # fmt: skip


def test_single_node_machine_is_not_bound() -> None:
    text = gpu_fleet("      a: {model: m, port: 8001, gpus: [0]}",
                     topology=(FIXTURES / "h200x1-idle" / "topo-m.txt").read_text()
                     .replace("\x1b[4m", "").replace("\x1b[0m", "")
                     .replace("GPU0\t X \t0-15\t0", "GPU0\t X \t0-15\tN/A"))  # fmt: skip
    lines = unit(text.replace("count: 8", "count: 1"), "a")
    assert not [line for line in lines if "NUMA" in line or "CPUAffinity" in line]


def test_topology_as_pairs_says_nothing_about_numa() -> None:
    text = gpu_fleet("      a: {model: m, port: 8001, gpus: [0]}").split("      topology")[0]
    text += '      topology: {"0-1": NV18}\n    os: {nvidia: {driver: "580"}}\n'
    text += '    vllm: {version: "0.32.0", variant: cu130}\n'
    text += "    servers:\n      a: {model: m, port: 8001, gpus: [0]}\n"
    assert not [line for line in unit(text, "a") if "NUMA" in line]


CPU = """\
version: 1
models:
  m: {{url: "https://models.example/m.tar.gz", sha256: "{sha}"}}
hosts:
  cpu:
    address: 10.0.0.2
    vllm: {{version: "0.32.0", variant: cpu}}
    servers:
      a: {{model: m, port: 8001{a}}}
      b: {{model: m, port: 8002{b}}}
"""


def cpu_warnings(a: str = "", b: str = "") -> list[str]:
    warnings: list = []
    load_text(CPU.format(sha=SHA, a=a, b=b), "f.yaml", warnings=warnings)
    return [str(w) for w in warnings]


def bind(value: str) -> str:
    return f", env: {{VLLM_CPU_OMP_THREADS_BIND: {value!r}}}"


def test_two_cpu_servers_left_at_auto_share_cores() -> None:
    (warning,) = cpu_warnings()
    assert "servers a, b all bind their threads with VLLM_CPU_OMP_THREADS_BIND=auto" in warning


def test_cpu_servers_with_disjoint_lists_are_fine() -> None:
    assert cpu_warnings(bind("0-7"), bind("8-15")) == []


def test_cpu_servers_with_overlapping_lists_are_warned() -> None:
    (warning,) = cpu_warnings(bind("0-7"), bind("6-9"))
    assert "servers.b.env.VLLM_CPU_OMP_THREADS_BIND" in warning
    assert "CPU 6 is also bound by server a" in warning


def test_malformed_thread_binding_is_refused() -> None:
    with pytest.raises(FleetError, match="is not auto, nobind or CPU lists per rank"):
        load_text(CPU.format(sha=SHA, a=bind("0-7;8"), b=bind("9")), "f.yaml")


def test_one_cpu_server_is_left_alone() -> None:
    text = CPU.format(sha=SHA, a="", b="").split("      b:")[0]
    warnings: list = []
    plan = host_plan(load_text(text, "f.yaml", warnings=warnings), "cpu", secrets=lambda r: "")
    assert warnings == []
    assert "VLLM_CPU_OMP_THREADS_BIND" not in plan.servers[0].env_text
