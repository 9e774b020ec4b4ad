"""pyinfra inventory: the hosts of the fleet file ``$FLEET`` (default inventory/sandbox.yaml).

The whole fleet file is validated here, before pyinfra connects to anything; a broken file
stops the run with file:line messages.

    pyinfra -y inventory.py deploy.py
"""

import sys

from cli.inventory import fleet_path, inventory_hosts
from fleet.load import FleetError

try:
    vllm_hosts = inventory_hosts(fleet_path())
except FleetError as _error:
    print(f"vllm-fleet: {fleet_path()} cannot be deployed:", file=sys.stderr)
    for _problem in _error.problems:
        print(f"  {_problem}", file=sys.stderr)
    raise SystemExit(1) from None
