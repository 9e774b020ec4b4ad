"""The fleet file's JSON Schema, generated from the pydantic models.

``inventory/fleet.schema.json`` is this output, committed; a test fails when it is stale. A key
of ``hosts:`` may also be a range, and a block may name a group of an Ansible inventory
(:mod:`fleet.spec.hostranges`, made into hosts before the models see them): the schema checks
such a block as a host's.

Example:
    >>> fleet_schema()["title"]
    'Fleet'
    >>> RANGE_KEY_PATTERN in fleet_schema()["properties"]["hosts"]["patternProperties"]
    True
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleet.spec.hostranges import PLACEHOLDER, RANGE_KEY_PATTERN
from fleet.spec.models import Fleet

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "inventory" / "fleet.schema.json"


def fleet_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of fleet files."""
    schema = Fleet.model_json_schema()
    hosts = schema["properties"]["hosts"]
    hosts["patternProperties"][RANGE_KEY_PATTERN] = {"$ref": "#/$defs/Host"}
    hosts["description"] += (
        " A key may be a range, as in Ansible inventories: gpu-[001:512] is one host per number "
        "(padding kept), node-[a:f] per letter, [1:9:2] with a step; every host gets the block's "
        "settings, and its address is counted up from the block's (an IP address, optionally "
        f"with the network's prefix: 10.0.1.1/24) or made from its name ('{PLACEHOLDER}.example."
        "com')."
    )
    schema["$defs"]["Host"]["properties"]["inventory"] = {
        "description": "This block is the group of its key in this Ansible inventory (INI, or "
        "YAML ending in .yml/.yaml; relative to the fleet file): one host per host of the group "
        "and its children, each with the block's settings, its address ansible_host (else its "
        "name), its ssh port and user ansible_port and ansible_user.",
        "title": "Inventory",
        "type": "string",
    }
    host = schema["$defs"]["Host"]  # an address, or an inventory that gives each host one
    host["required"] = [name for name in host["required"] if name != "address"]
    host["anyOf"] = [{"required": ["address"]}, {"required": ["inventory"]}]
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def write_schema(path: Path = SCHEMA_PATH) -> None:
    """Regenerate the committed schema file."""
    path.write_text(json.dumps(fleet_schema(), indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_schema()
