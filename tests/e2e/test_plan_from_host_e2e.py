"""``fleet plan --from-host`` against a sandbox host's GPUs, through the real facts over SSH.

Real parts: a systemd container reached over SSH, the ``fleet`` command as users run it, the
pyinfra facts it reads the host with (``nvidia-smi -q -x`` for memory and processes,
``nvidia-smi topo -m`` for links) and the planner. Stand-ins: the GPUs — the stand-in
``nvidia-smi`` of tests/support/standin_nvidia, copied onto the host with a hardware description
(2 × H200 linked by NV18, as the captured machines) and one foreign process holding 20,000 MiB of
GPU 1. Cheap on purpose: a plain host of its own, no deploy, no vLLM (~10 s).

What it shows: the plan uses the host's GPU count (the file says 1, the host has 2, and the plan
says so), the CUDA total measured there (total − ``memory.reserved``: 143771 − 616 MiB), and the
memory another process holds: with ``--place`` the whole-card server takes the empty GPU 0 and
the small one shares GPU 1 beside the foreign process; a second whole-card server, whose
utilization the foreign process leaves no room for on GPU 1, is refused with the room left.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sandbox import hosts as sandbox
from tests.support import e2e
from tests.support.e2e import ROOT
from tests.support.standin_nvidia.hardware import install

pytestmark = pytest.mark.e2e

HOST = "plan-e2e"
STANDIN_SMI = ROOT / "tests" / "support" / "standin_nvidia" / "files" / "nvidia-smi"
UUIDS = ["GPU-c91839b2-571c-2565-ceec-e9cd59b00357", "GPU-c39cba33-b336-2da3-0c59-8e64ffaff1c5"]
HARDWARE = {
    "name": "NVIDIA H200", "memory_mib": 143771, "cpus": "0-1", "nvlinks": 18,
    "slots": ["0000:00:06.0", "0000:00:07.0"],
    "uuids": {"0000:00:06.0": UUIDS[0], "0000:00:07.0": UUIDS[1]},
}  # fmt: skip
#: Another program (not the fleet's) holding 20,000 MiB of GPU 1.
FOREIGN = [{"pid": 4242, "process_name": "python3", "used_memory": 20000, "gpu_uuid": UUIDS[1]}]

FLEET = """\
# yaml-language-server: $schema={schema}
version: 1
models:
  big: {{hf: "Qwen/Qwen3-8B", revision: "b968826d9c46dd6066d109eabc6255188de91218",
        weights_gib: 15.3}}
  small: {{hf: "Qwen/Qwen3-0.6B", revision: "c1899de289a04d12100db370d81485cdf75e47ca",
          weights_gib: 1.11}}
hosts:
  {host}:
    address: sandbox
    gpus: {{count: {count}, model: H200}}
    vllm: {{version: "0.32.0", variant: cu130}}
    os: {{nvidia: {{driver: "580"}}, cuda: "13.0", python: "3.12"}}
    servers:
{servers}"""
PLACED = """\
      whole: {model: big, port: 8000}
      side: {model: small, port: 8001, args: {gpu-memory-utilization: 0.3}}
"""
#: Two whole-card servers: the first takes the empty GPU 0; 0.9 of GPU 1's 139.8 GiB (+ its
#: context) is 126.3 GiB, more than the 119.8 the foreign process leaves.
CROWDED = """\
      first: {model: big, port: 8000, args: {gpu-memory-utilization: 0.9}}
      second: {model: big, port: 8001, args: {gpu-memory-utilization: 0.9}}
"""


def on_host(command: str, stdin: str = "") -> subprocess.CompletedProcess:
    """A shell command on this module's host."""
    return e2e.on_host(command, HOST, stdin)


@pytest.fixture(scope="module")
def host_up():
    """The plain sandbox host with the stand-in GPUs and nvidia-smi; gone afterwards."""
    sandbox.down([HOST])
    sandbox.up({HOST: []})
    install(lambda command, stdin: on_host(command, stdin), HARDWARE)
    script = STANDIN_SMI.read_text().replace("@DRIVER@", "580.159.04").replace("@CUDA@", "13.0")
    steps = [
        ("cat > /usr/bin/nvidia-smi && chmod 755 /usr/bin/nvidia-smi", script),
        ("mkdir -p /run/nvidia-standin && cat > /run/nvidia-standin/compute-apps.json",
         json.dumps(FOREIGN)),
    ]  # fmt: skip
    for command, stdin in steps:
        done = on_host(command, stdin)
        assert done.returncode == 0, done.stderr
    yield HOST
    sandbox.down([HOST])


def fleet_file(tmp_path: Path, servers: str, count: int = 1) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET.format(schema=ROOT / "inventory" / "fleet.schema.json", host=HOST,
                                 servers=servers, count=count))
    return path


@pytest.fixture(scope="module")
def placed(host_up, tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    path = fleet_file(tmp_path_factory.mktemp("placed"), PLACED)
    return e2e.fleet_cli(path, "plan", "--place", "--from-host", HOST, "--json", str(path),
                         timeout=120)


def test_the_host_nvidia_smi_is_the_stand_in(host_up) -> None:
    listed = on_host("nvidia-smi -L").stdout
    assert listed.count("NVIDIA H200") == 2, listed


def test_plan_from_host_succeeds(placed) -> None:
    assert placed.returncode == 0, (placed.stdout + placed.stderr)[-3000:]


def test_plan_uses_the_hosts_gpu_count_and_says_so(placed) -> None:
    assert f"{HOST}: the fleet file says 1 GPUs, the host has 2: planning with the host's" \
        in placed.stderr
    document = json.loads(placed.stdout)
    assert sorted(g["index"] for g in document["gpus"]) == [0, 1]


def test_plan_uses_the_measured_cuda_total(placed) -> None:
    document = json.loads(placed.stdout)
    whole = next(s for s in document["servers"] if s["server"] == "whole")
    assert "memory.reserved 616 MiB" in whole["cuda_total_source"]
    assert whole["budget_bytes"] == int(0.92 * (143771 - 616) * 2**20)


def test_whole_card_server_takes_the_empty_gpu_small_one_shares_with_the_process(placed) -> None:
    document = json.loads(placed.stdout)
    chosen = {c["server"]: c for c in document["placement"]}
    assert chosen["whole"]["gpus"] == [0]
    assert chosen["side"]["gpus"] == [1]
    assert "other processes" in chosen["side"]["reason"]


def test_a_server_the_foreign_process_leaves_no_room_for_is_refused(host_up, tmp_path) -> None:
    path = fleet_file(tmp_path, CROWDED)
    result = e2e.fleet_cli(path, "plan", "--place", "--from-host", HOST, str(path), timeout=120)
    said = result.stdout + result.stderr
    assert result.returncode == 1, said[-3000:]
    assert f"{HOST}/second: cannot place: needs 126.32 GiB on one GPU" in result.stderr, said
    assert "GPU 1 119.76 GiB" in result.stderr, said
