"""The fleet file's JSON Schema, generated from the pydantic models.

``inventory/fleet.schema.json`` is this output, committed; a test fails when it is stale.

Example:
    >>> fleet_schema()["title"]
    'Fleet'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleet.spec import Fleet

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "inventory" / "fleet.schema.json"


def fleet_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of fleet files."""
    schema = Fleet.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def write_schema(path: Path = SCHEMA_PATH) -> None:
    """Regenerate the committed schema file."""
    path.write_text(json.dumps(fleet_schema(), indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_schema()
