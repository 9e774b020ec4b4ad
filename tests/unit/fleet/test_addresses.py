"""Addresses typed once (fleet/spec/addresses.py and the field types of fleet/spec/fields.py).

Tables of what each address field takes and refuses (hostile values included: zone ids that
would split a unit's command line, options, what glibc reads differently from Python), the
loopback and every-interface predicates, one machine under two spellings, and where the
fleet's scrape targets and router workers point.
"""

from __future__ import annotations

import ipaddress
import socket
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from fleet.hostplan.types import ServerUnit
from fleet.load import load_text
from fleet.planner.endpoints import client_url, worker_url
from fleet.planner.monitoring import scrape_targets
from fleet.planner.reach import Reach
from fleet.read.problems import FleetError
from fleet.spec.addresses import is_any, is_loopback, local_address, machine_key
from fleet.spec.fields import BindAddress, HeadAddress, HostAddress, ServerBind
from fleet.spec.models import Fleet

HOST = TypeAdapter(HostAddress)
HEAD = TypeAdapter(HeadAddress)
SERVER_BIND = TypeAdapter(ServerBind)
BIND = TypeAdapter(BindAddress)
ALL = {"host": HOST, "head": HEAD, "server-bind": SERVER_BIND, "bind": BIND}


def refusal(adapter: TypeAdapter, value: str) -> str:
    with pytest.raises(ValidationError) as info:
        adapter.validate_python(value)
    return info.value.errors()[0]["msg"]


# --- what each field takes ---------------------------------------------------------------------

ACCEPTED = [
    ("host", "10.0.1.21"),
    ("host", "0.0.0.1"),
    ("host", "255.255.255.254"),
    ("host", "gpu-01.example.com"),
    ("host", "gpu-01.example.com."),
    ("host", "GPU-01"),
    ("host", "localhost"),
    ("host", "127.0.0.1"),
    ("host", "sandbox"),
    ("host", "2001:db8::1"),
    ("host", "::ffff:10.0.1.21"),
    ("host", "fe80::1%eth0"),
    ("host", "fe80::1%ens8f0np0"),
    ("host", "fe80::1%2"),
    ("host", "fe80::1%bond0.100"),
    ("host", "a" * 63 + ".example"),
    ("host", ".".join(["a" * 61] * 4)),
    ("head", "10.10.0.1"),
    ("head", "node-a.lan"),
    ("head", "fe80::1%ib0"),
    ("head", "sandbox"),
    ("server-bind", "127.0.0.1"),
    ("server-bind", "0.0.0.0"),
    ("server-bind", "::"),
    ("server-bind", "::1"),
    ("server-bind", "localhost"),
    ("server-bind", "gpu-01.lan"),
    ("server-bind", "10.0.0.5"),
    ("server-bind", "fe80::1%eth0"),
    ("bind", "127.0.0.1"),
    ("bind", "0.0.0.0"),
    ("bind", "::"),
    ("bind", "::1"),
    ("bind", "10.0.0.5"),
]


@pytest.mark.parametrize(("kind", "value"), ACCEPTED)
def test_a_correct_address_is_taken_as_written(kind, value):
    assert ALL[kind].validate_python(value) == value


