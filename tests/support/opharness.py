"""Operation tests without a host (pyinfra-testing style): fake facts in, commands and noops out.

Example:
    from tests.support.opharness import run_op
    commands, noops = run_op(ops.vllm_installed, {"VenvPackages": None},
                             venv="/v", requirement="vllm==0.11.0", version="0.11.0")
"""

from __future__ import annotations

from typing import Any

from pyinfra.context import ctx_host


class FakeHost:
    """Just enough of pyinfra's Host for operation generators: facts by class name."""

    name = "gpu-1"
    print_prefix = "[gpu-1] "

    def __init__(self, facts: dict[str, Any]) -> None:
        self.facts = facts
        self.noops: list[str] = []

    def get_fact(self, cls: type, *args: Any, **kwargs: Any) -> Any:
        value = self.facts[cls.__name__]
        return value(**kwargs) if callable(value) else value

    def noop(self, text: str) -> None:
        self.noops.append(text)


def run_op(op: Any, facts: dict[str, Any], **kwargs: Any) -> tuple[list[str], list[str]]:
    """(commands, noop texts) of one operation, given fake facts."""
    fake = FakeHost(facts)
    with ctx_host.use(fake):
        commands = [
            c.get_raw_value() if hasattr(c, "get_raw_value") else str(c)
            for c in op._inner(**kwargs)
        ]
    return commands, fake.noops
