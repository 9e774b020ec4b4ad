"""``fleet bench`` and ``fleet doctor``'s bench rounds against a TLS server of the fleet file:
https to where it is reached (its address, or an SSH port forward's 127.0.0.1:LOCAL), trusting
the CA the fleet file names, checked for the name its certificate covers; the API key in no
output. The server is the fake OpenAI server serving https with a test CA's certificate; the
SSH forward is stood in for by a tunnel that "opens" on the fake server's own port.
"""

from __future__ import annotations

import argparse
import json
import ssl
from pathlib import Path

import pytest

from cli.bench import command
from cli.bench.command import add_parser, resolve_target
from cli.doctor import benchcheck
from cli.main import main
from tests.support.fakeserver import FakeServer
from tests.support.testca import ServerFiles, TestCA

KEY = "tls-bench-key-77a1"
FLEET = """\
version: 1
defaults:
  vllm: {{version: "0.32.0", variant: cpu}}
models:
  m: {{url: "http://127.0.0.1:1/m.tar.gz", sha256: "{sha}"}}
hosts:
  box:
    address: {address}
    servers:
      secure:
        model: m
        port: {port}
        host: {bind}
        served_model_name: "ttft=0.01,chunks=3"
        api_key: {{env: FLEET_TLS_BENCH_KEY}}
        tls:
          certificate: {{file: {certificate}}}
          key: {{file: {key}}}
          ca: {{file: {ca}}}
"""


def tls_server(files: ServerFiles) -> FakeServer:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.certificate, files.key)
    return FakeServer(tls=context, api_key=KEY)


def write_fleet(
    tmp_path: Path,
    files: ServerFiles,
    port: int,
    address: str = "127.0.0.1",
    bind: str = "127.0.0.1",
    ca: Path | None = None,
) -> Path:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        FLEET.format(
            sha="a" * 64,
            address=address,
            port=port,
            bind=bind,
            certificate=files.certificate,
            key=files.key,
            ca=ca or files.ca,
        )
    )
    return fleet


def bench(fleet: Path, out: Path, tunnel: str = "never") -> int:
    return main(
        [
            "bench",
            str(fleet),
            "--server",
            "box/secure",
            "--tunnel",
            tunnel,
            "--concurrency",
            "1",
            "--requests",
            "3",
            "--out",
            str(out),
            "--no-progress",
        ]
    )


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_TLS_BENCH_KEY", KEY)


def test_bench_reaches_a_tls_server_directly_trusting_the_fleet_files_ca(tmp_path, capsys):
    files = TestCA().server_files(tmp_path, ["127.0.0.1"])
    with tls_server(files) as fake:
        code = bench(write_fleet(tmp_path, files, fake.port), tmp_path / "out")
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert code == 0, data
    assert data["target"]["url"].startswith("https://127.0.0.1:")
    assert data["steps"][0]["ok"] == 3 and not data["steps"][0]["errors"]
    assert data["steps"][0]["server"], "the /metrics reads over https"
    printed = capsys.readouterr()
    for text in (
        printed.out,
        printed.err,
        *(p.read_text() for p in (tmp_path / "out").iterdir() if p.suffix in (".json", ".csv")),
    ):
        assert KEY not in text


class ForwardToFake:
    """Stands in for the SSH local forward: "opens" on the fake server's port, remembers where
    the forward would lead on the host."""

    opened: list[tuple[str, int]] = []
    port = 0

    def __init__(self, data: dict, remote_port: int, remote_host: str = "127.0.0.1"):
        self.remote = (remote_host, remote_port)

    def open(self) -> int:
        ForwardToFake.opened.append(self.remote)
        return ForwardToFake.port

    def close(self) -> None:
        pass


def test_bench_through_the_tunnel_checks_the_certificate_for_the_hosts_address(
        tmp_path, monkeypatch):  # fmt: skip
    """A server binding every interface of 10.44.0.11: its certificate names 10.44.0.11, the
    forward leads to its loopback, the client connects to 127.0.0.1:LOCAL."""
    files = TestCA().server_files(tmp_path, ["10.44.0.11"])
    with tls_server(files) as fake:
        ForwardToFake.port, ForwardToFake.opened = fake.port, []
        monkeypatch.setattr(command, "Tunnel", ForwardToFake)
        fleet = write_fleet(tmp_path, files, 8443, address="10.44.0.11", bind="0.0.0.0")
        code = bench(fleet, tmp_path / "out", tunnel="always")
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert code == 0, data
    assert ForwardToFake.opened == [("127.0.0.1", 8443)]
    assert data["target"]["url"] == f"https://127.0.0.1:{fake.port}"
    assert data["steps"][0]["ok"] == 3
    assert any("for the name 10.44.0.11" in note for note in data["notes"])


def test_a_certificate_of_another_ca_is_refused_with_a_clear_error(tmp_path, capsys):
    """The fleet file's files are sound (fleet check passes), the server serves another CA's
    certificate (e.g. one left from before)."""
    files = TestCA().server_files(tmp_path, ["127.0.0.1"])
    other = TestCA("another CA").server_files(tmp_path, ["127.0.0.1"], prefix="other")
    with tls_server(other) as fake:
        code = bench(write_fleet(tmp_path, files, fake.port), tmp_path / "out")
    err = capsys.readouterr().err
    assert code == 1
    assert "certificate was refused" in " ".join(err.split()), err
    assert KEY not in err


def test_resolve_gives_the_target_the_ca_and_the_name(tmp_path):
    files = TestCA().server_files(tmp_path, ["10.44.0.12"])
    fleet = write_fleet(tmp_path, files, 18000, address="10.44.0.11", bind="10.44.0.12")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(), str(fleet))
    parsed = parser.parse_args(["bench", str(fleet), "--server", "box/secure", "--tunnel", "never"])
    with resolve_target(parsed) as resolved:
        target = resolved.target("completions")
    assert (target.base_url, target.tls_name) == ("https://10.44.0.12:18000", "10.44.0.12")
    assert target.ca_pem == files.ca.read_text()
    assert "BEGIN" not in repr(resolved) + repr(target) and KEY not in repr(target)


def test_doctor_measures_a_tls_server_through_the_tunnel(tmp_path, monkeypatch):
    files = TestCA().server_files(tmp_path, ["127.0.0.1"])
    baseline = {
        "api": "completions",
        "fixed_output": True,
        "input_len": 16,
        "output_len": 4,
        "seed": 0,
        "prompts": "synthetic",
    }
    with tls_server(files) as fake:
        ForwardToFake.port, ForwardToFake.opened = fake.port, []
        monkeypatch.setattr(command, "Tunnel", ForwardToFake)
        fleet = write_fleet(tmp_path, files, fake.port)
        found = benchcheck.measure(str(fleet), "box/secure", baseline, requests=2, rounds_at_most=1)
    assert "error" not in found, found
    assert found["fresh"]["ok"] == 2
    assert found["metrics_gauges"] is not None
