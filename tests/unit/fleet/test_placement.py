"""``fleet plan --place``: the GPUs it chooses (the hand plans of DESIGN.md's reference
deployments, topology first for parallel groups, packing by memory), what it refuses, what
``--write`` changes in the file (nothing but the inserted lines), and ``--from-host`` on the
real H200 captures."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from cli import main as cli
from cli.planplace import states_of
from facts.gpumemory import GpuMemory
from fleet.load import load_fleet, load_text
from fleet.planner.fit import GiB, cuda_total_bytes, plan_fleet
from fleet.planner.gpuswrite import WriteProblem, write_gpus
from fleet.planner.placement import (
    GpuState,
    measured,
    measured_sources,
    place_fleet,
    placed,
    strip_gpus,
    unplaced,
)
from fleet.planner.replicaset import linked_hosts
from fleet.read.problems import FleetError

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "inventory" / "examples"
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia"


def _stripped(name: str, tmp_path: Path | None = None):
    text = strip_gpus((EXAMPLES / f"{name}.yaml").read_text())
    fleet = load_text(text, str(EXAMPLES / f"{name}.yaml"), capacity=False, unplaced=True)
    return text, fleet


def _gpus(placement) -> dict[str, list[int]]:
    return {c.server: c.gpus for c in placement.choices}


def test_servers_without_gpus_are_refused_unless_placing() -> None:
    text, _ = _stripped("quad-4090d")
    with pytest.raises(FleetError, match="needs at least one GPU index"):
        load_text(text, "quad.yaml", capacity=False)


def test_quad_4090d_reproduces_the_hand_plan() -> None:
    """DESIGN.md: one model per card on GPUs 1–3, the three small services sharing GPU0."""
    _, fleet = _stripped("quad-4090d")
    placement = place_fleet(fleet)
    assert placement.refused == []
    assert _gpus(placement) == {"vlm": [1], "llm": [2], "guard": [3],
                                "router": [0], "summarize": [0], "tagger": [0]}
    declared = load_fleet(EXAMPLES / "quad-4090d.yaml")
    assert {n: s.gpus for n, s in placed(fleet, placement).hosts["quad-4090d"].servers.items()} \
        == {n: s.gpus for n, s in declared.hosts["quad-4090d"].servers.items()}


def test_quad_4090d_explains_each_choice() -> None:
    _, fleet = _stripped("quad-4090d")
    placement = place_fleet(fleet)
    assert placement.summary["quad-4090d"] == (
        "quad-4090d: 4 GPUs of 23.49 GiB CUDA total; fastest pair GPUs 0,1 (PIX: one PCIe "
        "switch), slowest PXB: several PCIe bridges. 0 parallel group(s) placed first on the "
        "fastest links, then 3 small server(s) packed by memory (sharing GPU 0), then 3 "
        "whole-card server(s) one per GPU; no server needs more than one GPU, so no link matters"
    )
    choices = {c.server: c for c in placement.choices}
    assert "gpu-memory-utilization 0.3 × 23.49 GiB" in choices["router"].reason
    assert "lowest-numbered empty GPU" in choices["router"].reason
    assert "shares GPU 0 with router, summarize" in choices["tagger"].reason
    assert "GPU 1: kept whole for servers that need a card of their own" in \
        choices["router"].rejected
    assert "vLLM 0.11.0's default gpu-memory-utilization 0.9" in choices["vlm"].reason
    assert "a card of its own: GPU 1" in choices["vlm"].reason
    assert any(r.startswith("GPU 0: 0.02 GiB left (router, summarize, tagger)")
               for r in choices["vlm"].rejected)
    # guard runs with --enforce-eager: no CUDA graphs outside its budget.
    assert "0.50 GiB outside the budget (CUDA context 0.50)" in choices["guard"].reason


def test_tensor_parallel_goes_to_the_pix_pair_only() -> None:
    """"TP=1 first, TP=2 only on the PIX pair": the group takes GPUs 0-1 (PIX), never a PXB
    pair; the small services then open the lowest free card."""
    _, fleet = _stripped("quad-4090d")
    servers = fleet.hosts["quad-4090d"].servers
    servers["vlm"].args["tensor-parallel-size"] = 2
    del servers["guard"]
    placement = place_fleet(fleet)
    assert _gpus(placement) == {"vlm": [0, 1], "router": [2], "summarize": [2], "tagger": [2],
                                "llm": [3]}
    vlm = placement.choices[0]
    assert "GPUs 0,1: PIX: one PCIe switch, the fastest set with room" in vlm.reason
    assert vlm.rejected[0] == "GPUs 0,2: slower link: PXB: several PCIe bridges"


def test_two_groups_take_the_two_pix_pairs() -> None:
    _, fleet = _stripped("quad-4090d")
    host = fleet.hosts["quad-4090d"]
    host.gpus.topology = {"0-1": "PXB", "0-2": "PIX", "0-3": "PXB", "1-2": "PXB",
                          "1-3": "PIX", "2-3": "PXB"}
    host.servers = {name: host.servers[name] for name in ("vlm", "llm")}
    for server in host.servers.values():
        server.args["tensor-parallel-size"] = 2
    assert _gpus(place_fleet(fleet)) == {"vlm": [0, 2], "llm": [1, 3]}


def test_workstation_gets_its_one_gpu() -> None:
    _, fleet = _stripped("workstation-4090")
    assert _gpus(place_fleet(fleet)) == {"chat": [0]}


def test_h200_pair_places_tp8_pp2_on_all_nvlinked_gpus_of_both_hosts() -> None:
    _, fleet = _stripped("h200-pair")
    (choice,) = place_fleet(fleet).choices
    assert choice.gpus == list(range(8))
    assert "8 on each of 2 hosts" in choice.reason and "NV18: NVLink" in choice.reason


def test_declared_servers_stay_and_count() -> None:
    """A server that lists its GPUs keeps them; placement works around it."""
    text = (EXAMPLES / "quad-4090d.yaml").read_text().replace("        gpus: [1]\n", "", 1)
    text = text.replace("gpus: [2]", "gpus: [1]", 1)  # llm declared on GPU 1
    fleet = load_text(text, "quad.yaml", capacity=False, unplaced=True)
    assert unplaced(fleet) == [("quad-4090d", "vlm")]
    assert _gpus(place_fleet(fleet)) == {"vlm": [2]}


def test_overcommit_is_refused_with_the_room_left() -> None:
    _, fleet = _stripped("quad-4090d")
    servers = fleet.hosts["quad-4090d"].servers
    servers["extra"] = servers["vlm"].model_copy(update={"port": 16020})
    placement = place_fleet(fleet)
    (refusal,) = placement.refused
    assert refusal.server == "extra"
    assert refusal.message == (
        "needs 22.14 GiB on one GPU (vLLM 0.11.0's default gpu-memory-utilization 0.9 × "
        "23.49 GiB + 1.00 GiB outside the budget (CUDA context 0.50, CUDA graphs 0.50)); no GPU "
        "has that much left (left, 0.5 GiB headroom kept: GPU 0 0.02 GiB, GPU 1 0.85 GiB, "
        "GPU 2 0.85 GiB, GPU 3 1.35 GiB)"
    )
    assert "lower its gpu-memory-utilization" in refusal.hint
    for gpu in placement.rooms["quad-4090d"]:
        assert gpu.taken <= gpu.total - 0.5 * GiB


def test_overcommit_exits_1_and_writes_nothing(tmp_path: Path, capsys) -> None:
    text, _ = _stripped("quad-4090d")
    text = text.replace("      guard:\n", "      extra:\n        model: vlm-7b\n"
                        "        port: 16020\n      guard:\n")
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    assert cli.main(["plan", "--place", "--write", str(path)]) == 1
    captured = capsys.readouterr()
    assert "quad-4090d/guard: cannot place: needs 21.64 GiB on one GPU" in captured.err
    assert "not written" in captured.err
    assert path.read_text() == text


@pytest.mark.parametrize("name", ["quad-4090d", "workstation-4090", "h200-pair"])
def test_write_restores_the_example_byte_for_byte(tmp_path: Path, name: str, capsys) -> None:
    """The examples list gpus right after model: stripped, placed and written, each file is
    its original again, comments, order and the h200's ``topology: |4`` block included."""
    original = (EXAMPLES / f"{name}.yaml").read_bytes()
    path = tmp_path / f"{name}.yaml"
    path.write_text(strip_gpus(original.decode()))
    for source in (EXAMPLES / f"{name}.yaml").parent.glob("*.json"):
        shutil.copy(source, tmp_path)
    assert cli.main(["plan", "--place", "--write", str(path)]) == 0
    assert path.read_bytes() == original
    assert "wrote" in capsys.readouterr().out
    load_fleet(path)  # a plain, full check passes


