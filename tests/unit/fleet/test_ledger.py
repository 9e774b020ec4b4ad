"""The ledger of host resources (fleet/checks/ledger.py): what the fleet writes on a host is what it
claims, and each resource has one owner.

The located messages of the hostile files are tests/data/invalid/ledger-*.yaml's (run by
test_load.py); here, one behaviour per test: the claims agree with the rendered host plans, each
rule holds at its boundary, and what may be shared is accepted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.checks import ledger
from fleet.checks.ledger import AF_UNIX_MAX, Claim, claim_problems, host_claims, normalise
from fleet.hostplan.render import host_plan
from fleet.load import load_fleet, load_text
from fleet.read.problems import FleetError

ROOT = Path(__file__).resolve().parents[3]
CORPUS = sorted((ROOT / "tests" / "data" / "valid").glob("*.yaml")) + sorted(
    (ROOT / "inventory").rglob("*.yaml"))

CPU = """\
version: 1
defaults:
  vllm: {{version: "0.32.0", variant: cpu}}
models:
  m: {{hf: "org/m", revision: "0123456789abcdef0123456789abcdef01234567"}}
hosts:
  box:
    address: {address}
    servers:
      {name}: {{model: m, port: {port}}}
  box-2:
    address: {address2}
    servers:
      other: {{model: m, port: {port2}}}
{extra}"""

GPU_RAY = """\
version: 1
defaults:
  gpus: {{count: 4, model: "H100"}}
  os: {{nvidia: {{driver: "580"}}}}
  vllm: {{version: "0.32.0", variant: cu130}}
models:
  m: {{hf: "org/m", revision: "0123456789abcdef0123456789abcdef01234567"}}
hosts:
  gpu-a:
    address: 10.0.0.1
    servers:
      {name}:
        model: m
        port: 8000
        host: 0.0.0.0
        gpus: [0, 1]
        worker_hosts: [gpu-b]
        multinode: {{launcher: {launcher}, head_address: 10.0.0.1}}
        args: {{tensor-parallel-size: 2, pipeline-parallel-size: 2, gpu-memory-utilization: {share}}}
  gpu-b:
    address: 10.0.0.2
    servers:
      own: {{model: m, port: {own_port}, host: 0.0.0.0, gpus: [0], args: {{gpu-memory-utilization: {own_share}}}}}
