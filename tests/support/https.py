"""HTTPS test harness: the test plays the kube-apiserver against a real TLS server.

The server listens on 127.0.0.1 with CertWatcher's context (so certificate rotation is the real
code path); the client trusts only the test CA and verifies the name the apiserver dials,
`scheduling-webhook.hopsworks.svc`, which a static resolver maps to 127.0.0.1 (no DNS, no
`check_hostname=False`). Sessions keep connections alive, as the apiserver does, and the server
counts the TCP connections it accepts so tests can prove reuse.

    async def test_x(https_server: StartHttpsServer) -> None:
        srv = await https_server(app)                  # or https_server(app, client_ca=True)
        async with srv.session.post(srv.url("/mutate/pods"), json=review) as resp:
            assert resp.status == 200
        assert srv.connections_accepted == 1           # server side: TCP connections accepted
        assert srv.client_connections().created == 1   # client side: aiohttp's own account
        cert = (await srv.handshake()).cert            # a raw new connection: what is served now

The fixture: list `pytest_plugins = ["tests.support.https"]` in tests/conftest.py, or wrap
`https_servers(tmp_path)` in a fixture of your own (tests/test_tls.py does).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from cryptography import x509

from webhook.http.listener import ConnectionLimits, Listener
from webhook.tls.issuing import (
    CA_CERT_FILE,
    CERT_FILE,
    KEY_FILE,
    CertKey,
    make_ca,
    make_client_cert,
    make_serving_cert,
    write_file_atomic,
)
from webhook.tls.watcher import CertWatcher, make_client_ssl_context

SERVICE = "scheduling-webhook"
NAMESPACE = "hopsworks"
SERVICE_HOST = f"{SERVICE}.{NAMESPACE}.svc"  # what the apiserver dials and verifies
LOOPBACK = "127.0.0.1"
LOOPBACK6 = "::1"  # for servers started with host=LOOPBACK6, where the machine has IPv6 loopback


async def wait_until(
    predicate: Callable[[], bool], *, within: float = 5.0, interval: float = 0.01, what: str = "condition"
) -> None:
    """Bounded polling: return as soon as `predicate()` holds, fail after `within` seconds."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(interval)


def ipv6_loopback() -> bool:
    """Whether this machine can listen on ::1 (containers without IPv6 cannot)."""
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind((LOOPBACK6, 0))
    except OSError:
        return False
    return True


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


