"""TLS for the admission server: certificates, the server SSLContext, and hot reload from disk.

Keys are ECDSA P-256: the kube-apiserver (Go crypto/tls) and OpenSSL both support it everywhere,
signing is an order of magnitude cheaper than RSA-2048 on the server side of a handshake, and
keys and certificates are small (they travel in every handshake and in the webhook's caBundle).
P-256 rather than P-384 because Go has constant-time assembly for it and it is the TLS default.

Certificate rotation (CertWatcher) swaps whole SSLContexts from an SNI callback rather than calling
`load_cert_chain` on the listening context; see CertWatcher for why.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import ipaddress
import logging
import os
import ssl
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.metrics import CERT_EXPIRY, CERT_RELOADS
from webhook.tasks import cancel_and_wait

log = logging.getLogger(__name__)

CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"

# Clock skew between the machine that issues and the nodes that verify.
_BACKDATE = dt.timedelta(minutes=5)
# TLS 1.2 only (1.3 suites are OpenSSL's defaults, all AEAD): forward secrecy and AEAD, nothing else.
# Go's crypto/tls (the apiserver) offers all of these.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


# --------------------------------------------------------------------------------------------
# Certificates
# --------------------------------------------------------------------------------------------


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
        if not isinstance(key, CertificateIssuerPrivateKeyTypes):
            raise ValueError(f"unsupported key type {type(key).__name__}")
        if key.public_key() != cert.public_key():
            raise ValueError("the private key does not belong to the certificate")
        return cls(cert=cert, key=key)


def generate_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names a Service is reached by; the apiserver dials `<svc>.<ns>.svc`."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _now() -> dt.datetime:
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
    now = _now()
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
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), critical=False
        )
    for ext, critical in extensions:
        builder = builder.add_extension(ext, critical=critical)
    return builder.sign(signing_key, hashes.SHA256())


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
    name = common_name or f"scheduling-webhook-ca@{int(_now().timestamp())}"
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


def _split_names(dns_names: Iterable[str], ips: Iterable[str | IPAddress]) -> tuple[list[str], list[IPAddress]]:
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
    dns, addrs = _split_names([*service_dns_names(service, namespace), *dns_names], ips)
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
    return san.get_values_for_type(x509.DNSName), san.get_values_for_type(x509.IPAddress)


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
    if cert.not_valid_after_utc <= _now() + RENEW_BEFORE:
        return f"it expires {cert.not_valid_after_utc:%Y-%m-%d}"
    return None


def certs_command(args: Any) -> int:
    """`scheduling-webhook certs`: keep an existing CA (unless args.new_ca), always re-issue tls.crt.

    Writes ca.crt, ca.key (0600, needed to re-issue with the same CA), tls.crt, tls.key (0600).
    """
    out = Path(args.out)
    ca_crt, ca_key = out / CA_CERT_FILE, out / CA_KEY_FILE
    new_ca = bool(getattr(args, "new_ca", False))
    days = int(args.days)
    if days < 1:
        print("error: --days must be at least 1", file=sys.stderr)
        return 2
    keep_ca = ca_crt.exists() and not new_ca
    if keep_ca:
        if not ca_key.exists():
            print(f"error: {ca_crt} exists but {ca_key} does not: cannot issue with that CA", file=sys.stderr)
            return 1
        try:
            ca = CertKey.from_pem(ca_crt.read_bytes(), ca_key.read_bytes())
        except ValueError as e:
            print(f"error: cannot use the CA in {out}: {e}", file=sys.stderr)
            return 1
        if ca.cert.not_valid_after_utc <= _now() + dt.timedelta(days=1):
            print(
                f"error: the CA in {ca_crt} expires {ca.cert.not_valid_after_utc:%Y-%m-%d}: make a new one",
                file=sys.stderr,
            )
            return 1
    else:
        ca = make_ca(days=max(days, 3650))
    try:
        wanted = _split_names([*service_dns_names(args.service, args.namespace), *args.hostname], args.ip)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if keep_ca and getattr(args, "keep_valid", False):
        why_not = reissue_reason(out, ca, wanted)
        if why_not is None:
            current = x509.load_pem_x509_certificate((out / CERT_FILE).read_bytes())
            print(f"kept {out / CERT_FILE} (valid for the names asked, expires {current.not_valid_after_utc:%Y-%m-%d})")
            return 0
        print(f"re-issuing {out / CERT_FILE}: {why_not}")
    serving = make_serving_cert(ca, args.service, args.namespace, dns_names=args.hostname, ips=args.ip, days=days)
    written = write_serving_files(out, ca, serving, write_ca=not keep_ca)
    ca_name = ca.cert.subject.rfc4514_string()
    if keep_ca:
        print(f"kept CA {ca_crt} ({ca_name}, expires {ca.cert.not_valid_after_utc:%Y-%m-%d})")
    else:
        print(f"new CA {ca_crt} ({ca_name}, expires {ca.cert.not_valid_after_utc:%Y-%m-%d})")
    dns, addrs = sans_of(serving.cert)
    names = ", ".join([*dns, *(str(a) for a in addrs)])
    for path in written:
        mode = path.stat().st_mode & 0o777
        what = f"serving certificate for {names}, expires {serving.cert.not_valid_after_utc:%Y-%m-%d}"
        print(f"wrote {path} ({oct(mode)[2:]}{': ' + what if path.name == CERT_FILE else ''})")
    return 0


# --------------------------------------------------------------------------------------------
# SSL contexts
# --------------------------------------------------------------------------------------------


def _server_context(client_ca_file: str | os.PathLike[str] | None, min_version: ssl.TLSVersion) -> ssl.SSLContext:
    if min_version < ssl.TLSVersion.TLSv1_2:
        raise ValueError(f"minimum TLS version {min_version.name} is below TLS 1.2")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # No maximum: OpenSSL picks the highest both sides speak, so TLS 1.3 whenever the client can.
    ctx.minimum_version = min_version
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION
    ctx.set_alpn_protocols(["http/1.1"])  # aiohttp serves HTTP/1.1; say so rather than let h2 be guessed
    if client_ca_file is not None:
        # OpenSSL also checks the client certificate's purpose (EKU clientAuth) on the server side.
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=os.fspath(client_ca_file))
    return ctx


def make_server_ssl_context(
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    client_ca_file: str | os.PathLike[str] | None = None,
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2,
) -> ssl.SSLContext:
    """A server context: TLS 1.2 minimum (1.3 negotiated whenever possible), forward-secret AEAD
    ciphers only; with `client_ca_file`, a client certificate from that CA is required.

    Static: use CertWatcher to follow certificate files that change.
    """
    ctx = _server_context(client_ca_file, min_version)
    ctx.load_cert_chain(os.fspath(cert_file), os.fspath(key_file))
    return ctx


def make_client_ssl_context(
    *,
    cafile: str | os.PathLike[str] | None = None,
    cadata: bytes | str | None = None,
    certfile: str | os.PathLike[str] | None = None,
    keyfile: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A client context that trusts only the given CA (not the system store) and checks hostnames."""
    if cafile is None and cadata is None:
        raise ValueError("a client context needs a CA to trust (cafile or cadata)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname by default
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cafile is not None:
        ctx.load_verify_locations(cafile=os.fspath(cafile))
    if cadata is not None:
        ctx.load_verify_locations(cadata=cadata.decode() if isinstance(cadata, bytes) else cadata)
    if certfile is not None:
        ctx.load_cert_chain(os.fspath(certfile), os.fspath(keyfile) if keyfile is not None else None)
    return ctx


# --------------------------------------------------------------------------------------------
# Reload from disk
# --------------------------------------------------------------------------------------------

ReloadResult = Literal["loaded", "unchanged", "failed"]


class CertWatcher:
    """Serves the certificate that is on disk now, without a restart and without failing a request.

    Like controller-runtime's certwatcher, it polls the files (every `interval` seconds) and
    switches only to a pair that loads and matches; a broken or half-written pair keeps the old one
    and counts `webhook_certificate_reloads_total{result="failure"}` once per distinct content.
    It compares file contents (a SHA-256 of cert, key and client CA), not mtimes: a Kubernetes Secret
    volume update swaps the `..data` symlink, and copied files can keep their mtime.

    How the new certificate reaches handshakes: the server listens with `ssl_context`, a context
    that holds the protocol settings but no certificate; its `sni_callback` runs on every
    ClientHello (OpenSSL calls it with or without SNI) and points the connection at the context
    built for the current pair. This is Go's `tls.Config.GetCertificate`, which certwatcher uses.
    A switch is the assignment of one reference, so a handshake sees the old pair or the new one,
    never a mix; established connections keep theirs until they close.

    Why not `load_cert_chain` on the listening context? It does reach new handshakes (OpenSSL copies
    the context's certificates into each new connection; tests/test_tls.py shows it), but:
    it sets the certificate before the key and OpenSSL drops the old key when they differ, so
    there is a moment with the new certificate and no key; CPython releases the GIL while loading,
    so a handshake on another thread can land in it; and OpenSSL keeps one certificate per key type,
    so rotating from an RSA to an ECDSA certificate leaves the old RSA one served to clients that
    prefer RSA (also shown by a test). A fresh context per pair has none of these problems.

    Use from one event loop: reload_now() does small blocking reads (a few KB) on the loop.
    """

    def __init__(
        self,
        cert_file: str | os.PathLike[str],
        key_file: str | os.PathLike[str],
        *,
        client_ca_file: str | os.PathLike[str] | None = None,
        interval: float = 10.0,
        min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.client_ca_file = Path(client_ca_file) if client_ca_file is not None else None
        self.interval = interval
        self._min_version = min_version
        # The listening context: settings and the dispatch callback, no certificate of its own.
        self._listening = _server_context(self.client_ca_file, min_version)
        self._listening.sni_callback = self._on_client_hello
        self._current: ssl.SSLContext | None = None
        self._certificate: x509.Certificate | None = None
        self._digest: bytes | None = None  # content the current context was built from
        self._failed_digest: bytes | None = None  # content that failed, counted once
        self._pending_digest: bytes | None = None  # failed once while polling, not yet counted
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_dir(
        cls, certs_dir: str | os.PathLike[str], *, client_ca_file: str | os.PathLike[str] | None = None, **kw: Any
    ) -> CertWatcher:
        """Watch `<dir>/tls.crt` and `<dir>/tls.key` (a mounted kubernetes.io/tls Secret)."""
        d = Path(certs_dir)
        return cls(d / CERT_FILE, d / KEY_FILE, client_ca_file=client_ca_file, **kw)

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """Give this to the server (aiohttp TCPSite/SockSite, loop.create_server)."""
        return self._listening

    @property
    def ready(self) -> bool:
        """True once a valid certificate and key are loaded."""
        return self._current is not None

    @property
    def certificate(self) -> x509.Certificate | None:
        """The certificate new handshakes get."""
        return self._certificate

    def _on_client_hello(
        self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> int | None:
        current = self._current
        if current is None:
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR  # not ready: refuse rather than hang
        conn.context = current
        return None

    def _read(self) -> tuple[bytes, bytes, bytes]:
        ca = self.client_ca_file.read_bytes() if self.client_ca_file is not None else b""
        return self.cert_file.read_bytes(), self.key_file.read_bytes(), ca

    @staticmethod
    def _hash(parts: tuple[bytes, bytes, bytes]) -> bytes:
        h = hashlib.sha256()
        for part in parts:
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
        return h.digest()

    def reload_now(self) -> ReloadResult:
        """Check the files once; switch to them if they changed and are a valid pair.

        "loaded": new handshakes get the new certificate; "unchanged": same content as served;
        "failed": the files do not load (the previous certificate, if any, is still served).
        """
        return self._check(settle=False)

    def _check(self, *, settle: bool) -> ReloadResult:
        for _ in range(3):  # content that changes under us (a swap in progress) is read again
            try:
                parts = self._read()
            except OSError as e:
                # The error text stands in for content: the same missing file is counted once.
                return self._failed(f"unreadable: {e}".encode(), f"cannot read certificate files: {e}", settle)
            digest = self._hash(parts)
            if digest == self._digest:
                self._pending_digest = None
                return "unchanged"
            if digest == self._failed_digest:
                return "failed"  # already counted and logged
            try:
                ctx = _server_context(self.client_ca_file, self._min_version)
                ctx.load_cert_chain(self.cert_file, self.key_file)  # checks that the key matches
                cert = x509.load_pem_x509_certificate(parts[0])
                error = None
            except (ssl.SSLError, OSError, ValueError) as e:
                error = f"invalid certificate pair {self.cert_file}, {self.key_file}: {e}"
            # What was loaded must be what was hashed: files read again equal, or start over.
            try:
                if self._hash(self._read()) != digest:
                    continue
            except OSError:
                continue
            if error is not None:
                return self._failed(digest, error, settle)
            self._current, self._certificate, self._digest = ctx, cert, digest
            self._failed_digest = self._pending_digest = self.last_error = None
            CERT_RELOADS.labels(result="success").inc()
            CERT_EXPIRY.set(cert.not_valid_after_utc.timestamp())
            if cert.not_valid_after_utc <= _now():
                log.warning("serving certificate %s has expired (%s)", self.cert_file, cert.not_valid_after_utc)
            log.info(
                "serving certificate loaded: %s, serial %x, expires %s",
                cert.subject.rfc4514_string(),
                cert.serial_number,
                cert.not_valid_after_utc.isoformat(),
            )
            return "loaded"
        return self._failed(None, "certificate files kept changing while being read", settle)

    def _failed(self, digest: bytes | None, error: str, settle: bool) -> ReloadResult:
        self.last_error = error
        if digest is not None and digest == self._failed_digest:
            return "failed"  # counted once per distinct content
        if settle and digest is not None and digest != self._pending_digest:
            # Polling: a writer that renames tls.key and tls.crt one after the other shows a
            # mismatched pair for a moment; count it only if it is still there on the next poll.
            self._pending_digest = digest
            return "failed"
        CERT_RELOADS.labels(result="failure").inc()
        log.warning("%s; %s", error, "keeping the previous certificate" if self.ready else "no certificate yet")
        self._failed_digest, self._pending_digest = digest, None
        return "failed"

    async def start(self) -> None:
        """Load the files now and poll them from then on. Does not raise when they are invalid:
        `ready` stays false (report it on /readyz) and polling retries."""
        if self._task is not None and not self._task.done():
            return
        self.reload_now()
        self._task = asyncio.create_task(self._poll(), name="cert-watcher")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self._check(settle=True)
            except Exception:  # the watcher must outlive any surprise; the old pair stays served
                log.exception("certificate reload check failed")
