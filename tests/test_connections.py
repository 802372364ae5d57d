"""What a connection may hold, over real HTTPS: the listener's handshake, header and idle timeouts,
its connection cap, the probe listener, and requests refused from their head alone.

Each case is a hostile client (one that says nothing, dribbles headers, floods connections, or
announces a body too large) against the server's own listener (webhook.http.listener.Listener), as
`serve` runs it; the limits are shortened so that the tests take seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import socket
import ssl
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from tests.support.apps import cache_app
from tests.support.cluster import cluster_state
from tests.support.https import (
    LOOPBACK,
    SERVICE_HOST,
    StartHttpsServer,
    client_ssl_context,
    free_port,
    make_cert_files,
    wait_until,
)
from tests.support.reviews import pod_review
from webhook.core.decision import Decision
from webhook.http.app import SERVER_KEY, STATE_KEY, create_probe_app
from webhook.http.listener import ConnectionLimits, Listener, bytes_after_request
from webhook.metrics import REGISTRY
from webhook.runtime import Runtime, ServeOptions
from webhook.tls.watcher import make_client_ssl_context

SHORT = ConnectionLimits(handshake_timeout_s=0.5, header_timeout_s=0.5, idle_timeout_s=1.5, max_connections=64)
EXAMPLE_CLUSTER = Path(__file__).resolve().parents[1] / "examples" / "cluster"


def ready_app() -> Any:
    state = cluster_state()
    for kind in ("Namespace", "PriorityClass", "ConfigMap", "LocalQueue", "Pod"):
        state.synced[kind] = True
    return cache_app(state)


async def connect(port: int, ctx: ssl.SSLContext | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    hostname = SERVICE_HOST if ctx is not None else None
    return await asyncio.open_connection(LOOPBACK, port, ssl=ctx, server_hostname=hostname)


async def trickled_until_closed(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, byte: bytes, times: int
) -> bool:
    """Send `byte` every 0.1 s, up to `times` times; True once the server has closed the connection."""
    for _ in range(times):
        try:
            writer.write(byte)
            await writer.drain()
        except (ConnectionError, ssl.SSLError):
            return True
        if await closed_within(reader, 0.1):
            return True
    return False


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """True when the server closes the connection (EOF or reset) within `seconds`."""
    try:
        while await asyncio.wait_for(reader.read(4096), seconds):
            pass
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        pass
    return True


GET_READYZ = f"GET /readyz HTTP/1.1\r\nHost: {SERVICE_HOST}\r\n\r\n".encode()


async def answer_status(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> int:
    writer.write(request)
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), 5)
    while (line := await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return int(status.split()[1])


# -- timeouts ------------------------------------------------------------------------------------


async def test_a_connection_silent_after_the_handshake_is_closed(https_server: StartHttpsServer) -> None:
    srv = await https_server(ready_app(), limits=SHORT)
    reader, writer = await connect(srv.port, srv.client_ssl_context())
    assert await closed_within(reader, 1.2)  # the header timeout (0.5 s), well before the idle one (1.5 s)
    writer.close()


async def test_a_client_dribbling_headers_is_closed(https_server: StartHttpsServer) -> None:
    srv = await https_server(ready_app(), limits=SHORT)
    reader, writer = await connect(srv.port, srv.client_ssl_context())
    writer.write(f"POST /mutate/pods HTTP/1.1\r\nHost: {SERVICE_HOST}\r\n".encode())
    started = time.monotonic()
    # one header byte every 0.1 s, never the end of the head
    assert await trickled_until_closed(reader, writer, b"X", 40)
    assert time.monotonic() - started < 1.2  # the header timeout, not the idle one
    writer.close()


async def test_a_handshake_never_started_is_dropped(https_server: StartHttpsServer) -> None:
    srv = await https_server(ready_app(), limits=SHORT)
    reader, writer = await connect(srv.port, None)  # TCP only: no ClientHello ever comes
    assert await closed_within(reader, 5.0)
    writer.close()


async def test_keep_alive_outlives_the_header_timeout_and_ends_at_the_idle_timeout(
    https_server: StartHttpsServer,
) -> None:
    srv = await https_server(ready_app(), limits=SHORT)
    reader, writer = await connect(srv.port, srv.client_ssl_context())
    assert await answer_status(reader, writer, GET_READYZ) == 200
    await asyncio.sleep(0.9)  # idle past the header timeout: an idle keep-alive connection stays
    assert await answer_status(reader, writer, GET_READYZ) == 200
    started = time.monotonic()
    assert await closed_within(reader, 5.0)
    assert time.monotonic() - started >= 1.0  # the idle timeout, not the header timeout
    writer.close()


# -- the cap ---------------------------------------------------------------------------------------


async def test_at_the_cap_the_oldest_silent_connection_makes_room_and_a_served_one_stays(
    https_server: StartHttpsServer,
) -> None:
    # At the cap a silent connection makes room for the newcomer: refusing the newcomer instead would
    # let silent connections hold the cap for good.
    limits = ConnectionLimits(handshake_timeout_s=2, header_timeout_s=30, idle_timeout_s=30, max_connections=8)
    srv = await https_server(ready_app(), limits=limits)
    ctx = srv.client_ssl_context()
    working = await connect(srv.port, ctx)  # as the apiserver: one kept-alive connection
    assert await answer_status(*working, GET_READYZ) == 200
    silent = [await connect(srv.port, ctx) for _ in range(7)]
    assert srv.listener.open_connections == 8
    newcomer = await connect(srv.port, ctx)
    assert await answer_status(*newcomer, GET_READYZ) == 200  # answered, not reset
    assert await closed_within(silent[0][0], 2.0)  # the oldest that never completed a request
    assert not await closed_within(silent[1][0], 0.2)
    assert await answer_status(*working, GET_READYZ) == 200  # the served one is still open
    assert srv.listener.open_connections == 8
    for _, writer in [*silent, working, newcomer]:
        writer.close()


async def test_a_newcomer_is_shed_only_when_every_connection_has_a_request_in_flight(
    https_server: StartHttpsServer,
) -> None:
    release = asyncio.Event()

    async def held(_: Any) -> Decision:
        await release.wait()
        return Decision.allow()

    limits = ConnectionLimits(handshake_timeout_s=2, header_timeout_s=30, idle_timeout_s=30, max_connections=4)
    state = ready_app()[STATE_KEY]
    srv = await https_server(cache_app(state, handlers={"/mutate/pods": held}), limits=limits)
    ctx = srv.client_ssl_context()
    body = json.dumps(pod_review("churn")).encode()
    head = (
        f"POST /mutate/pods HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    in_flight = [await connect(srv.port, ctx) for _ in range(4)]
    for _, writer in in_flight:
        writer.write(head + body)
        await writer.drain()
    await asyncio.sleep(0.2)
    with pytest.raises((ConnectionError, ssl.SSLError, asyncio.IncompleteReadError)):
        extra = await connect(srv.port, ctx)
        await answer_status(*extra, GET_READYZ)
    release.set()
    for reader, _ in in_flight:  # none of them was cut to make room
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 200 ")
    again = await connect(srv.port, ctx)
    assert await answer_status(*again, GET_READYZ) == 200
    for _, writer in [*in_flight, again]:
        writer.close()


SLOW = ConnectionLimits(
    handshake_timeout_s=0.5, header_timeout_s=0.5, body_timeout_s=0.5, idle_timeout_s=5, max_connections=64
)


def slow_body_head(length: int = 4_000_000) -> bytes:
    return (
        f"POST /mutate/pods HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


async def test_a_slow_body_is_closed_at_the_body_deadline(https_server: StartHttpsServer) -> None:
    # A body announced as 4 MB and sent a byte at a time must not hold its connection for good.
    srv = await https_server(ready_app(), limits=SLOW)
    reader, writer = await connect(srv.port, srv.client_ssl_context())
    writer.write(slow_body_head() + b"{")
    await writer.drain()
    started = time.monotonic()
    # a byte every 0.1 s: the head arrived at once, the body never ends
    assert await trickled_until_closed(reader, writer, b" ", 30)
    assert time.monotonic() - started < 1.5
    writer.close()


async def test_an_aborted_upload_is_one_line_at_debug(
    https_server: StartHttpsServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A client hanging up mid-body is ordinary: no ERROR traceback in the log.
    srv = await https_server(ready_app(), limits=SHORT)
    with caplog.at_level(logging.DEBUG):
        _, writer = await connect(srv.port, srv.client_ssl_context())
        writer.write(slow_body_head(100_000) + b'{"apiVersion": ')
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.transport.abort()
        await asyncio.sleep(0.3)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.exc_info]
    (line,) = [r for r in caplog.records if "body" in r.getMessage() and r.name.startswith("webhook")]
    assert line.levelno == logging.DEBUG and "\n" not in line.getMessage()


# -- a fresh client during the attacks, over real TLS ------------------------------------------------


async def open_quietly(port: int, ctx: ssl.SSLContext | None) -> asyncio.StreamWriter | None:
    try:
        return (await connect(port, ctx))[1]
    except (ConnectionError, ssl.SSLError, OSError):
        return None


async def review_status(srv: Any) -> int:
    """A new connection from a new client, as an apiserver that dials: its review's status."""
    async with srv.new_session() as session, session.post(srv.url("/mutate/pods"), json=pod_review("churn")) as resp:
        assert resp.status != 200 or (await resp.json())["response"]["allowed"]
        return resp.status


