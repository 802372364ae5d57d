"""A stopping server never closes a keep-alive connection under the apiserver.

The kube-apiserver keeps HTTP/1.1 connections to a webhook alive and does not resend a review
that met a closing connection: the admission fails ("EOF"). So while the server stops, each answer
says "Connection: close", and a connection its client still holds stays open until the client
closes it or the linger ends (webhook.http.listener, Runtime.shutdown).

The server runs in this process on the example state with its admission port, as the chart runs
it; the clients are raw TLS connections, which show every header and when a connection ends.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any

import pytest

from tests.support.https import LOOPBACK, SERVICE_HOST, CertFiles, client_ssl_context, make_cert_files
from tests.support.reviews import pod_review
from tests.test_admission_port import start as start_with_admission_port
from webhook.runtime import Runtime

EXAMPLE_CLUSTER = Path(__file__).resolve().parents[1] / "examples" / "cluster"
DRAIN_SECONDS = 0.5


class Connection:
    """One keep-alive connection, as the apiserver's client holds it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, ctx: ssl.SSLContext) -> Connection:
        reader, writer = await asyncio.open_connection(LOOPBACK, port, ssl=ctx, server_hostname=SERVICE_HOST)
        return cls(reader, writer)

    async def review(self) -> tuple[int, dict[str, str]]:
        """POST a review; the status and headers of the answer (its body read, not kept)."""
        body = json.dumps(pod_review("vision", dry_run=True)).encode()
        head = (f"POST /mutate/pods HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
        self.writer.write(head + body)
        await self.writer.drain()
        raw = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        status_line, *lines = raw.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines if ":" in line)}
        await asyncio.wait_for(self.reader.readexactly(int(headers["content-length"])), 10)
        return int(status_line.split()[1]), headers

    async def closed_by_server(self, within: float) -> bool:
        try:
            return await asyncio.wait_for(self.reader.read(1), within) == b""
        except TimeoutError:
            return False

    def close(self) -> None:
        self.writer.close()


async def start(tmp_path: Path, certs: CertFiles, linger_seconds: float) -> tuple[Runtime, int]:
    runtime, _ = await start_with_admission_port(
        tmp_path, certs, drain_seconds=DRAIN_SECONDS, linger_seconds=linger_seconds
    )
    assert runtime.admission_port is not None
    return runtime, runtime.admission_port


@pytest.fixture
def certs(tmp_path: Path) -> CertFiles:
    return make_cert_files(tmp_path / "certs")


async def test_a_connection_held_through_the_drain_is_answered_and_told_to_close(
    tmp_path: Path, certs: CertFiles
) -> None:
    runtime, port = await start(tmp_path, certs, linger_seconds=30.0)
    ctx = client_ssl_context(certs.ca.cert_pem)
    busy, idle = await Connection.open(port, ctx), await Connection.open(port, ctx)
    stopping: asyncio.Task[Any] | None = None
    try:
        for conn in (busy, idle):
            status, headers = await conn.review()
            assert status == 200 and headers.get("connection", "").lower() != "close", headers

        stopping = asyncio.create_task(runtime.shutdown())
        await asyncio.sleep(DRAIN_SECONDS / 2)
        # Draining: answered, and told to close: the client takes its next review elsewhere.
        status, headers = await busy.review()
        assert (status, headers.get("connection")) == (200, "close"), headers
        assert await busy.closed_by_server(within=5)

        # Past the drain the listener no longer accepts, but the connection the client still holds
        # is not closed under it: a review sent on it now is answered, not met by a close.
        await asyncio.sleep(DRAIN_SECONDS + 0.5)
        assert not stopping.done()
        status, headers = await idle.review()
        assert (status, headers.get("connection")) == (200, "close"), headers
        assert await idle.closed_by_server(within=5)

        # Every client closed its connection: the stop goes on without waiting out the linger.
        # The linger is 30 s: a stop that waited it out would miss this bound.
        await asyncio.wait_for(stopping, timeout=20)
    finally:
        busy.close()
        idle.close()
        if stopping is None:
            await runtime.shutdown()


async def test_a_connection_left_idle_is_closed_when_the_linger_ends(tmp_path: Path, certs: CertFiles) -> None:
    runtime, port = await start(tmp_path, certs, linger_seconds=1.0)
    ctx = client_ssl_context(certs.ca.cert_pem)
    idle = await Connection.open(port, ctx)
    try:
        status, _ = await idle.review()
        assert status == 200
        stopping = asyncio.create_task(runtime.shutdown())
        # The drain, then the linger: the server closes what its client never closed.
        assert await idle.closed_by_server(within=DRAIN_SECONDS + 1.0 + 10)
        await asyncio.wait_for(stopping, timeout=10)
    finally:
        idle.close()
