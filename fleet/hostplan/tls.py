"""A server's TLS: its certificate and key by reference, examined at ``fleet check``, delivered
to its unit alone, trusted by the probes.

The fleet file names the files (``tls: {certificate: {file: PATH}, key: {file: PATH}}``, or
``{env: NAME}``), read on the control machine like any secret (:mod:`fleet.hostplan.secrets`).
The deploy writes each to ``/etc/vllm-fleet/SERVER.tls-PART.pem`` (root, 0600, in the 0700
folder beside the environment file); the unit names them with ``LoadCredential=``, so systemd
hands them to the server's processes alone, readable by its user only, on a private ramfs
(``/run/credentials/vllm-SERVER.service/``), and vLLM gets those paths (``--ssl-certfile``,
``--ssl-keyfile``, ``--ssl-ca-certs``, ``--ssl-cert-reqs``). No unit, command line or message
holds a key's bytes; the certificate's SHA-256 fingerprint is in the plan (``fleet verify``
compares the served one with it).

Checked at ``fleet check`` (:func:`tls_findings`), each a located error: every file is PEM of
its kind, the key is not encrypted (vLLM has no flag for its password: OpenSSL would ask on a
terminal) and matches the certificate, the certificate is valid now, its names (subjectAltName,
as Python's ``ssl`` matches them: no common-name fallback) cover the address clients use, and,
with ``tls.ca``, it chains to one of those CA certificates through the intermediates written
after it. A certificate that expires within :data:`SOON` is a warning.

Example:
    >>> from fleet.spec.models import Server
    >>> server = Server(model="m", port=8443, tls={"certificate": {"file": "/c.pem"},
    ...                                            "key": {"file": "/k.pem"}})
    >>> unit_words("chat", server)
    ['--ssl-certfile', '/run/credentials/vllm-chat.service/tls-certificate', '--ssl-keyfile', '/run/credentials/vllm-chat.service/tls-key']
    >>> credentials("chat", server)
    ['tls-certificate:/etc/vllm-fleet/chat.tls-certificate.pem', 'tls-key:/etc/vllm-fleet/chat.tls-key.pem']
"""  # noqa: E501

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import re
from collections.abc import Callable, Iterator

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtensionOID

from fleet.catalog.paths import credential_path, tls_path
from fleet.hostplan.secrets import read_secret
from fleet.hostplan.types import TlsFile, TlsPlan
from fleet.planner.reach import client_name
from fleet.read.problems import Finding, Loc
from fleet.spec.models import CERT_REQS, Fleet, SecretRef, Server, ServerTls

#: A certificate that expires sooner than this is a warning at ``fleet check``.
SOON = datetime.timedelta(days=14)
_CERT = re.compile(r"-----BEGIN CERTIFICATE-----\s.*?-----END CERTIFICATE-----", re.DOTALL)
_KEY = re.compile(r"-----BEGIN ((?:[A-Z0-9]+ )?PRIVATE KEY)-----\s.*?-----END \1-----",
                  re.DOTALL)
#: What the unit's credentials and vLLM's flags are made of: (fleet key, credential part, flag).
_HANDED = (("certificate", "certificate", "ssl-certfile"), ("key", "key", "ssl-keyfile"),
           ("client_ca", "client-ca", "ssl-ca-certs"))


def _parts(tls: ServerTls) -> Iterator[tuple[str, str, str]]:
    for key, part, flag in _HANDED:
        if getattr(tls, key) is not None:
            yield key, part, flag


def unit_words(name: str, server: Server) -> list[str]:
    """vLLM's TLS flags of server ``name``: the credentials' paths inside its unit, and the
    client-certificate mode of mutual TLS ([] without ``tls``)."""
    tls = server.tls
    if tls is None:
        return []
    words = [w for _, part, flag in _parts(tls) for w in (f"--{flag}", credential_path(name, part))]
    if tls.client_mode is not None:
        words += ["--ssl-cert-reqs", str(CERT_REQS[tls.client_mode])]
    return words


def credentials(name: str, server: Server) -> list[str]:
    """The ``LoadCredential=`` values of server ``name``'s unit (``ID:PATH``)."""
    if server.tls is None:
        return []
    return [f"tls-{part}:{tls_path(name, part)}" for _, part, _ in _parts(server.tls)]


