"""``fleet bench --endpoint NAME``: the router of the endpoint is the target, with its key."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cli.bench.command import BenchError, add_parser, resolve_target

ROOT = Path(__file__).resolve().parents[3]
VALID = ROOT / "tests" / "data" / "valid" / "endpoint-two-replicas.yaml"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(), str(VALID))
    return parser.parse_args(["bench", str(VALID), *argv])


def test_the_router_is_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAT_API_KEY", "k-endpoint")
    with resolve_target(parse("--endpoint", "chat")) as resolved:
        assert resolved.base_url == "http://10.0.0.11:8000"  # gpu-a, bound to every interface
        assert (resolved.model, resolved.api_key) == ("chat", "k-endpoint")
        assert resolved.name == "endpoint chat"


def test_an_unknown_endpoint_is_named() -> None:
    with (
        pytest.raises(BenchError, match=r"no endpoint 'chta'.*endpoints: chat"),
        resolve_target(parse("--endpoint", "chta")),
    ):
        pass


def test_server_url_and_endpoint_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        parse("--endpoint", "chat", "--server", "chat-a")
