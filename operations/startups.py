"""Record a server's start, in phases, on its host, and print it in the deploy's output.

Example:
    start_recorded(name="Record tiny's start", unit="vllm-tiny.service", server="tiny",
                   model="tiny-llama", script=remote_program("startup_phases"))
"""

from __future__ import annotations

from pyinfra.api import QuoteString, StringCommand, operation

from fleet.catalog.paths import MODEL_INSTALLS, STARTUPS_DIR, startup_record
from operations.models import StreamedCommand


@operation(is_idempotent=False)
def start_recorded(unit: str, server: str, model: str, script: str):
    """Append the unit's last start (its phases from the journal, the model install before it)
    to the server's record (:func:`fleet.catalog.paths.startup_record`) and print it; run it only
    when
    the deploy (re)started the server and its first completion came.

    + unit: the server's unit; server: its name; model: the model it serves
    + script: the host-side startup_phases.py

    **Example:**

    .. code:: python

        start_recorded(name="Record tiny's start", unit="vllm-tiny.service", server="tiny",
                       model="tiny-llama", script=path, _if=restart.did_change)
    """
    yield StringCommand("install", "-d", "-m", "755", QuoteString(STARTUPS_DIR))
    yield StreamedCommand(
        "python3", QuoteString(script), "--unit", QuoteString(unit),
        "--name", QuoteString(server), "--record", QuoteString(startup_record(server)),
        "--model", QuoteString(model), "--model-installs", QuoteString(MODEL_INSTALLS),
    )  # fmt: skip
