"""``fleet status`` without a live server: probes built from real captures (a vLLM CPU 0.32
``/metrics`` page, the stand-in nvidia-smi's report of the captured H200s), hosts that do not
answer, the screen, ``--json`` and ``--watch``. The live server is tests/e2e/test_bench_e2e.py.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from cli import main as cli
from cli.bench.tunnel import free_port
from cli.status.command import exit_status
from cli.status.model import DOWN, STARTING, UP, fleet_status
from cli.status.probe import HostProbe, probe_script, split_sections
from cli.status.view import screen
from facts.gpuhealth import HEALTH_QUERY
from fleet.hostplan.render import host_plan
from fleet.judge.health import BAD, OK, WARN
from fleet.load import load_text
from tests.unit.facts.test_facts_standin import machine, standin

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm-startup"
#: /metrics of a real vLLM CPU 0.32 serving the tiny test model, after two completions.
METRICS = (DATA / "cpu-v032-tiny.metrics.txt").read_text()
SHA = "0" * 64
FLEET = f"""\
version: 1
models:
  tiny: {{url: "https://models.example/tiny.tar.gz", sha256: "{SHA}"}}
hosts:
  cpu-1:
    address: 127.0.0.1
    ssh: {{port: 1}}
    vllm: {{version: "0.32.0", variant: cpu}}
    servers:
      tiny: {{model: tiny, port: 18000, served_model_name: tiny}}
      other: {{model: tiny, port: 18001, served_model_name: other}}
  gpu-1:
    address: 10.0.0.2
    gpus: {{count: 2, model: "H200"}}
    os: {{nvidia: {{driver: "580"}}}}
    vllm: {{version: "0.32.0", variant: cu130}}
    servers:
      chat: {{model: tiny, port: 18002, gpus: [0]}}
