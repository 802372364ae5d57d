"""TLS: certificates, protocol versions, client certificates and rotation without a restart.

The client is a real TLS client that verifies the CA and the name the apiserver dials; the
certificates are checked again by an independent verifier (cryptography's x509.verification).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import ipaddress
import ssl
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from tests.support.https import (
    LOOPBACK,
    NAMESPACE,
    SERVICE,
    SERVICE_HOST,
    HttpsServer,
    StartHttpsServer,
    client_ssl_context,
    make_cert_files,
    raw_request,
    wait_until,
)
from webhook import certs_cli
from webhook.metrics import REGISTRY
from webhook.tls import issuing
from webhook.tls import watcher as tls_watcher

# The `https_server` fixture comes from tests.support.https, registered in tests/conftest.py.


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


@dataclass
class OkApp:
    """GET / -> "ok"; counts the requests that reached a handler."""

    calls: int = 0
    app: web.Application = field(default_factory=web.Application)

    def __post_init__(self) -> None:
        self.app.router.add_get("/", self._ok)

    async def _ok(self, request: web.Request) -> web.Response:
        self.calls += 1
        return web.Response(text="ok")


def reloads(result: str) -> float:
    return REGISTRY.get_sample_value("webhook_certificate_reloads_total", {"result": result}) or 0.0


def fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def old_protocol_client() -> ssl.SSLContext:
    """A client that offers only TLS 1.0/1.1 (OpenSSL 3 needs security level 0 for them)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1
    ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    return ctx


async def get_ok(session: aiohttp.ClientSession, srv: HttpsServer) -> None:
    async with session.get(srv.url("/")) as resp:
        assert resp.status == 200
        assert await resp.text() == "ok"


# --------------------------------------------------------------------------------------------
# certificates
# --------------------------------------------------------------------------------------------


def test_serving_certificate_names_usage_and_chain() -> None:
    ca = issuing.make_ca(days=30)
    cert = issuing.make_serving_cert(
        ca, SERVICE, NAMESPACE, dns_names=["localhost", "127.0.0.1", "localhost"], ips=["::1"], days=10
    ).cert

    dns, ips = issuing.sans_of(cert)
    assert dns == [
        "scheduling-webhook",
        "scheduling-webhook.hopsworks",
        "scheduling-webhook.hopsworks.svc",
        "scheduling-webhook.hopsworks.svc.cluster.local",
        "localhost",
    ]
    assert ips == [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]  # IP literal -> IP SAN
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and not usage.key_cert_sign
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"

    ca_constraints = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert ca_constraints.critical and ca_constraints.value.ca is True
    assert ca.cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    cert.verify_directly_issued_by(ca.cert)

    # An independent path validator (RFC 5280 + CA/B rules) accepts it for every service name.
    verifier = PolicyBuilder().store(Store([ca.cert]))
    for name in dns[:4]:
        verifier.build_server_verifier(x509.DNSName(name)).verify(cert, [])
    verifier.build_server_verifier(x509.IPAddress(ipaddress.ip_address("127.0.0.1"))).verify(cert, [])
    with pytest.raises(VerificationError):
        verifier.build_server_verifier(x509.DNSName("other.hopsworks.svc")).verify(cert, [])
    with pytest.raises(VerificationError):  # another CA
        PolicyBuilder().store(Store([issuing.make_ca().cert])).build_server_verifier(x509.DNSName(SERVICE_HOST)).verify(
            cert, []
        )