"""  # noqa: E501


def cpu(name: str = "chat", port: int = 8001, port2: int = 8001, extra: str = "",
        address: str = "10.0.0.1", address2: str = "10.0.0.2") -> str:
    return CPU.format(name=name, port=port, port2=port2, extra=extra, address=address,
                      address2=address2)


def ray(name: str = "med", launcher: str = "ray", share: float = 0.45, own_share: float = 0.4,
        own_port: int = 8001) -> str:
    return GPU_RAY.format(name=name, launcher=launcher, share=share, own_share=own_share,
                          own_port=own_port)


def problems(text: str) -> list[str]:
    with pytest.raises(FleetError) as error:
        load_text(text, "f.yaml")
    return [f"{'.'.join(map(str, p.path))}: {p.message}; {p.hint}" for p in error.value.problems]


def accepted(text: str) -> bool:
    load_text(text, "f.yaml")
    return True


# --- the claims are what is rendered ----------------------------------------------------------


def rendered(path: Path) -> dict[str, tuple[set[str], set[str], set[str]]]:
    """Per host of a fleet file: the unit names, file paths and handed directories its host plan
    writes (units, environment files, router key files, monitoring drop-ins; StateDirectory,
    CacheDirectory, RuntimeDirectory of every unit)."""
    fleet = load_fleet(path)
    found = {}
    for name in fleet.hosts:
        plan = host_plan(fleet, name, secrets=lambda ref: "")
        units, files, folders = set(), set(), set()
        texts = []
        for server in plan.servers:
            units.add(server.unit)
            files.add(server.env_path)
            texts.append(server.unit_text)
            if server.ray_head:
                units.add(server.ray_head.unit)
                texts.append(server.ray_head.unit_text)
        for router in plan.routers:
            units.add(router.unit)
            files.add(router.env_path)
        if plan.monitoring is not None:
            files.add(plan.monitoring.node_exporter.path)
            if plan.monitoring.gpu_metrics is not None:
                units.add(plan.monitoring.gpu_metrics.unit)
            if plan.monitoring.prometheus is not None:
                files.add(plan.monitoring.prometheus.service.path)
        for text in texts:
            for line in text.splitlines():
                key, _, value = line.partition("=")
                root = {"StateDirectory": "/var/lib", "CacheDirectory": "/var/cache",
                        "RuntimeDirectory": "/run"}.get(key)
                if root:
                    folders.update(f"{root}/{word}" for word in value.split())
        found[name] = (units, files, folders)
    return found


def claimed(path: Path) -> dict[str, tuple[set[str], set[str], set[str]]]:
    fleet = load_fleet(path)
    out = {}
    for name, claims in host_claims(fleet).items():
        units = {str(c.value) for c in claims if c.kind == "unit"}
        files = {str(c.value) for c in claims if c.kind == "file"}
        folders = {str(c.value) for c in claims if c.kind == "directory" and c.handed}
        out[name] = (units, files, folders)
    return out


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_every_unit_file_and_directory_written_is_claimed(path: Path) -> None:
    written, held = rendered(path), claimed(path)
    for host, (units, files, folders) in written.items():
        held_units, held_files, held_folders = held[host]
        assert units <= held_units, units - held_units
        assert files <= held_files, files - held_files
        # the cache folder's tmp/ is inside the server's own cache folder
        assert {f for f in folders if not f.endswith("/tmp")} <= held_folders, (
            folders - held_folders)


def test_ray_ports_claimed_are_the_ones_ray_start_is_given() -> None:
    fleet = load_text(ray(), "f.yaml")
    for host in ("gpu-a", "gpu-b"):
        plan = host_plan(fleet, host, secrets=lambda ref: "")
        [entry] = [s for s in plan.servers if s.name == "med"]
        text = entry.ray_head.unit_text if entry.ray_head else entry.unit_text
        [line] = [x for x in text.splitlines() if x.startswith("ExecStart=")]
        words = line.split()
        given = {int(words[words.index(flag) + 1]) for flag in (
            "--node-manager-port", "--object-manager-port", "--min-worker-port")}
        ports = {int(c.value) for c in host_claims(fleet)[host] if c.kind == "port"}
        assert given <= ports


# --- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("one", "other"), [
    ("vllm-chat_a.service", "vllm-chat-a.service"),
    ("vllm-Chat.service", "vllm-chat.service"),
    ("/etc/vllm-fleet/Router_Chat.env", "/etc/vllm-fleet/router-chat.env"),
])
def test_names_compare_case_folded_with_dash_and_underscore_alike(one: str, other: str) -> None:
    assert normalise(one) == normalise(other)


@pytest.mark.parametrize(("second", "refused"), [("chat_a", True), ("chat-a2", False),
                                                 ("chat.a", False)])
def test_server_names_of_one_host_differ_beyond_dash_and_underscore(second: str,
                                                                    refused: bool) -> None:
    text = cpu(name="chat-a").replace("      chat-a: {model: m, port: 8001}",
                                      "      chat-a: {model: m, port: 8001}\n"
                                      f"      {second}: {{model: m, port: 8002}}")
    if refused:
        [found] = problems(text)
        assert "unit vllm-chat-a.service on box is claimed twice" in found
        assert "names are compared case-folded, with '-' and '_' alike" in found
    else:
        assert accepted(text)


@pytest.mark.parametrize(("where", "text"), [
    ("server", cpu(name="chаt")),
    ("host", cpu().replace("  box-2:", "  bоx-2:")),
    ("model", cpu().replace("  m: {hf", "  mа: {hf")),
    ("worker host", ray().replace("worker_hosts: [gpu-b]", "worker_hosts: [gpu-б]")),
])
def test_a_name_that_is_not_ascii_names_the_character(where: str, text: str) -> None:
    assert any("is not ASCII" in p and "U+04" in p for p in problems(text)), where


# --- units and files ---------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "unit"), [
    (ray().replace("  gpu-b:\n", "      med-ray: {model: m, port: 8002, gpus: [2]}\n  gpu-b:\n"),
     "vllm-med-ray.service"),
    (cpu(name="router-chat", extra="endpoints:\n  chat:\n    replicas: [box-2/other]\n"
         "    router: {host: box, port: 8100}\n").replace("port: 8001}", "port: 8001, "
         "host: 0.0.0.0}"), "/etc/vllm-fleet/router-chat.env"),
    (cpu(name="fleet_cpu-governor").replace("    address: 10.0.0.1\n",
                                            "    address: 10.0.0.1\n    os: {cpu_governor: "
                                            "performance}\n"), "vllm-fleet-cpu-governor.service"),
])
def test_a_unit_or_file_of_two_owners_is_refused_naming_both(text: str, unit: str) -> None:
    [found] = problems(text)
    assert f"{unit} on " in found and "claimed twice: by " in found and " and by " in found


def test_two_groups_sharing_a_worker_host_are_one_finding() -> None:
    text = ray(launcher="native").replace("  gpu-b:", """\
  gpu-c:
    address: 10.0.0.3
    servers:
      med:
        model: m
        port: 8000
        host: 0.0.0.0
        gpus: [2, 3]
        worker_hosts: [gpu-b]
        multinode: {head_address: 10.0.0.3}
        args: {tensor-parallel-size: 2, pipeline-parallel-size: 2, gpu-memory-utilization: 0.3}
  gpu-b:""")
    [found] = problems(text)
    assert "unit vllm-med.service on gpu-b is claimed twice: by group gpu-a/med (worker gpu-b)" \
        in found and "and by group gpu-c/med (worker gpu-b)" in found


@pytest.mark.parametrize("name", ["models", "previous", "startups", "servers", "ray"])
def test_a_server_named_like_a_tool_folder_is_accepted(name: str) -> None:
    assert accepted(cpu(name=name))


def test_a_handed_directory_may_not_hold_another_owners_path() -> None:
    store = Claim("directory", "/var/lib/vllm-fleet/models", "the verified model store", ())
    model = Claim("directory", "/var/lib/vllm-fleet/models/m", "model m", ("models", "m"))
    above = Claim("directory", "/var/lib/vllm-fleet", "server a/x", ("hosts", "a"), handed=True)
    found = list(claim_problems([("a", [store, model, above])], set()))
    assert [path for path, _, _ in found] == [("hosts", "a")] * 2  # the store, and model m
    assert all("lies inside directory /var/lib/vllm-fleet (server a/x)" in m for _, m, _ in found)


# --- ports -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "field"), [
    ("endpoints:\n  e:\n    replicas: [box/chat]\n    router: {host: box, port: 80}\n",
     "endpoints.e.router.port"),
    ("endpoints:\n  e:\n    replicas: [box/chat]\n    router: {host: box, port: 8100, "
     "metrics_port: 900}\n", "endpoints.e.router.metrics_port"),
    ("monitoring:\n  host: box\n  prometheus: {port: 443}\n", "monitoring.prometheus.port"),
    ("monitoring:\n  host: box\n  alertmanager: {port: 993}\n", "monitoring.alertmanager.port"),
    ("monitoring:\n  host: box\n  node_exporter_port: 100\n", "monitoring.node_exporter_port"),
])
def test_a_port_below_1024_of_a_unit_without_capabilities_is_refused(extra: str,
                                                                     field: str) -> None:
    found = problems(cpu(extra=extra))
    assert any(p.startswith(f"{field}: port ") and "CapabilityBoundingSet" in p
               and "choose a port ≥ 1024" in p for p in found), found


def test_a_server_port_below_1024_is_refused() -> None:
    [found] = problems(cpu(port=80))
    assert found.startswith("hosts.box.servers.chat.port: port 80 on box is below 1024")


def test_a_port_below_1024_of_a_unit_that_keeps_its_capability_is_accepted() -> None:
    # the site's DCGM exporter is its own unit; sshd keeps its capability
    text = ray().replace("    address: 10.0.0.2\n", "    address: 10.0.0.2\n    ssh: {port: 22}\n")
    text += ("monitoring:\n  host: gpu-a\n  exporters:\n"
             "    gpu-b: {gpu_metrics: dcgm, dcgm_port: 940}\n")
    assert accepted(text)


@pytest.mark.parametrize(("sandbox", "refused"), [(True, True), (False, False)])
def test_one_port_on_two_hosts_clashes_only_on_one_network(sandbox: bool, refused: bool) -> None:
    address = "sandbox" if sandbox else "10.0.0.1"
    text = cpu(address=address, address2="sandbox" if sandbox else "10.0.0.2")
    if refused:
        assert any("sandbox hosts share this machine's network" in p for p in problems(text))
    else:
        assert accepted(text)


@pytest.mark.parametrize(("port", "refused"), [(6380, True), (6381, True), (10002, True),
                                               (10999, True), (6379, False), (10001, False),
                                               (11000, False)])
def test_a_server_beside_a_ray_worker_node_keeps_off_its_ports(port: int, refused: bool) -> None:
    """A worker's node runs its node and object managers and worker ports; the GCS and the
    Client server are the head's."""
    text = ray(own_port=port)
    if refused:
        assert any("gpu-b.servers.own.port" in p or "on gpu-b" in p for p in problems(text))
    else:
        assert accepted(text)