"""


@pytest.fixture(scope="module")
def plans():
    fleet = load_text(FLEET, "fleet.yaml")
    return {name: host_plan(fleet, name, secrets=lambda ref: "") for name in fleet.hosts}


def unit(name: str, active: str = "active", sub: str = "running", restarts: int = 0) -> list:
    """``systemctl show -p …`` of one unit, as systemd prints it."""
    return [f"Id={name}", "LoadState=loaded", f"ActiveState={active}", f"SubState={sub}",
            f"NRestarts={restarts}", "ActiveEnterTimestamp=Tue 2026-12-01 11:44:11 UTC",
            "ExecMainPID=26746"]  # fmt: skip


def answer(status: int, body: str = "") -> list[str]:
    return [json.dumps({"status": status, "body": body})]


def cpu_probe(taken_at: float = 1000.0, **units) -> HostProbe:
    sections = {
        ("unit", "tiny"): unit("vllm-tiny.service"),
        ("http-health", "tiny"): answer(200),
        ("metrics", "tiny"): answer(200, METRICS),
        ("unit", "other"): unit("vllm-other.service", "failed", "failed", 5),
        ("http-health", "other"): ["request failed: <urlopen error [Errno 111] refused>"],
        ("metrics", "other"): ["request failed: <urlopen error [Errno 111] refused>"],
    }
    for name, lines in units.items():
        sections[("unit", name)] = lines
    return HostProbe("cpu-1", sections, None, taken_at, 0.2)


def gpu_probe(tmp_path: Path, overrides: dict | None = None) -> HostProbe:
    root = machine(tmp_path / "standin", busy=True)
    if overrides:
        path = root / "etc/nvidia-standin/gpus.json"
        hardware = json.loads(path.read_text())
        hardware["health"] = overrides
        path.write_text(json.dumps(hardware))
    health = standin(root, f"--query-gpu={HEALTH_QUERY}", "--format=csv,noheader,nounits")
    return HostProbe("gpu-1", {
        ("unit", "chat"): unit("vllm-chat.service"),
        ("http-health", "chat"): answer(200),
        ("metrics", "chat"): answer(200, METRICS.replace('model_name="tiny"',
                                                         'model_name="tiny"')),
        ("health", ""): health.splitlines(),
    }, None, 1000.0, 0.3)  # fmt: skip


def test_probe_script_asks_each_server_and_the_gpus(plans) -> None:
    script = probe_script(plans["gpu-1"], startup=True)
    markers = [line for line in script.splitlines() if line.startswith("echo")]
    assert markers == [
        "echo '@@ unit chat'",
        "echo '@@ http-health chat'",
        "echo '@@ metrics chat'",
        "echo '@@ journal chat'",
        "echo '@@ startups chat'",
        "echo '@@ health'",
    ]
    assert "nvidia-smi --query-gpu=" in script and "VLLM_API_KEY" not in script


def test_probe_script_asks_each_server_where_it_listens() -> None:
    """A server bound to 127.0.0.2 (or ::) is asked there, not on 127.0.0.1 (issue 23)."""
    text = FLEET.replace("served_model_name: tiny}", "served_model_name: tiny, host: 127.0.0.2}")
    text = text.replace("served_model_name: other}", "served_model_name: other, host: '::'}")
    plan = host_plan(load_text(text, "fleet.yaml"), "cpu-1", secrets=lambda ref: "")
    payloads = [json.loads(line.split("printf %s ", 1)[1].split(" | ", 1)[0].strip("'"))
                for line in probe_script(plan).splitlines() if line.startswith("printf %s ")]
    assert [(p["url"], p["path"]) for p in payloads] == [
        ("http://127.0.0.2:18000", "/health"), ("http://127.0.0.2:18000", "/metrics"),
        ("http://[::1]:18001", "/health"), ("http://[::1]:18001", "/metrics")]


def test_cpu_host_has_no_gpu_section(plans) -> None:
    assert "nvidia-smi" not in probe_script(plans["cpu-1"])


def test_sections_keep_empty_answers() -> None:
    assert split_sections(["junk", "@@ metrics a", "@@ unit a", "x"]) == {
        ("metrics", "a"): [],
        ("unit", "a"): ["x"],
    }


def test_live_server_row_from_a_real_metrics_page(plans) -> None:
    status = fleet_status({"cpu-1": plans["cpu-1"]}, {"cpu-1": cpu_probe()})
    tiny = status.servers[0]
    assert (tiny.server, tiny.health, tiny.model, tiny.restarts) == ("tiny", UP, "tiny", 0)
    assert (tiny.running, tiny.waiting, tiny.kv_cache_pct, tiny.preemptions) == (0, 0, 0, 0)
    assert 0.005 < tiny.ttft_p50_s < 0.1 and tiny.ttft_window_s is None
    assert tiny.levels == {"health": OK, "waiting": OK, "preemptions": OK,
                           "kv_cache_pct": OK, "restarts": OK}  # fmt: skip


def test_failed_server_is_down_and_its_restarts_are_bad(plans) -> None:
    other = fleet_status({"cpu-1": plans["cpu-1"]}, {"cpu-1": cpu_probe()}).servers[1]
    assert (other.health, other.state, other.restarts) == (DOWN, "failed (failed)", 5)
    assert other.levels["health"] == BAD and other.levels["restarts"] == BAD
    assert other.running is None


def test_running_unit_that_does_not_answer_is_down(plans) -> None:
    found = cpu_probe()
    found.sections[("http-health", "tiny")] = ["request failed: timed out"]
    tiny = fleet_status({"cpu-1": plans["cpu-1"]}, {"cpu-1": found}).servers[0]
    assert (tiny.health, tiny.state) == (DOWN, "active (running), /health not answering")


def test_activating_server_is_starting(plans) -> None:
    found = cpu_probe(tiny=unit("vllm-tiny.service", "activating", "start-post"))
    tiny = fleet_status({"cpu-1": plans["cpu-1"]}, {"cpu-1": found}).servers[0]
    assert (tiny.health, tiny.levels["health"]) == (STARTING, WARN)


def test_ttft_is_over_the_last_minute_once_an_older_scrape_is_kept(plans) -> None:
    history: dict = {}
    fleet_status({"cpu-1": plans["cpu-1"]}, {"cpu-1": cpu_probe(1000.0)}, history)
    again = fleet_status({"cpu-1": plans["cpu-1"]}, {"cpu-1": cpu_probe(1030.0)}, history)
    assert again.servers[0].ttft_window_s is None  # 30 s: not yet a minute
    later = fleet_status({"cpu-1": plans["cpu-1"]}, {"cpu-1": cpu_probe(1061.0)}, history)
    tiny = later.servers[0]
    assert tiny.ttft_window_s == 61
    assert tiny.ttft_p50_s is None  # the same page: no request in that minute


def test_unreachable_host_makes_its_servers_down(plans) -> None:
    found = HostProbe("cpu-1", error="ssh: connect to host 127.0.0.1 port 1: refused")
    status = fleet_status({"cpu-1": plans["cpu-1"]}, {"cpu-1": found})
    assert [(r.server, r.health) for r in status.servers] == [("tiny", DOWN), ("other", DOWN)]
    assert status.servers[0].state.startswith("host unreachable: ssh: connect")
    assert status.unreachable == {"cpu-1": found.error}
    assert exit_status(status) == 2


def test_gpu_rows_from_the_standin_report_of_the_captured_h200s(plans, tmp_path: Path) -> None:
    status = fleet_status({"gpu-1": plans["gpu-1"]}, {"gpu-1": gpu_probe(tmp_path)})
    gpu = status.gpus[0]
    assert (gpu.index, gpu.memory_total_mib, gpu.power_limit_w, gpu.pcie_text) == (
        0,
        143771,
        700.0,
        "Gen5 x16",
    )
    assert gpu.memory_used_mib == 1551 and gpu.temperature_c == 38
    assert gpu.levels == {"memory_pct": OK, "temperature_c": OK, "power_pct": OK,
                          "utilization_pct": "idle", "pcie": OK, "ecc": OK}  # fmt: skip
    assert exit_status(status) == 0


def test_a_gpu_that_fell_back_is_bad_and_fails_the_exit_status(plans, tmp_path: Path) -> None:
    found = gpu_probe(
        tmp_path, {"0000:00:07.0": {"pcie.link.gen.current": 1, "temperature.gpu": 87}}
    )
    status = fleet_status({"gpu-1": plans["gpu-1"]}, {"gpu-1": found})
    gpu = status.gpus[1]
    assert gpu.pcie_text == "Gen1/5 x16" and gpu.problems == ["PCIe Gen1 of Gen5"]
    assert gpu.levels["pcie"] == BAD and gpu.levels["temperature_c"] == BAD
    assert exit_status(status) == 2


def test_screen_shows_servers_gpus_and_colours(plans, tmp_path: Path) -> None:
    status = fleet_status(plans, {"cpu-1": cpu_probe(), "gpu-1": gpu_probe(tmp_path)})
    console = Console(record=True, width=200, color_system="truecolor", file=io.StringIO())
    console.print(screen(status))
    text = console.export_text(clear=False)
    assert "cpu-1/tiny" in text and "cpu-1/other" in text and "gpu-1/gpu1" in text
    assert "since start" in text and "Gen5 x16" in text and "failed (failed)" in text
    styled = console.export_text(styles=True)
    assert "\x1b[1;31mdown" in styled  # bold red
    assert "\x1b[32mup" in styled  # green


UNREACHABLE = """\
version: 1
models:
  tiny: {url: "https://models.example/tiny.tar.gz", sha256: "SHA"}
