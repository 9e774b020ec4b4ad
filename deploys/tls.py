"""A server's TLS files on its host: written root-owned 0600 beside its environment file.

Its unit names them with ``LoadCredential=``: systemd copies each into the unit's own
credentials folder, readable by the service's user only (``fleet.hostplan.tls``). A changed file
restarts the server (or rolls it through its endpoint) like any other configuration change.
"""

from __future__ import annotations

from io import StringIO

from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files

from fleet.catalog.paths import tls_previous_path
from fleet.hostplan.types import ServerUnit
from operations.services import previous_saved


def tls_restore(entry: ServerUnit) -> dict[str, str]:
    """The restore pairs (live → saved copy) of ``entry``'s TLS files (none without TLS)."""
    if entry.tls is None:
        return {}
    return {f.path: tls_previous_path(entry.name, f.part) for f in entry.tls.files}


def tls_saved(entry: ServerUnit) -> dict[str, str]:
    """Keep the current copy of each of ``entry``'s TLS files that is about to change; the
    restore pairs its restart puts back if the new configuration fails."""
    restore = tls_restore(entry)
    for tls_file in entry.tls.files if entry.tls else ():
        previous_saved(name=f"Keep the current TLS {tls_file.part} of {entry.unit}",
                       path=tls_file.path, text=tls_file.text, backup=restore[tls_file.path])
    return restore


def tls_written(entry: ServerUnit) -> list[OperationMeta]:
    """Write ``entry``'s TLS files (none without TLS); the operations, for ``any_changed``."""
    if entry.tls is None:
        return []
    return [
        files.put(
            name=f"Write the TLS {tls_file.part} of {entry.unit}",
            src=StringIO(tls_file.text),
            dest=tls_file.path,
            user="root",
            group="root",
            mode="600",
        )
        for tls_file in entry.tls.files
    ]
