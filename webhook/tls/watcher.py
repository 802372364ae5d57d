"""The server and client SSL contexts, and hot reload of the serving certificate from disk.

Certificate rotation (CertWatcher) swaps whole SSLContexts from an SNI callback rather than calling
`load_cert_chain` on the listening context; see CertWatcher for why.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
from pathlib import Path
from typing import Any, Literal

from cryptography import x509

from webhook.metrics import CERT_EXPIRY, CERT_RELOADS
from webhook.tasks import cancel_and_wait
from webhook.tls.issuing import CERT_FILE, KEY_FILE, utc_now

log = logging.getLogger(__name__)

# TLS 1.2 only (1.3 suites are OpenSSL's defaults, all AEAD): forward secrecy and AEAD, nothing else.
# Go's crypto/tls (the apiserver) offers all of these.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"

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


def client_certificate_names(peercert: Any) -> frozenset[str]:
    """The names a client certificate that the handshake verified carries: the subject's common
    names and the DNS names of its subjectAltName (`SSLObject.getpeercert()`'s dict; anything
    else, such as no certificate, has none)."""
    if not isinstance(peercert, dict):
        return frozenset()
    names: set[str] = set()
    for rdn in peercert.get("subject") or ():
        names.update(str(value) for key, value in rdn if key == "commonName")
    names.update(str(value) for kind, value in peercert.get("subjectAltName") or () if kind == "DNS")
    return frozenset(names)


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
            if cert.not_valid_after_utc <= utc_now():
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
