"""Listening sockets with bounds: what an idle, slow or flooding client can hold is limited.

Every connection costs memory from accept on (the TLS state and buffers, the HTTP parser), so a
listener bounds each phase of a connection's life and how many there are:

- the TLS handshake must finish within `handshake_timeout_s` (asyncio aborts it otherwise);
- the head of each request (request line and headers) must arrive within `header_timeout_s` of
  its first byte, and the first request within that time of the handshake: a client that
  connects and says nothing, or dribbles headers (slowloris), is closed;
- the body must be complete within `body_timeout_s` of the head: a client that announces
  megabytes and sends a byte a minute is closed;
- an idle keep-alive connection is closed after `idle_timeout_s`. The kube-apiserver's webhook
  client is a Go http.Transport with Kubernetes' defaults (k8s.io/apimachinery utilnet
  SetTransportDefaults): it closes connections idle for 90 s itself. Closing later than that
  means the client always closes first, so a review is never sent on a connection the server is
  closing at that very moment (the apiserver would see a reset and fail the admission);
- at most `max_connections` at once (handshakes in progress included). At the cap a new
  connection makes room: the oldest connection that never completed a request is closed (then,
  if none, the longest idle), never one with a request in flight (webhook.http.connections).
  Only when every connection has a request in flight is the newcomer refused at accept.

A listener given `client_names` (the admission listener, whose context requires a client
certificate from the apiserver's CA) also closes, right after the handshake, a connection whose
certificate names none of them: a CA that signs other clients too then still admits only the
apiserver.

Kubelet probes and the metrics scraper use a listener of their own (see Runtime), so a flood on
the main port cannot make the pod look dead.

aiohttp's RequestHandler is extended rather than wrapped: it is the one place that knows when a
request's headers and body are complete (aiohttp is pinned below 4 in pyproject.toml). TLS is
asyncio's own SSLProtocol, created here so that a connection is closable during its handshake.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import logging
import math
import ssl
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from webhook.http.app import request_handler
from webhook.http.connections import NEVER_SERVED, SERVED, ConnectionTable
from webhook.logsafe import log_safe
from webhook.metrics import CONNECTIONS_CLOSED, CONNECTIONS_OPEN
from webhook.tls.watcher import client_certificate_names

log = logging.getLogger(__name__)


DEFAULT_MAX_CONNECTIONS = 1024
# asyncio gives every TLS connection a receive buffer of SSLProtocol.max_size, 256 KiB, allocated
# at accept and held for the connection's life: most of what an idle connection costs. Two TLS
# records (16 KiB of payload each) per socket read are plenty; a 4 MiB review then takes more
# reads of the socket, each as cheap. Set for the whole process (class attribute of the stdlib).
TLS_READ_BUFFER_BYTES = 32 * 1024


# Why the server closed a connection (the reason label of webhook_connections_closed_total).
SHED = "shed"
EVICTED = "evicted"
HEADER_TIMEOUT = "header_timeout"
BODY_TIMEOUT = "body_timeout"
CLIENT_REFUSED = "client_refused"  # a verified client certificate that names no accepted client


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    handshake_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    # From the end of a request's head to the end of its body. The apiserver sends a review at
    # once; 4 MiB in 10 s is 400 KiB/s, far below any pod network.
    body_timeout_s: float = 10.0
    # Longer than the apiserver's 90 s idle timeout, so that the apiserver closes first.
    idle_timeout_s: float = 120.0
    # About 45 kB each when idle (bench/idle_connections.py): 1,024 cost under 50 MB. The
    # apiservers keep a few idle connections each (Go keeps 25 per host at most with
    # Kubernetes' defaults; far fewer in practice), so the cap is never reached by them.
    max_connections: int = DEFAULT_MAX_CONNECTIONS


class BoundedRequestHandler(RequestHandler):
    """aiohttp's handler plus the head and body deadlines, and no echo of malformed request heads.

    One timer per connection: it ticks at most every `header_timeout_s` and compares the clock
    with `_deadline`, which a request's phases only overwrite (a float, no timer armed per
    request)."""

    __slots__ = (
        "_body",
        "_body_timeout_s",
        "_deadline",
        "_deadline_reason",
        "_header_timeout_s",
        "_listener",
        "_since",
        "_socket",
        "_tick_s",
        "_timer",
        "_timer_at",
    )

    def __init__(self, listener: Listener, server: web.Server, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self._listener = listener
        self._request_handler = listener.request_handler  # type: ignore[assignment]  # it takes the app's Request
        self._header_timeout_s = listener.limits.header_timeout_s
        self._body_timeout_s = listener.limits.body_timeout_s
        self._tick_s = max(self._header_timeout_s, self._body_timeout_s)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._deadline = math.inf
        self._deadline_reason = HEADER_TIMEOUT
        # The payload of the request whose body is still arriving, if any.
        self._body: Any = None
        # When the connection was accepted, then when its latest request began (its first byte).
        self._since = self._loop.time()
        # The socket's own transport (below TLS): closing it drops the connection at once,
        # without waiting on a TLS close_notify from a client that may never answer.
        self._socket: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # After the TLS handshake: from here the first request's head has its deadline.
        if self._socket is None:
            self._socket = transport
        super().connection_made(transport)
        if self._listener.client_names and not self._listener.accepts_client(transport):
            # Before the abort: a request that came with the handshake's last flight is already
            # read and is fed to this handler once this returns; aiohttp drops data on a handler
            # being force-closed.
            self._force_close = True
            self.abort()
            return
        self._set_deadline(self._loop.time() + self._header_timeout_s, HEADER_TIMEOUT)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._body = None
        self._listener._lost(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        count = self._request_count
        super().data_received(data)
        if self._request_count != count:  # a head is complete
            payload = self._messages[-1][1] if self._messages else None
            if payload is not None and not payload.is_eof():
                self._body = payload
                self._set_deadline(self._loop.time() + self._body_timeout_s, BODY_TIMEOUT)
            else:
                self._body = None
                self._deadline = math.inf
        elif self._body is not None:
            if self._body.is_eof():
                self._body = None
                self._deadline = math.inf
        elif self._deadline == math.inf and data:  # the first bytes of the next request
            now = self._loop.time()
            self._since = now
            self._set_deadline(now + self._header_timeout_s, HEADER_TIMEOUT)

    def _set_deadline(self, at: float, reason: str) -> None:
        self._deadline = at
        self._deadline_reason = reason
        if at < self._timer_at:  # rare: the timer would tick too late for this deadline
            self._arm(at)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        if self._force_close:
            return
        now = self._loop.time()
        if now < self._deadline:
            self._arm(min(self._deadline, now + self._tick_s))
            return
        if self._deadline_reason == HEADER_TIMEOUT and (self._messages or self._request_in_progress):
            # A pipelined head behind a request still being answered: its clock starts later.
            self._set_deadline(now + self._header_timeout_s, HEADER_TIMEOUT)
            return
        self._listener._closed(self._deadline_reason)
        self.abort()

    def abort(self) -> None:
        """Close the connection now (no TLS goodbye): a deadline passed, or the cap needs room."""
        if self._socket is not None:
            self._socket.abort()  # type: ignore[attr-defined]
        elif self.transport is not None:
            self.transport.abort()

    def eviction_rank(self) -> tuple[int, float] | None:
        """How soon to close this one to make room (see webhook.http.connections)."""
        if self._socket is None:
            return None  # accepted this very moment, not yet attached to its socket
        if self._force_close or self._close:
            return (NEVER_SERVED, self._since)
        busy = self._request_in_progress or bool(self._messages)
        if busy and self._body is None:
            return None  # a request in flight
        served = self._request_count > (1 if busy else 0)
        return (SERVED if served else NEVER_SERVED, self._since)

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        # The parser's message quotes the start of the offending line, which can be an
        # Authorization header: neither the log nor the answer repeats it.
        log.warning(
            "refused a malformed HTTP request from %s: %s (HTTP %d)", request.remote, type(exc).__name__, status
        )
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Bad Request"
        response = web.Response(
            status=status,
            text=f"{status} {phrase}: malformed request head",
            content_type="text/plain",
            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"},
        )
        response.force_close()
        return response


class TlsConnection(asyncio.sslproto.SSLProtocol):
    """asyncio's own TLS protocol, made by the listener instead of by asyncio, so that the
    listener holds a connection from accept on and can close it during its handshake too."""

    def __init__(self, handler: BoundedRequestHandler, ssl_context: ssl.SSLContext, handshake_timeout_s: float) -> None:
        super().__init__(
            asyncio.get_running_loop(),
            handler,
            ssl_context,
            None,  # type: ignore[arg-type]  # no waiter: a failed handshake just closes the socket
            server_side=True,
            ssl_handshake_timeout=handshake_timeout_s,  # type: ignore[arg-type]  # a float, as asyncio takes it
        )
        self._handler = handler

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._handler._socket = transport
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        # A handshake that failed or timed out never reaches the handler: forget it here.
        self._handler._listener._lost(self._handler)


class Shed(ConnectionRefusedError):
    """Raised from the protocol factory: asyncio then drops the socket before any TLS work."""


class Listener:
    """One listening socket serving `runner`'s application with `limits`."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        limits: ConnectionLimits,
        name: str = "main",
        *,
        reuse_port: bool = False,
        client_names: frozenset[str] = frozenset(),
    ) -> None:
        self.runner = runner
        self.client_names = client_names
        self._refused_clients = 0
        self.reuse_port = reuse_port
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.limits = limits
        self.name = name
        self.server: asyncio.Server | None = None
        # From accept (handshakes included) until lost.
        self._table: ConnectionTable[BoundedRequestHandler] = ConnectionTable(
            served_batch=max(1, limits.max_connections // 64)
        )
        self.accepted = 0  # TCP connections accepted, shed ones included
        # The admission routes without the router, the rest through it (webhook.http.app).
        self.request_handler = request_handler(runner.app)
        self._gauge = CONNECTIONS_OPEN.labels(name)
        self._closed_counters = {
            reason: CONNECTIONS_CLOSED.labels(name, reason)
            for reason in (SHED, EVICTED, HEADER_TIMEOUT, BODY_TIMEOUT, CLIENT_REFUSED)
        }

    @property
    def open_connections(self) -> int:
        return len(self._table)

    async def start(self) -> None:
        asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER_BYTES
        loop = asyncio.get_running_loop()
        # TLS is layered by _accept (TlsConnection), not by asyncio: see TlsConnection.
        self.server = await loop.create_server(
            self._accept, self.host, self.port, backlog=128, reuse_port=self.reuse_port or None
        )
        if self.port == 0:
            self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def _accept(self) -> asyncio.BaseProtocol:
        self.accepted += 1
        if len(self._table) >= self.limits.max_connections:
            victims = self._table.make_room()
            if not victims:  # every connection has a request in flight: real load, shed it
                self._closed(SHED)
                raise Shed(f"{self.name} listener: {self.limits.max_connections} connections busy")
            for victim in victims:
                self._closed(EVICTED)
                victim.abort()
        server = self.runner.server
        assert server is not None, "the runner is set up before the listener starts"
        # The same arguments aiohttp's own Server.__call__ gives its handlers.
        handler = BoundedRequestHandler(self, server, loop=asyncio.get_running_loop(), **server._kwargs)
        self._table.add(handler)
        self._gauge.set(len(self._table))
        if self.ssl_context is None:
            return handler
        return TlsConnection(handler, self.ssl_context, self.limits.handshake_timeout_s)

    def accepts_client(self, transport: asyncio.BaseTransport) -> bool:
        """Whether the verified client certificate names one of `client_names`; a refusal is
        counted, and logged on the first and then every 1,000th time (a flood writes no flood of lines)."""
        names = client_certificate_names(transport.get_extra_info("peercert"))
        if names & self.client_names:
            return True
        self._closed(CLIENT_REFUSED)
        if self._refused_clients % 1000 == 0:
            log.warning(
                "%s listener: closed a connection whose client certificate names %s, none of the accepted %s "
                "(%d refused so far)",
                self.name,
                log_safe(sorted(names), 200),
                sorted(self.client_names),
                self._refused_clients + 1,
            )
        self._refused_clients += 1
        return False

    def _closed(self, reason: str) -> None:
        self._closed_counters[reason].inc()

    def _lost(self, handler: BoundedRequestHandler) -> None:
        self._table.discard(handler)
        self._gauge.set(len(self._table))