hosts:
  down-1:
    address: 127.0.0.1
    ssh: {port: 1}
    vllm: {version: "0.32.0", variant: cpu}
    servers: {tiny: {model: tiny, port: 18000}}
  gone-1:
    address: sandbox
    vllm: {version: "0.32.0", variant: cpu}
    servers: {tiny: {model: tiny, port: 18001}}
""".replace("SHA", SHA)


@pytest.fixture
def unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEET_SANDBOX_DIR", str(tmp_path / "no-sandboxes"))
    path = tmp_path / "fleet.yaml"
    path.write_text(UNREACHABLE)
    return path


def test_cli_reports_every_unreachable_host_as_down(unreachable: Path, capsys) -> None:
    assert cli.main(["status", str(unreachable), "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert [(r["host"], r["health"]) for r in report["servers"]] == [
        ("down-1", "down"),
        ("gone-1", "down"),
    ]
    assert "sandbox host gone-1 is not running" in report["unreachable"]["gone-1"]
    assert report["unreachable"]["down-1"]


def test_cli_watch_refreshes_then_stops(unreachable: Path, capsys) -> None:
    began = time.monotonic()
    code = cli.main(["status", str(unreachable), "--watch", "--count", "2", "--interval", "0.1",
                     "--host", "gone-1"])  # fmt: skip
    assert code == 2 and time.monotonic() - began < 30
    assert "gone-1/tiny" in capsys.readouterr().out


def test_cli_refuses_a_bad_fleet_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("version: 1\nhosts: {a: {adress: x}}\n")
    assert cli.main(["status", str(path)]) == 1
    assert "invalid" in capsys.readouterr().err


def test_real_h200_under_load_is_healthy_at_its_power_limit(plans) -> None:
    """The captured H200 running matmuls: 100 % busy at 693 of 700 W, the power cap active."""
    capture = Path(__file__).resolve().parents[2] / "fixtures/nvidia/h200x1-health"
    found = HostProbe("gpu-1", {("health", ""): (capture / "query-health-load.csv")
                                .read_text().splitlines()}, None, 1000.0)  # fmt: skip
    status = fleet_status({"gpu-1": plans["gpu-1"]}, {"gpu-1": found})
    (gpu,) = status.gpus
    assert (gpu.utilization_pct, gpu.power_pct, gpu.clock_events) == (100, 99.0, ["sw_power_cap"])
    assert gpu.levels["power_pct"] == OK and gpu.problems == [] and gpu.throttle == []


def test_cli_watch_json_prints_one_document_per_reading(unreachable: Path, capsys) -> None:
    code = cli.main(["status", str(unreachable), "--watch", "--json", "--count", "2",
                     "--interval", "0.1", "--host", "gone-1"])  # fmt: skip
    readings = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 2 and len(readings) == 2
    assert all(r["servers"][0]["health"] == "down" for r in readings)


def test_monitoring_units_are_probed_and_judged(tmp_path: Path) -> None:
    text = UNREACHABLE.replace("port: 18000}", "port: 18000, host: 0.0.0.0}")
    fleet = load_text(text + "monitoring: {host: gone-1, alertmanager: {port: 18609}}\n",
                      "fleet.yaml")  # fmt: skip
    plan = host_plan(fleet, "gone-1", secrets=lambda ref: "")
    markers = [line for line in probe_script(plan).splitlines() if "@@ monitoring" in line]
    assert markers == ["echo '@@ monitoring node'", "echo '@@ monitoring prometheus'",
                       "echo '@@ monitoring alertmanager'"]  # fmt: skip
    found = HostProbe("gone-1", {
        ("monitoring", "node"): unit("prometheus-node-exporter.service", "failed", "failed"),
        ("monitoring", "prometheus"): unit("prometheus.service"),
        ("monitoring", "alertmanager"): unit("prometheus-alertmanager.service", "activating",
                                             "auto-restart"),
    }, None, 1000.0)  # fmt: skip
    status = fleet_status({"gone-1": plan}, {"gone-1": found})
    assert [(r.part, r.health, r.state) for r in status.monitoring] == [
        ("node", DOWN, "failed (failed)"),
        ("prometheus", UP, "active (running)"),
        ("alertmanager", STARTING, "activating (auto-restart)"),
    ]
    assert exit_status(status) == 2
    console = Console(record=True, width=160, file=io.StringIO())
    console.print(screen(status))
    shown = console.export_text()
    assert "monitoring" in shown and "failed (failed)" in shown


@pytest.mark.parametrize(
    ("monitoring", "said"),
    [
        # a sandbox Prometheus: asked on loopback here, and it does not answer
        ("{host: gone-1, prometheus: {port: PORT}}", "http://127.0.0.1:PORT: <urlopen error"),
        # Prometheus on loopback of a real host: asked there over ssh, which does not answer
        ("{host: down-1, prometheus: {port: PORT}}", "http://127.0.0.1:PORT (over ssh): "),
    ],
)
def test_cli_uses_the_fleets_prometheus_and_says_when_it_does_not_answer(
    unreachable: Path, capsys, monitoring: str, said: str
) -> None:
    port = str(free_port())
    text = unreachable.read_text() + f"monitoring: {monitoring.replace('PORT', port)}\n"
    unreachable.write_text(text.replace("port: 18000}", "port: 18000, host: 0.0.0.0}"))
    assert cli.main(["status", str(unreachable), "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    why = report["unreachable"]["prometheus"]
    assert why.startswith(said.replace("PORT", port)) and why.endswith("(figures from the hosts)")
    assert report["prometheus"] is None
    assert {(r["host"], r["part"], r["health"]) for r in report["monitoring"]} >= {
        ("down-1", "node", "down"), ("gone-1", "node", "down")}  # fmt: skip
    assert cli.main(["status", str(unreachable), "--json", "--from-hosts"]) == 2
    assert "prometheus" not in json.loads(capsys.readouterr().out)["unreachable"]
