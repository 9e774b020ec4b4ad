"""A test certificate authority made with ``cryptography``: a CA, server certificates signed by
it (names, validity, key kind as asked), written as PEM files under a test's ``tmp_path``.

Example:
    ca = TestCA()
    files = ca.server_files(tmp_path, names=["127.0.0.1", "gpu-1.example"])
    files.certificate, files.key, files.ca  # Paths, 0600
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

NOW = datetime.datetime.now(datetime.UTC)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(out)


def key_pem(key: object, password: bytes | None = None) -> str:
    """A private key as PEM (PKCS#8; encrypted with ``password``)."""
    encryption = (serialization.BestAvailableEncryption(password) if password
                  else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM,  # type: ignore[attr-defined]
                             serialization.PrivateFormat.PKCS8, encryption).decode()


def cert_pem(certificate: x509.Certificate) -> str:
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


@dataclass
class ServerFiles:
    """A server's PEM files: its certificate (then the chain), key, and the CA that signed it."""

    certificate: Path
    key: Path
    ca: Path
    cert: x509.Certificate


class TestCA:
    """A CA (EC P-256) that signs server certificates."""

    __test__ = False  # not a pytest class

    def __init__(self, common: str = "vllm-fleet test CA"):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cert = (
            x509.CertificateBuilder().subject_name(_name(common)).issuer_name(_name(common))
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(NOW - datetime.timedelta(days=1))
            .not_valid_after(NOW + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()),
                           critical=False)
            .sign(self.key, hashes.SHA256())
        )

    def issue(self, names: list[str], key: object | None = None, days: float = 365,
              start_days: float = -1) -> tuple[x509.Certificate, object]:
        """A server certificate for ``names`` (subjectAltName), valid from ``start_days`` to
        ``days`` from now, and its key (new EC P-256 unless given)."""
        key = key or ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder().subject_name(_name(names[0] if names else "server"))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())  # type: ignore[attr-defined]
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW + datetime.timedelta(days=start_days))
            .not_valid_after(NOW + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self.key.public_key()), critical=False)
        )
        if names:
            builder = builder.add_extension(_san(names), critical=False)
        return builder.sign(self.key, hashes.SHA256()), key

    def server_files(self, folder: Path, names: list[str], prefix: str = "server",
                     **issue: object) -> ServerFiles:
        """Issue a certificate for ``names`` and write it, its key and this CA as 0600 PEM files."""
        cert, key = self.issue(names, **issue)  # type: ignore[arg-type]
        paths = []
        for suffix, text in (("crt", cert_pem(cert)), ("key", key_pem(key)),
                             ("ca.crt", cert_pem(self.cert))):
            path = folder / f"{prefix}.{suffix}"
            path.write_text(text)
            path.chmod(0o600)
            paths.append(path)
        return ServerFiles(*paths, cert=cert)


def other_keys() -> dict[str, object]:
    """A key of each kind vLLM's OpenSSL takes (RSA, EC, Ed25519)."""
    return {"rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "ec": ec.generate_private_key(ec.SECP384R1()),
            "ed25519": ed25519.Ed25519PrivateKey.generate()}