class StaticResolver(AbstractResolver):
    """Resolves only the names it is given (to loopback); anything else is an error, not DNS.
    Also the bench's load generator resolves the Service name with it."""

    def __init__(self, hosts: Mapping[str, str]) -> None:
        self._hosts = dict(hosts)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addr = self._hosts.get(host)
        if addr is None:
            raise OSError(f"static resolver: unknown host {host!r}")
        return [
            ResolveResult(
                hostname=host,
                host=addr,
                port=port,
                family=socket.AF_INET6 if ":" in addr else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
        ]

    async def close(self) -> None:
        return None


class KubeletSecretDir:
    """A folder laid out as kubelet's AtomicWriter lays out a Secret volume: the files live in
    `..<generation>/`, `..data` links to it, and each key is a symlink `key -> ..data/key`.
    `update()` swaps `..data` in one rename, as kubelet does when the Secret changes."""

    def __init__(self, path: Path, files: Mapping[str, bytes]) -> None:
        self.path = path
        self._generation = 0
        path.mkdir(parents=True, exist_ok=True)
        self.update(files)

    def update(self, files: Mapping[str, bytes]) -> None:
        self._generation += 1
        new_dir = self.path / f"..gen_{self._generation:04d}"
        new_dir.mkdir()
        for name, data in files.items():
            (new_dir / name).write_bytes(data)
            os.chmod(new_dir / name, 0o600 if name.endswith(".key") else 0o644)
        data_link = self.path / "..data"
        old_target = os.readlink(data_link) if data_link.is_symlink() else None
        tmp_link = self.path / "..data_tmp"
        os.symlink(new_dir.name, tmp_link)
        os.replace(tmp_link, data_link)  # the atomic switch
        for name in files:
            if not (self.path / name).is_symlink():
                os.symlink(f"..data/{name}", self.path / name)
        if old_target is not None:
            for child in (self.path / old_target).iterdir():
                child.unlink()
            (self.path / old_target).rmdir()


@dataclass
class CertFiles:
    """A test CA, a serving certificate for SERVICE_HOST, and where they are on disk."""

    dir: Path
    ca: CertKey
    serving: CertKey
    cert_file: Path
    key_file: Path
    ca_file: Path
    layout: Literal["plain", "kubelet"] = "plain"
    secret: KubeletSecretDir | None = None
    # Client certificates (for client_ca=True): the CA the server trusts, and a cert it signed.
    client_ca: CertKey | None = None
    client: CertKey | None = None
    client_ca_file: Path | None = None

    def issue(self, *, service: str = SERVICE, namespace: str = NAMESPACE, days: int = 30) -> CertKey:
        """A new serving certificate from the same CA (not installed)."""
        return make_serving_cert(self.ca, service, namespace, dns_names=["localhost"], ips=[LOOPBACK], days=days)

    def install(self, serving: CertKey) -> None:
        """Put a serving pair on disk the way production does: atomic renames, or a `..data` swap."""
        self.install_pem(serving.cert_pem, serving.key_pem)
        self.serving = serving

    def install_pem(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Any bytes, e.g. a broken pair. Plain layout: two renames (key, then certificate), so
        a watcher can see one new file with one old; kubelet layout: both in one swap."""
        if self.secret is not None:
            self.secret.update({CERT_FILE: cert_pem, KEY_FILE: key_pem, CA_CERT_FILE: self.ca.cert_pem})
        else:
            write_file_atomic(self.key_file, key_pem, 0o600)
            write_file_atomic(self.cert_file, cert_pem, 0o644)


def make_cert_files(
    directory: Path,
    *,
    service: str = SERVICE,
    namespace: str = NAMESPACE,
    ca: CertKey | None = None,
    layout: Literal["plain", "kubelet"] = "plain",
    client_ca: bool = False,
) -> CertFiles:
    """Generate a CA and a serving certificate (for `<service>.<namespace>.svc`, localhost and
    127.0.0.1) into `directory`; with `client_ca`, also a client CA and a client certificate."""
    ca = ca or make_ca(days=30)
    serving = make_serving_cert(ca, service, namespace, dns_names=["localhost"], ips=[LOOPBACK], days=30)
    directory.mkdir(parents=True, exist_ok=True)
    files = CertFiles(
        dir=directory,
        ca=ca,
        serving=serving,
        cert_file=directory / CERT_FILE,
        key_file=directory / KEY_FILE,
        ca_file=directory / CA_CERT_FILE,
        layout=layout,
    )
    if layout == "kubelet":
        files.secret = KubeletSecretDir(
            directory, {CERT_FILE: serving.cert_pem, KEY_FILE: serving.key_pem, CA_CERT_FILE: ca.cert_pem}
        )
    else:
        write_file_atomic(files.ca_file, ca.cert_pem, 0o644)
        files.install(serving)
    if client_ca:
        files.client_ca = make_ca("test-apiserver-client-ca", days=30)
        files.client = make_client_cert(files.client_ca, days=30)
        files.client_ca_file = directory.parent / f"{directory.name}-client-ca.crt"
        write_file_atomic(files.client_ca_file, files.client_ca.cert_pem, 0o644)
    return files


def client_ssl_context(ca_pem: bytes, client: CertKey | None = None, directory: Path | None = None) -> ssl.SSLContext:
    """Trust only `ca_pem`, verify hostnames; present `client` (written under `directory`)."""
    if client is None:
        return make_client_ssl_context(cadata=ca_pem)
    if directory is None:
        raise ValueError("a client certificate needs a directory to be written to (ssl loads keys from files)")
    stem = f"client-{client.cert.serial_number:x}"
    certfile, keyfile = directory / f"{stem}.crt", directory / f"{stem}.key"
    write_file_atomic(certfile, client.cert_pem, 0o644)
    write_file_atomic(keyfile, client.key_pem, 0o600)
    return make_client_ssl_context(cadata=ca_pem, certfile=certfile, keyfile=keyfile)


@dataclass
class Handshake:
    """What one raw TLS connection negotiated, and the status line of the answer to one request."""

    version: str
    cipher: str
    cert: x509.Certificate  # the certificate the server presented
    status_line: bytes


async def raw_request(
    port: int,
    ctx: ssl.SSLContext,
    *,
    server_hostname: str | None = SERVICE_HOST,
    path: str = "/",
    host: str = LOOPBACK,
) -> Handshake:
    """One new TCP connection, TLS handshake and HTTP/1.1 GET, below aiohttp (whose responses
    give up their connection, and so the peer certificate, as soon as a small body is read).
    Raises ssl.SSLError / ConnectionError when the server refuses the handshake; with TLS 1.3 a
    refused client certificate surfaces on the read, after the client's side of the handshake."""
    reader, writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname=server_hostname)
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionResetError("the server closed the connection without an answer")
        return Handshake(
            version=ssl_object.version(),
            cipher=ssl_object.cipher()[0],
            cert=x509.load_der_x509_certificate(ssl_object.getpeercert(binary_form=True)),
            status_line=status_line,
        )
    finally:
        writer.close()


@dataclass
class ClientConnections:
    """What a client session did with connections (from aiohttp's tracing signals)."""

    created: int = 0
    reused: int = 0


@dataclass
class HttpsServer:
    """A running HTTPS server and a keep-alive client session that trusts it."""

    app: web.Application
    runner: web.AppRunner
    server: asyncio.Server
    watcher: CertWatcher
    certs: CertFiles
    port: int
    session: aiohttp.ClientSession = field(init=False)
    hostname: str = SERVICE_HOST
    host: str = LOOPBACK  # the address it listens on, which `hostname` resolves to
    listener: Listener = field(init=False)
    _sessions: list[aiohttp.ClientSession] = field(default_factory=list)
    _client_stats: dict[int, ClientConnections] = field(default_factory=dict)

    @property
    def connections_accepted(self) -> int:
        """TCP connections the server accepted so far (a reused keep-alive connection counts once)."""
        return self.listener.accepted

    def url(self, path: str = "/") -> str:
        return f"https://{self.hostname}:{self.port}{path}"

    @property
    def open_connections(self) -> int:
        """Connections the server holds open now (idle keep-alive ones included)."""
        server = self.runner.server
        return len(server.connections) if server is not None else 0

    def client_ssl_context(self, client: CertKey | Literal["default"] | None = "default") -> ssl.SSLContext:
        """Trust the test CA; present the test client certificate by default when there is one,
        `client=None` for none, or another CertKey (e.g. one from another CA)."""
        chosen = self.certs.client if isinstance(client, str) else client
        return client_ssl_context(self.certs.ca.cert_pem, chosen, self.certs.dir.parent)

    def new_session(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        limit: int = 8,
        force_close: bool = False,
        timeout: float = 10.0,
    ) -> aiohttp.ClientSession:
        """Another client (closed by the fixture): `force_close=True` makes every request a new
        TCP connection and TLS handshake; `limit=1` pins a session to a single connection."""
        connector = aiohttp.TCPConnector(
            ssl=ssl_context or self.client_ssl_context(),
            resolver=StaticResolver({self.hostname: self.host}),
            limit=limit,
            force_close=force_close,
            keepalive_timeout=None if force_close else 60.0,
        )
        stats = ClientConnections()
        trace = aiohttp.TraceConfig()

        async def created(*_: object) -> None:
            stats.created += 1

        async def reused(*_: object) -> None:
            stats.reused += 1

        trace.on_connection_create_end.append(created)
        trace.on_connection_reuseconn.append(reused)
        session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=timeout), trace_configs=[trace]
        )
        self._sessions.append(session)
        self._client_stats[id(session)] = stats
        return session

    def client_connections(self, session: aiohttp.ClientSession | None = None) -> ClientConnections:
        """Connections a session made by new_session (default: `session`) created and reused."""
        return self._client_stats[id(session or self.session)]

    async def handshake(
        self, ctx: ssl.SSLContext | None = None, *, server_hostname: str | None = SERVICE_HOST
    ) -> Handshake:
        """A raw new connection + GET / (see raw_request); by default as the test apiserver."""
        return await raw_request(
            self.port, ctx or self.client_ssl_context(), server_hostname=server_hostname, host=self.host
        )

    async def close(self) -> None:
        for session in self._sessions:
            await session.close()
        self.server.close()
        await self.runner.cleanup()  # closes the connections it still holds
        await self.server.wait_closed()
        await self.watcher.stop()