def test_client_certificate_is_for_client_auth_only() -> None:
    ca = issuing.make_ca(days=30)
    client = issuing.make_client_cert(ca, "apiserver", days=10)
    assert list(client.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    client.cert.verify_directly_issued_by(ca.cert)
    assert issuing.CertKey.from_pem(client.cert_pem, client.key_pem).cert == client.cert
    with pytest.raises(ValueError, match="does not belong"):
        issuing.CertKey.from_pem(client.cert_pem, issuing.make_client_cert(ca).key_pem)


def test_serving_certificate_does_not_outlive_its_ca() -> None:
    ca = issuing.make_ca(days=2)
    cert = issuing.make_serving_cert(ca, SERVICE, NAMESPACE, days=365).cert
    assert cert.not_valid_after_utc == ca.cert.not_valid_after_utc


def certs_args(out: Path, **kw: object) -> argparse.Namespace:
    base: dict[str, object] = {
        "out": str(out),
        "service": SERVICE,
        "namespace": NAMESPACE,
        "hostname": ["localhost"],
        "ip": ["127.0.0.1"],
        "days": 30,
    }
    return argparse.Namespace(**(base | kw))


def test_certs_command_writes_files_and_is_idempotent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    assert certs_cli.certs_command(certs_args(out)) == 0
    for name, mode in [("ca.crt", 0o644), ("ca.key", 0o600), ("tls.crt", 0o644), ("tls.key", 0o600)]:
        assert stat.S_IMODE((out / name).stat().st_mode) == mode, name
    printed = capsys.readouterr().out
    assert "new CA" in printed and f"wrote {out / 'tls.key'} (600)" in printed
    assert "scheduling-webhook.hopsworks.svc" in printed
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "temporary files left behind"

    ca_pem = (out / "ca.crt").read_bytes()
    first = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    serving = issuing.CertKey.from_pem((out / "tls.crt").read_bytes(), (out / "tls.key").read_bytes())
    assert issuing.sans_of(serving.cert)[1] == [ipaddress.ip_address("127.0.0.1")]

    # Again: the CA is kept (the caBundle in the webhook configurations stays valid), the
    # serving certificate is re-issued by it.
    assert certs_cli.certs_command(certs_args(out)) == 0
    assert "kept CA" in capsys.readouterr().out
    assert (out / "ca.crt").read_bytes() == ca_pem
    second = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    assert second.serial_number != first.serial_number
    second.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600

    # Asked for a new CA: a different one.
    assert certs_cli.certs_command(certs_args(out, new_ca=True)) == 0
    assert (out / "ca.crt").read_bytes() != ca_pem


def test_certs_command_refuses_what_it_cannot_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    assert certs_cli.certs_command(certs_args(out, ip=["not-an-ip"])) == 2
    assert certs_cli.certs_command(certs_args(out)) == 0
    (out / "ca.key").unlink()
    before = (out / "tls.crt").read_bytes()
    assert certs_cli.certs_command(certs_args(out)) == 1
    assert "ca.key" in capsys.readouterr().err
    assert (out / "tls.crt").read_bytes() == before  # nothing half-done


def test_keep_valid_keeps_a_matching_certificate_and_reissues_one_lacking_a_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make run` runs `certs --keep-valid` for localhost/127.0.0.1 every time: a certificate made
    for the Service alone (once the README's install step wrote there) must be replaced."""
    out = tmp_path / "dev"
    dev = {"keep_valid": True, "days": 365}
    assert certs_cli.certs_command(certs_args(out, **dev)) == 0
    first = (out / "tls.crt").read_bytes()
    capsys.readouterr()
    assert certs_cli.certs_command(certs_args(out, **dev)) == 0
    assert f"kept {out / 'tls.crt'}" in capsys.readouterr().out
    assert (out / "tls.crt").read_bytes() == first  # valid, the names asked, 30+ days left: untouched

    assert certs_cli.certs_command(certs_args(out, hostname=[], ip=[], days=365)) == 0  # the Service's names only
    capsys.readouterr()
    assert certs_cli.certs_command(certs_args(out, **dev)) == 0
    assert "re-issuing" in (printed := capsys.readouterr().out) and "it lacks localhost, 127.0.0.1" in printed
    dns, ips = issuing.sans_of(x509.load_pem_x509_certificate((out / "tls.crt").read_bytes()))
    assert "localhost" in dns and ipaddress.ip_address("127.0.0.1") in ips

    # Signed by another CA, or expiring within 30 days: re-issued too.
    other = issuing.make_ca()
    stray = issuing.make_serving_cert(other, SERVICE, NAMESPACE, dns_names=["localhost"], ips=["127.0.0.1"])
    issuing.write_serving_files(out, other, stray, write_ca=False)
    assert certs_cli.certs_command(certs_args(out, **dev)) == 0
    assert "not issued by the CA" in capsys.readouterr().out
    assert certs_cli.certs_command(certs_args(out, days=10)) == 0
    capsys.readouterr()
    assert certs_cli.certs_command(certs_args(out, **dev)) == 0
    assert "it expires" in capsys.readouterr().out


def test_expiry_metric_follows_the_served_certificate(tmp_path: Path) -> None:
    certs = make_cert_files(tmp_path / "certs")
    watcher = tls_watcher.CertWatcher(certs.cert_file, certs.key_file)
    assert watcher.reload_now() == "loaded"
    expiry = REGISTRY.get_sample_value("webhook_serving_certificate_expiry_timestamp_seconds")
    assert expiry == certs.serving.cert.not_valid_after_utc.timestamp()
    longer = certs.issue(days=90)
    certs.install(longer)
    assert watcher.reload_now() == "loaded"
    assert REGISTRY.get_sample_value("webhook_serving_certificate_expiry_timestamp_seconds") == (
        longer.cert.not_valid_after_utc.timestamp()
    )


# --------------------------------------------------------------------------------------------
# the HTTPS client's checks, keep-alive
# --------------------------------------------------------------------------------------------


async def test_keep_alive_reuses_one_connection(https_server: StartHttpsServer) -> None:
    ok = OkApp()
    srv = await https_server(ok.app)
    for _ in range(25):
        await get_ok(srv.session, srv)
    assert ok.calls == 25
    assert srv.connections_accepted == 1
    assert (srv.client_connections().created, srv.client_connections().reused) == (1, 24)
    assert srv.open_connections == 1


async def test_client_refuses_a_certificate_for_another_name(https_server: StartHttpsServer, tmp_path: Path) -> None:
    ok = OkApp()
    srv = await https_server(ok.app, certs=make_cert_files(tmp_path / "other", service="other-webhook"))
    with pytest.raises(aiohttp.ClientConnectorCertificateError) as err:
        await get_ok(srv.session, srv)
    assert err.value.certificate_error.verify_code == 62  # X509_V_ERR_HOSTNAME_MISMATCH
    assert ok.calls == 0


async def test_client_refuses_a_certificate_from_another_ca(https_server: StartHttpsServer) -> None:
    ok = OkApp()
    srv = await https_server(ok.app)
    session = srv.new_session(ssl_context=client_ssl_context(issuing.make_ca().cert_pem))
    with pytest.raises(aiohttp.ClientConnectorCertificateError) as err:
        await get_ok(session, srv)
    assert err.value.certificate_error.verify_code == 20  # X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY
    assert ok.calls == 0


# --------------------------------------------------------------------------------------------
# protocol versions
# --------------------------------------------------------------------------------------------


async def test_tls13_by_default_tls12_accepted(https_server: StartHttpsServer) -> None:
    srv = await https_server(OkApp().app)
    client = srv.client_ssl_context()
    default = await raw_request(srv.port, client)
    assert default.version == "TLSv1.3"
    assert default.status_line.startswith(b"HTTP/1.1 200")

    client.maximum_version = ssl.TLSVersion.TLSv1_2
    v12 = await raw_request(srv.port, client)
    assert v12.version == "TLSv1.2"
    assert v12.cipher.startswith("ECDHE-ECDSA-") and ("GCM" in v12.cipher or "CHACHA20" in v12.cipher)
    assert v12.status_line.startswith(b"HTTP/1.1 200")


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
async def test_tls11_and_below_refused(https_server: StartHttpsServer) -> None:
    ok = OkApp()
    srv = await https_server(ok.app)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await raw_request(srv.port, old_protocol_client(), server_hostname=None)
    assert ok.calls == 0

    # Control: the same client does speak TLS 1.1 to a server that allows it, so the refusal
    # above is the server's minimum version, not a client that cannot offer TLS 1.1.
    permissive = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    permissive.minimum_version = ssl.TLSVersion.TLSv1
    permissive.set_ciphers("DEFAULT:@SECLEVEL=0")
    permissive.load_cert_chain(srv.certs.cert_file, srv.certs.key_file)
    control = await asyncio.start_server(lambda r, w: w.close(), LOOPBACK, 0, ssl=permissive)
    try:
        _, writer = await asyncio.open_connection(
            LOOPBACK, control.sockets[0].getsockname()[1], ssl=old_protocol_client()
        )
        assert writer.get_extra_info("ssl_object").version() == "TLSv1.1"
        writer.close()
    finally:
        control.close()
        await control.wait_closed()

    with pytest.raises(ValueError, match=r"below TLS 1\.2"):
        tls_watcher.make_server_ssl_context(srv.certs.cert_file, srv.certs.key_file, min_version=ssl.TLSVersion.TLSv1_1)


# --------------------------------------------------------------------------------------------
# client certificates (the apiserver can present one)
# --------------------------------------------------------------------------------------------


async def test_client_certificate_required_and_verified(https_server: StartHttpsServer, tmp_path: Path) -> None:
    ok = OkApp()
    srv = await https_server(ok.app, client_ca=True)
    assert srv.certs.client_ca is not None

    await get_ok(srv.session, srv)  # the session presents the client certificate the CA signed
    assert ok.calls == 1

    strangers = issuing.make_ca()
    refused: dict[str, ssl.SSLContext] = {
        "no certificate": srv.client_ssl_context(None),
        "another CA": srv.client_ssl_context(issuing.make_client_cert(strangers)),
        # Right CA, wrong purpose: OpenSSL checks EKU clientAuth on the server side.
        "serverAuth only": srv.client_ssl_context(issuing.make_serving_cert(srv.certs.client_ca, "x", "y")),
    }
    for what, ctx in refused.items():
        # With TLS 1.3 the client finishes its side first and learns of the refusal on the
        # first read; either way no request reaches a handler.
        with pytest.raises(aiohttp.ClientError):
            await get_ok(srv.new_session(ssl_context=ctx), srv)
        for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            ctx.maximum_version = version
            with pytest.raises((ssl.SSLError, ConnectionError)):
                handshake = await raw_request(srv.port, ctx)
                assert handshake.status_line, f"{what} over {version.name}: no answer but no error"
        assert ok.calls == 1, what


# --------------------------------------------------------------------------------------------
# rotation
# --------------------------------------------------------------------------------------------


@dataclass
class Traffic:
    """Requests in a loop while certificates change: one keep-alive client on one connection, and
    clients that open a new connection (and handshake) for every request."""

    srv: HttpsServer
    failures: list[str] = field(default_factory=list)
    keepalive_requests: int = 0
    fresh: list[tuple[float, str]] = field(default_factory=list)  # (monotonic start, served cert)
    keepalive_session: aiohttp.ClientSession | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def _keepalive(self, session: aiohttp.ClientSession) -> None:
        while not self._stop.is_set():
            try:
                await get_ok(session, self.srv)
                self.keepalive_requests += 1
            except (aiohttp.ClientError, OSError, AssertionError) as e:
                self.failures.append(f"keep-alive: {e!r}")

    async def _new_connections(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                answer = await self.srv.handshake()
                assert answer.status_line.startswith(b"HTTP/1.1 200"), answer.status_line
                self.fresh.append((started, fingerprint(answer.cert)))
            except (ssl.SSLError, OSError, AssertionError) as e:
                self.failures.append(f"new connection: {e!r}")

    def start(self, fresh_clients: int = 3) -> None:
        self.keepalive_session = self.srv.new_session(limit=1)
        self._tasks.append(asyncio.create_task(self._keepalive(self.keepalive_session)))
        self._tasks += [asyncio.create_task(self._new_connections()) for _ in range(fresh_clients)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def fresh_since(self, t: float) -> list[str]:
        return [cert for started, cert in self.fresh if started > t]


@pytest.mark.parametrize("layout", ["plain", "kubelet"])
async def test_rotation_without_restart_or_failed_request(
    https_server: StartHttpsServer, tmp_path: Path, layout: str
) -> None:
    certs = make_cert_files(tmp_path / "certs", layout="kubelet" if layout == "kubelet" else "plain")
    if layout == "kubelet":
        assert certs.cert_file.is_symlink() and (certs.dir / "..data").is_symlink()
    srv = await https_server(OkApp().app, certs=certs, watch_interval=0.05)
    failures_before = reloads("failure")
    first = fingerprint(certs.serving.cert)
    traffic = Traffic(srv)
    traffic.start()
    try:
        await wait_until(lambda: traffic.keepalive_requests >= 5 and len(traffic.fresh) >= 5, what="traffic")
        for _ in range(2):  # rotate twice: the second swap must work as well as the first
            new = certs.issue()
            certs.install(new)
            await wait_until(lambda new=new: srv.watcher.certificate == new.cert, what="the watcher to load it")
            switched, keepalive_before = time.monotonic(), traffic.keepalive_requests
            await wait_until(
                lambda t=switched, k=keepalive_before: (
                    len(traffic.fresh_since(t)) >= 10 and traffic.keepalive_requests >= k + 5
                ),
                what="new handshakes and keep-alive requests after the switch",
            )
            # Every handshake that began after the switch got the new certificate.
            assert set(traffic.fresh_since(switched)) == {fingerprint(new.cert)}
    finally:
        await traffic.stop()

    assert traffic.failures == []
    assert {cert for _, cert in traffic.fresh[:5]} == {first}
    # The keep-alive client stayed on its one connection throughout, across both rotations.
    assert traffic.keepalive_session is not None
    stats = srv.client_connections(traffic.keepalive_session)
    assert (stats.created, stats.reused) == (1, traffic.keepalive_requests - 1)
    assert srv.connections_accepted == len(traffic.fresh) + 1
    if layout == "kubelet":  # one atomic swap: never a mismatched pair on disk
        assert reloads("failure") == failures_before


async def test_broken_pair_keeps_the_old_certificate(https_server: StartHttpsServer, tmp_path: Path) -> None:
    # Kubelet layout: each pair appears in one swap, so the count of failed reloads is exact.
    srv = await https_server(OkApp().app, certs=make_cert_files(tmp_path / "certs", layout="kubelet"))
    certs, watcher = srv.certs, srv.watcher
    old = certs.serving
    new = certs.issue()
    await get_ok(srv.session, srv)  # a keep-alive connection from before the trouble

    # A key that is not the certificate's (a half-finished copy), then a truncated certificate.
    for cert_pem, key_pem in [(new.cert_pem, old.key_pem), (new.cert_pem[: len(new.cert_pem) // 2], new.key_pem)]:
        failures = reloads("failure")
        certs.install_pem(cert_pem, key_pem)
        await wait_until(lambda f=failures: reloads("failure") == f + 1, what="a counted failed reload")
        assert watcher.certificate == old.cert and watcher.ready
        assert watcher.last_error and "invalid certificate pair" in watcher.last_error
        assert (await srv.handshake()).cert == old.cert  # new handshakes: still the old one
        assert watcher.reload_now() == "failed"
        assert reloads("failure") == failures + 1  # the same bad content is counted once

    certs.install(new)
    await wait_until(lambda: watcher.certificate == new.cert, what="the fixed pair to load")
    assert watcher.last_error is None
    assert (await srv.handshake()).cert == new.cert
    await get_ok(srv.session, srv)  # the keep-alive connection opened before all this still works
    assert srv.client_connections().created == 1


async def test_not_ready_until_a_valid_pair_appears(tmp_path: Path) -> None:
    certs_dir = tmp_path / "later"
    watcher = tls_watcher.CertWatcher.from_dir(certs_dir, interval=0.05)
    failures = reloads("failure")
    await watcher.start()
    try:
        assert not watcher.ready and watcher.certificate is None
        assert reloads("failure") == failures + 1
        # Not ready: a handshake is refused at once (no hang, no certificate from nowhere).
        server, port = await _serve(watcher.ssl_context)
        ca = issuing.make_ca(days=30)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await raw_request(port, client_ssl_context(ca.cert_pem))
        files = make_cert_files(certs_dir, ca=ca)
        await wait_until(lambda: watcher.ready, what="the watcher to load the new files")
        assert watcher.certificate == files.serving.cert
        handshake = await raw_request(port, client_ssl_context(ca.cert_pem))
        assert handshake.cert == files.serving.cert
        server.close()
        await server.wait_closed()
    finally:
        await watcher.stop()


async def test_client_without_sni_gets_the_current_certificate(https_server: StartHttpsServer) -> None:
    # OpenSSL runs the servername callback with or without SNI; the rotation relies on that.
    srv = await https_server(OkApp().app)
    new = srv.certs.issue()
    srv.certs.install(new)
    assert srv.watcher.reload_now() == "loaded"
    no_sni = srv.client_ssl_context()
    no_sni.check_hostname = False
    handshake = await raw_request(srv.port, no_sni, server_hostname=None)
    assert handshake.cert == new.cert


# --------------------------------------------------------------------------------------------
# why CertWatcher swaps contexts instead of reloading the listening one
# --------------------------------------------------------------------------------------------


async def _serve(ctx: ssl.SSLContext) -> tuple[asyncio.Server, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, LOOPBACK, 0, ssl=ctx)
    return server, server.sockets[0].getsockname()[1]


async def test_load_cert_chain_on_a_live_context_reaches_new_handshakes(tmp_path: Path) -> None:
    files = make_cert_files(tmp_path / "certs")
    ctx = tls_watcher.make_server_ssl_context(files.cert_file, files.key_file)
    server, port = await _serve(ctx)
    try:
        client = client_ssl_context(files.ca.cert_pem)
        assert (await raw_request(port, client)).cert == files.serving.cert
        new = files.issue()
        files.install(new)
        ctx.load_cert_chain(files.cert_file, files.key_file)  # on the context the server listens with
        assert (await raw_request(port, client)).cert == new.cert
    finally:
        server.close()
        await server.wait_closed()


async def test_load_cert_chain_keeps_a_certificate_of_another_key_type(tmp_path: Path) -> None:
    # OpenSSL keeps one certificate per key type in a context: after an RSA -> ECDSA rotation by
    # load_cert_chain, a client that prefers RSA still gets the old certificate. CertWatcher's
    # per-pair contexts do not.
    files = make_cert_files(tmp_path / "certs")
    rsa_cert = issuing.make_serving_cert(
        files.ca, SERVICE, NAMESPACE, key=rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )
    files.install(rsa_cert)
    ecdsa_cert = files.issue()
    rsa_only = client_ssl_context(files.ca.cert_pem)
    rsa_only.maximum_version = ssl.TLSVersion.TLSv1_2  # TLS 1.2 ciphers name the key type
    rsa_only.set_ciphers("ECDHE-RSA-AES128-GCM-SHA256")

    live = tls_watcher.make_server_ssl_context(files.cert_file, files.key_file)
    watcher = tls_watcher.CertWatcher(files.cert_file, files.key_file)
    assert watcher.reload_now() == "loaded"
    live_server, live_port = await _serve(live)
    watched_server, watched_port = await _serve(watcher.ssl_context)
    try:
        files.install(ecdsa_cert)
        live.load_cert_chain(files.cert_file, files.key_file)
        assert watcher.reload_now() == "loaded"

        assert (await raw_request(live_port, rsa_only)).cert == rsa_cert.cert  # the stale one
        with pytest.raises((ssl.SSLError, ConnectionError)):  # the watcher serves only the new ECDSA one
            await raw_request(watched_port, rsa_only)
        assert (await raw_request(watched_port, client_ssl_context(files.ca.cert_pem))).cert == ecdsa_cert.cert
    finally:
        for server in (live_server, watched_server):
            server.close()
            await server.wait_closed()


def test_a_leaf_names_its_ca_by_the_cas_own_key_identifier() -> None:
    """A CA made elsewhere (Helm's genCA, Go 1.25+) may identify its key by a truncated SHA-256
    rather than SHA-1: a leaf must name the identifier the CA carries, or OpenSSL finds no issuer."""
    key = ec.generate_private_key(ec.SECP256R1())
    ski = hashlib.sha256(key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)).digest()[:20]  # fmt: skip
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "go-made CA")])
    now = issuing.utc_now()
    ca_cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    assert ski != x509.SubjectKeyIdentifier.from_public_key(key.public_key()).digest
    leaf = issuing.make_serving_cert(issuing.CertKey(cert=ca_cert, key=key), "svc", "ns")
    akid = leaf.cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert akid.key_identifier == ski
    verifier = PolicyBuilder().store(Store([ca_cert])).time(now).build_server_verifier(x509.DNSName("svc.ns.svc"))
    verifier.verify(leaf.cert, [])
