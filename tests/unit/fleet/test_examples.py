"""The fleet files of ``inventory/examples/``: what a user copies, kept honest.

Each example passes ``fleet check``, ``fleet plan`` and ``fleet render`` (exit 0, no
traceback) and starts with the line that points editors at the schema. Together they show every
section a user may write: the test names the example that shows monitoring, an endpoint whose
replicas are placed by count, and a rollout gated by a canary, and fails if none does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from fleet.load import load_fleet
from fleet.read.yamlread import read_yaml

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "inventory" / "examples").glob("*.yaml"))
#: The example that shows the newer sections (monitoring, endpoints, replicas by count).
FEATURED = ROOT / "inventory" / "examples" / "fleet-endpoint-monitoring.yaml"
SCHEMA_LINE = "# yaml-language-server: $schema=../fleet.schema.json"


def raw(path: Path) -> dict[str, Any]:
    """An example's YAML as written (before defaults merge or replicas are placed)."""
    mapping, _ = read_yaml(path.read_text(encoding="utf-8"))
    return mapping


def test_there_are_examples():
    assert FEATURED in EXAMPLES and len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("command", ["check", "plan", "render"])
def test_example_passes_the_command(command: str, path: Path, capsys):
    assert main([command, str(path)]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_starts_with_the_schema_line(path: Path):
    assert path.read_text(encoding="utf-8").splitlines()[0] == SCHEMA_LINE


def test_an_example_declares_monitoring():
    assert [p.name for p in EXAMPLES if "monitoring" in raw(p)] == [FEATURED.name]


def test_an_example_places_replicas_by_count_behind_a_canary():
    [endpoint] = raw(FEATURED)["endpoints"].values()
    assert endpoint["replicas"]["count"] >= 2
    assert endpoint["rollout"]["canary"] and endpoint["rollout"]["max_unavailable"] == 1


def test_the_featured_example_places_each_replica_on_a_gpu_box():
    fleet = load_fleet(FEATURED)
    placed = {
        (host_name, name): server.gpus
        for host_name, host in fleet.hosts.items()
        for name, server in host.servers.items()
        if name.startswith("chat-")
    }
    # Spread first over the two 4090 D boxes: a's first free card (GPU0), b's first card.
    assert placed == {
        ("quad-4090d-a", "chat-1"): [0],
        ("quad-4090d-b", "chat-2"): [0],
    }


def test_the_featured_example_renders_the_router_and_prometheus(capsys):
    assert main(["render", str(FEATURED)]) == 0
    out = capsys.readouterr().out
    assert "--worker-urls http://10.0.0.21:16100 http://10.0.0.22:16100" in out
    assert "--web.listen-address=127.0.0.1:9090" in out and "job_name: vllm-router" in out
    # The router listens on the front box's address only: Prometheus, beside it, scrapes there.
    assert "--prometheus-host 10.0.0.20 --prometheus-port 8009" in out
    assert "- 10.0.0.20:8009\n" in out and "127.0.0.1:8009" not in out