def fingerprint(pem: str) -> str:
    """The SHA-256 of the first certificate in ``pem`` (DER), lowercase hex; "" without one.

    Example:
        >>> fingerprint("no certificate")
        ''
    """
    match = _CERT.search(pem)
    if match is None:
        return ""
    body = "".join(match.group(0).splitlines()[1:-1])
    try:
        return hashlib.sha256(base64.b64decode(body, validate=False)).hexdigest()
    except ValueError:
        return ""


def tls_plan(name: str, server: Server, secrets: Callable[[SecretRef], str]) -> TlsPlan | None:
    """What the deploy writes for server ``name``'s TLS (None without ``tls``): each file with
    its text (never in a repr), the probes' CA file, the certificate's fingerprint."""
    tls = server.tls
    if tls is None:
        return None
    certificate = secrets(tls.certificate)
    files = [TlsFile(part, tls_path(name, part), secrets(getattr(tls, key)))
             for key, part, _ in _parts(tls)]
    files.append(TlsFile("ca", tls_path(name, "ca"), trusted_text(tls, secrets)))
    return TlsPlan(files=tuple(files), fingerprint=fingerprint(certificate))


def trusted_text(tls: ServerTls, secrets: Callable[[SecretRef], str]) -> str:
    """The PEM its clients trust for a server's ``tls`` (the probes on its host, Prometheus,
    ``fleet bench``): ``tls.ca``, else the certificate itself (pinned)."""
    return secrets(tls.ca if tls.ca is not None else tls.certificate)


def _certificates(text: str) -> list[x509.Certificate]:
    """Every certificate of a PEM text, in order ([] if none); ValueError on a broken one."""
    return [x509.load_pem_x509_certificate(block.group(0).encode())
            for block in _CERT.finditer(text)]


