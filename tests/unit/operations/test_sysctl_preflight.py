"""The deploy refuses a kernel parameter the host's kernel lacks, before the drop-in is written;
inside a container a known key that the namespace hides is reported, not refused. The fact runs
here for real against this machine's /proc/sys."""

from __future__ import annotations

import logging
import subprocess

import pytest
from pyinfra.api.exceptions import DeployError
from pyinfra.context import ctx_host

from deploys.os_tuning import preflight
from facts.sysctl import SysctlMissing
from operations.host import sysctl_applied
from tests.support.opharness import FakeHost, run_op


def run_preflight(missing: list[str], container: str | None, keys: list[str]) -> FakeHost:
    fake = FakeHost({"SysctlMissing": missing, "Container": container})
    with ctx_host.use(fake):
        preflight(keys)
    return fake


def test_a_key_the_kernel_lacks_is_refused_naming_it_and_its_file() -> None:
    with pytest.raises(DeployError) as info:
        run_preflight(["vm.swapiness"], None, ["vm.swapiness", "net.core.somaxconn"])
    message = str(info.value)
    assert message.startswith("gpu-1: this host's kernel has no sysctl vm.swapiness")
    assert "no /proc/sys/vm/swapiness; did you mean 'vm.swappiness'?" in message
    assert "before the drop-in is written" in message


def test_every_missing_key_is_named_at_once() -> None:
    with pytest.raises(DeployError) as info:
        run_preflight(["net.vendor.knob", "vm.swapiness"], None,
                      ["net.vendor.knob", "vm.swapiness"])
    assert "net.vendor.knob (no /proc/sys/net/vendor/knob)" in str(info.value)
    assert "vm.swapiness (no /proc/sys/vm/swapiness" in str(info.value)


def test_keys_the_kernel_has_pass() -> None:
    run_preflight([], None, ["vm.swappiness"])


def test_a_known_key_hidden_in_a_container_is_reported_not_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="pyinfra"):  # cli.factsession quiets it
        run_preflight(["net.core.rmem_max"], "systemd-nspawn", ["net.core.rmem_max"])
    assert "not visible in this systemd-nspawn container" in caplog.text


def test_an_unknown_key_missing_in_a_container_is_still_refused() -> None:
    with pytest.raises(DeployError, match=r"vm\.swapiness"):
        run_preflight(["vm.swapiness"], "systemd-nspawn", ["vm.swapiness"])


def test_read_only_keys_in_a_container_are_still_reported_not_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="pyinfra"):  # cli.factsession quiets it
        commands, _ = run_op(sysctl_applied, {"Sysctl": {"vm.swappiness": 60},
                                              "SysctlWritable": {"vm.swappiness": False}},
                             values={"vm.swappiness": 1})
    assert commands == []
    assert "not applicable here" in caplog.text


def run_fact(keys: list[str]) -> list[str]:
    fact = SysctlMissing()
    output = subprocess.run(["sh", "-c", fact.command(keys).get_raw_value()],
                            capture_output=True, text=True, check=True).stdout
    return fact.process(output.splitlines())


def test_the_fact_finds_the_missing_keys_on_this_machine() -> None:
    assert run_fact(["vm.swappiness", "vm.swapiness", "net.core.somaxconn"]) == ["vm.swapiness"]


def test_a_glob_key_is_missing_only_when_it_matches_nothing() -> None:
    assert run_fact(["net.ipv4.conf.*.rp_filter", "net.ipv4.conf.*.nope"]) == [
        "net.ipv4.conf.*.nope"]


def test_a_glob_key_with_shell_characters_is_refused_before_any_command() -> None:
    with pytest.raises(ValueError):
        SysctlMissing().command(["net.*;reboot"])
