"""Certificates made for a test: a CA, a server certificate for 127.0.0.1 and localhost, a client
certificate, and a second CA with a client certificate of its own (one the servers must refuse).

EC P-256 keys: a few milliseconds each, where RSA would take a good part of a second."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=1)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID_FOR))


@dataclass(frozen=True)
class Authority:
    name: x509.Name
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, common_name: str) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name(common_name)
        cert = (_builder(common_name, name, key.public_key())
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        return cls(name, key, cert)

    def issue(self, common_name: str, server: bool, client: bool,
              ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A leaf certificate; a server one names 127.0.0.1 and localhost."""
        key = ec.generate_private_key(ec.SECP256R1())
        usages = [oid for oid, wanted in ((ExtendedKeyUsageOID.SERVER_AUTH, server),
                                          (ExtendedKeyUsageOID.CLIENT_AUTH, client)) if wanted]
        builder = (_builder(common_name, self.name, key.public_key())
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(self.key, hashes.SHA256()), key


def _write(directory: Path, name: str, cert: x509.Certificate, key=None) -> tuple[Path, Path | None]:
    cert_path = directory / f"{name}.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is None:
        return cert_path, None
    key_path = directory / f"{name}-key.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


@dataclass(frozen=True)
class PKI:
    """Paths of the PEM files."""

    ca: Path
    server_cert: Path       # 127.0.0.1 and localhost; also good as a client certificate (`specrouter up`)
    server_key: Path
    client_cert: Path       # the router's client certificate, signed by `ca`
    client_key: Path
    other_ca: Path          # a CA the servers do not trust
    other_client_cert: Path
    other_client_key: Path


def make_pki(directory: Path) -> PKI:
    ca, other = Authority.create("specrouter test CA"), Authority.create("another CA")
    ca_path, _ = _write(directory, "ca", ca.cert)
    other_path, _ = _write(directory, "other-ca", other.cert)
    server = _write(directory, "server", *ca.issue("specrouter server", server=True, client=True))
    client = _write(directory, "client", *ca.issue("specrouter router", server=False, client=True))
    stranger = _write(directory, "other-client", *other.issue("stranger", server=False, client=True))
    return PKI(ca_path, *server, *client, other_path, *stranger)
