"""Issue 21's leftovers at `fleet check`: kernel parameter names and their numeric values, the
ssh identity file's shape, local model files that exist, and tabs inside block scalars."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fleet.checks.sysctl_names import NAMES_FILE, closest, kind, names
from fleet.load import FleetError, load_fleet, load_text
from fleet.planner.numa import gpu_affinity
from fleet.read.yamlread import read_yaml

ROOT = Path(__file__).resolve().parents[3]
SHA = "ab" * 32
HOST = '    address: 10.0.0.1\n    vllm: {version: "0.32.0", variant: cpu}\n'


def fleet_text(host_extra: str = "", models: str = "") -> str:
    return f"version: 1\n{models}hosts:\n  box:\n{HOST}{host_extra}"


def sysctl(entries: str) -> str:
    return fleet_text(f"    os:\n      sysctl: {{{entries}}}\n")


def load(text: str) -> tuple[list, object]:
    warnings: list = []
    fleet = load_text(text, "f.yaml", warnings=warnings)
    return warnings, fleet


def problems(text: str) -> list:
    with pytest.raises(FleetError) as info:
        load_text(text, "f.yaml")
    return info.value.problems


# --- the names data --------------------------------------------------------------------------


def test_the_names_file_says_where_it_comes_from() -> None:
    header = "\n".join(line for line in NAMES_FILE.read_text().splitlines()
                       if line.startswith("#"))
    assert "Source: /proc/sys of Linux 6.18" in header
    assert "Documentation/admin-guide/sysctl" in header


def test_every_line_is_a_name_and_a_kind() -> None:
    for line in NAMES_FILE.read_text().splitlines():
        if not line.startswith("#"):
            assert re.fullmatch(r"[a-z0-9_]+(\.[A-Za-z0-9_*-]+)+ (int|ints|text)", line), line


@pytest.mark.parametrize("key", ["vm.swappiness", "net.core.somaxconn", "fs.file-max",
                                 "kernel.numa_balancing", "vm.max_map_count",
                                 "net.ipv4.tcp_congestion_control", "kernel.sysrq"])
def test_the_design_and_common_tuning_keys_are_known(key: str) -> None:
    assert kind(key) is not None


@pytest.mark.parametrize("key", ["net.ipv4.conf.eth0.rp_filter", "net.ipv4.conf.all.forwarding",
                                 "net.ipv6.conf.ens8f0np0.disable_ipv6",
                                 "net.ipv4.neigh.default.gc_thresh3",
                                 "net.ipv4.conf.*.rp_filter"])
def test_interface_keys_are_known_for_any_interface(key: str) -> None:
    assert kind(key) == "int"
    assert "net.ipv4.conf.*.rp_filter" in names()


@pytest.mark.parametrize(("key", "wanted"), [("net.ipv4.tcp_rmem", "ints"),
                                             ("kernel.core_pattern", "text"),
                                             ("net.ipv4.tcp_congestion_control", "text"),
                                             ("net.core.rps_default_mask", "text"),
                                             ("kernel.printk_devkmsg", "text")])
def test_words_lists_and_bitmaps_are_not_numbers(key: str, wanted: str) -> None:
    assert kind(key) == wanted


def test_a_typo_gets_a_did_you_mean_with_its_own_interface() -> None:
    assert closest("vm.swapiness") == "did you mean 'vm.swappiness'?"
    assert closest("net.ipv4.conf.eth0.rp_filtre") == "did you mean 'net.ipv4.conf.eth0.rp_filter'?"


# --- sysctl at fleet check -------------------------------------------------------------------


def test_a_misspelt_key_is_a_located_warning_with_the_fix() -> None:
    warnings, _ = load(sysctl("vm.swapiness: 1"))
    [warning] = warnings
    assert (warning.line, warning.path) == (7, ("hosts", "box", "os", "sysctl", "vm.swapiness"))
    assert "did you mean 'vm.swappiness'?" in warning.message
    assert "/proc/sys/vm/swapiness" in warning.hint


def test_known_keys_give_no_warning() -> None:
    warnings, _ = load(sysctl('vm.swappiness: 1, net.ipv4.conf.all.rp_filter: 2, '
                              'net.ipv4.tcp_rmem: "4096 87380 6291456"'))
    assert warnings == []


@pytest.mark.parametrize("value", ["on", "off", "yes", "true-ish", "2M", "high"])
def test_words_for_a_numeric_key_are_refused_at_the_key(value: str) -> None:
    [problem] = problems(sysctl(f"vm.swappiness: {value}"))
    assert problem.path == ("hosts", "box", "os", "sysctl", "vm.swappiness")
    assert f"vm.swappiness takes a number, not {value!r}" in problem.message


def test_on_gets_the_number_to_write() -> None:
    [problem] = problems(sysctl("net.ipv4.ip_forward: on"))
    assert problem.hint == ("write net.ipv4.ip_forward: 1 (the kernel reads a switch as 1 for "
                            "on, 0 for off)")


@pytest.mark.parametrize("entry", ["vm.swappiness: 10", 'vm.swappiness: "10"',
                                   'kernel.sysrq: "0x1b6"', "kernel.sched_rt_runtime_us: -1",
                                   'net.ipv4.ip_local_port_range: "1024 65000"',
                                   "net.ipv4.tcp_congestion_control: bbr",
                                   "kernel.core_pattern: core", "kernel.printk_devkmsg: on"])
def test_numbers_and_words_where_words_belong_are_accepted(entry: str) -> None:
    load(sysctl(entry))


def test_an_unknown_key_takes_any_value_it_took_before() -> None:
    warnings, fleet = load(sysctl("net.vendor.knob: fast"))
    assert fleet.hosts["box"].os.sysctl == {"net.vendor.knob": "fast"}  # type: ignore[attr-defined]
    assert len(warnings) == 1


# --- the ssh identity file -------------------------------------------------------------------

PRIVATE = b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"  # noqa: E501
PUBLIC = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHN0YW5kLWluIGtleSBmb3IgYSB0ZXN0 ops@control\n"


def ssh_key(path: Path | str) -> str:
    return fleet_text(f"    ssh: {{user: ops, key: {path}}}\n")


def key_file(tmp_path: Path, name: str, content: bytes, mode: int = 0o600) -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    path.chmod(mode)
    return path


def test_a_private_key_of_mode_0600_is_accepted(tmp_path: Path) -> None:
    warnings, _ = load(ssh_key(key_file(tmp_path, "id_ed25519", PRIVATE)))
    assert warnings == []


@pytest.mark.parametrize("header", [b"-----BEGIN RSA PRIVATE KEY-----",
                                    b"-----BEGIN PRIVATE KEY-----",
                                    b"-----BEGIN EC PRIVATE KEY-----"])
def test_pem_private_keys_are_accepted(tmp_path: Path, header: bytes) -> None:
    load(ssh_key(key_file(tmp_path, "id_pem", header + b"\nMIIE\n")))


def test_the_public_half_is_refused_with_the_private_path(tmp_path: Path) -> None:
    key_file(tmp_path, "id_ed25519", PRIVATE)
    public = key_file(tmp_path, "id_ed25519.pub", PUBLIC, 0o644)
    [problem] = problems(ssh_key(public))
    assert problem.path == ("hosts", "box", "ssh", "key")
    assert "is the public half of a key" in problem.message
    assert problem.hint == f"write key: {tmp_path / 'id_ed25519'}"


def test_public_key_content_under_a_private_name_is_refused(tmp_path: Path) -> None:
    [problem] = problems(ssh_key(key_file(tmp_path, "id_ed25519", PUBLIC)))
    assert "is the public half of a key" in problem.message


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_key_open_to_others_is_refused_as_ssh_refuses_it(tmp_path: Path, mode: int) -> None:
    path = key_file(tmp_path, "id_ed25519", PRIVATE, mode)
    [problem] = problems(ssh_key(path))
    assert f"permissions {mode:04o}" in problem.message
    assert "UNPROTECTED PRIVATE KEY FILE" in problem.message
    assert problem.hint == f"chmod 600 {path}"


def test_a_huge_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = key_file(tmp_path, "id_huge", PRIVATE + b"A" * (1 << 20))
    [problem] = problems(ssh_key(path))
    assert "an ssh private key is a few KiB" in problem.message


def test_a_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "id_fifo"
    os.mkfifo(fifo)
    [problem] = problems(ssh_key(fifo))  # would hang if it were opened
    assert "is a FIFO, not an ssh private key" in problem.message


def test_a_missing_identity_file_is_a_warning_not_an_error(tmp_path: Path) -> None:
    warnings, _ = load(ssh_key(tmp_path / "nowhere"))
    [warning] = warnings
    assert warning.path == ("hosts", "box", "ssh", "key")
    assert "does not exist on this machine" in warning.message
    assert "Identity file … not accessible" in warning.hint


def test_a_key_under_home_is_read_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    key_file(tmp_path / ".ssh", "id_ed25519.pub", PUBLIC)
    [problem] = problems(ssh_key("~/.ssh/id_ed25519.pub"))
    assert problem.hint == "write key: ~/.ssh/id_ed25519"


def test_a_broken_default_key_is_reported_once(tmp_path: Path) -> None:
    path = key_file(tmp_path, "k.pub", PUBLIC)
    text = (f"version: 1\ndefaults:\n  ssh: {{key: {path}}}\nhosts:\n" + "".join(
        f"  h{n}:\n    address: 10.0.0.{n}\n    vllm: {{version: \"0.32.0\", variant: cpu}}\n"
        for n in range(1, 4)))
    [problem] = problems(text)
    assert problem.path == ("defaults", "ssh", "key")


# --- local model files -----------------------------------------------------------------------


def model(path: Path | str) -> str:
    return fleet_text(models=f"models:\n  m: {{file: {path}, sha256: \"{SHA}\"}}\n")


def test_a_model_file_that_exists_is_accepted(tmp_path: Path) -> None:
    archive = tmp_path / "m.tar.gz"
    archive.write_bytes(b"\x1f\x8b")
    load(model(archive))


def test_a_missing_model_file_is_a_located_error(tmp_path: Path) -> None:
    [problem] = problems(model(tmp_path / "m.tar.gz"))
    assert (problem.line, problem.path) == (3, ("models", "m", "file"))
    assert "does not exist on this machine" in problem.message


def test_a_relative_model_file_is_still_refused_for_its_form() -> None:
    [problem] = problems(model("m.tar.gz"))
    assert "absolute path" in problem.message + (problem.hint or "")


# --- tabs inside block scalars ---------------------------------------------------------------

TABBED = ROOT / "tests" / "data" / "valid" / "topology-tabs-h200.yaml"


def test_a_pasted_tab_separated_topology_loads_with_its_links_and_affinity() -> None:
    gpus = load_fleet(TABBED).hosts["h200-pair-box"].gpus
    assert "\tGPU0\tGPU1\tCPU Affinity" in str(gpus.topology)
    assert gpus.links == {(0, 1): "NV18"}
    assert {n: (a.cpus, a.node) for n, a in gpu_affinity(str(gpus.topology)).items()} == {
        0: ("0-31", 0), 1: ("0-31", 0)}


def test_the_topology_is_the_capture_without_its_underline_escapes() -> None:
    capture = (ROOT / "tests/fixtures/nvidia/h200x2-idle/topo-m.txt").read_text()
    table = re.sub(r"\x1b\[[0-9;]*m", "", capture).split("\n\n")[0] + "\n"
    assert load_fleet(TABBED).hosts["h200-pair-box"].gpus.topology == table


def test_a_tab_in_a_block_scalar_is_kept_exactly() -> None:
    data, _ = read_yaml("topology: |\n  \tGPU0\tGPU1\tCPU Affinity\n  GPU0\t X \tNV18\t0-31\n"
                        "  GPU1\tNV18\t X \t0-31\nafter: 1\n")
    assert data == {"topology": "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-31\n"
                                "GPU1\tNV18\t X \t0-31\n", "after": 1}


@pytest.mark.parametrize("text", [
    fleet_text("    gpus:\n      topology: |\n\tGPU0\tGPU1\n"),
    fleet_text("    gpus:\n      topology: |\n        \tGPU0\n\t  GPU1\n"),
    fleet_text("    gpus:\n      topology: |\n        \tGPU0\n\tcount: 2\n"),
    "version: 1\nhosts:\n\tbox: {}\n",
], ids=["tab-indents-the-block", "tab-indents-a-later-line", "tab-indents-a-key-after",
        "tab-indents-a-key"])
def test_a_tab_as_indentation_is_still_refused(text: str) -> None:
    [problem] = problems(text)
    assert "a tab at column 1" in problem.message


def test_a_tabbed_block_in_a_sequence_item_is_read_as_yaml_reads_it() -> None:
    data, _ = read_yaml("a:\n  - k: |\n      \tGPU0\n    j: 1\n")
    assert data == {"a": [{"k": "\tGPU0\n", "j": 1}]}


def test_a_header_like_line_inside_quotes_is_left_as_written() -> None:
    data, _ = read_yaml('q: "x\n  y: |\n     \tz"\n')
    assert data == {"q": "x y: | z"}


def test_another_problem_beside_a_tabbed_block_is_the_one_reported() -> None:
    text = fleet_text("    gpus:\n      topology: |\n        \tGPU0\tGPU1\n        GPU0\t X \n"
                      "    vllm: {version: 1}\n")
    found = problems(text)
    assert not any("a tab" in problem.message for problem in found)
    assert any(problem.path[-1] == "vllm" for problem in found)