class StartHttpsServer(Protocol):
    def __call__(
        self,
        app: web.Application,
        *,
        client_ca: bool = False,
        certs: CertFiles | None = None,
        watch_interval: float = 0.05,
        min_version: ssl.TLSVersion | None = None,  # None: CertWatcher's own default, as `serve` has it
        limits: ConnectionLimits | None = None,
        host: str = LOOPBACK,
    ) -> Awaitable[HttpsServer]: ...


async def start_https_server(
    app: web.Application,
    directory: Path,
    *,
    client_ca: bool = False,
    certs: CertFiles | None = None,
    watch_interval: float = 0.05,
    min_version: ssl.TLSVersion | None = None,  # None: CertWatcher's own default, as `serve` has it
    limits: ConnectionLimits | None = None,
    host: str = LOOPBACK,
) -> HttpsServer:
    """Start `app` on `host` (127.0.0.1, or LOOPBACK6):<ephemeral> over TLS; the caller must
    `await srv.close()`."""
    certs = certs or make_cert_files(directory / "certs", client_ca=client_ca)
    if client_ca and certs.client_ca_file is None:
        raise ValueError("client_ca=True needs CertFiles made with client_ca=True")
    watcher = CertWatcher(
        certs.cert_file,
        certs.key_file,
        client_ca_file=certs.client_ca_file if client_ca else None,
        interval=watch_interval,
        **({"min_version": min_version} if min_version is not None else {}),
    )
    await watcher.start()
    assert watcher.ready, watcher.last_error
    limits = limits or ConnectionLimits()
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0, keepalive_timeout=limits.idle_timeout_s)
    await runner.setup()
    # The server's own listener: handshake, header and idle timeouts and the connection cap.
    listener = Listener(runner, host, 0, watcher.ssl_context, limits, "test")
    await listener.start()
    assert listener.server is not None
    srv = HttpsServer(
        app=app, runner=runner, server=listener.server, watcher=watcher, certs=certs, port=listener.port, host=host
    )
    srv.listener = listener
    srv.session = srv.new_session()
    return srv