REFUSED = [
    # the root command: a zone id that systemd would split into three commands
    ("head", "fe80::1%i --help ; +touch PWNED ; +echo ", "the zone id after % must be"),
    ("head", "fe80::1%eth0;reboot", "the zone id after % must be"),
    ("head", "fe80::1%+eth0", "the zone id after % must be"),
    ("head", "fe80::1%eth0 VLLM_SERVER_DEV_MODE=1", "the zone id after % must be"),
    ("head", "fe80::1%", "the zone id after % must be"),
    ("head", "fe80::1%" + "e" * 16, "at most 15"),
    ("head", "fe80::1%-eth0", "the zone id after % must be"),
    ("head", "fe80::1%eth0%1", "the zone id after % must be"),
    ("server-bind", "fe80::1%eth0 --api-key x", "the zone id after % must be"),
    ("bind", "fe80::1%eth0 --host 0.0.0.0", "the zone id after % must be"),
    ("host", "fe80::1%eth0\nUser=root", "U+000A"),
    # options
    ("server-bind", "--trust-remote-code", "would be read as an option"),
    ("host", "-oProxyCommand=touch", "would be read as an option"),
    ("head", "--help", "would be read as an option"),
    ("bind", "--web.enable-admin-api", "would be read as an option"),
    # what glibc's inet_aton reads differently from Python
    ("host", "10.0.1.021", "reads as octal: 10.0.1.17; write 10.0.1.21"),
    ("head", "010.0.0.1", "reads as octal: 8.0.0.1"),
    ("server-bind", "10.0.0.08", "leading zero"),
    ("host", "0x0a.0.0.1", "hex number"),
    ("host", "10.0.0.0x1", "hex number"),
    ("host", "10.1", "reads it as 10.0.0.1"),
    ("host", "167772161", "reads it as 10.0.0.1"),
    ("host", "1.2.3.4.5", "5 numbers, not four"),
    ("host", "10.0.0.1.", "without the trailing dot"),
    ("host", "10.a.0.1", "not an IPv4 address"),
    # out of range, malformed
    ("server-bind", "10.0.0.256", "each of its four numbers is 0–255"),
    ("host", "10.0.0.256", "each of its four numbers is 0–255"),
    ("host", "999.1.1.1", "each of its four numbers is 0–255"),
    ("host", "2001:db8::g", "not an IPv6 address"),
    ("host", "1:2:3:4:5:6:7:8:9", "not an IPv6 address"),
    ("host", "[::1]", "without brackets"),
    ("host", "::ffff:10.0.1.021", "not an IPv6 address"),
    # host names (RFC 1123)
    ("host", "gpu box 01", "letters, digits and hyphens between dots"),
    ("host", "gpu_01", "letters, digits and hyphens between dots"),
    ("host", "gpu-.lan", "letters, digits and hyphens between dots"),
    ("host", "a" * 64, "letters, digits and hyphens between dots"),
    ("host", ".".join(["a" * 63] * 4), "letters, digits and hyphens between dots"),
    ("host", "gpu..lan", "letters, digits and hyphens between dots"),
    ("host", "gpü.lan", "letters, digits and hyphens between dots"),
    ("host", "ubuntu@10.0.0.11", "put the user in ssh.user"),
    ("host", "10.0.0.11:22", "put the port in ssh.port"),
    ("server-bind", "0.0.0.0:8000", "put the port in port"),
    ("server-bind", "every interface", "is not an address to bind"),
    ("server-bind", "", "is not an address to bind"),
    # what no machine is reached at
    ("host", "0.0.0.0", "means every interface"),
    ("head", "::", "means every interface"),
    ("head", "224.0.0.1", "multicast or broadcast"),
    ("host", "255.255.255.255", "multicast or broadcast"),
    # IP only where the service is given an IP
    ("bind", "gpu-01.lan", "is not an IP address to listen on"),
    ("bind", "0.0.0.0 --web.enable-admin-api", "is not an IP address to listen on"),
]


@pytest.mark.parametrize(("kind", "value", "words"), REFUSED)
def test_a_wrong_or_hostile_address_is_refused_saying_why(kind, value, words):
    assert words in refusal(ALL[kind], value)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=string.printable + "%:.\u00a0\u200b", max_size=40))
def test_no_accepted_address_can_split_a_line_or_start_an_option(value):
    """Whatever text comes in, what a field takes is one word that begins no option."""
    for adapter in ALL.values():
        try:
            taken = adapter.validate_python(value)
        except ValidationError:
            continue
        assert not taken.startswith("-")
        assert not set(taken) & set(" \t\n\r;+'\"\\$`@\u00a0\u200b")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=5), st.booleans())
def test_an_accepted_ipv4_address_is_the_one_glibc_reads(numbers, zero):
    """Python and glibc (ssh, curl) agree on every IPv4 address a field takes."""
    value = ".".join(f"0{n}" if zero and n else str(n) for n in numbers)
    try:
        HOST.validate_python(value)
    except ValidationError:
        return
    assert socket.inet_aton(value) == ipaddress.IPv4Address(value).packed


# --- loopback, every interface, one machine -----------------------------------------------------


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.1.1", True),
        ("127.255.255.254", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LOCALHOST.", True),
        ("ip6-localhost", True),
        ("ip6-loopback", True),
        ("app.localhost", True),
        ("128.0.0.1", False),
        ("10.0.0.1", False),
        ("0.0.0.0", False),
        ("::", False),
        ("localhost-1", False),
        ("mylocalhost", False),
        ("fe80::1%lo", False),
        ("10.0.1.021", False),
    ],
)
def test_loopback_is_all_of_127_8_and_localhost(address, loopback):
    assert is_loopback(address) is loopback


@pytest.mark.parametrize(
    ("address", "anywhere"),
    [("0.0.0.0", True), ("::", True), ("0:0::0", True), ("::ffff:0.0.0.0", True),
     ("127.0.0.1", False), ("gpu-01", False), ("0.0.0.1", False)],
)
def test_every_interface_however_spelt(address, anywhere):
    assert is_any(address) is anywhere


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("10.0.1.21", "::ffff:10.0.1.21"),
        ("10.0.1.21", "::FFFF:10.0.1.21"),
        ("2001:db8::1", "2001:DB8:0:0:0:0:0:1"),
        ("GPU-01.example.com", "gpu-01.example.com."),
        ("127.0.0.1", "localhost"),
        ("127.0.1.1", "::1"),
    ],
)
def test_one_machine_under_two_spellings_has_one_key(one, other):
    assert machine_key(one) == machine_key(other)