async def test_a_fresh_client_is_answered_while_an_attacker_holds_silent_and_slow_connections(
    https_server: StartHttpsServer,
) -> None:
    # Silent handshakes and slow bodies must not fill the cap so that every new connection is
    # reset. The attacker here holds far more than the cap, of every kind, and keeps dialling.
    limits = ConnectionLimits(
        handshake_timeout_s=30, header_timeout_s=30, body_timeout_s=30, idle_timeout_s=30, max_connections=16
    )
    srv = await https_server(ready_app(), limits=limits)
    ctx = srv.client_ssl_context()
    held: list[asyncio.StreamWriter | None] = []
    for round_ in range(3):
        # handshakes never started (TCP only), handshakes done and silent, a first request's slow
        # body, and connections that completed one request and now sit idle
        held += [await open_quietly(srv.port, None) for _ in range(12)]
        held += [await open_quietly(srv.port, ctx) for _ in range(12)]
        for _ in range(8):
            pair = None
            with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
                pair = await connect(srv.port, ctx)
                pair[1].write(slow_body_head() + b"{")
            held.append(pair[1] if pair else None)
        for _ in range(8):
            with contextlib.suppress(ConnectionError, ssl.SSLError, OSError, asyncio.IncompleteReadError):
                pair = await connect(srv.port, ctx)
                await answer_status(*pair, GET_READYZ)
                held.append(pair[1])
        assert srv.listener.open_connections <= 16
        assert await review_status(srv) == 200, f"round {round_}"
    for writer in held:
        if writer is not None:
            writer.close()


