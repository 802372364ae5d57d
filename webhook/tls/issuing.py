"""Certificates: ECDSA keys, the CA, serving and client certificates, and their files.

Keys are ECDSA P-256: the kube-apiserver (Go crypto/tls) and OpenSSL both support it everywhere,
signing is an order of magnitude cheaper than RSA-2048 on the server side of a handshake, and
keys and certificates are small (they travel in every handshake and in the webhook's caBundle).
P-256 rather than P-384 because Go has constant-time assembly for it and it is the TLS default.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard, get_args

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"

# Clock skew between the machine that issues and the nodes that verify.
_BACKDATE = dt.timedelta(minutes=5)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


# --------------------------------------------------------------------------------------------
# Certificates
# --------------------------------------------------------------------------------------------


def _is_issuer_key(key: object) -> TypeGuard[CertificateIssuerPrivateKeyTypes]:
    """A key that can sign certificates (`CertificateIssuerPrivateKeyTypes` is a Union: isinstance
    takes its members)."""
    return isinstance(key, get_args(CertificateIssuerPrivateKeyTypes))


@dataclass(frozen=True)
class CertKey:
    """A certificate and its private key; PEM bytes on demand so tests need no files."""

    cert: x509.Certificate
    key: CertificateIssuerPrivateKeyTypes

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @classmethod
    def from_pem(cls, cert_pem: bytes, key_pem: bytes) -> CertKey:
        """Load a pair; ValueError when either does not parse or the key is not the cert's."""
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not _is_issuer_key(key):
            raise ValueError(f"unsupported key type {type(key).__name__}")
        if key.public_key() != cert.public_key():
            raise ValueError("the private key does not belong to the certificate")
        return cls(cert=cert, key=key)


def generate_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names a Service is reached by; the apiserver dials `<svc>.<ns>.svc`."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _issue(
    *,
    subject: x509.Name,
    public_key: Any,
    issuer: CertKey | None,
    signing_key: CertificateIssuerPrivateKeyTypes,
    days: int,
    extensions: Sequence[tuple[x509.ExtensionType, bool]],
) -> x509.Certificate:
    now = utc_now()
    not_after = now + dt.timedelta(days=days)
    if issuer is not None:
        # A certificate that outlives its CA is useless: stop at the CA's end.
        not_after = min(not_after, issuer.cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject if issuer else subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )
    if issuer is not None:
        builder = builder.add_extension(_authority_key_identifier(issuer), critical=False)
    for ext, critical in extensions:
        builder = builder.add_extension(ext, critical=critical)
    return builder.sign(signing_key, hashes.SHA256())


def _authority_key_identifier(issuer: CertKey) -> x509.AuthorityKeyIdentifier:
    """The identifier the CA itself carries: a CA made elsewhere (Helm's genCA, built with Go 1.25 or
    newer, hashes its key with truncated SHA-256) may not use the SHA-1 one cryptography derives,
    and a verifier that matches identifiers would then find no issuer."""
    try:
        ski = issuer.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _key_usage(*, digital_signature: bool = False, cert_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,  # ECDSA keys sign; they never encipher
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def make_ca(common_name: str | None = None, days: int = 3650) -> CertKey:
    """A self-signed CA (CA:TRUE, pathlen 0, keyCertSign)."""
    key = generate_key()
    # A timestamp in the name, as kubeadm does, so two generations of the CA are told apart.
    name = common_name or f"scheduling-webhook-ca@{int(utc_now().timestamp())}"
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = _issue(
        subject=subject,
        public_key=key.public_key(),
        issuer=None,
        signing_key=key,
        days=days,
        extensions=[
            (x509.BasicConstraints(ca=True, path_length=0), True),
            (_key_usage(digital_signature=True, cert_sign=True), True),
        ],
    )
    return CertKey(cert=cert, key=key)


def split_names(dns_names: Iterable[str], ips: Iterable[str | IPAddress]) -> tuple[list[str], list[IPAddress]]:
    """Deduplicate; an IP literal given as a host name becomes an IP SAN (verifiers check those)."""
    dns: list[str] = []
    addrs: list[IPAddress] = []
    for name in dns_names:
        try:
            addr = ipaddress.ip_address(name)
        except ValueError:
            if name not in dns:
                dns.append(name)
        else:
            if addr not in addrs:
                addrs.append(addr)
    for ip in ips:
        addr = ip if isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address) else ipaddress.ip_address(ip)
        if addr not in addrs:
            addrs.append(addr)
    return dns, addrs