def test_a_port_range_overlapping_a_written_port_names_the_written_one() -> None:
    [found] = problems(ray(own_port=10500))
    assert found.startswith("hosts.gpu-b.servers.own.port: port 10500 of server gpu-b/own on "
                            "gpu-b lies in ports 10002–10999 of the Ray worker port range")


# --- ports a server's args open ---------------------------------------------------------------

ARGS = """\
version: 1
defaults:
  vllm: {{version: "0.32.0", variant: cpu}}
models:
  m: {{hf: "org/m", revision: "0123456789abcdef0123456789abcdef01234567"}}
hosts:
  box:
    address: 10.0.0.1
    servers:
      chat: {{model: m, port: 8000, args: {args}}}
      other: {{model: m, port: {other}}}
"""


@pytest.mark.parametrize(("args", "field"), [
    ("{grpc-port: 8001}", "grpc-port"),
    ("{grpc-port: '8001'}", "grpc-port"),
    ("{data-parallel-rpc-port: 8001}", "data-parallel-rpc-port"),
    ("{data-parallel-multi-port-external-lb: true, data-parallel-supervisor-port: 8001}",
     "data-parallel-supervisor-port"),
])
def test_a_port_a_servers_args_open_has_one_owner(args: str, field: str) -> None:
    [found] = problems(ARGS.format(args=args, other=8001))
    assert "port 8001 on box is claimed twice" in found, found
    assert f"--{field} of server box/chat (hosts.box.servers.chat.args." in found, found
    assert "server box/other" in found, found
    assert accepted(ARGS.format(args=args, other=8002))


