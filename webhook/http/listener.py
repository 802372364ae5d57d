"""Listening sockets with bounds: what an idle, slow or flooding client can hold is limited.

Every connection costs memory from accept on (the TLS state and buffers, the HTTP parser), so a
listener bounds each phase of a connection's life and how many there are:

- the TLS handshake must finish within `handshake_timeout_s` (asyncio aborts it otherwise);
- the head of each request (request line and headers) must arrive within `header_timeout_s` of
  its first byte, and the first request within that time of the handshake: a client that
  connects and says nothing, or dribbles headers (slowloris), is closed;
- an idle keep-alive connection is closed after `idle_timeout_s`. The kube-apiserver's webhook
  client is a Go http.Transport with Kubernetes' defaults (k8s.io/apimachinery utilnet
  SetTransportDefaults): it closes connections idle for 90 s itself. Closing later than that
  means the client always closes first, so a review is never sent on a connection the server is
  closing at that very moment (the apiserver would see a reset and fail the admission);
- at most `max_connections` at once (handshakes in progress included). Past the cap a new
  connection is closed at accept, before any TLS work: the load is shed, and the connections
  already open (the apiserver's keep-alive ones) keep being served.

Kubelet probes and the metrics scraper use a listener of their own (see Runtime), so a flood on
the main port cannot make the pod look dead.

aiohttp's RequestHandler is extended rather than wrapped: it is the one place that knows when a
request's headers are complete (aiohttp is pinned below 4 in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import logging
import ssl
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from webhook.metrics import CONNECTIONS_CLOSED, CONNECTIONS_OPEN

log = logging.getLogger(__name__)


DEFAULT_MAX_CONNECTIONS = 1024
# asyncio gives every TLS connection a receive buffer of SSLProtocol.max_size, 256 KiB, allocated
# at accept and held for the connection's life: most of what an idle connection costs. Two TLS
# records (16 KiB of payload each) per socket read are plenty; a 4 MiB review then takes more
# reads of the socket, each as cheap. Set for the whole process (class attribute of the stdlib).
TLS_READ_BUFFER_BYTES = 32 * 1024


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    handshake_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    # Longer than the apiserver's 90 s idle timeout, so that the apiserver closes first.
    idle_timeout_s: float = 120.0
    # About 45 kB each when idle (bench/idle_connections.py): 1,024 cost under 50 MB. The
    # apiservers keep a few idle connections each (Go keeps 25 per host at most with
    # Kubernetes' defaults; far fewer in practice), so the cap is never reached by them.
    max_connections: int = DEFAULT_MAX_CONNECTIONS


class BoundedRequestHandler(RequestHandler):
    """aiohttp's handler plus the header deadline, and no echo of malformed request heads."""

    __slots__ = ("_header_timeout_s", "_header_timer", "_listener")

    def __init__(self, listener: Listener, server: web.Server, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self._listener = listener
        self._header_timeout_s = listener.limits.header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # After the TLS handshake: from here the first request's head has its deadline.
        self._listener._established(self)
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_header_timer()
        self._listener._lost(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        between_requests = not self._messages and self._current_request is None
        super().data_received(data)
        if self._messages:
            self._disarm_header_timer()  # a request's head is complete
        elif between_requests and self._header_timer is None and data:
            self._arm_header_timer()  # the first bytes of the next request on a kept-alive connection

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self._loop.call_later(self._header_timeout_s, self._header_deadline)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_deadline(self) -> None:
        self._header_timer = None
        if self._messages or self._current_request is not None:
            return
        CONNECTIONS_CLOSED.labels(self._listener.name, "header_timeout").inc()
        self.force_close()

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
            status=status, text=f"{status} {phrase}: malformed request head", content_type="text/plain"
        )
        response.force_close()
        return response


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
    ) -> None:
        self.runner = runner
        self.reuse_port = reuse_port
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.limits = limits
        self.name = name
        self.server: asyncio.Server | None = None
        self._open: set[BoundedRequestHandler] = set()
        # Accepted, handshake not finished: handler -> when asyncio gives up on the handshake.
        self._handshaking: dict[BoundedRequestHandler, float] = {}
        self.accepted = 0  # TCP connections accepted, shed ones included
        self._gauge = CONNECTIONS_OPEN.labels(name)
        self._shed = CONNECTIONS_CLOSED.labels(name, "shed")

    @property
    def open_connections(self) -> int:
        self._forget_failed_handshakes()
        return len(self._open) + len(self._handshaking)

    async def start(self) -> None:
        asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER_BYTES
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            self._accept,
            self.host,
            self.port,
            ssl=self.ssl_context,
            ssl_handshake_timeout=self.limits.handshake_timeout_s if self.ssl_context else None,
            backlog=128,
            reuse_port=self.reuse_port or None,
        )
        if self.port == 0:
            self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def _accept(self) -> asyncio.BaseProtocol:
        self.accepted += 1
        if self.open_connections >= self.limits.max_connections:
            self._shed.inc()
            raise Shed(f"{self.name} listener: {self.limits.max_connections} connections open")
        server = self.runner.server
        assert server is not None, "the runner is set up before the listener starts"
        # The same arguments aiohttp's own Server.__call__ gives its handlers.
        handler = BoundedRequestHandler(self, server, loop=asyncio.get_running_loop(), **server._kwargs)
        if self.ssl_context is not None:
            self._handshaking[handler] = asyncio.get_running_loop().time() + self.limits.handshake_timeout_s + 1
        else:
            self._open.add(handler)
        self._gauge.set(len(self._open) + len(self._handshaking))
        return handler

    def _forget_failed_handshakes(self) -> None:
        # A handshake that fails or times out never reaches the handler: asyncio has closed the
        # socket by its deadline, so an entry past it is a connection that no longer exists.
        if not self._handshaking:
            return
        now = asyncio.get_running_loop().time()
        for handler, deadline in list(self._handshaking.items()):
            if deadline <= now:
                del self._handshaking[handler]

    def _established(self, handler: BoundedRequestHandler) -> None:
        self._handshaking.pop(handler, None)
        self._open.add(handler)

    def _lost(self, handler: BoundedRequestHandler) -> None:
        self._open.discard(handler)
        self._handshaking.pop(handler, None)
        self._gauge.set(len(self._open) + len(self._handshaking))
