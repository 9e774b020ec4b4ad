"""GPU health: the ``--query-gpu`` parser, held against the real H200 captures.

The field names must be ones the real nvidia-smi lists (its captured ``--help-query-gpu``); the
stand-in nvidia-smi must report, for the captured machine, the values the real cards reported
in their ``nvidia-smi -q -x`` captures (parsed here with ElementTree, independently).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from facts.gpuhealth import HEALTH_FIELDS, HEALTH_QUERY, GpuHealth, parse_health
from tests.unit.facts.test_facts_standin import FIXTURES, machine, standin


def help_fields() -> set[str]:
    text = (FIXTURES / "h200x2-idle" / "help-query-gpu.txt").read_text()
    return {name for line in text.splitlines() for name in re.findall(r'^"([^"]+)"|or "([^"]+)"',
            line) for name in name if name}  # fmt: skip


def xml_gpu(state: str, index: int = 0) -> ET.Element:
    root = ET.parse(FIXTURES / f"h200x2-{state}" / "nvidia-smi-q.xml").getroot()
    return root.findall("gpu")[index]


def number(element: ET.Element, path: str) -> float:
    return float(element.findtext(path).split()[0].rstrip("x"))


@pytest.mark.parametrize("field", HEALTH_FIELDS)
def test_every_field_is_one_the_real_nvidia_smi_lists(field: str) -> None:
    assert field in help_fields()


@pytest.mark.parametrize("state", ["idle", "busy"])
def test_standin_reports_what_the_real_cards_reported(tmp_path: Path, state: str) -> None:
    root = machine(tmp_path, busy=state == "busy")
    output = standin(root, f"--query-gpu={HEALTH_QUERY}", "--format=csv,noheader,nounits")
    gpus = GpuHealth().process(output.splitlines())["gpus"]
    assert len(gpus) == 2
    card, gpu = xml_gpu(state), gpus[0]
    link = "pci/pci_gpu_link_info"
    assert gpu["pcie"] == {
        "gen": number(card, f"{link}/pcie_gen/current_link_gen"),
        "gen_max": number(card, f"{link}/pcie_gen/max_link_gen"),
        "width": number(card, f"{link}/link_widths/current_link_width"),
        "width_max": number(card, f"{link}/link_widths/max_link_width"),
    }
    assert gpu["ecc"]["mode"] == card.findtext("ecc_mode/current_ecc")
    assert gpu["power_limit_w"] == number(card, "gpu_power_readings/current_power_limit")
    assert gpu["clocks_mhz"]["sm_max"] == number(card, "max_clocks/sm_clock")
    assert gpu["memory_reserved_mib"] == number(card, "fb_memory_usage/reserved")
    assert gpu["memory_total_mib"] == number(card, "fb_memory_usage/total")
    assert gpu["pstate"] == card.findtext("performance_state")
    assert gpu["throttle"] == []


def test_idle_card_reports_the_idle_clock_event_and_low_clocks(tmp_path: Path) -> None:
    root = machine(tmp_path, busy=False)
    output = standin(root, f"--query-gpu={HEALTH_QUERY}", "--format=csv,noheader,nounits")
    gpu = GpuHealth().process(output.splitlines())["gpus"][0]
    card = xml_gpu("idle")
    assert card.findtext("clocks_event_reasons/clocks_event_reason_gpu_idle") == "Active"
    assert gpu["clock_events_active"] == "0x0000000000000001"
    assert gpu["clocks_mhz"]["sm"] == number(card, "clocks/sm_clock")


def test_unavailable_values_are_none_not_zero() -> None:
    row = ["[N/A]"] * len(HEALTH_FIELDS)
    row[0] = "0"
    row[HEALTH_FIELDS.index("ecc.errors.uncorrected.volatile.total")] = "[Not Supported]"
    gpu = parse_health([", ".join(row)])["gpus"][0]
    assert gpu["index"] == 0
    assert gpu["ecc"]["uncorrected_volatile"] is None
    assert gpu["pcie"]["gen"] is None and gpu["power_w"] is None


@pytest.mark.parametrize(
    ("mask", "events", "throttle"),
    [
        ("0x0000000000000001", ["gpu_idle"], []),
        ("0x0000000000000004", ["sw_power_cap"], []),
        ("0x0000000000000044", ["sw_power_cap", "hw_thermal_slowdown"], ["hw_thermal_slowdown"]),
        ("[N/A]", [], []),
    ],
)
def test_clock_event_bitmask_is_decoded(mask: str, events: list, throttle: list) -> None:
    values = dict.fromkeys(HEALTH_FIELDS, "0")
    values["clocks_event_reasons.active"] = mask
    gpu = parse_health([", ".join(values.values())])["gpus"][0]
    assert (gpu["clock_events"], gpu["throttle"]) == (events, throttle)


def test_a_failing_nvidia_smi_is_an_error_not_a_gpu() -> None:
    lines = (FIXTURES / "synthetic" / "nvidia-smi-no-driver.txt").read_text().splitlines()
    result = parse_health(lines)
    assert result["gpus"] == [] and "NVIDIA-SMI has failed" in result["error"]


def test_standin_refuses_a_field_it_does_not_know(tmp_path: Path) -> None:
    root = machine(tmp_path, busy=False)
    output = standin(root, "--query-gpu=index,no.such.field", "--format=csv,noheader,nounits")
    assert 'Field "no.such.field" is not a valid field to query.' in output


def test_standin_health_override_shows_a_fallen_back_link(tmp_path: Path) -> None:
    root = machine(tmp_path, busy=False)
    path = root / "etc/nvidia-standin/gpus.json"
    hardware = json.loads(path.read_text())
    hardware["health"] = {
        "0000:00:07.0": {"pcie.link.width.current": 8, "ecc.errors.uncorrected.aggregate.total": 3}
    }
    path.write_text(json.dumps(hardware))
    output = standin(root, f"--query-gpu={HEALTH_QUERY}", "--format=csv,noheader,nounits")
    gpus = GpuHealth().process(output.splitlines())["gpus"]
    assert gpus[0]["pcie"]["width"] == 16
    assert gpus[1]["pcie"]["width"] == 8 and gpus[1]["ecc"]["uncorrected_aggregate"] == 3


# --- the real capture of such a query (tests/fixtures/nvidia/h200x1-health) -------------------

HEALTH = FIXTURES / "h200x1-health"


def capture_fields() -> tuple[str, ...]:
    """The field list capture_health.sh asked for (aliases included: clocks.sm, clocks.mem)."""
    script = (FIXTURES / "capture_health.sh").read_text()
    return tuple(re.search(r"^HEALTH=(\S+)$", script, re.MULTILINE).group(1).split(","))


@pytest.mark.parametrize("suffix", ["", "-load"])
def test_header_and_field_list_parse_the_same(suffix: str) -> None:
    with_header = parse_health((HEALTH / f"query-health{suffix}.csv").read_text().splitlines())
    bare = parse_health(
        (HEALTH / f"query-health-noheader-nounits{suffix}.csv").read_text().splitlines(),
        capture_fields(),
    )
    assert with_header["error"] is None and bare["error"] is None
    # two calls a moment apart: the power draw moved (89.13 W, then 86.42 W); nothing else did
    moving = {"raw", "power_w", "utilization_pct", "memory_utilization_pct", "temperature_c"}
    strip = [{k: v for k, v in gpu.items() if k not in moving} for gpu in with_header["gpus"]]
    assert strip == [{k: v for k, v in gpu.items() if k not in moving} for gpu in bare["gpus"]]


def test_real_idle_h200() -> None:
    (gpu,) = parse_health((HEALTH / "query-health.csv").read_text().splitlines())["gpus"]
    assert gpu["pcie"] == {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16}
    assert (gpu["memory_total_mib"], gpu["memory_reserved_mib"], gpu["memory_used_mib"]) == (
        143771,
        616,
        0,
    )
    assert (gpu["power_w"], gpu["power_limit_w"], gpu["temperature_c"]) == (89.13, 700.0, 39)
    assert gpu["clocks_mhz"] == {"sm": 345, "sm_max": 1980, "memory": 3201, "memory_max": 3201}
    assert gpu["clock_events"] == ["gpu_idle"] and gpu["throttle"] == []
    assert gpu["ecc"] == {"mode": "Enabled", "corrected_volatile": 0, "uncorrected_volatile": 0,
                          "corrected_aggregate": 0, "uncorrected_aggregate": 0}  # fmt: skip
    assert gpu["pstate"] == "P0" and gpu["utilization_pct"] == 0


def test_real_h200_under_load_runs_at_its_power_cap_without_throttling() -> None:
    (gpu,) = parse_health((HEALTH / "query-health-load.csv").read_text().splitlines())["gpus"]
    assert (gpu["utilization_pct"], gpu["power_w"], gpu["clocks_mhz"]["sm"]) == (100, 693.3, 1470)
    assert gpu["clock_events"] == ["sw_power_cap"] and gpu["throttle"] == []


def test_the_fact_asks_with_a_header() -> None:
    assert "--format=csv,nounits " in GpuHealth().command()
    assert f"--query-gpu={HEALTH_QUERY} " in GpuHealth().command()


def test_standin_answers_the_facts_own_command(tmp_path: Path) -> None:
    """What drift, verify and status run on a stand-in host: the header form, with units."""
    root = machine(tmp_path, busy=True)
    words = GpuHealth().command().split(" 2>&1")[0].split()[1:]
    output = standin(root, *words)
    assert output.splitlines()[0].startswith("index, pci.bus_id, pstate, pcie.link.gen.current")
    report = GpuHealth().process(output.splitlines())
    assert report["error"] is None
    assert [g["memory_used_mib"] for g in report["gpus"]] == [1551, 2575]
    assert [g["power_w"] for g in report["gpus"]] == [120.66, 120.66]
