"""No server or model name reaches vllm-fleet's own folders or units, in either direction.

A server's StateDirectory, CacheDirectory and RuntimeDirectory are handed to the service user;
had a server called ``models`` got ``/var/lib/vllm-fleet/models``, the verified model store would
be writable by it. Each server's directories therefore live below ``servers/``, which no name can
leave; the names that would reach the tool's own units (``fleet-…``) are refused.
"""

from __future__ import annotations

import pytest

from fleet.catalog import paths
from fleet.checks.ledger import host_claims
from fleet.hostplan.render import host_plan
from fleet.load import load_text
from fleet.read.problems import FleetError

TOOL_PLACES = [paths.MODELS_DIR, paths.PREVIOUS_DIR, paths.REMOTE_DIR, paths.VENV_DIR,
               paths.UV_DIR, paths.PYTHON_DIR, "/var/lib/vllm-fleet/sandbox",
               "/var/cache/vllm-fleet/images", paths.ENV_DIR]  # fmt: skip
NAMES = ["models", "previous", "sandbox", "images", "hostside", "servers", "venv", "uv",
         "python", "tiny"]  # fmt: skip

FLEET = """\
version: 1
models:
  {name}: {{url: "https://models.example/m.tar.gz", sha256: "{sha}"}}
hosts:
  box:
    address: 10.0.0.1
    vllm: {{version: "0.32.0", variant: cpu}}
    servers:
      {name}: {{model: {name}, port: 8000}}
"""


def directives(unit_text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in unit_text.splitlines() if line.startswith(key + "=")]


@pytest.mark.parametrize("name", NAMES)
def test_a_servers_own_directories_stay_below_servers(name: str) -> None:
    fleet = load_text(FLEET.format(name=name, sha="ab" * 32), "f.yaml")
    [server] = host_plan(fleet, "box", secrets=lambda ref: "").servers
    owned = [
        *(f"/var/lib/{d}" for d in directives(server.unit_text, "StateDirectory")),
        *(f"/var/cache/{d}" for v in directives(server.unit_text, "CacheDirectory")
          for d in v.split()),
        *(f"/run/{d}" for d in directives(server.unit_text, "RuntimeDirectory")),
    ]  # fmt: skip
    assert len(owned) == 4
    for place in owned:
        assert place.startswith(("/var/lib/vllm-fleet/servers/", "/var/cache/vllm-fleet/servers/",
                                 "/run/vllm-fleet/servers/"))  # fmt: skip
        for tool in TOOL_PLACES:
            assert not (place == tool or place.startswith(tool + "/") or tool.startswith(place))


@pytest.mark.parametrize("name", NAMES)
def test_a_model_named_like_a_tool_folder_stays_in_the_store(name: str) -> None:
    assert paths.model_path(name) == f"{paths.MODELS_DIR}/{name}"


@pytest.mark.parametrize("name", ["fleet-cpu-governor", "fleet-router", "fleet-"])
def test_names_of_the_tools_own_units_are_refused(name: str) -> None:
    with pytest.raises(FleetError, match="are vllm-fleet's own units"):
        load_text(FLEET.format(name=name, sha="ab" * 32).replace(
            f"  {name}: {{url", "  m: {url").replace(f"model: {name}", "model: m"), "f.yaml")


OWN_UNITS = """\
version: 1
models:
  m: {{url: "https://models.example/m.tar.gz", sha256: "{sha}"}}
hosts:
  box:
    address: 10.0.0.1
    os: {{cpu_governor: performance}}
    vllm: {{version: "0.32.0", variant: cpu}}
    servers:
      chat: {{model: m, port: 8000}}
      {name}: {{model: m, port: 8001}}
endpoints:
  x:
    replicas: [box/chat]
    router: {{host: box, port: 8100}}
"""


@pytest.mark.parametrize(("name", "unit"), [
    ("fleet_cpu-governor", r"vllm-fleet-cpu-governor\.service"),
    ("fleet_router-x", r"vllm-fleet[-_]router-x\.service"),
])
def test_names_that_reach_the_tools_own_units_once_normalised_are_refused(name: str,
                                                                         unit: str) -> None:
    """``fleet-`` is refused by the name rule; ``fleet_`` by the ledger (fleet/checks/ledger.py),
    which
    compares unit names with ``-`` and ``_`` alike."""
    with pytest.raises(FleetError, match=f"unit {unit} on box is claimed twice") as error:
        load_text(OWN_UNITS.format(name=name, sha="ab" * 32), "f.yaml")
    [problem] = error.value.problems
    assert problem.path == ("hosts", "box", "servers", name) or problem.path[0] == "endpoints"


@pytest.mark.parametrize("name", NAMES)
def test_the_ledger_holds_a_servers_directories_apart_from_the_tools(name: str) -> None:
    fleet = load_text(FLEET.format(name=name, sha="ab" * 32), "f.yaml")
    claims = host_claims(fleet)["box"]
    tool = [str(c.value) for c in claims if c.kind == "directory" and not c.handed]
    own = [str(c.value) for c in claims if c.kind == "directory" and c.handed]
    assert len(own) == 3
    for place in own:
        assert not any(place == t or place.startswith(t + "/") or t.startswith(place + "/")
                       for t in tool), (place, tool)
