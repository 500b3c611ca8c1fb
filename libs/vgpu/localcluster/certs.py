"""A throwaway certificate authority for the local cluster: a CA and a server certificate for
127.0.0.1/localhost, written as PEM files, so the webhook and the extender speak HTTPS as in a
real cluster (kube-apiserver only calls webhooks over HTTPS)."""

from __future__ import annotations

import datetime
import ipaddress
import pathlib
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class ServingCerts:
    """PEM file paths: the CA (for clients and caBundle) and the server's cert and key."""

    ca_file: pathlib.Path
    cert_file: pathlib.Path
    key_file: pathlib.Path

    def ca_pem(self) -> bytes:
        return self.ca_file.read_bytes()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_serving_certs(directory: pathlib.Path, *, now: datetime.datetime, days: int = 7) -> ServingCerts:
    """Write ca.pem, tls.crt and tls.key into ``directory`` (created) and return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("kube-vgpu local CA"))
        .issuer_name(_name("kube-vgpu local CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("kube-vgpu local server"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = ServingCerts(directory / "ca.pem", directory / "tls.crt", directory / "tls.key")
    paths.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths.key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    paths.key_file.chmod(0o600)
    return paths
