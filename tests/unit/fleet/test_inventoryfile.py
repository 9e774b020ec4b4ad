"""Hosts read from an Ansible inventory the site keeps (:mod:`fleet.read.ansible`, made into hosts
by :mod:`fleet.spec.hostranges`): INI and YAML, child groups, the variables read, and each
problem located in the file it is in (the fleet file's ones: ``tests/data/invalid/inventory-*``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleet.load import FleetError, load_text
from fleet.read.ansible import InventoryProblem, group_hosts

ROOT = Path(__file__).resolve().parents[3]
INVENTORIES = ROOT / "tests" / "data" / "inventories"
HEAD = """\
version: 1
defaults:
  vllm: {version: "0.32.0", variant: cpu}
hosts:
"""


def load(body: str, folder: Path = INVENTORIES) -> dict[str, tuple[str, str, int]]:
    """Each host's (address, ssh user, ssh port) of a fleet file written in ``folder``."""
    fleet = load_text(HEAD + body, str(folder / "fleet.yaml"))
    return {name: (h.address, h.ssh.user, h.ssh.port) for name, h in fleet.hosts.items()}


@pytest.mark.parametrize("inventory", ["site.ini", "site.yml"])
def test_a_group_with_its_children_becomes_hosts(inventory):
    hosts = load(f"  serving:\n    inventory: {inventory}\n    ssh: {{user: root}}\n"
                 "  front:\n    address: 10.0.9.1\n")
    assert hosts == {
        "gpu-01": ("gpu-01", "ops", 22), "gpu-02": ("gpu-02", "ops", 22),
        "gpu-03": ("gpu-03", "ops", 22), "gpu-04": ("gpu-04", "ops", 22),
        "big-1": ("10.0.5.1", "root", 2222), "cpu-a": ("10.0.6.1", "root", 22),
        "front": ("10.0.9.1", "root", 22),
    }


@pytest.mark.parametrize(("inventory", "group", "names"), [
    ("site.ini", "cpus", ["cpu-a"]),
    ("site.ini", "ungrouped", ["mgmt-1"]),
    ("site.ini", "all", ["mgmt-1", "gpu-[01:04]", "big-1", "cpu-a"]),
    ("site.yml", "all", ["mgmt-1", "gpu-[01:04]", "big-1", "cpu-a"]),
    ("site.yml", "gpus", ["gpu-[01:04]", "big-1"]),
])
def test_group_hosts_reads_each_form(inventory, group, names):
    text = (INVENTORIES / inventory).read_text()
    found = group_hosts(text, group, yaml_form=inventory.endswith(".yml"))
    assert [host.pattern for host in found] == names


def test_only_the_connection_variables_are_read():
    (host,) = group_hosts("[g]\nh ansible_host=10.0.0.1 ansible_become=true x='a b'\n", "g",
                          yaml_form=False)
    assert host.variables == {"ansible_host": "10.0.0.1"}


def test_a_child_group_met_twice_is_read_once():
    text = "[a]\nh1\n[b:children]\na\n[c:children]\na\nb\n"
    assert [h.pattern for h in group_hosts(text, "c", yaml_form=False)] == ["h1"]


@pytest.mark.parametrize(("text", "line", "words"), [
    ("[gpus]\nGPU-01\n", 2, "'GPU-01' is not a host name here"),
    ("[gpus]\nok-1 ansible_port=ssh\n", 2, "ansible_port=ssh is not a port number"),
    ("[gpus]\nok-1\n[bad\n", 3, "'[bad' is not a section"),
    ("[gpus]\nok-1 stray\n", 2, "'stray' is not a variable"),
    ("[gpus]\nok-[3:1]\n", 2, "counts down"),
])
def test_a_problem_in_the_inventory_is_located_in_it(tmp_path, text, line, words):
    (tmp_path / "hosts.ini").write_text(text)
    with pytest.raises(FleetError) as info:
        load("  gpus:\n    inventory: hosts.ini\n", tmp_path)
    (problem,) = info.value.problems
    assert (problem.file, problem.line) == (str(tmp_path / "hosts.ini"), line)
    assert words in problem.message


def test_a_broken_yaml_inventory_is_located_in_it(tmp_path):
    (tmp_path / "hosts.yml").write_text("all:\n  children:\n    gpus:\n      hosts: [a, b]\n")
    with pytest.raises(FleetError) as info:
        load("  gpus:\n    inventory: hosts.yml\n", tmp_path)
    (problem,) = info.value.problems
    assert (problem.file, problem.line) == (str(tmp_path / "hosts.yml"), 4)


def test_a_huge_group_is_counted_before_it_is_made(tmp_path):
    (tmp_path / "hosts.ini").write_text("[gpus]\ngpu-[0:999999999]\n")
    with pytest.raises(FleetError) as info:
        load("  gpus:\n    inventory: hosts.ini\n", tmp_path)
    (problem,) = info.value.problems
    assert problem.path == ("hosts", "gpus", "inventory")
    assert "makes 1,000,000,000 hosts" in problem.message


def test_a_fifo_is_not_read_as_an_inventory(tmp_path):
    os.mkfifo(tmp_path / "hosts.ini")  # opened without blocking, then refused
    with pytest.raises(FleetError) as info:
        load("  gpus:\n    inventory: hosts.ini\n", tmp_path)
    (problem,) = info.value.problems
    assert (problem.line, problem.path) == (6, ("hosts", "gpus", "inventory"))
    assert "not a regular file" in problem.message


def test_a_group_missing_from_the_inventory_names_the_groups_it_has():
    with pytest.raises(FleetError) as info:
        load("  gpu:\n    inventory: site.ini\n")
    (problem,) = info.value.problems
    assert problem.hint == "its groups: cpus, gpus, serving, ungrouped"


def test_a_fault_of_the_group_block_is_one_problem_at_its_line():
    with pytest.raises(FleetError) as info:
        load("  gpus:\n    inventory: site.ini\n    gpus: {count: -1}\n")
    (problem,) = info.value.problems
    assert problem.line == 7
    assert problem.message.endswith("(and on 4 more hosts of gpus)")


def test_group_hosts_refuses_a_missing_group():
    with pytest.raises(InventoryProblem, match="no group 'x'"):
        group_hosts("[a]\nh\n", "x", yaml_form=False)


@pytest.mark.parametrize("path", ["/etc/shadow", "/proc/self/environ", "~/.ssh/id_ed25519"])
def test_a_credential_or_kernel_file_is_not_read_as_an_inventory(tmp_path, path):
    with pytest.raises(FleetError) as info:
        load(f"  all:\n    inventory: {path}\n", tmp_path)
    (problem,) = info.value.problems
    assert problem.path == ("hosts", "all", "inventory")
    assert "not an inventory" in problem.message
