"""HTTPS to a server as the fleet file says to trust it: its CA (PEM text, read on the control
machine) alone, and the name its certificate covers, whatever address the client connects to
(``fleet bench`` reaches a server through an SSH port forward on ``127.0.0.1:LOCAL``, while the
certificate names the server's own address). Standard library only.

One :class:`ssl.SSLContext` carries both: it trusts the PEM's certificates only (a certificate
given as its own CA is a trust anchor, OpenSSL's partial chain, as the fleet's probes trust a
pinned certificate) and checks every connection for ``name`` — through ``wrap_socket``
(urllib: ``/v1/models``, ``/tokenize``) and ``wrap_bio`` (asyncio, so aiohttp's requests and
``/metrics`` reads) alike. Python 3.13's strict X.509 checks are off, as in
``hostside/tlsprobe.py``: a client trusts what vLLM's OpenSSL serves.

Example:
    >>> context("", "10.0.0.5") is None
    True
"""

from __future__ import annotations

import ssl
from typing import Any

#: OpenSSL's X509_V_FLAG_PARTIAL_CHAIN (``ssl.VERIFY_X509_PARTIAL_CHAIN`` since Python 3.10).
_PARTIAL_CHAIN = getattr(ssl, "VERIFY_X509_PARTIAL_CHAIN", 0x80000)
_STRICT = getattr(ssl, "VERIFY_X509_STRICT", 0x20)


class NamedContext(ssl.SSLContext):
    """A client context that checks the certificate for :attr:`name` on every connection
    (the host of the URL is only where it connects)."""

    name = ""

    def wrap_socket(self, sock: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs["server_hostname"] = self.name or kwargs.get("server_hostname")
        return super().wrap_socket(sock, *args, **kwargs)

    def wrap_bio(self, incoming: Any, outgoing: Any, *args: Any,  # type: ignore[override]
                 **kwargs: Any) -> Any:  # fmt: skip
        kwargs["server_hostname"] = self.name or kwargs.get("server_hostname")
        return super().wrap_bio(incoming, outgoing, *args, **kwargs)


def context(ca_pem: str, name: str) -> NamedContext | None:
    """A context trusting ``ca_pem``'s certificates alone, checking ``name`` (None without a
    CA: the client's default, the system's CA store for the URL's host). ValueError (an
    ``ssl.SSLError``) when the text holds no certificate it can read.
    """
    if not ca_pem:
        return None
    ctx = NamedContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cadata=ca_pem)
    ctx.verify_flags = (ctx.verify_flags | _PARTIAL_CHAIN) & ~_STRICT
    ctx.name = name
    return ctx


def is_certificate_error(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a refused certificate: untrusted, or not for
    the name checked.

    Example:
        >>> is_certificate_error(ssl.SSLCertVerificationError(1, "certificate verify failed"))
        True
        >>> is_certificate_error(ConnectionRefusedError())
        False
    """
    if isinstance(error, ssl.SSLCertVerificationError):
        return True
    reason = getattr(error, "reason", None)  # urllib's URLError
    refused = getattr(error, "certificate_error", None)  # aiohttp's certificate error
    return isinstance(reason, ssl.SSLCertVerificationError) or isinstance(
        refused, ssl.SSLCertVerificationError
    )


def refusal(error: BaseException, name: str) -> str:
    """Why a certificate was refused, in a sentence naming the name checked (``name``; "" when
    the URL's host was) and what to fix.

    Example:
        >>> refusal(ssl.SSLCertVerificationError(1, "x"), "10.0.0.5")  # doctest: +ELLIPSIS
        "the server's certificate was refused (x) for the name 10.0.0.5: ..."
    """
    cause = error
    for inner in (getattr(error, "reason", None), getattr(error, "certificate_error", None)):
        if isinstance(inner, ssl.SSLCertVerificationError):
            cause = inner
    why = getattr(cause, "verify_message", None) or getattr(cause, "strerror", None) or str(cause)
    return (
        f"the server's certificate was refused ({why}) for the name {name or 'of the URL'}: "
        "trust the CA that signed it (the fleet file's tls.ca, else its certificate) and "
        "issue it for that name"
    )
