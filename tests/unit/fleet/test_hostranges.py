"""Host ranges (:mod:`fleet.spec.hostranges`): names and addresses made, refusals, and each made
host located at the lines of its block. Each refusal also has its file under
``tests/data/invalid/range-*.yaml`` (held by test_load.py)."""

from __future__ import annotations

import re
import time

import pytest

from fleet.load import FleetError, load_text
from fleet.read.problems import Problem
from fleet.spec.hostranges import (
    MAX_HOSTS,
    RangeProblem,
    expand_hosts,
    expand_name,
    fold,
    range_addresses,
    range_count,
)
from fleet.spec.schema import fleet_schema

HEAD = """\
version: 1
defaults:
  vllm: {version: "0.32.0", variant: cpu}
models:
  m: {hf: "org/m", revision: "0123456789abcdef0123456789abcdef01234567"}
hosts:
"""


@pytest.mark.parametrize(("key", "names"), [
    ("gpu-[001:003]", ["gpu-001", "gpu-002", "gpu-003"]),
    ("n[9:11]", ["n9", "n10", "n11"]),
    ("n[5:5]", ["n5"]),
    ("n[:2]", ["n0", "n1", "n2"]),
    ("n[1:9:4]", ["n1", "n5", "n9"]),
    ("n[01:10:3]", ["n01", "n04", "n07", "n10"]),
    ("web-[a:c].lan", ["web-a.lan", "web-b.lan", "web-c.lan"]),
    ("r[1:2]-g[01:02]", ["r1-g01", "r1-g02", "r2-g01", "r2-g02"]),
])
def test_a_range_makes_its_names_in_order(key, names):
    assert expand_name(key) == names
    assert range_count(key) == len(names)


@pytest.mark.parametrize(("key", "words"), [
    ("n[10:1]", "counts down"),
    ("n[]", "an empty range"),
    ("n[1:]", "has no end"),
    ("n[01:100]", "pads its numbers to different widths"),
    ("n[1:010]", "pads its numbers to different widths"),
    ("n[1-4]", "write [1:4]"),
    ("n[1..4]", "write [1:4]"),
    ("n[1,2]", "is not a range"),
    ("n[1:4:0]", "a step of 0"),
    ("n[a:9]", "from a letter to a number"),
    ("n[A:C]", "write [a:c]"),
    ("n[1:4", "without its pair"),
    ("n1:4]", "without its pair"),
    ("N[1:2]", "which is not a host name"),
    ("n[1:2]_" + "x" * 62, "which is not a host name"),
])
def test_a_bad_range_is_refused_saying_what_to_write(key, words):
    with pytest.raises(RangeProblem) as info:
        expand_name(key)
    assert words in f"{info.value.message}; {info.value.hint}"


def test_a_huge_range_is_counted_without_being_made():
    start = time.process_time()
    assert range_count("n[0:999999999999]") == 10**12
    out = expand_hosts({"n[0:999999999999]": {"address": "10.0.0.1"}})
    assert time.process_time() - start < 1
    (finding,) = out.findings
    assert finding[0] == ("hosts", "n[0:999999999999]")
    assert f"more than the {MAX_HOSTS:,}" in finding[1]
    assert not out.hosts


def test_ranges_are_counted_together_with_plain_hosts():
    half = MAX_HOSTS // 2
    hosts = {f"a[1:{half}]": {}, f"b[1:{half}]": {}, "c": {}}
    (finding,) = expand_hosts(hosts).findings
    assert f"and the fleet file {2 * half + 1:,} in all" in finding[1]


@pytest.mark.parametrize(("address", "count", "first", "last"), [
    ("10.0.0.1", 300, "10.0.0.1", "10.0.1.44"),
    ("10.0.1.1/24", 254, "10.0.1.1", "10.0.1.254"),
    ("10.0.0.10/31", 2, "10.0.0.10", "10.0.0.11"),
    ("fd00::fffe", 3, "fd00::fffe", "fd00::1:0"),
    ("fe80::1%eth0", 2, "fe80::1%eth0", "fe80::2%eth0"),
    ("{name}.dc1.example.com", 2, "h0.dc1.example.com", "h1.dc1.example.com"),
    ("sandbox", 2, "sandbox", "sandbox"),
])
def test_addresses_count_up_or_take_the_name(address, count, first, last):
    made = range_addresses(address, [f"h{i}" for i in range(count)])
    assert (made[0], made[-1], len(set(made))) == (first, last, 1 if first == last else count)