# -- the probe listener ------------------------------------------------------------------------------


async def start_runtime(tmp_path: Path, certs_dir: Path, **options: Any) -> tuple[Runtime, ServeOptions]:
    """`serve --state <copy of examples/cluster>` in this process."""
    state = tmp_path / "state"
    shutil.copytree(EXAMPLE_CLUSTER, state)
    serve = ServeOptions(
        host=LOOPBACK,
        port=free_port(),
        certs=certs_dir,
        state_dir=state,
        drain_seconds=0.0,
        linger_seconds=0.0,
        **options,
    )
    runtime = Runtime(serve)
    await runtime.start()
    return runtime, serve


def make_client_ssl_context_for(certs: Any, directory: Path) -> ssl.SSLContext:
    return client_ssl_context(certs.ca.cert_pem, certs.client, directory)


def kubelet_context() -> ssl.SSLContext:
    """As a kubelet HTTPS probe: no certificate verification, no client certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def probe(port: int, path: str) -> int:
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=kubelet_context())) as session,
        session.get(f"https://{LOOPBACK}:{port}{path}") as resp,
    ):
        return resp.status


async def test_with_a_client_ca_probes_and_metrics_answer_without_a_client_certificate(tmp_path: Path) -> None:
    certs = make_cert_files(tmp_path / "certs", client_ca=True)
    assert certs.client_ca_file is not None and certs.client is not None
    runtime, options = await start_runtime(tmp_path, certs.dir, client_ca=certs.client_ca_file, probe_port=free_port())
    try:
        assert options.probe_port is not None
        for path in ("/healthz", "/readyz", "/metrics"):
            assert await probe(options.probe_port, path) == 200, path
        # The main port still demands the apiserver's client certificate.
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            await probe(options.port, "/healthz")
        with_cert = make_client_ssl_context_for(certs, tmp_path)
        reader, writer = await connect(options.port, with_cert)
        assert await answer_status(reader, writer, GET_READYZ) == 200
        writer.close()
        # The probe port serves nothing else: no admission, no GPU API.
        assert await probe(options.probe_port, "/api/v1/admin/runai") == 404
    finally:
        await runtime.shutdown()


async def test_a_flood_on_the_main_port_does_not_starve_the_probes(tmp_path: Path) -> None:
    certs = make_cert_files(tmp_path / "certs")
    limits = ConnectionLimits(max_connections=4)
    runtime, options = await start_runtime(tmp_path, certs.dir, probe_port=free_port(), connection_limits=limits)
    try:
        ctx = make_client_ssl_context(cadata=certs.ca.cert_pem)
        flood = [await connect(options.port, ctx) for _ in range(8)]
        assert options.probe_port is not None
        assert await probe(options.probe_port, "/readyz") == 200
        assert await probe(options.probe_port, "/healthz") == 200
        for _, writer in flood:
            writer.close()
    finally:
        await runtime.shutdown()


# -- requests refused from their head, and what the log keeps of hostile ones -------------------------


async def test_expect_100_continue_with_a_body_too_large_gets_413_not_continue(https_server: StartHttpsServer) -> None:
    srv = await https_server(ready_app(), limits=SHORT)
    reader, writer = await connect(srv.port, srv.client_ssl_context())
    head = (
        f"POST /mutate/pods HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nContent-Type: application/json\r\n"
        "Content-Length: 5000000\r\nExpect: 100-continue\r\n\r\n"
    )
    writer.write(head.encode())
    await writer.drain()
    assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 413 ")
    writer.close()
    # A body within bounds still gets "100 Continue", then its answer.
    reader, writer = await connect(srv.port, srv.client_ssl_context())
    body = json.dumps(pod_review("churn")).encode()
    head = (
        f"POST /mutate/pods HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n"
    )
    writer.write(head.encode())
    await writer.drain()
    assert await asyncio.wait_for(reader.readline(), 5) == b"HTTP/1.1 100 Continue\r\n"
    writer.close()


async def test_an_oversized_header_is_refused_without_echoing_or_logging_it(
    https_server: StartHttpsServer, caplog: pytest.LogCaptureFixture
) -> None:
    srv = await https_server(ready_app(), limits=SHORT)
    secret = "eyJhbGciOiJSUzI1NiIsImtpZCI6InNlY3JldCJ9"
    reader, writer = await connect(srv.port, srv.client_ssl_context())
    with caplog.at_level(logging.DEBUG):
        authorization = f"Authorization: Bearer {secret}{'A' * 20_000}\r\n"
        writer.write(f"GET /readyz HTTP/1.1\r\nHost: {SERVICE_HOST}\r\n{authorization}\r\n".encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(65536), 5)
    writer.close()
    assert answer.split(b"\r\n")[0].split()[1] in (b"400", b"431")
    assert secret.encode() not in answer and b"Bearer" not in answer
    assert not [r for r in caplog.records if secret in r.getMessage() or "Bearer" in r.getMessage()]
    assert not [r for r in caplog.records if r.exc_info and secret in str(r.exc_info[1])]
    assert any("malformed HTTP request" in r.getMessage() for r in caplog.records)


async def test_a_failing_review_logs_a_bounded_escaped_uid(
    https_server: StartHttpsServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(_: Any) -> Decision:
        raise RuntimeError("a bug")

    state = cluster_state()
    srv = await https_server(cache_app(state, handlers={"/mutate/pods": broken}), limits=SHORT)
    review = pod_review("churn")
    review["request"]["uid"] = "x\nFORGED 2026-01-01 INFO admin root did something\n" + "u" * 1_000_000
    with caplog.at_level(logging.ERROR):
        async with srv.session.post(srv.url("/mutate/pods"), json=review) as resp:
            assert resp.status == 200
            assert (await resp.json())["response"]["allowed"] is False
    (record,) = [r for r in caplog.records if "admission handler" in r.getMessage()]
    message = record.getMessage()
    assert "\n" not in message and len(message) < 300, message[:400]
    assert "\\nFORGED" in message


async def test_a_route_that_raises_logs_an_escaped_path(
    https_server: StartHttpsServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The path is the caller's and arrives decoded (%0A is a newline): unescaped, it forged log lines.
    async def broken(_: web.Request) -> web.Response:
        raise RuntimeError("a bug")

    state = cluster_state()
    srv = await https_server(cache_app(state, routes=[web.get(r"/broken/{tail:[\s\S]*}", broken)]), limits=SHORT)
    forged = "/broken/x%0AFORGED%202026-01-01%20INFO%20admin%20root%20did%20something%0A" + "u" * 3_000
    with caplog.at_level(logging.ERROR):
        async with srv.session.get(URL(srv.url(forged), encoded=True)) as resp:
            assert resp.status == 500 and "internal error" in (await resp.json())["error"]
    (record,) = [r for r in caplog.records if "unhandled error" in r.getMessage()]
    message = record.getMessage()
    assert "\n" not in message and len(message) < 400, message[:500]
    assert "\\nFORGED" in message


# -- answers not read, pipelining, and the head deadline of every request --------------------------

BIG_ANSWER_BYTES = 512 * 1024  # far above what the kernel's buffers take for a client that never reads


async def big_answer(request: web.Request) -> web.Response:
    size = int(request.query.get("bytes", BIG_ANSWER_BYTES))
    return web.Response(body=b"x" * size, content_type="application/octet-stream")


def big_answer_app() -> web.Application:
    return cache_app(ready_app()[STATE_KEY], routes=[web.get("/big", big_answer)])


GET_BIG = f"GET /big HTTP/1.1\r\nHost: {SERVICE_HOST}\r\n\r\n".encode()


async def unread_connection(port: int, ctx: ssl.SSLContext) -> tuple[socket.socket, asyncio.StreamWriter]:
    """A TLS connection from a socket with a small receive buffer that stops reading after the
    handshake, below TLS too: what the server writes to it stays in the server's buffers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (LOOPBACK, port))
    _, writer = await asyncio.open_connection(sock=sock, ssl=ctx, server_hostname=SERVICE_HOST)
    writer.transport.pause_reading()  # type: ignore[attr-defined]  # a Transport, typed as WriteTransport
    writer.transport._ssl_protocol._transport.pause_reading()  # type: ignore[attr-defined]
    return sock, writer