@contextlib.asynccontextmanager
async def https_servers(directory: Path) -> AsyncIterator[StartHttpsServer]:
    """`start(app, ...)` servers under `directory`; all of them are closed on exit."""
    started: list[HttpsServer] = []

    async def start(
        app: web.Application,
        *,
        client_ca: bool = False,
        certs: CertFiles | None = None,
        watch_interval: float = 0.05,
        min_version: ssl.TLSVersion | None = None,  # None: CertWatcher's own default, as `serve` has it
        limits: ConnectionLimits | None = None,
        host: str = LOOPBACK,
    ) -> HttpsServer:
        server_dir = directory / f"https-{len(started)}"
        server_dir.mkdir(parents=True)
        srv = await start_https_server(
            app,
            server_dir,
            client_ca=client_ca,
            certs=certs,
            watch_interval=watch_interval,
            min_version=min_version,
            limits=limits,
            host=host,
        )
        started.append(srv)
        return srv

    try:
        yield start
    finally:
        for srv in reversed(started):
            await srv.close()


@pytest.fixture
async def https_server(tmp_path: Path) -> AsyncIterator[StartHttpsServer]:
    """Factory fixture: `srv = await https_server(app, client_ca=False)`; all closed at teardown.
    Use it through `pytest_plugins = ["tests.support.https"]` in tests/conftest.py, or wrap
    `https_servers(tmp_path)` in a fixture of your own."""
    async with https_servers(tmp_path) as start:
        yield start