@pytest.mark.parametrize(("address", "count", "words"), [
    ("10.0.1.1/24", 255, "run past 10.0.1.254"),
    ("10.0.1.0/24", 1, "network address"),
    ("255.255.255.255", 2, "the last address of the address space"),
    ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 2, "the address space"),
    ("10.0.0.1/33", 1, "not a prefix length"),
    ("gpu.lan/24", 1, "a prefix length follows an IP address only"),
    ("gpu.lan", 2, "would get the one address"),
    ("{name}.{rack}.lan", 2, "braces other than {name}"),
    ("10.0.1.021", 2, "octal"),
])
def test_an_address_that_cannot_serve_the_range_is_refused(address, count, words):
    with pytest.raises(RangeProblem) as info:
        range_addresses(address, [f"h{i}" for i in range(count)])
    assert words in f"{info.value.message}; {info.value.hint}"


def _written_out(count: int) -> str:
    return HEAD + "".join(
        f"  gpu-{i:03d}:\n    address: 10.0.{i // 256}.{i % 256}\n    servers:\n"
        f"      chat: {{model: m, port: 8000, args: {{max-model-len: 512}}}}\n"
        for i in range(1, count + 1))


def test_a_range_loads_as_the_same_fleet_written_out():
    ranged = HEAD + ("  gpu-[001:300]:\n    address: 10.0.0.1\n    servers:\n"
                     "      chat: {model: m, port: 8000, args: {max-model-len: 512}}\n")
    a, b = load_text(ranged, "r.yaml"), load_text(_written_out(300), "w.yaml")
    assert list(a.hosts) == list(b.hosts)
    assert a.model_dump() == b.model_dump()


def test_the_hosts_of_a_range_keep_their_place_among_the_others():
    text = HEAD + ("  first:\n    address: 10.9.0.1\n  mid-[1:2]:\n    address: 10.9.1.1\n"
                   "  last:\n    address: 10.9.2.1\n")
    assert list(load_text(text).hosts) == ["first", "mid-1", "mid-2", "last"]


def test_made_hosts_are_named_by_endpoints_and_monitoring():
    text = HEAD + """\
  cpu-[1:3]:
    address: 10.0.0.1
    servers:
      chat: {model: m, port: 8000, host: 0.0.0.0, args: {max-model-len: 512}}
endpoints:
  chat:
    replicas: [cpu-1/chat, cpu-3/chat]
    router: {host: cpu-2, port: 9000, bind: 0.0.0.0}
"""
    fleet = load_text(text)
    assert [str(r) for r in fleet.endpoints["chat"].replicas] == ["cpu-1/chat", "cpu-3/chat"]


def test_a_fault_of_one_made_host_names_it_at_the_blocks_line():
    text = HEAD + """\
  box:
    address: 10.0.0.2
  gpu-[1:4]:
    address: 10.0.0.1
"""
    with pytest.raises(FleetError) as info:
        load_text(text, "f.yaml")
    (problem,) = info.value.problems
    assert (problem.line, problem.path) == (10, ("hosts", "gpu-2", "address"))
    assert "hosts 'box' and 'gpu-2' are one machine" in problem.message


def test_a_fault_of_the_block_is_one_problem_at_its_line():
    text = HEAD + """\
  gpu-[1:4]:
    address: 10.0.0.1
    servers:
      chat: {model: nope, port: 8000}
"""
    with pytest.raises(FleetError) as info:
        load_text(text, "f.yaml")
    (problem,) = info.value.problems
    assert problem.line == 10
    assert problem.path == ("hosts", "gpu-1", "servers", "chat", "model")
    assert problem.message.endswith("(and on 3 more hosts of gpu-[1:4])")


def test_a_default_merged_into_made_hosts_is_located_at_the_default():
    text = HEAD.replace('variant: cpu}', 'variant: cpu}\n  ssh: {port: 0}') + (
        "  gpu-[1:4]:\n    address: 10.0.0.1\n")
    with pytest.raises(FleetError) as info:
        load_text(text, "f.yaml")
    (problem,) = info.value.problems
    assert (problem.line, problem.path) == (4, ("defaults", "ssh", "port"))


