"""The second wall: each rendering refuses what its syntax cannot carry, even when a value has
slipped past the fleet file's checks (here handed in directly, as a bug elsewhere could)."""

from __future__ import annotations

import pytest

from cli.remote import ssh_config_entry
from fleet.hostplan.quoting import ssh_config_value, sysctl_line, systemd_quote
from fleet.hostplan.render import render_sysctl

HOSTILE = [
    "10.0.0.1\nProxyCommand sh -c id",
    "10.0.0.1\rProxyCommand id",
    "a b",
    'x"y',
    "x\x00y",
    "\u2028ProxyCommand id",
]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("field", ["ssh_hostname", "ssh_user", "ssh_key", "ssh_known_hosts_file"])
def test_ssh_config_refuses_values_that_could_start_a_directive(field: str, value: str) -> None:
    data = {"ssh_hostname": "10.0.0.1", "ssh_port": 22, "ssh_user": "root", field: value}
    with pytest.raises(ValueError):
        ssh_config_entry("box", data)


def test_ssh_config_of_ordinary_data_has_one_directive_per_line() -> None:
    text = ssh_config_entry("box", {"ssh_hostname": "10.0.0.1", "ssh_port": 2222,
                                    "ssh_user": "ubuntu", "ssh_key": "/root/.ssh/id_ed25519"})
    keys = [line.split()[0] for line in text.splitlines()]
    assert keys == ["Host", "HostName", "Port", "User", "BatchMode", "IdentityFile",
                    "IdentitiesOnly", "StrictHostKeyChecking"]  # fmt: skip


@pytest.mark.parametrize("value", ["1\nkernel.core_pattern = |/tmp/x", "|/tmp/x %p", "a;b", "x\ty"])
def test_sysctl_lines_refuse_what_sysctl_d_would_misread(value: str) -> None:
    with pytest.raises(ValueError):
        sysctl_line("kernel.core_pattern", value)
    with pytest.raises(ValueError):
        render_sysctl({"kernel.core_pattern": value})


def test_sysctl_drop_in_has_exactly_the_given_keys() -> None:
    text = render_sysctl({"vm.swappiness": 1, "net.ipv4.tcp_rmem": "4096 87380 6291456"})
    body = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert body == ["vm.swappiness = 1", "net.ipv4.tcp_rmem = 4096 87380 6291456"]


@pytest.mark.parametrize("word", ["x\nUser=root", "x\rUser=root", "x\x00", "x\u2029y"])
def test_systemd_words_refuse_line_breaks(word: str) -> None:
    with pytest.raises(ValueError):
        systemd_quote(word)


def test_ssh_config_value_takes_ports_as_numbers() -> None:
    assert ssh_config_value(2222) == "2222"