def make_serving_cert(
    ca: CertKey,
    service: str,
    namespace: str,
    *,
    dns_names: Iterable[str] = (),
    ips: Iterable[str | IPAddress] = (),
    days: int = 365,
    key: CertificateIssuerPrivateKeyTypes | None = None,
) -> CertKey:
    """A serving certificate (EKU serverAuth) for the Service's names plus extra names and IPs.

    `key`: certify this key instead of generating a P-256 one (tests use it for other key types).
    Raises ValueError for an IP that does not parse.
    """
    dns, addrs = split_names([*service_dns_names(service, namespace), *dns_names], ips)
    key = key or generate_key()
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
    sans += [x509.IPAddress(a) for a in addrs]
    # Verifiers ignore the CN when SANs exist (Go since 1.15); it is for humans reading logs.
    return _issue_leaf(
        ca,
        f"{service}.{namespace}.svc",
        key,
        days,
        ExtendedKeyUsageOID.SERVER_AUTH,
        extra=[(x509.SubjectAlternativeName(sans), False)],
    )


def make_client_cert(ca: CertKey, common_name: str = "kube-apiserver-webhook-client", days: int = 365) -> CertKey:
    """A client certificate (EKU clientAuth), as the apiserver presents to a webhook."""
    return _issue_leaf(ca, common_name, generate_key(), days, ExtendedKeyUsageOID.CLIENT_AUTH)


def _issue_leaf(
    ca: CertKey,
    common_name: str,
    key: CertificateIssuerPrivateKeyTypes,
    days: int,
    usage: x509.ObjectIdentifier,
    extra: Sequence[tuple[x509.ExtensionType, bool]] = (),
) -> CertKey:
    """An end-entity certificate for `key`, signed by `ca`, for one extended key usage."""
    cert = _issue(
        subject=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]),
        public_key=key.public_key(),
        issuer=ca,
        signing_key=ca.key,
        days=days,
        extensions=[
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (_key_usage(digital_signature=True), True),
            (x509.ExtendedKeyUsage([usage]), False),
            *extra,
        ],
    )
    return CertKey(cert=cert, key=key)


def sans_of(cert: x509.Certificate) -> tuple[list[str], list[IPAddress]]:
    """The DNS and IP subject alternative names of a certificate."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    # IPAddress entries may hold networks too (name constraints); a server's SANs are addresses.
    ips = [ip for ip in san.get_values_for_type(x509.IPAddress) if isinstance(ip, IPAddress)]
    return san.get_values_for_type(x509.DNSName), ips


def write_file_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write via a temporary file and rename, so a watcher never reads half a file; `mode` exact."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # os.open's mode is filtered by the umask
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_serving_files(out_dir: Path, ca: CertKey, serving: CertKey, *, write_ca: bool) -> list[Path]:
    """Write tls.crt and tls.key, and with `write_ca` ca.crt and ca.key; keys 0600. Returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if write_ca:
        write_file_atomic(out_dir / CA_KEY_FILE, ca.key_pem, 0o600)
        write_file_atomic(out_dir / CA_CERT_FILE, ca.cert_pem, 0o644)
        written += [out_dir / CA_KEY_FILE, out_dir / CA_CERT_FILE]
    # Key before certificate: a watcher that looks in between sees a mismatch and keeps the old pair.
    write_file_atomic(out_dir / KEY_FILE, serving.key_pem, 0o600)
    write_file_atomic(out_dir / CERT_FILE, serving.cert_pem, 0o644)
    written += [out_dir / KEY_FILE, out_dir / CERT_FILE]
    return written


# `certs --keep-valid` re-issues a serving certificate this close to its expiry.
RENEW_BEFORE = dt.timedelta(days=30)


def reissue_reason(out: Path, ca: CertKey, wanted: tuple[list[str], list[IPAddress]]) -> str | None:
    """Why the serving pair in `out` cannot be kept, or None when it is signed by `ca`, matches its
    key, names every wanted DNS name and IP, and is not within RENEW_BEFORE of its expiry."""
    try:
        pair = CertKey.from_pem((out / CERT_FILE).read_bytes(), (out / KEY_FILE).read_bytes())
    except OSError as e:
        return f"cannot read it ({e.strerror})"
    except ValueError as e:
        return f"it does not load: {e}"
    cert = pair.cert
    try:
        cert.verify_directly_issued_by(ca.cert)
    except (ValueError, TypeError, InvalidSignature):
        return f"it was not issued by the CA in {out / CA_CERT_FILE}"
    dns, addrs = sans_of(cert)
    lacking = [n for n in wanted[0] if n not in dns] + [str(a) for a in wanted[1] if a not in addrs]
    if lacking:
        return f"it lacks {', '.join(lacking)}"
    if cert.not_valid_after_utc <= utc_now() + RENEW_BEFORE:
        return f"it expires {cert.not_valid_after_utc:%Y-%m-%d}"
    return None
