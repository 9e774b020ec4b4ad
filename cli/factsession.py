"""A pyinfra inventory to read facts from fleet hosts, outside a deploy (``fleet drift``,
``fleet doctor``, ``fleet plan --from-host``): pyinfra's and paramiko's own logging silenced
(each command reports unreachable hosts itself) and a 10 s connect timeout.

Example (needs reachable hosts)::

    inventory = fact_inventory([("gpu-01", {"ssh_hostname": "10.0.0.11"})])
    inventory.get_host("gpu-01").get_fact(NvidiaSmiGpus)
"""

from __future__ import annotations

import logging
from typing import Any

from pyinfra.api import Config, Inventory, State

#: Seconds to wait for a host's SSH connection before it counts as unreachable.
CONNECT_TIMEOUT = 10


def fact_inventory(targets: list[tuple[str, dict[str, Any]]]) -> Inventory:
    """An inventory of ``[(name, connection data)]`` with its pyinfra state attached."""
    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    inventory = Inventory((targets, {}))
    State(inventory=inventory, config=Config(CONNECT_TIMEOUT=CONNECT_TIMEOUT))
    return inventory