@pytest.mark.parametrize(
    ("one", "other"),
    [("10.0.1.21", "10.0.1.12"), ("gpu-01.example.com", "gpu-01.example.org"),
     ("fe80::1%eth0", "fe80::1%eth1"), ("2001:db8::1", "2001:db8::2")],
)
def test_two_machines_keep_two_keys(one, other):
    assert machine_key(one) != machine_key(other)


def test_local_address_keeps_a_loopback_bind():
    """A service bound to 127.0.1.1 or ::1 is not reached at 127.0.0.1; one bound to every
    IPv6 interface is reached at ::1 (a host with bindv6only gives it no IPv4)."""
    assert [local_address(a) for a in ("0.0.0.0", "::", "127.0.1.1", "::1", "localhost")] == [
        "127.0.0.1", "::1", "127.0.1.1", "::1", "localhost"]


# --- where the fleet points ---------------------------------------------------------------------

MODEL = {"m": {"hf": "org/m", "revision": "0123456789" * 4}}
CPU = {"version": "0.32.0", "variant": "cpu"}


def fleet(hosts: dict, **sections) -> Fleet:
    return Fleet.model_validate(
        {"version": 1, "models": MODEL,
         "hosts": {name: {"address": address, "vllm": CPU, "servers": servers}
                   for name, (address, servers) in hosts.items()}, **sections}
    )


def test_a_server_on_the_monitoring_host_is_scraped_where_it_listens():
    """On Prometheus's own host a server bound to one address is scraped there, not on
    127.0.0.1 where nothing listens."""
    f = fleet({"mon": ("10.0.0.10", {
        "a": {"model": "m", "port": 8000, "host": "10.0.0.10"},
        "b": {"model": "m", "port": 8001, "host": "127.0.1.1"},
        "c": {"model": "m", "port": 8002, "host": "0.0.0.0"}})}, monitoring={"host": "mon"})
    vllm = {t.labels["server"]: t.address for t in scrape_targets(f) if t.job == "vllm"}
    assert vllm == {"a": "10.0.0.10:8000", "b": "127.0.1.1:8001", "c": "127.0.0.1:8002"}


def test_no_scrape_target_of_another_host_is_a_loopback_address():
    """Every host's targets, in a fleet that fleet check takes, point at that host."""
    f = fleet({"mon": ("10.0.0.10", {}),
               "gpu": ("10.0.0.11", {"chat": {"model": "m", "port": 8000, "host": "0.0.0.0"}})},
              monitoring={"host": "mon"})
    for target in scrape_targets(f):
        if target.labels["host"] != "mon":
            assert not is_loopback(target.address.rsplit(":", 1)[0]), target


def test_router_workers_on_its_own_host_keep_their_loopback_address():
    f = fleet({"a": ("10.0.0.11", {"r": {"model": "m", "port": 8001, "host": "127.0.1.1"}})},
              endpoints={"chat": {"replicas": ["a/r"], "router": {"host": "a", "port": 9000}}})
    assert worker_url(f, "a", "a/r") == "http://127.0.1.1:8001"


def test_a_client_reaches_a_router_bound_to_ipv6_loopback_there():
    f = fleet({"a": ("10.0.0.11", {"r": {"model": "m", "port": 8001}})},
              endpoints={"chat": {"replicas": ["a/r"],
                                  "router": {"host": "a", "port": 9000, "bind": "::1"}}})
    assert client_url(f, "chat") == ("a", "::1", 9000)


def test_a_server_bound_to_ipv6_is_probed_at_a_bracketed_url():
    unit = ServerUnit(name="s", unit="vllm-s.service", unit_path="/u", unit_text="", env_path="/e",
                      env_text=None, model="m", served_name="m", host="::1", port=8000,
                      has_api_key=False, reach=Reach("http", "::1", 8000))
    assert unit.url == "http://[::1]:8000"


def test_a_loopback_host_is_scraped_by_a_prometheus_on_the_control_machines_network():
    """A host at 127.0.0.1 is the control machine, whose network a sandbox shares: correct."""
    text = (
        "version: 1\nmodels: {m: {hf: org/m, revision: '" + "0123456789" * 4 + "'}}\n"
        "defaults: {vllm: {version: '0.32.0', variant: cpu}}\nhosts:\n"
        "  here: {address: 127.0.0.1, servers: {s: {model: m, port: 8000, host: 0.0.0.0}}}\n"
        "  box: {address: sandbox}\nmonitoring: {host: box}\n"
    )
    fleet = load_text(text, "fleet.yaml")
    assert "127.0.0.1:8000" in {t.address for t in scrape_targets(fleet)}
    with pytest.raises(FleetError, match=r"would scrape here at 127\.0\.0\.1"):
        load_text(text.replace("address: sandbox", "address: 10.0.0.9"), "fleet.yaml")
