"""The load generator against a real TLS server (the fake OpenAI server serving https with a
certificate of a test CA for 10.0.0.5, reached at 127.0.0.1 as through an SSH port forward):
requests, /tokenize and /metrics succeed trusting that CA for that name, and fail with a
``certificate`` error without the CA, with another CA, or for another name.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from loadgen import trust
from loadgen.runner import Options, Runner, Step, Target, served_model, server_tokenizer
from loadgen.timing import Prompt
from tests.support.fakeserver import FakeServer
from tests.support.testca import TestCA, cert_pem

NAME = "10.0.0.5"  # the server's address on its certificate; the client connects to loopback
KEY = "bench-tls-key-5c1e"


@pytest.fixture(scope="module")
def ca() -> TestCA:
    return TestCA()


@pytest.fixture(scope="module")
def server(ca: TestCA, tmp_path_factory: pytest.TempPathFactory):
    files = ca.server_files(Path(tmp_path_factory.mktemp("tls")), [NAME])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.certificate, files.key)
    with FakeServer(tls=context, api_key=KEY) as running:
        yield running


def target(server: FakeServer, ca_pem: str, name: str = NAME) -> Target:
    return Target(server.url, "tiny", api_key=KEY, name="box/secure", ca_pem=ca_pem, tls_name=name)


def run(target: Target, requests: int = 4):
    runner = Runner(
        target,
        [Prompt(text="hello world", output_tokens=4)],
        Options(timeout=10, sample_interval=0.1),
    )
    [step] = asyncio.run(runner.run([Step(concurrency=2, requests=requests)]))
    return step, runner


def test_requests_and_metrics_succeed_trusting_the_ca_for_the_certificates_name(server, ca):
    assert server.url.startswith("https://127.0.0.1:")
    step, runner = run(target(server, cert_pem(ca.cert)))
    assert [r.error for r in step.results] == [None] * 4
    assert all(r.ok and r.output_tokens == 4 for r in step.results)
    assert step.server is not None, runner.notes  # /metrics read over https, before and after
    assert not [n for n in runner.notes if "/metrics" in n]


def test_models_and_tokenize_succeed_over_https(server, ca):
    good = target(server, cert_pem(ca.cert))
    assert served_model(good.base_url, good.headers(), good.ssl_context())
    assert server_tokenizer(good) is not None


def test_the_key_is_in_no_repr(server, ca):
    assert KEY not in repr(target(server, cert_pem(ca.cert)))


@pytest.mark.parametrize("case", ["system store", "another CA", "another name"])
def test_requests_fail_as_certificate_errors_otherwise(server, ca, case):
    bad = {
        "system store": target(server, ""),
        "another CA": target(server, cert_pem(TestCA("another CA").cert)),
        "another name": target(server, cert_pem(ca.cert), "10.0.0.6"),
    }[case]
    step, _ = run(bad, requests=2)
    assert [r.error for r in step.results] == ["certificate", "certificate"]
    assert "certificate verify failed" in step.results[0].detail
    with pytest.raises(OSError) as raised:
        server_tokenizer(bad)
    assert trust.is_certificate_error(raised.value)
    message = trust.refusal(raised.value, bad.tls_name)
    assert message.startswith("the server's certificate was refused (")
    if case == "another name":
        assert "10.0.0.6" in message and "mismatch" in message


def test_no_ca_is_the_default_context():
    assert trust.context("", NAME) is None
    assert Target("https://127.0.0.1:1", "m").ssl_context() is None
