"""GPU-stack operations and refusals with fake facts (pyinfra-testing style): facts in,
commands or noop text out. Covers the Ubuntu branches, which the Debian sandbox cannot run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyinfra.api.exceptions import DeployError
from pyinfra.context import ctx_host

from deploys import nvidia as nvidia_deploy
from fleet.hostplan.stack import (
    GOVERNOR_UNIT,
    DriverLayout,
    DriverPackages,
    driver_packages,
    pin_text,
    repo_distro,
    source_text,
    stack_plan,
)
from fleet.hostplan.types import StackPlan
from fleet.spec.models import Host
from operations import nvidia
from operations.host import governor_applied
from tests.support import systemdwords
from tests.support.opharness import FakeHost, run_op

H200_PCI = {
    "gpus": [{"slot": f"0000:{b}:00.0", "class": "0302", "device_id": "2335", "name": "Device"}
             for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")],
    "nvswitches": [{"slot": f"0000:0{i}:00.0", "class": "0680", "device_id": "22a3",
                    "name": "Device"} for i in (5, 6, 7, 8)],
}  # fmt: skip
UBUNTU_2404 = {"name": "Ubuntu", "major": 24, "minor": 4, "release_meta": {}}
UBUNTU_2204 = {"name": "Ubuntu", "major": 22, "minor": 4, "release_meta": {}}
DEBIAN_12 = {"name": "Debian", "major": 12, "minor": 7, "release_meta": {}}


def stack(variant: str = "cu129", **os: Any) -> StackPlan:
    """The stack plan of an 8-GPU host with the given ``os`` section and vLLM build."""
    host = Host.model_validate({
        "address": "10.0.0.9", "gpus": {"count": 8, "model": "H200 SXM"},
        "os": {"nvidia": {"driver": "570"}, **os},
        "vllm": {"version": "0.11.0", "variant": variant},
    })  # fmt: skip
    return stack_plan(host)


# --- distribution branches -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("distro", "folder"),
    [(UBUNTU_2204, "ubuntu2204"), (UBUNTU_2404, "ubuntu2404"), (DEBIAN_12, "debian12")],
)
def test_repository_folder_per_distribution(distro: dict, folder: str) -> None:
    assert repo_distro(distro["name"], distro["major"], distro["minor"]) == folder


@pytest.mark.parametrize("distro", [UBUNTU_2204, UBUNTU_2404])
def test_ubuntu_driver_and_fabric_manager_by_branch(distro: dict) -> None:
    folder = repo_distro(distro["name"], distro["major"], distro["minor"])
    assert driver_packages(folder, 535, True, "nvidia") == DriverPackages(
        packages=("nvidia-driver-535", "nvidia-fabricmanager-535"),
        probe="nvidia-driver-535",
    )


def test_ubuntu_without_nvswitch_has_no_fabric_manager() -> None:
    assert driver_packages("ubuntu2204", 570, False, "distro").packages == ("nvidia-driver-570",)


def test_debian_driver_is_every_part_at_one_version() -> None:
    layout = driver_packages("debian12", 570, True, "nvidia")
    assert layout.probe == "nvidia-driver"
    assert layout.packages[-1] == "nvidia-fabricmanager-570"
    assert layout.fabric_manager == "nvidia-fabricmanager-570"
    assert "nvidia-persistenced" in layout.packages


def test_debian_archive_has_no_570() -> None:
    with pytest.raises(ValueError, match="driver 535 only"):
        driver_packages("debian12", 570, False, "distro")


def test_ubuntu_apt_source_is_signed_by_its_own_key() -> None:
    text = source_text(stack().nvidia, "ubuntu2404", "x86_64")
    assert (
        "deb [signed-by=/etc/apt/keyrings/vllm-fleet-nvidia.gpg] "
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/ /"
    ) in text


def apt_words(line: str) -> list[str]:
    """A one-line apt source as apt reads it: the rest after ``#`` is a comment, words split on
    blanks."""
    return line.partition("#")[0].split()


@pytest.mark.parametrize("repository", [
    "https://mirror.example/cuda", "http://10.0.0.5:8080/nvidia/repos", "https://m.example/a?b=c",
    "https://[fd00::5]/cuda", "https://m.example/a]b[c",
])
def test_an_accepted_repository_is_one_word_of_the_apt_source(repository: str) -> None:
    nvidia = stack(nvidia={"driver": "570", "repository": repository}).nvidia
    [line] = [line for line in source_text(nvidia, "ubuntu2404", "x86_64").splitlines()
              if not line.startswith("#")]
    assert apt_words(line) == ["deb", f"[signed-by={nvidia.keyring}]",
                               f"{repository}/ubuntu2404/x86_64/", "/"]


@pytest.mark.parametrize("repository", ["https://mirror.example/cuda#", "https://m.example/#x",
                                        "https://m.example/a b", "https://m.example/a\tb"])
def test_a_repository_that_would_end_or_split_the_apt_source_is_refused(repository: str) -> None:
    with pytest.raises(ValueError, match="repository"):
        stack(nvidia={"driver": "570", "repository": repository})


def test_arm64_uses_the_sbsa_repository() -> None:
    assert "/ubuntu2204/sbsa/ /" in source_text(stack().nvidia, "ubuntu2204", "sbsa")


@pytest.mark.parametrize(
    ("declared", "pin"),
    [("570", "Pin: version 570.*"), ("570.172.08", "Pin: version 570.172.08-*")],
)
def test_pin_by_branch_or_exact_version(declared: str, pin: str) -> None:
    assert pin in pin_text(["nvidia-driver-570"], declared)


# --- refusals before anything is installed ---------------------------------------------------


def preflight(plan: StackPlan, **facts: Any) -> DriverLayout:
    base = {"PciGpus": H200_PCI, "LinuxDistribution": UBUNTU_2404, "DebArch": "amd64"}
    fake = FakeHost({**base, **facts})
    with ctx_host.use(fake):
        return nvidia_deploy.preflight(plan)


def test_preflight_on_ubuntu_hgx_finds_the_fabric_manager() -> None:
    layout = preflight(stack())
    assert layout.fabric_manager_wanted is True
    assert layout.packages == ("nvidia-driver-570", "nvidia-fabricmanager-570")
    assert layout.origin.endswith("/ubuntu2404/x86_64")


def test_preflight_without_nvswitch_skips_the_fabric_manager() -> None:
    plan = stack()
    layout = preflight(plan, PciGpus={"gpus": H200_PCI["gpus"], "nvswitches": []})
    assert layout.packages == ("nvidia-driver-570",)
    assert layout.fabric_manager is None


def test_preflight_declared_fabric_manager_wins() -> None:
    plan = stack(nvidia={"driver": "570", "fabric_manager": True})
    layout = preflight(plan, PciGpus={"gpus": H200_PCI["gpus"], "nvswitches": []})
    assert layout.packages[-1] == "nvidia-fabricmanager-570"


def test_refuses_an_unsupported_distribution() -> None:
    with pytest.raises(DeployError, match=r"Ubuntu 20\.4 is not supported"):
        preflight(stack(), LinuxDistribution={"name": "Ubuntu", "major": 20, "minor": 4})


def test_refuses_an_unknown_architecture() -> None:
    with pytest.raises(DeployError, match="'ppc64el' has no NVIDIA repository"):
        preflight(stack(), DebArch="ppc64el")


def test_refuses_gpus_that_lspci_does_not_show() -> None:
    with pytest.raises(DeployError, match="declares 8 GPUs, but lspci shows 0"):
        preflight(stack(), PciGpus={"gpus": [], "nvswitches": []})


# --- operations --------------------------------------------------------------------------------

UBUNTU_570 = ["nvidia-driver-570", "nvidia-fabricmanager-570"]


def states(version: str, held: bool = True, packages: list[str] = UBUNTU_570) -> dict:
    return {p: {"version": f"{version}-0ubuntu1", "held": held} for p in packages}


def driver(facts: dict, declared: str = "570") -> tuple[list[str], list[str]]:
    return run_op(
        nvidia.driver_installed,
        {"DebPackageStates": facts},
        declared=declared,
        packages=UBUNTU_570,
        probe="nvidia-driver-570",
        script="/usr/local/lib/vllm-fleet/nvidia_driver.py",
        origin="https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64",
    )


def test_fresh_host_runs_the_installer() -> None:
    commands, _ = driver({})
    spec = json.loads(commands[0].split(" ", 2)[2].strip("'"))
    assert spec["declared"] == "570"
    assert spec["packages"] == UBUNTU_570
    assert spec["origin"].endswith("ubuntu2404/x86_64")


def test_installed_branch_is_a_noop() -> None:
    commands, noops = driver(states("570.172.08"))
    assert commands == []
    assert noops == ["NVIDIA driver 570.172.08 (nvidia-driver-570, nvidia-fabricmanager-570) "
                     "is installed"]  # fmt: skip


def test_an_older_release_of_the_branch_stays() -> None:
    """A branch means: the newest when first installed, then held — not upgraded later."""
    commands, _ = driver(states("570.133.20"))
    assert commands == []


def test_other_branch_is_replaced() -> None:
    commands, _ = driver(states("535.230.02"))
    assert len(commands) == 1 and "nvidia_driver.py" in commands[0]


def test_fabric_manager_one_patch_off_is_fixed() -> None:
    facts = states("570.172.08")
    facts["nvidia-fabricmanager-570"]["version"] = "570.133.20-1"
    commands, _ = driver(facts)
    assert len(commands) == 1


def test_exact_version_mismatch_is_fixed() -> None:
    commands, _ = driver(states("570.133.20"), declared="570.172.08")
    assert len(commands) == 1


def test_holds_missing_are_not_a_driver_change() -> None:
    commands, _ = driver(states("570.172.08", held=False))
    assert commands == []


def test_hold_only_the_loose_packages() -> None:
    facts = states("570.172.08")
    facts["nvidia-fabricmanager-570"]["held"] = False
    commands, _ = run_op(nvidia.packages_held, {"DebPackageStates": facts}, packages=UBUNTU_570)
    assert commands == ["apt-mark hold nvidia-fabricmanager-570"]


def test_all_held_is_a_noop() -> None:
    commands, noops = run_op(
        nvidia.packages_held, {"DebPackageStates": states("570.172.08")}, packages=UBUNTU_570
    )
    assert commands == [] and noops == ["nvidia-driver-570, nvidia-fabricmanager-570 are held"]


KEY = "EB693B3035CD5710E231E123A4B469963BF863CC"


def test_key_with_the_declared_fingerprint_is_a_noop() -> None:
    commands, _ = run_op(nvidia.apt_key_installed, {"KeyringFingerprints": [KEY]},
                         url="https://x/3bf863cc.pub", path="/k.gpg", fingerprint=KEY)  # fmt: skip
    assert commands == []


@pytest.mark.parametrize("have", [None, [], ["0" * 40]])
def test_missing_or_wrong_key_is_fetched_and_checked(have: list | None) -> None:
    commands, _ = run_op(nvidia.apt_key_installed, {"KeyringFingerprints": have},
                         url="https://x/3bf863cc.pub", path="/k.gpg", fingerprint=KEY)  # fmt: skip
    assert commands[0].startswith("python3 -c ")
    assert commands[0].endswith(f"install https://x/3bf863cc.pub /k.gpg {KEY}")


def test_running_fabric_manager_is_a_noop() -> None:
    facts = {"FabricManager": {"version": "570.172.08", "active": "active", "enabled": "enabled"}}
    commands, _ = run_op(nvidia.fabric_manager_running, facts, package="nvidia-fabricmanager-570")
    assert commands == []


def test_stopped_fabric_manager_starts_only_on_its_own_driver() -> None:
    facts = {"FabricManager": {"version": "570.172.08", "active": "inactive", "enabled": None}}
    commands, _ = run_op(nvidia.fabric_manager_running, facts, package="nvidia-fabricmanager-570")
    assert '[ "$fm" = "$drv" ]; then systemctl start nvidia-fabricmanager.service' in commands[0]
    assert "waits for the reboot" in commands[0]


@pytest.mark.parametrize(
    ("governors", "commands"),
    [
        ({"performance": 32}, []),
        ({}, []),
        ({"powersave": 30, "performance": 2}, [f"systemctl restart {GOVERNOR_UNIT}"]),
    ],
)
def test_governor(governors: dict, commands: list[str]) -> None:
    got, _ = run_op(governor_applied, {"CpuGovernor": governors}, governor="performance",
                    unit=GOVERNOR_UNIT)  # fmt: skip
    assert got == commands


# --- the plan ------------------------------------------------------------------------------------


def test_persistence_drop_in_replaces_exec_start_only() -> None:
    text = stack().nvidia.persistenced_text
    assert "ExecStart=\nExecStart=/usr/bin/nvidia-persistenced" in text
    assert "--persistence-mode" in text and "--no-persistence-mode" not in text
    assert "WantedBy=multi-user.target" in text


def test_cuda_profile_puts_the_pinned_toolkit_on_path() -> None:
    cuda = stack(cuda="12.8").cuda
    assert cuda.package == "cuda-toolkit-12-8"
    assert 'export PATH="/usr/local/cuda-12.8/bin:${PATH}"' in cuda.profile_text


def test_governor_unit_escapes_the_shell_variable_for_systemd() -> None:
    text = stack(cpu_governor="performance").governor.unit_text
    assert 'echo performance > \\"$$f\\"' in text
    line = next(value for key, value in systemdwords.lines(text) if key == "ExecStart")
    assert systemdwords.commands(line)[0].argv[-1].endswith('echo performance > "$f"; done')
    assert "ConditionPathExists=/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor" in text


def test_nofile_drop_in_covers_every_vllm_unit() -> None:
    nofile = stack(nofile=1048576).nofile
    assert nofile.path == "/etc/systemd/system/vllm-.service.d/50-vllm-fleet-nofile.conf"
    assert "LimitNOFILE=1048576" in nofile.text