def test_a_port_below_1024_through_args_is_refused() -> None:
    [found] = problems(ARGS.format(args="{grpc-port: 443}", other=8001))
    assert found.startswith("hosts.box.servers.chat.args.grpc-port: port 443 on box is below "
                            "1024"), found


@pytest.mark.parametrize(("args", "refused"), [
    ("{data-parallel-multi-port-external-lb: true}", True),
    ("{data-parallel-size: 2}", False),
    ("{data-parallel-multi-port-external-lb: true, data-parallel-supervisor-port: 9300}", False),
])
def test_the_supervisor_port_is_claimed_at_its_default_only_in_its_mode(args: str,
                                                                         refused: bool) -> None:
    text = ARGS.format(args=args, other=ledger.SUPERVISOR_PORT)
    if refused:
        [found] = problems(text)
        assert "--data-parallel-supervisor-port of server box/chat (its default" in found
    else:
        assert accepted(text)


def test_the_arg_ports_are_vllm_flags_and_the_supervisor_default_is_vllms() -> None:
    flags = json.loads((ROOT / "fleet" / "catalog" / "vllm_flags" / "0.32.0.json").read_text())
    for key, switch in ledger.ARG_PORTS.items():
        assert flags["flags"][key]["type"] == "int", key
        assert switch is None or flags["flags"][switch]["takes_value"] is False
    default = flags["flags"]["data-parallel-supervisor-port"]["default"]
    assert int(default) == ledger.SUPERVISOR_PORT


# --- sockets -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("length", "refused"), [(46, False), (47, True)])
def test_vllm_ipc_socket_paths_fit_af_unix(length: int, refused: bool) -> None:
    name = "s" + "x" * (length - 1)
    if refused:
        [found] = problems(cpu(name=name))
        assert f"over the {AF_UNIX_MAX} bytes" in found and "at most 46 characters" in found
    else:
        assert accepted(cpu(name=name))


@pytest.mark.parametrize(("length", "refused"), [(23, False), (24, True)])
def test_ray_session_socket_paths_fit_af_unix(length: int, refused: bool) -> None:
    name = "r" + "x" * (length - 1)
    if refused:
        [found] = problems(ray(name=name))
        assert f"/sockets/{ledger.RAY_SOCKET.split('/')[-1]} (108 bytes)" in found
        assert "at most 23 characters" in found
    else:
        assert accepted(ray(name=name))


# --- GPUs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("share", "own_share", "refused"), [(0.45, 0.4, False), (0.6, 0.45, True)])
def test_a_group_members_gpus_count_with_the_worker_hosts_own(share: float, own_share: float,
                                                               refused: bool) -> None:
    text = ray(share=share, own_share=own_share)
    if refused:
        [found] = problems(text)
        assert found.startswith(f"hosts.gpu-a.servers.med.args: servers sharing GPU 0 take own "
                                f"{own_share:g} + group gpu-a/med (worker gpu-b) {share:g}")
    else:
        assert accepted(text)
