"""HTTPS to a fleet server as its plan says to trust it: one CA file, one name (standard library).

A probe on a server's host connects where the server listens (loopback for a bind to every
interface) but checks the name clients use (``--tls-name``, the plan's
:class:`fleet.planner.reach.Reach`), against the certificates of ``--cafile`` only (the fleet
file's ``tls.ca``, or the deployed certificate itself: a certificate of the file is a trust
anchor even when it is not a CA's, OpenSSL's partial chain). The system's CA store is not used.
Python 3.13's strict X.509 checks are off, so a probe trusts what the clients of vLLM's
OpenSSL trust.

Example:
    with tlsprobe.urlopen("https://127.0.0.1:8443/health", 5, "/etc/vllm-fleet/chat.tls-ca.pem",
                          "gpu-1.example") as reply:
        reply.status
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import socket
import ssl
import urllib.parse
import urllib.request
from typing import Any

#: OpenSSL's X509_V_FLAG_PARTIAL_CHAIN (``ssl.VERIFY_X509_PARTIAL_CHAIN`` since Python 3.10).
_PARTIAL_CHAIN = getattr(ssl, "VERIFY_X509_PARTIAL_CHAIN", 0x80000)
_STRICT = getattr(ssl, "VERIFY_X509_STRICT", 0x20)


def context(cafile: str) -> ssl.SSLContext:
    """A client context that trusts ``cafile``'s certificates alone and checks the name."""
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.verify_flags = (ctx.verify_flags | _PARTIAL_CHAIN) & ~_STRICT
    return ctx


class _Named(urllib.request.HTTPSHandler):
    """urllib's HTTPS, checking ``name`` whatever address the URL connects to."""

    def __init__(self, ctx: ssl.SSLContext, name: str):
        super().__init__(context=ctx)
        self._tls = ctx
        self._name = name

    def https_open(self, req: urllib.request.Request) -> Any:
        name = self._name

        class Connection(http.client.HTTPSConnection):
            def connect(self) -> None:
                http.client.HTTPConnection.connect(self)
                self.sock = self._context.wrap_socket(  # type: ignore[attr-defined]
                    self.sock, server_hostname=name or self.host)

        return self.do_open(Connection, req, context=self._tls)


def urlopen(request: str | urllib.request.Request, timeout: float, cafile: str | None = None,
            tls_name: str | None = None) -> Any:
    """``urllib.request.urlopen``; with ``cafile``, HTTPS that trusts it alone and checks
    ``tls_name`` (default: the URL's host), with no proxy (the server is on this host)."""
    if not cafile:
        return urllib.request.urlopen(request, timeout=timeout)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         _Named(context(cafile), tls_name or ""))
    return opener.open(request, timeout=timeout)


def served_fingerprint(url: str, tls_name: str | None, timeout: float = 5) -> str:
    """The SHA-256 (lowercase hex, of its DER) of the certificate a server at base ``url``
    serves for ``tls_name`` — whatever it is, trusted or not: ``fleet verify`` compares it with
    the deployed one."""
    parts = urllib.parse.urlsplit(url)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection((parts.hostname, parts.port or 443), timeout=timeout)
    with raw, ctx.wrap_socket(raw, server_hostname=tls_name or parts.hostname) as tls:
        der = tls.getpeercert(binary_form=True)
    return hashlib.sha256(der or b"").hexdigest()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The probe programs' TLS options (``--cafile``, ``--tls-name``)."""
    parser.add_argument("--cafile", help="https: the only certificates trusted (the plan's)")
    parser.add_argument("--tls-name", help="https: the name the certificate must cover")
