"""The admission webhooks on a port of their own (`serve --admission-port`), over real HTTPS.

Only that port serves /mutate/* and /validate/*, and only it asks for the apiserver's client
certificate (`--client-ca`) and checks the names on it (`--client-name`): the console and the APIs
on the main port stay reachable by browsers and API clients, which have no such certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.https import LOOPBACK, SERVICE_HOST, CertFiles, client_ssl_context, free_port, make_cert_files
from tests.support.reviews import pod_review
from webhook.metrics import CONNECTIONS_CLOSED, admission_counts
from webhook.runtime import Runtime, ServeOptions, StartupError
from webhook.tls.issuing import make_client_cert

EXAMPLE_CLUSTER = Path(__file__).resolve().parents[1] / "examples" / "cluster"
APISERVER = "kube-apiserver-webhook-client"


async def start(tmp_path: Path, certs: CertFiles, **options: Any) -> tuple[Runtime, ServeOptions]:
    """`serve --state <copy of examples/cluster> --admission-port N` in this process."""
    state = tmp_path / "state"
    shutil.copytree(EXAMPLE_CLUSTER, state)
    serve = ServeOptions(
        host=LOOPBACK,
        port=free_port(),
        admission_port=free_port(),
        certs=certs.dir,
        state_dir=state,
        **{"drain_seconds": 0.0, "linger_seconds": 0.0, **options},
    )
    runtime = Runtime(serve)
    await runtime.start()
    return runtime, serve


async def call(port: int, ctx: ssl.SSLContext, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    connector = aiohttp.TCPConnector(ssl=ctx)
    async with aiohttp.ClientSession(connector=connector) as session:
        kwargs: dict[str, Any] = {"json": body} if body is not None else {}
        async with session.request(method, f"https://{LOOPBACK}:{port}{path}", **kwargs) as resp:
            text = await resp.text()
            return resp.status, json.loads(text) if resp.content_type == "application/json" else text


def review() -> dict[str, Any]:
    return pod_review("vision", dry_run=True)


async def request_in_the_handshakes_last_flight(port: int, ctx: ssl.SSLContext, body: bytes) -> bytes:
    """A POST written in the same TCP write as the client's Finished message, so that the server
    reads both at once; returns whatever the server sent back before closing."""
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=SERVICE_HOST)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            if outgoing.pending:
                writer.write(outgoing.read())
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("closed during the handshake") from None
            incoming.write(data)
    head = (f"POST /validate/pods HTTP/1.1\r\nHost: {SERVICE_HOST}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    tls.write(head + body)
    writer.write(outgoing.read())  # the Finished message and the request, in one write
    answer = b""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while data := await asyncio.wait_for(reader.read(65536), 5):
            incoming.write(data)
            with contextlib.suppress(ssl.SSLWantReadError):
                answer += tls.read(65536)
    writer.close()
    return answer


def reviews_answered() -> int:
    counts = admission_counts("validate_pods")
    return counts.allowed + counts.patched + counts.denied + counts.bad_request + counts.internal_errors


def closed_for(reason: str) -> float:
    return float(CONNECTIONS_CLOSED.labels("admission", reason)._value.get())


async def test_the_webhooks_answer_on_the_admission_port_only_and_the_console_on_the_main_port(
    tmp_path: Path,
) -> None:
    certs = make_cert_files(tmp_path / "certs")
    runtime, options = await start(tmp_path, certs)
    ctx = client_ssl_context(certs.ca.cert_pem)
    assert options.admission_port is not None
    try:
        status, answer = await call(options.admission_port, ctx, "POST", "/validate/pods", review())
        assert status == 200 and answer["response"]["allowed"] is True, answer
        status, answer = await call(options.port, ctx, "POST", "/validate/pods", review())
        assert status == 404, answer
        status, _ = await call(options.port, ctx, "GET", "/ui/")
        assert status == 200
        status, _ = await call(options.admission_port, ctx, "GET", "/ui/")
        assert status == 404
        # Probes and readiness stay where they were: one status for both ports.
        status, _ = await call(options.port, ctx, "GET", "/readyz")
        assert status == 200
    finally:
        await runtime.shutdown()


async def test_with_a_client_ca_only_the_admission_port_asks_for_the_apiservers_certificate(tmp_path: Path) -> None:
    certs = make_cert_files(tmp_path / "certs", client_ca=True)
    assert certs.client_ca_file is not None
    runtime, options = await start(tmp_path, certs, client_ca=certs.client_ca_file)
    assert options.admission_port is not None
    anonymous = client_ssl_context(certs.ca.cert_pem)
    apiserver = client_ssl_context(certs.ca.cert_pem, certs.client, tmp_path)
    try:
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            await call(options.admission_port, anonymous, "POST", "/validate/pods", review())
        status, answer = await call(options.admission_port, apiserver, "POST", "/validate/pods", review())
        assert status == 200 and answer["response"]["allowed"] is True
        # The console's port never asks for one: a browser has none.
        status, _ = await call(options.port, anonymous, "GET", "/ui/")
        assert status == 200
    finally:
        await runtime.shutdown()


async def test_a_certificate_of_the_client_ca_that_names_another_client_is_closed_after_the_handshake(
    tmp_path: Path,
) -> None:
    """A CA that signs more clients than the apiserver (a cluster CA) still lets only the names given in."""
    certs = make_cert_files(tmp_path / "certs", client_ca=True)
    assert certs.client_ca_file is not None and certs.client_ca is not None
    runtime, options = await start(tmp_path, certs, client_ca=certs.client_ca_file, client_names=(APISERVER,))
    assert options.admission_port is not None
    other = make_client_cert(certs.client_ca, common_name="system:kube-scheduler", days=1)
    before, answered = closed_for("client_refused"), reviews_answered()
    try:
        for _ in range(5):
            with pytest.raises((aiohttp.ClientError, ConnectionError)):
                await call(
                    options.admission_port,
                    client_ssl_context(certs.ca.cert_pem, other, tmp_path),
                    "POST",
                    "/validate/pods",
                    review(),
                )
        assert closed_for("client_refused") == before + 5
        # A request that arrives together with the handshake's last flight is not read either.
        wrong = client_ssl_context(certs.ca.cert_pem, other, tmp_path)
        answer = await request_in_the_handshakes_last_flight(
            options.admission_port, wrong, json.dumps(review()).encode()
        )
        assert answer == b"" and closed_for("client_refused") == before + 6
        assert reviews_answered() == answered
        named = make_client_cert(certs.client_ca, common_name=APISERVER, days=1)
        status, answer = await call(
            options.admission_port,
            client_ssl_context(certs.ca.cert_pem, named, tmp_path),
            "POST",
            "/validate/pods",
            review(),
        )
        assert status == 200 and answer["response"]["allowed"] is True
    finally:
        await runtime.shutdown()


async def test_a_client_name_without_a_client_ca_does_not_start(tmp_path: Path) -> None:
    certs = make_cert_files(tmp_path / "certs")
    with pytest.raises(StartupError, match="--client-name needs --client-ca"):
        await start(tmp_path, certs, client_names=(APISERVER,))