def test_an_unquoted_name_placeholder_is_named_as_a_mapping():
    with pytest.raises(FleetError) as info:
        load_text(HEAD + "  gpu-[1:2]:\n    address: {name}\n", "f.yaml")
    (problem,) = info.value.problems
    assert problem.path == ("hosts", "gpu-[1:2]", "address")
    assert 'quote the address: address: "{name}.example.com"' in str(problem)


def test_fold_keeps_apart_what_differs():
    made_by = {"a-1": "a-[1:2]", "a-2": "a-[1:2]", "b-1": "b-[1:2]"}
    problems = [
        Problem("f", 3, 5, ("hosts", "a-1", "gpus"), "bad"),
        Problem("f", 3, 5, ("hosts", "a-2", "gpus"), "bad"),
        Problem("f", 3, 5, ("hosts", "a-2", "gpus"), "other"),
        Problem("f", 9, 5, ("hosts", "b-1", "gpus"), "bad"),
        Problem("f", 12, 5, ("hosts", "plain", "gpus"), "bad"),
        Problem("f", 12, 5, ("hosts", "plain", "gpus"), "bad"),
    ]
    assert [str(p) for p in fold(problems, made_by)] == [
        "f:3:5: hosts.a-1.gpus: bad (and on 1 more host of a-[1:2])",
        "f:3:5: hosts.a-2.gpus: other",
        "f:9:5: hosts.b-1.gpus: bad",
        "f:12:5: hosts.plain.gpus: bad",
        "f:12:5: hosts.plain.gpus: bad",
    ]


def test_a_thousand_hosts_in_a_few_lines_load_in_the_time_of_fewer_written_out():
    """The issue's case, held loosely (a shared machine): a 1,000-host range loads in no more
    CPU time than the same fleet written out (benchmarks/host_ranges.py: 0.63 of it)."""
    ranged = HEAD + ("  gpu-[0001:1000]:\n    address: 10.0.0.1/16\n    servers:\n"
                     "      chat: {model: m, port: 8000, args: {max-model-len: 512}}\n")
    written = _written_out(1000)
    load_text(ranged)  # warm-up

    def cpu(text: str) -> float:
        start = time.process_time()
        load_text(text)
        return time.process_time() - start

    assert len(ranged.splitlines()) < 12
    assert min(cpu(ranged) for _ in range(2)) < 1.2 * min(cpu(written) for _ in range(2))


@pytest.mark.parametrize("key", ["gpu-[001:512]", "n[:2]", "n[1:9:4]", "r[1:2]-g[01:02]",
                                 "web-[a:c].lan"])
def test_the_schema_checks_a_range_block_as_a_host(key):
    hosts = fleet_schema()["properties"]["hosts"]["patternProperties"]
    matching = [pattern for pattern in hosts if re.search(pattern, key)]
    assert [hosts[pattern] for pattern in matching] == [{"$ref": "#/$defs/Host"}]


@pytest.mark.parametrize("key", ["gpu-1", "gpu-[1-4]", "gpu-[1:4", "GPU-[1:2]"])
def test_the_schema_underlines_what_is_not_a_range_or_a_name(key):
    patterns = fleet_schema()["properties"]["hosts"]["patternProperties"]
    assert sum(bool(re.search(pattern, key)) for pattern in patterns) == (key == "gpu-1")


def test_overlapping_address_spans_show_a_few_hosts_and_count_the_rest():
    text = HEAD + "  a-[1:100]:\n    address: 10.0.0.1\n  b-[1:100]:\n    address: 10.0.0.51\n"
    with pytest.raises(FleetError) as info:
        load_text(text, "f.yaml")
    problems = info.value.problems
    assert [p.path for p in problems] == [
        ("hosts", "b-1", "address"), ("hosts", "b-2", "address"), ("hosts", "b-3", "address"),
        ("hosts", "b-[1:100]", "address")]
    assert {p.line for p in problems} == {10}
    assert "hosts 'a-51' and 'b-1' are one machine" in problems[0].message
    assert problems[-1].message == "and 47 more problems like these on other hosts of b-[1:100]"