def test_write_changes_only_the_inserted_lines() -> None:
    text = (
        "version: 1  # top\n"
        "hosts:\n"
        "  h:\n"
        "    servers:\n"
        "      # the first server\n"
        "      a:\n"
        "        model: \"m\"   # quoted, with a comment\n"
        "        # before port\n"
        "        port: 1\n"
        "      b: {model: m, port: 2}  # flow\n"
        "      c:\n"
        "        gpus: []\n"
        "        model: m\n"
        "      d:\n"
        "        port: 4\n"
        "        model: m\n"
    )
    chosen = {("h", "a"): [0], ("h", "b"): [1, 2], ("h", "c"): [3], ("h", "d"): [4]}
    new = write_gpus(text, chosen)
    assert new.splitlines()[6:8] == ['        model: "m"   # quoted, with a comment',
                                     "        gpus: [0]"]
    assert "      b: {model: m, gpus: [1, 2], port: 2}  # flow" in new
    assert "        gpus: [3]\n        model: m\n" in new
    assert new.endswith("        model: m\n        gpus: [4]\n")
    inserted = {"        gpus: [0]", "        gpus: [4]"}
    kept = [line for line in new.splitlines() if line not in inserted]
    old = text.replace("gpus: []", "gpus: [3]").replace("{model: m, port: 2}",
                                                        "{model: m, gpus: [1, 2], port: 2}")
    assert kept == old.splitlines()