def established(sock: socket.socket) -> bool:
    """The kernel's TCP state (reading the socket would take the answers this test must leave)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == 1  # TCP_ESTABLISHED


def closed_total(reason: str) -> float:
    return REGISTRY.get_sample_value("webhook_connections_closed_total", {"listener": "test", "reason": reason}) or 0.0


@pytest.mark.parametrize(
    "size",
    [
        BIG_ANSWER_BYTES,  # most of it held in this process: the handler waits in drain()
        40 * 1024,  # all of it in the kernel's send queue, which the client never acknowledges
    ],
)
async def test_a_client_that_never_reads_its_answer_is_closed_at_the_answer_deadline(
    https_server: StartHttpsServer, size: int
) -> None:
    # Without a deadline on writing, a client that never reads would hold its connection, the
    # handler in drain() and the answer's memory for good.
    limits = ConnectionLimits(
        handshake_timeout_s=2, header_timeout_s=0.5, answer_timeout_s=0.5, idle_timeout_s=60, max_connections=64
    )
    srv = await https_server(big_answer_app(), limits=limits)
    before = closed_total("answer_timeout")
    sock, writer = await unread_connection(srv.port, srv.client_ssl_context())
    writer.write(f"GET /big?bytes={size} HTTP/1.1\r\nHost: {SERVICE_HOST}\r\n\r\n".encode())
    await wait_until(lambda: not established(sock), within=20, what="the server to close the connection")
    assert closed_total("answer_timeout") == before + 1
    assert srv.listener.open_connections == 0
    writer.transport.abort()
    sock.close()


async def test_a_keep_alive_client_reading_a_large_answer_slowly_is_not_reset(
    https_server: StartHttpsServer,
) -> None:
    # The deadline is for clients that stopped reading. A keep-alive client that took its last
    # answer up at once, then asks again just before that answer's deadline and takes a large one
    # up slowly (a loaded machine, a small receive window), gets it whole: the old deadline does
    # not carry over, and one still reading past a deadline gets another.
    limits = ConnectionLimits(
        handshake_timeout_s=2, header_timeout_s=5, answer_timeout_s=0.5, idle_timeout_s=60, max_connections=64
    )
    srv = await https_server(big_answer_app(), limits=limits)
    before = closed_total("answer_timeout")
    size = 300 * 1024
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (LOOPBACK, srv.port))
    reader, writer = await asyncio.open_connection(
        sock=sock, ssl=srv.client_ssl_context(), server_hostname=SERVICE_HOST, limit=4096
    )
    small = 100
    writer.write(f"GET /big?bytes={small} HTTP/1.1\r\nHost: {SERVICE_HOST}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert len(await reader.readexactly(small)) == small
    await asyncio.sleep(0.8 * limits.answer_timeout_s)
    writer.write(f"GET /big?bytes={size} HTTP/1.1\r\nHost: {SERVICE_HOST}\r\n\r\n".encode())
    received = 0
    while received < size:
        chunk = await asyncio.wait_for(reader.read(8192), 10)
        assert chunk, f"the connection ended after {received} of {size} bytes"
        received += len(chunk)
        await asyncio.sleep(0.05)  # about 160 KiB/s: the answer spans several deadlines
    assert closed_total("answer_timeout") == before
    writer.close()


async def test_at_the_cap_connections_not_reading_their_answers_make_room_before_a_served_one(
    https_server: StartHttpsServer,
) -> None:
    # Counted as requests in flight, connections whose answers are not read would make newcomers
    # evict the apiserver's keep-alive connection first, then be refused once none was left.
    limits = ConnectionLimits(
        handshake_timeout_s=2, header_timeout_s=30, body_timeout_s=30, answer_timeout_s=60, idle_timeout_s=60,
        max_connections=4,
    )  # fmt: skip
    srv = await https_server(big_answer_app(), limits=limits)
    ctx = srv.client_ssl_context()
    working = await connect(srv.port, ctx)  # as the apiserver: one kept-alive connection
    assert await answer_status(*working, GET_READYZ) == 200
    unread = [await unread_connection(srv.port, ctx) for _ in range(3)]
    for _, writer in unread:
        writer.write(GET_BIG)
    await wait_until(
        lambda: sum(1 for c in srv.listener.connections() if c.unsent_bytes()) == 3,
        within=10,
        what="three answers held for clients that do not read",
    )
    newcomers = []
    for _ in range(3):  # each newcomer takes the room of one that does not read
        newcomers.append(await connect(srv.port, ctx))
        assert await answer_status(*newcomers[-1], GET_READYZ) == 200
    await wait_until(lambda: not any(established(sock) for sock, _ in unread), within=10, what="evictions")
    assert await answer_status(*working, GET_READYZ) == 200  # the served one is still open
    for sock, writer in unread:
        writer.transport.abort()
        sock.close()
    for _, writer in [working, *newcomers]:
        writer.close()


async def read_answers(reader: asyncio.StreamReader, seconds: float) -> tuple[list[int], bool]:
    """The statuses of the answers that arrive within `seconds`, and whether the server closed."""
    statuses: list[int] = []
    try:
        async with asyncio.timeout(seconds):
            while line := await reader.readline():
                status = int(line.split()[1])
                length = 0
                while (header := await reader.readline()) not in (b"\r\n", b""):
                    if header.lower().startswith(b"content-length:"):
                        length = int(header.split(b":")[1])
                await reader.readexactly(length)
                statuses.append(status)
    except TimeoutError:
        return statuses, False
    except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
        pass
    return statuses, True


async def test_a_client_pipelining_past_the_bound_is_closed(https_server: StartHttpsServer) -> None:
    # Unbounded, one connection could queue hundreds of requests, each owed an answer.
    limits = replace(SHORT, idle_timeout_s=30, answer_timeout_s=0.5, max_pipelined=4)
    srv = await https_server(ready_app(), limits=limits)
    before = closed_total("pipeline_limit")
    reader, writer = await connect(srv.port, srv.client_ssl_context())
    writer.write(GET_READYZ * 4)  # as deep as the bound: all answered, the connection stays
    statuses, closed = await read_answers(reader, 1.0)
    assert statuses == [200] * 4 and not closed
    writer.write(GET_READYZ * 40)
    # Past the bound the client gets one 429, and the connection is reset at the answer deadline.
    statuses, closed = await read_answers(reader, 10.0)
    assert closed and statuses == [429]
    assert closed_total("pipeline_limit") == before + 1
    writer.close()


PARTIAL_HEAD = f"GET /readyz HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nX-Slow: ".encode()


def review_request() -> bytes:
    body = json.dumps(pod_review("churn")).encode()
    head = (
        f"POST /mutate/pods HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


@pytest.mark.parametrize("first", ["get", "review"])
async def test_a_partial_head_in_the_same_read_as_a_request_has_the_head_deadline(
    https_server: StartHttpsServer, first: str
) -> None:
    # The start of a second head sent with a complete request has the head's deadline, not the
    # idle timeout of a connection with nothing pending.
    limits = replace(SHORT, idle_timeout_s=60)
    srv = await https_server(ready_app(), limits=limits)
    before = closed_total("header_timeout")
    reader, writer = await connect(srv.port, srv.client_ssl_context())
    writer.write((GET_READYZ if first == "get" else review_request()) + PARTIAL_HEAD)
    statuses, closed = await read_answers(reader, 20.0)
    assert statuses == [200] and closed
    assert closed_total("header_timeout") == before + 1
    writer.close()


@pytest.mark.parametrize("split", ["get", "review", "review, body apart", "two reviews"])
async def test_a_request_that_ends_its_read_leaves_the_connection_idle_past_the_head_deadline(
    https_server: StartHttpsServer, split: str
) -> None:
    srv = await https_server(ready_app(), limits=replace(SHORT, idle_timeout_s=60))
    reader, writer = await connect(srv.port, srv.client_ssl_context())
    review = review_request()
    body_at = review.index(b"\r\n\r\n") + 4
    reads = {
        "get": [GET_READYZ],
        "review": [review],
        "review, body apart": [review[:body_at], review[body_at:]],
        "two reviews": [review, review],
    }[split]
    for data in reads:
        writer.write(data)
        await writer.drain()
        await asyncio.sleep(0.05)
    statuses, closed = await read_answers(reader, 1.5)  # three head deadlines
    assert statuses == [200] * len([r for r in reads if r.startswith((b"GET", b"POST"))]) and not closed
    writer.close()


CR_LF = b"\r\n"


@pytest.mark.parametrize(
    ("segment", "carry", "body_left", "heads", "length", "after"),
    [
        (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", b"", 0, 1, 0, False),
        (b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HT", b"", 0, 1, 0, True),
        (b"\n", b"a\r\n\r", 0, 1, 0, False),  # the blank line split between two reads
        (b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", b"", 0, 1, 2, False),
        (b"\n{}", b"1\r\n\r", 0, 1, 2, False),  # a head's blank line split, then its body
        (b"\n{}G", b"1\r\n\r", 0, 1, 2, True),
        (b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}G", b"", 0, 1, 2, True),
        (b"POST / HTTP/1.1\r\nContent-Length: 6\r\n\r\n{\r\n\r\n}", b"", 0, 1, 6, False),
        (b"}", b"", 1, 0, 0, False),  # the rest of a body begun earlier
        (b"}GET", b"", 1, 0, 0, True),
        (b"}POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", b"", 1, 1, 2, False),
        (b"\r\n\r\n}POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", b"", 5, 1, 2, False),
        (b"}POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}P", b"", 1, 1, 2, True),
        (b"0\r\n\r\n", b"", None, 0, 0, False),  # a chunked body's last chunk
        (b"0\r\n\r\nGET", b"", None, 0, 0, True),
        (b"a" * 10, b"", 0, 2, 4, True),  # several bodies in one read: not told apart, so True
    ],
)
def test_bytes_after_request(
    segment: bytes, carry: bytes, body_left: int | None, heads: int, length: int | None, after: bool
) -> None:
    assert bytes_after_request(segment, carry, body_left, heads, length) is after


async def test_readiness_says_no_room_while_every_connection_is_in_flight_and_the_log_says_it_once(
    https_server: StartHttpsServer, caplog: pytest.LogCaptureFixture
) -> None:
    # With every admission connection taken, the replica must say it is not ready (the probe
    # port answers while the full one cannot) and the log must say so once, not per refusal.
    release = asyncio.Event()
    entered: list[None] = []

    async def held(_: Any) -> Decision:
        entered.append(None)
        await release.wait()
        return Decision.allow()

    limits = ConnectionLimits(handshake_timeout_s=2, header_timeout_s=30, idle_timeout_s=30, max_connections=2)
    app = cache_app(ready_app()[STATE_KEY], handlers={"/mutate/pods": held})
    srv = await https_server(app, limits=limits)
    srv.app[SERVER_KEY].readiness.append(srv.listener.no_room)  # as Runtime does for its admission port
    probes_runner = web.AppRunner(create_probe_app(srv.app), access_log=None)
    await probes_runner.setup()
    probes = Listener(probes_runner, LOOPBACK, 0, srv.watcher.ssl_context, SHORT, "test-probes")
    await probes.start()
    try:
        assert await probe(probes.port, "/readyz") == 200
        ctx = srv.client_ssl_context()
        in_flight = [await connect(srv.port, ctx) for _ in range(2)]
        for _, writer in in_flight:
            writer.write(review_request())
        await wait_until(lambda: len(entered) == 2, what="both reviews in the handler")
        with caplog.at_level(logging.INFO, logger="webhook.http.listener"):
            async with (
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=kubelet_context())) as session,
                session.get(f"https://{LOOPBACK}:{probes.port}/readyz") as resp,
            ):
                assert resp.status == 503
                assert any("connections" in w for w in (await resp.json())["waiting_for"])
            for _ in range(3):
                with pytest.raises((ConnectionError, ssl.SSLError, asyncio.IncompleteReadError)):
                    extra = await connect(srv.port, ctx)
                    await answer_status(*extra, GET_READYZ)
            release.set()
            for reader, _ in in_flight:
                assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 200 ")
            assert await probe(probes.port, "/readyz") == 200
            again = await connect(srv.port, ctx)
            assert await answer_status(*again, GET_READYZ) == 200
        lines = [r.getMessage() for r in caplog.records if r.name == "webhook.http.listener"]
        assert len([m for m in lines if "refusing new ones" in m]) == 1, lines
        assert len([m for m in lines if "accepting new connections again" in m]) == 1, lines
        for _, writer in [*in_flight, again]:
            writer.close()
    finally:
        await probes.stop()
        await probes_runner.cleanup()
