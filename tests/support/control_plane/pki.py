"""The test control plane's PKI: one CA for the apiserver's serving certificate and every client
certificate (admin in `system:masters`, the controllers, the scheduler, kwok), and the
ServiceAccount signing key, as kubeadm lays them out (written once per control plane)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.tls.issuing import CertKey, generate_key, make_ca, write_file_atomic


@dataclass(frozen=True)
class ClientCert:
    cert_file: Path
    key_file: Path


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: CertKey
    ca_file: Path
    serving_cert_file: Path
    serving_key_file: Path
    sa_key_file: Path  # private: the apiserver signs tokens, the controller manager too
    sa_pub_file: Path  # public: the apiserver verifies tokens


def _leaf(
    ca: CertKey, subject: x509.Name, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName] | None = None
) -> CertKey:
    key = generate_key()
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)  # type: ignore[arg-type]
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return CertKey(cert=builder.sign(ca.key, hashes.SHA256()), key=key)


def _write_pair(dir: Path, name: str, pair: CertKey) -> tuple[Path, Path]:
    cert_file, key_file = dir / f"{name}.crt", dir / f"{name}.key"
    write_file_atomic(cert_file, pair.cert_pem, 0o644)
    write_file_atomic(key_file, pair.key_pem, 0o600)
    return cert_file, key_file


def make_pki(dir: Path, *, ips: list[str], dns_names: list[str]) -> Pki:
    dir.mkdir(parents=True, exist_ok=True)
    ca = make_ca("scheduling-webhook test control plane", days=7)
    ca_file = dir / "ca.crt"
    write_file_atomic(ca_file, ca.cert_pem, 0o644)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    serving = _leaf(ca, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
                    ExtendedKeyUsageOID.SERVER_AUTH, sans)  # fmt: skip
    serving_cert, serving_key = _write_pair(dir, "apiserver", serving)
    sa_key = ec.generate_private_key(ec.SECP256R1())
    sa_key_file, sa_pub_file = dir / "sa.key", dir / "sa.pub"
    write_file_atomic(
        sa_key_file,
        sa_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()),
        0o600,
    )  # fmt: skip
    write_file_atomic(
        sa_pub_file,
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        0o644,
    )
    return Pki(dir, ca, ca_file, serving_cert, serving_key, sa_key_file, sa_pub_file)


def client_cert(pki: Pki, name: str, user: str, groups: tuple[str, ...] = ()) -> ClientCert:
    """A client certificate the apiserver reads as `user` in `groups` (CN and O, as x509 auth does)."""
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
    pair = _leaf(pki.ca, x509.Name(attrs), ExtendedKeyUsageOID.CLIENT_AUTH)
    return ClientCert(*_write_pair(pki.dir, name, pair))


# The name on the client certificate kube-apiserver presents to admission webhooks.
WEBHOOK_CLIENT_NAME = "kube-apiserver-webhook-client"


@dataclass(frozen=True)
class WebhookClient:
    """What kube-apiserver presents to an admission webhook that asks for a client certificate,
    from a CA of its own: a webhook that trusts this CA admits the apiserver and no other client of
    the control plane (the cluster CA also signs the admin's, the controllers' and kwok's)."""

    ca: CertKey
    ca_file: Path
    cert: ClientCert
    name: str = WEBHOOK_CLIENT_NAME

    @property
    def ca_pem(self) -> bytes:
        return self.ca.cert_pem


def webhook_client(dir: Path) -> WebhookClient:
    ca = make_ca("scheduling-webhook test apiserver webhook clients", days=7)
    ca_file = dir / "webhook-client-ca.crt"
    write_file_atomic(ca_file, ca.cert_pem, 0o644)
    pair = _leaf(ca, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, WEBHOOK_CLIENT_NAME)]),
                 ExtendedKeyUsageOID.CLIENT_AUTH)  # fmt: skip
    return WebhookClient(ca, ca_file, ClientCert(*_write_pair(dir, "webhook-client", pair)))


def serving_cert(pki: Pki, name: str, *, ips: list[str], dns_names: tuple[str, ...] = ()) -> ClientCert:
    """A serving certificate from the control plane's CA, so that a client trusting the cluster CA
    (every kubeconfig of the control plane) also trusts a server beside the apiserver."""
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    return ClientCert(*_write_pair(pki.dir, name, _leaf(pki.ca, subject, ExtendedKeyUsageOID.SERVER_AUTH, sans)))


# The name on the client certificate kube-apiserver presents to aggregated API servers, and the one
# name its --requestheader-allowed-names accepts (kubeadm's choice too).
FRONT_PROXY_CLIENT_NAME = "front-proxy-client"


@dataclass(frozen=True)
class FrontProxy:
    """What the aggregation layer presents when it proxies a request to an APIService's server
    (--proxy-client-cert-file), from a CA of its own (--requestheader-client-ca-file): a server
    that trusts this CA for the X-Remote-User headers trusts the apiserver alone, never a user's
    client certificate, which the cluster CA signs."""

    ca_file: Path
    cert: ClientCert
    name: str = FRONT_PROXY_CLIENT_NAME


def front_proxy(dir: Path) -> FrontProxy:
    ca = make_ca("scheduling-webhook test front proxy", days=7)
    ca_file = dir / "front-proxy-ca.crt"
    write_file_atomic(ca_file, ca.cert_pem, 0o644)
    pair = _leaf(ca, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, FRONT_PROXY_CLIENT_NAME)]),
                 ExtendedKeyUsageOID.CLIENT_AUTH)  # fmt: skip
    return FrontProxy(ca_file, ClientCert(*_write_pair(dir, "front-proxy-client", pair)))