def _names(certificate: x509.Certificate) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) of a certificate's subjectAltName."""
    try:
        san = certificate.extensions.get_extension_for_oid(
            ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    except x509.ExtensionNotFound:
        return [], []
    return (list(san.get_values_for_type(x509.DNSName)),
            [str(ip) for ip in san.get_values_for_type(x509.IPAddress)])


def _dns_match(pattern: str, name: str) -> bool:
    """A DNS name of a certificate against ``name``, as OpenSSL matches them (a ``*`` stands for
    one whole leftmost label)."""
    pattern, name = pattern.lower().rstrip("."), name.lower().rstrip(".")
    if pattern.startswith("*."):
        head, _, rest = name.partition(".")
        return bool(head) and rest == pattern[2:]
    return pattern == name


def covers(certificate: x509.Certificate, name: str) -> bool:
    """Whether a certificate's names cover ``name`` (an address or a host name)."""
    dns, ips = _names(certificate)
    try:
        address = ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return any(_dns_match(pattern, name) for pattern in dns)
    return any(ipaddress.ip_address(ip) == address for ip in ips)


def _chains(chain: list[x509.Certificate], anchors: list[x509.Certificate]) -> bool:
    """Whether ``chain[0]`` is signed, through ``chain[1:]``, by one of ``anchors``."""
    current, pool = chain[0], chain[1:]
    for _ in range(len(pool) + 1):
        if any(_signed_by(current, anchor) for anchor in anchors):
            return True
        current = next((c for c in pool if _signed_by(current, c)), None)
        if current is None:
            return False
        pool = [c for c in pool if c is not current]
    return False


def _signed_by(certificate: x509.Certificate, issuer: x509.Certificate) -> bool:
    if certificate == issuer:  # the certificate itself given as the CA
        return True
    try:
        certificate.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _spki(public_key: object) -> bytes:
    return public_key.public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def examine(texts: dict[str, str], name: str,
            now: datetime.datetime | None = None) -> tuple[list[tuple[str, str, str]],
                                                           list[tuple[str, str, str]]]:
    """(errors, warnings) about one server's TLS files, each ``(key, message, fix)``; ``texts``
    maps the ``tls`` keys read (``certificate``, ``key``, ``ca``, ``client_ca``) to their PEM
    text, ``name`` is the address clients use. No message holds a file's content."""
    now = now or datetime.datetime.now(datetime.UTC)
    errors: list[tuple[str, str, str]] = []
    warnings: list[tuple[str, str, str]] = []
    parsed: dict[str, list[x509.Certificate]] = {}
    for key in ("certificate", "ca", "client_ca"):
        if key not in texts:
            continue
        try:
            parsed[key] = _certificates(texts[key])
        except ValueError:
            errors.append((key, "a CERTIFICATE block of it is not a readable X.509 certificate",
                           "give the PEM certificate(s) as issued (openssl x509 -in FILE -text "
                           "shows each)"))
            continue
        if not parsed[key]:
            errors.append((key, "it holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                           "give the PEM certificate file"
                           + (", the server's certificate first, then its intermediates"
                              if key == "certificate" else "")))
    chain = parsed.get("certificate") or []
    if "key" in texts:
        match = _KEY.search(texts["key"])
        if match is None:
            errors.append(("key", "it holds no PEM private key (-----BEGIN PRIVATE KEY-----)",
                           "give the certificate's private key in PEM"))
        elif match.group(1) == "OPENSSH PRIVATE KEY":
            errors.append(("key", "it is an OpenSSH key, which OpenSSL (vLLM's TLS) does not "
                           "read", "give the certificate's private key in PEM (openssl pkey)"))
        elif match.group(1) == "ENCRYPTED PRIVATE KEY" or "ENCRYPTED" in match.group(0):
            errors.append(("key", "the private key is encrypted: vLLM has no flag for its "
                           "password (OpenSSL would ask for it on a terminal)",
                           "decrypt it (openssl pkey -in KEY -out PLAIN) and keep PLAIN 0600"))
        else:
            try:
                key = serialization.load_pem_private_key(match.group(0).encode(), password=None)
            except (ValueError, TypeError, NotImplementedError):
                errors.append(("key", "the private key cannot be read (damaged or of an "
                               "unsupported kind)", "give the certificate's private key in PEM"))
            else:
                if chain and _spki(key.public_key()) != _spki(chain[0].public_key()):
                    errors.append(("key", "the key does not match the certificate (another "
                                   "key pair)", "give the key the certificate was issued for, "
                                   "or the certificate issued for this key"))
    if chain:
        leaf = chain[0]
        if leaf.not_valid_after_utc <= now:
            errors.append(("certificate", f"the certificate expired on "
                           f"{leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC",
                           "renew it and give the new certificate and key"))
        elif leaf.not_valid_before_utc > now:
            errors.append(("certificate", f"the certificate is not valid before "
                           f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC (every client "
                           "refuses it until then)", "give a certificate valid now"))
        elif leaf.not_valid_after_utc - now < SOON:
            warnings.append(("certificate", f"the certificate expires on "
                             f"{leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC",
                             "renew it; a new certificate is a configuration change that rolls"))
        if not covers(leaf, name):
            dns, ips = _names(leaf)
            held = ", ".join([*dns, *ips]) or "no subjectAltName"
            kind = "IP" if _is_ip(name) else "DNS"
            errors.append(("certificate", f"the certificate's names ({held}) do not cover "
                           f"{name}, the address clients use", f"issue it with subjectAltName "
                           f"{kind}:{name}, or bind the server to an address it covers (host:)"))
        anchors = parsed.get("ca")
        if anchors and not _chains(chain, anchors):
            errors.append(("certificate", "the certificate does not chain to tls.ca (no "
                           "certificate of it signed this one, through the intermediates "
                           "written after it)", "give the CA that issued it as tls.ca, or add "
                           "the missing intermediates after the certificate"))
    return errors, warnings


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return False
    return True


def tls_findings(fleet: Fleet, now: datetime.datetime | None = None) -> tuple[list[Finding],
                                                                               list[Finding]]:
    """(errors, warnings) about every server's TLS files, read here as the deploy will: each at
    the reference of the file it is about. A file that cannot be read is reported by
    :func:`fleet.hostplan.secrets.secret_file_findings`, not again here.

    Example:
        >>> from fleet.load import load_fleet
        >>> tls_findings(load_fleet("inventory/sandbox.yaml"))
        ([], [])
    """
    errors: list[Finding] = []
    warnings: list[Finding] = []
    for host_name, host in fleet.hosts.items():
        for name, server in host.servers.items():
            if server.tls is None:
                continue
            where: Loc = ("hosts", host_name, "servers", name, "tls")
            texts: dict[str, str] = {}
            for key in ("certificate", "key", "ca", "client_ca"):
                ref = getattr(server.tls, key)
                if ref is None:
                    continue
                try:
                    texts[key] = read_secret(ref)
                except ValueError:
                    continue
            found, soon = examine(texts, client_name(server, host.address), now)
            for out, items in ((errors, found), (warnings, soon)):
                for key, message, fix in items:
                    ref = getattr(server.tls, key)
                    out.append(((*where, key, "file" if ref.file else "env"),
                                f"tls.{key}: {message}", fix))
    return errors, warnings