def test_write_keeps_crlf_and_a_missing_last_newline() -> None:
    text = "hosts:\r\n  h:\r\n    servers:\r\n      a:\r\n        model: m"
    assert write_gpus(text, {("h", "a"): [0]}) == text + "\r\n        gpus: [0]\r\n"


@pytest.mark.parametrize(("text", "message"), [
    ("hosts: {h: {servers: {a: {port: 1, model: m}}}}\n", "model is the last key"),
    ("hosts:\n  h:\n    servers:\n      a:\n        model: m\n        gpus: [1]\n",
     "gpus is given but not as []"),
    ('hosts:\n  "[h:h]":\n    servers:\n      a: {model: m, port: 1}\n',
     "made by the range [h:h]; write its gpus in that block by hand"),
])
def test_write_refuses_what_it_cannot_place_safely(text: str, message: str) -> None:
    with pytest.raises(WriteProblem, match=re.escape(message)):
        write_gpus(text, {("h", "a"): [0]})


# --- --from-host on the real captures ---------------------------------------------------------

H200_PAIR = """\
version: 1
models:
  big: {hf: "Qwen/Qwen3-8B", revision: "b968826d9c46dd6066d109eabc6255188de91218",
        weights_gib: 15.3}
  small: {hf: "Qwen/Qwen3-0.6B", revision: "c1899de289a04d12100db370d81485cdf75e47ca",
          weights_gib: 1.11}
hosts:
  box:
    address: 10.0.0.5
    gpus: {count: 2, model: H200}
    vllm: {version: "0.32.0", variant: cu130}
    os: {nvidia: {driver: "580"}, cuda: "13.0", python: "3.12"}
    servers:
      whole: {model: big, port: 8000}
      side: {model: small, port: 8001, args: {gpu-memory-utilization: 0.05}}
"""


def _states(capture: str) -> list[GpuState]:
    xml = (FIXTURES / capture / "nvidia-smi-q.xml").read_text().splitlines()
    return states_of(GpuMemory().process(xml))


