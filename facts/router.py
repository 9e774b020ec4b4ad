"""Facts about endpoint routers: which router units vllm-fleet wrote on a host.

Example:
    from facts.router import FleetRouterUnits
    host.get_fact(FleetRouterUnits, unit_dir="/etc/systemd/system")
    # ['vllm-fleet-router-chat.service']
"""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand

#: The first line of every router unit vllm-fleet writes, exactly
#: (templates/vllm-router.service.j2).
ROUTER_UNIT_MARKER = (
    "# Managed by vllm-fleet: the router of an endpoint — edit the fleet file, not this unit."
)


class FleetRouterUnits(FactBase):
    """The router units in /etc/systemd/system that vllm-fleet wrote (first line exactly
    :data:`ROUTER_UNIT_MARKER`), sorted; units written by hand are not listed.

    .. code:: python

        ["vllm-fleet-router-chat.service"]

    Example:
        >>> FleetRouterUnits().process(["vllm-fleet-router-b.service", "x", "vllm-fleet-router-a.service"])
        ['vllm-fleet-router-a.service', 'vllm-fleet-router-b.service']
    """  # noqa: E501

    default = list

    def command(self, unit_dir: str) -> StringCommand:
        return StringCommand(
            "for f in", f"{unit_dir.rstrip('/')}/vllm-fleet-router-*.service", "; do",
            "test -f \"$f\" && head -n 1 \"$f\" | grep -qxF", QuoteString(ROUTER_UNIT_MARKER),
            "&& basename \"$f\"; done; true",
        )  # fmt: skip

    def process(self, output: list[str]) -> list[str]:
        return sorted(line.strip() for line in output if line.strip().endswith(".service"))