def test_from_host_puts_small_servers_beside_other_processes() -> None:
    """h200x2-busy: another python3 holds 1.5 GiB on GPU 0 and 2.5 GiB on GPU 1. The whole-card
    server takes the emptier GPU 0; the small one shares GPU 1 with the foreign process."""
    fleet = load_text(H200_PAIR, "f.yaml", capacity=False, unplaced=True)
    states = {"box": _states("h200x2-busy")}
    placement = place_fleet(measured(fleet, states), states)
    assert _gpus(placement) == {"side": [1], "whole": [0]}
    side = placement.choices[0]
    assert "shares GPU 1 with 2.51 GiB of other processes" in side.reason
    gpu0 = placement.rooms["box"][0]
    assert gpu0.total == 143155 * 2**20  # total − reserved, as measured


def test_from_host_plans_with_the_measured_cuda_total() -> None:
    fleet = load_text(H200_PAIR.replace("      whole: {model: big, port: 8000}\n", ""),
                      "f.yaml", capacity=False, unplaced=True)
    states = {"box": _states("h200x1-busy")}
    host = measured(fleet, states).hosts["box"]
    assert host.gpus.count == 1
    assert cuda_total_bytes(host.gpus.total_gib) == 143155 * 2**20
    planned = placed(measured(fleet, states), place_fleet(measured(fleet, states), states))
    (server,) = plan_fleet(planned).servers
    assert server.budget_bytes == int(0.05 * 143155 * 2**20)
    (said,) = plan_fleet(planned, measured_sources(states)).servers
    assert said.budget_bytes == server.budget_bytes
    assert said.cuda_total_source == ("measured on the host: nvidia-smi memory.total 143771 MiB "
                                      "− memory.reserved 616 MiB")


def test_from_host_refuses_what_the_other_processes_leave_no_room_for() -> None:
    """A 0.99 server cannot start where another process holds 1.5 GiB: vLLM would refuse it."""
    fleet = load_text(H200_PAIR.replace("0.05", "0.99").replace(
        "      whole: {model: big, port: 8000}\n", ""), "f.yaml", capacity=False, unplaced=True)
    states = {"box": _states("h200x1-busy")}
    (refusal,) = place_fleet(measured(fleet, states), states).refused
    assert refusal.message.startswith("needs 138.90 GiB on one GPU")
    assert "GPU 0 137.79 GiB" in refusal.message


def test_from_host_unreachable_host_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "f.yaml"
    path.write_text(H200_PAIR.replace("address: 10.0.0.5",
                                      "address: 127.0.0.1\n    ssh: {port: 1}"))
    assert cli.main(["plan", "--place", "--from-host", "box", str(path)]) == 1
    assert "cannot read GPUs of box: " in capsys.readouterr().err


def test_write_needs_place(capsys) -> None:
    assert cli.main(["plan", "--write", str(EXAMPLES / "quad-4090d.yaml")]) == 2
    assert "give both" in capsys.readouterr().err


def test_place_json_has_choices_refusals_and_the_plan(tmp_path: Path, capsys) -> None:
    path = tmp_path / "ws.yaml"
    path.write_text(strip_gpus((EXAMPLES / "workstation-4090.yaml").read_text()))
    assert cli.main(["plan", "--place", "--json", str(path)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [(c["server"], c["gpus"]) for c in document["placement"]] == [("chat", [0])]
    assert document["refused"] == []
    assert document["servers"][0]["gpus"] == [0] and document["servers"][0]["fits"]


# --- issue 21: placement is per host (and the hosts a group links it to) -----------------------


@pytest.mark.parametrize("name", ["quad-4090d", "h200-pair", "h200-pair-ray"])
def test_placing_one_host_alone_chooses_what_placing_the_fleet_does(name: str) -> None:
    """The replica placer asks placement about one host and its group partners only (linear in
    the fleet, where asking the whole fleet per candidate was quadratic): the same choices."""
    _, fleet = _stripped(name)
    whole = {(c.host, c.server): (c.gpus, c.reason) for c in place_fleet(fleet).choices}
    assert whole
    linked = linked_hosts(fleet)
    for host in fleet.hosts:
        names = linked.get(host, [host])
        part = fleet.model_copy(update={"hosts": {n: fleet.hosts[n] for n in names}})
        alone = {(c.host, c.server): (c.gpus, c.reason) for c in place_fleet(part).choices}
        assert {k: v for k, v in alone.items() if k[0] == host} == {
            k: v for k, v in whole.items() if k[0] == host}
