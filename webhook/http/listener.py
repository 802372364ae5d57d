"""Listening sockets with bounds: what an idle, slow or flooding client can hold is limited.

Every connection costs memory from accept on (the TLS state and buffers, the HTTP parser), so a
listener bounds each phase of a connection's life and how many there are:

- the TLS handshake must finish within `handshake_timeout_s` (asyncio aborts it otherwise);
- the head of each request (request line and headers) must arrive within `header_timeout_s` of
  its first byte, and the first request within that time of the handshake: a client that
  connects and says nothing, or dribbles headers (slowloris), is closed. A head that begins in
  the same read as the end of the request before it has the same deadline: see
  `bytes_after_request`;
- the body must be complete within `body_timeout_s` of the head: a client that announces
  megabytes and sends a byte a minute is closed;
- each answer must be taken up within `answer_timeout_s` of when its writing began: by then
  neither this process nor the kernel's send queue may hold any of the connection's outgoing
  bytes unacknowledged (`not_reading`), unless the client is still taking them up, slowly (they
  shrank, or more was written, over the moment after the deadline): then it has another
  `answer_timeout_s`. A client that asks and stops reading is reset, instead of holding its
  answers, the handler writing them and the requests queued behind them for good;
- at most `max_pipelined` requests of a connection may wait for their answers (the one being
  answered included): past that, nothing more of the connection is read or answered, and it is
  reset when the answer deadline passes. The kube-apiserver's Go client never pipelines; answers
  a client would be owed cost memory and CPU until they are read;
- an idle keep-alive connection is closed after `idle_timeout_s`. The kube-apiserver's webhook
  client is a Go http.Transport with Kubernetes' defaults (k8s.io/apimachinery utilnet
  SetTransportDefaults): it closes connections idle for 90 s itself. Closing later than that
  means the client always closes first, so a review is never sent on a connection the server is
  closing at that very moment (the apiserver would see a reset and fail the admission);
- while the server stops (`begin_drain`), every answer says "Connection: close", and the server
  waits for its clients to close their connections before it closes what is left, for the same
  reason;
- at most `max_connections` at once (handshakes in progress included). At the cap a new
  connection makes room: the oldest connection that never completed a request or does not read
  its answers is closed (then, if none, the longest idle), never one with a request in flight
  (webhook.http.connections). Only when every connection has a request in flight is the
  newcomer refused at accept; readiness then says so (`Listener.no_room`), and the log says
  once when the refusing starts and once when it stops.

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
import contextlib
import fcntl
import logging
import math
import socket
import ssl
import struct
import termios
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from webhook.http.app import NO_STORE, NOSNIFF, request_handler
from webhook.http.connections import NEVER_SERVED, SERVED, ConnectionTable
from webhook.logsafe import log_safe
from webhook.metrics import CONNECTIONS_CLOSED, CONNECTIONS_OPEN
from webhook.tls.watcher import client_certificate_names

log = logging.getLogger(__name__)


DEFAULT_MAX_CONNECTIONS = 1024
# The apiserver reads an answer (a few KiB) as it arrives; 10 s is its default webhook timeout.
DEFAULT_ANSWER_TIMEOUT_S = 10.0
# Requests of one connection waiting for their answers. The apiserver sends one at a time.
DEFAULT_MAX_PIPELINED = 4
# asyncio gives every TLS connection a receive buffer of SSLProtocol.max_size, 256 KiB, allocated
# at accept and held for the connection's life: most of what an idle connection costs. Two TLS
# records (16 KiB of payload each) per socket read are plenty; a 4 MiB review then takes more
# reads of the socket, each as cheap. Set for the whole process (class attribute of the stdlib).
TLS_READ_BUFFER_BYTES = 32 * 1024
# asyncio lets 512 KiB of encrypted answers wait per TLS connection before it tells the writer to
# wait (FLOW_CONTROL_HIGH_WATER_SSL_WRITE): a client that never reads makes the server hold that
# much for it. An answer is a few KiB; past this much unsent, the writer waits for the client.
TLS_WRITE_BUFFER_BYTES = 64 * 1024
# The kernel's send buffer of an accepted socket. Left to Linux, it grows to tcp_wmem's maximum
# (4 MiB by default) for a client that stops reading: kernel memory, charged to the pod, held for
# a client that may never read it. Fixed at this size (the kernel doubles it for its bookkeeping).
# Answers are a few KiB; 64 KiB in flight fills any cluster network.
SOCKET_SEND_BUFFER_BYTES = 64 * 1024
# Longer than a delayed ACK (at most 200 ms on Linux): an answer this old and still not
# acknowledged was not read.
NOT_READING_AFTER_S = 1.0
# The ioctl that reads a TCP socket's unacknowledged send queue (Linux; termios names it TIOCOUTQ).
SIOCOUTQ: int | None = getattr(termios, "TIOCOUTQ", None)
LINGER_NONE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection


# Why the server closed a connection (the reason label of webhook_connections_closed_total).
SHED = "shed"
EVICTED = "evicted"
HEADER_TIMEOUT = "header_timeout"
BODY_TIMEOUT = "body_timeout"
CLIENT_REFUSED = "client_refused"  # a verified client certificate that names no accepted client
ANSWER_TIMEOUT = "answer_timeout"
PIPELINE_LIMIT = "pipeline_limit"
CLOSE_REASONS = (SHED, EVICTED, HEADER_TIMEOUT, BODY_TIMEOUT, CLIENT_REFUSED, ANSWER_TIMEOUT, PIPELINE_LIMIT)
HEAD_END = b"\r\n\r\n"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    handshake_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    # From the end of a request's head to the end of its body. The apiserver sends a review at
    # once; 4 MiB in 10 s is 400 KiB/s, far below any pod network.
    body_timeout_s: float = 10.0
    # Longer than the apiserver's 90 s idle timeout, so that the apiserver closes first.
    idle_timeout_s: float = 120.0
    answer_timeout_s: float = DEFAULT_ANSWER_TIMEOUT_S
    max_pipelined: int = DEFAULT_MAX_PIPELINED
    # About 45 kB each when idle (bench/idle_connections.py): 1,024 cost under 50 MB. The
    # apiservers keep a few idle connections each (Go keeps 25 per host at most with
    # Kubernetes' defaults; far fewer in practice), so the cap is never reached by them.
    max_connections: int = DEFAULT_MAX_CONNECTIONS


def body_length(message: Any) -> int | None:
    """The body a parsed request head announces: its Content-Length, 0 for none, None when
    chunked (or for the parser's error placeholder, which has no headers)."""
    if getattr(message, "chunked", False):
        return None
    headers = getattr(message, "headers", None)
    if headers is None:
        return None
    value = headers.get("Content-Length")
    try:
        return int(value) if value else 0
    except ValueError:
        return None


def bytes_after_request(segment: bytes, carry: bytes, body_left: int | None, heads: int, length: int | None) -> bool:
    """Whether `segment`, the read in which a request became complete, holds bytes after it: the
    start of another head, whose deadline then runs from this read (aiohttp's C parser keeps a
    partial head to itself, so this is worked out from the bytes).

    `carry`: the last bytes of the read before (a head's blank line can straddle two reads);
    `body_left`: what a body in progress before this read still lacked (0: none; None: chunked);
    `heads`: the request heads this read completed; `length`: the body of the last of them
    (`body_length`). Requests end in a blank line (a head, or a chunked body's last chunk and
    trailers) or after exactly Content-Length bytes; line ends are CRLF, which the parser
    requires of requests. When this cannot tell (several requests with Content-Length bodies in
    one read, after a chunked body), the answer is True: the head deadline then closes the
    connection if nothing follows, which only a client that pipelines may meet."""
    if heads == 0:  # the read ended a body begun earlier
        if body_left is None:
            return not _ends_with_blank_line(carry, segment)
        return len(segment) > body_left
    if length is None or length == 0:  # the last request ends with a blank line
        return not _ends_with_blank_line(carry, segment)
    if heads > 1 or body_left is None:
        return True
    if body_left == 0:  # the head may have begun in the read before
        straddling = (carry + segment[: len(HEAD_END) - 1]).find(HEAD_END)
        head_end = straddling + len(HEAD_END) - len(carry) if straddling >= 0 else -1
    else:  # the end of the earlier body comes first
        head_end = -1
    if head_end < 0:
        blank = segment.find(HEAD_END, body_left)
        if blank < 0:
            return True
        head_end = blank + len(HEAD_END)
    return len(segment) - head_end > length


def _ends_with_blank_line(carry: bytes, segment: bytes) -> bool:
    # Without copying the segment (a read is up to TLS_READ_BUFFER_BYTES).
    if len(segment) >= len(HEAD_END):
        return segment.endswith(HEAD_END)
    return (carry + segment).endswith(HEAD_END)


class BoundedRequestHandler(RequestHandler):
    """aiohttp's handler plus the head, body and answer deadlines, the pipelining bound, and no
    echo of malformed request heads.

    One timer per connection: it ticks at most every `header_timeout_s` and compares the clock
    with `_deadline` (the head or body in progress) and `_answer_by` (the oldest answer not yet
    taken up), which a request's phases only overwrite (floats, no timer armed per request)."""

    __slots__ = (
        "_answer_by",
        "_answer_probe",
        "_answer_timeout_s",
        "_answering",
        "_body",
        "_body_length",
        "_body_timeout_s",
        "_carry",
        "_deadline",
        "_deadline_reason",
        "_header_timeout_s",
        "_latest_write",
        "_listener",
        "_max_pipelined",
        "_since",
        "_sock",
        "_socket",
        "_tick_s",
        "_timer",
        "_timer_at",
    )

    def __init__(self, listener: Listener, server: web.Server, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self._listener = listener
        self._request_handler = listener.request_handler  # type: ignore[assignment]  # it takes the app's Request
        limits = listener.limits
        self._header_timeout_s = limits.header_timeout_s
        self._body_timeout_s = limits.body_timeout_s
        self._answer_timeout_s = limits.answer_timeout_s
        self._max_pipelined = limits.max_pipelined
        self._tick_s = max(self._header_timeout_s, self._body_timeout_s)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._deadline = math.inf
        self._deadline_reason = HEADER_TIMEOUT
        self._answer_by = math.inf
        # At a due answer whose bytes are still held: (unsent bytes, last write) then, to tell a
        # client reading slowly (they shrink or a write follows) from one that stopped.
        self._answer_probe: tuple[int, float] | None = None
        self._answering = False
        # When an answer (or the TLS handshake's last message) was last written.
        self._latest_write = self._loop.time()
        # The payload of the request whose body is still arriving, if any, and its length
        # (None: chunked).
        self._body: Any = None
        self._body_length: int | None = 0
        # The last bytes read, for a head's blank line split between two reads.
        self._carry = b""
        # When the connection was accepted, then when its latest request began (its first byte).
        self._since = self._loop.time()
        # The socket's own transport (below TLS): closing it drops the connection at once,
        # without waiting on a TLS close_notify from a client that may never answer.
        self._socket: asyncio.BaseTransport | None = None
        self._sock: Any = None  # its socket (asyncio's TransportSocket), for SIOCOUTQ

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # After the TLS handshake: from here the first request's head has its deadline.
        if self._socket is None:
            self._socket = transport
            self._sock = bound_send_buffer(transport)
        elif isinstance(transport, asyncio.WriteTransport):  # TLS over the socket
            transport.set_write_buffer_limits(high=TLS_WRITE_BUFFER_BYTES)
        super().connection_made(transport)
        if self._listener.client_names and not self._listener.accepts_client(transport):
            # Before the abort: a request that came with the handshake's last flight is already
            # read and is fed to this handler once this returns; aiohttp drops data on a handler
            # being force-closed.
            self._force_close = True
            self.abort()
            return
        self._latest_write = self._loop.time()  # TLS 1.3 sends its session tickets now
        self._set_deadline(self._latest_write + self._header_timeout_s, HEADER_TIMEOUT)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._body = None
        self._listener._lost(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._force_close:  # closing, or past the pipelining bound: aiohttp ignores the bytes too
            return
        count = self._request_count
        body = self._body
        body_left: int | None = 0
        if body is not None:
            body_left = None if self._body_length is None else self._body_length - body.total_raw_bytes
        super().data_received(data)
        carry = self._carry
        self._carry = data[1 - len(HEAD_END) :] if len(data) >= len(HEAD_END) else (carry + data)[1 - len(HEAD_END) :]
        if len(self._messages) + self._request_in_progress > self._max_pipelined:
            self._stop_reading()
            return
        heads = self._request_count - count
        if heads:
            message, payload = self._messages[-1] if self._messages else (None, None)
            if payload is not None and not payload.is_eof():
                self._body = payload
                self._body_length = body_length(message)
                self._set_deadline(self._loop.time() + self._body_timeout_s, BODY_TIMEOUT)
                return
            self._body = None
            self._request_ended(data, carry, body_left, heads, body_length(message))
        elif body is not None:
            if body.is_eof():
                self._body = None
                self._request_ended(data, carry, body_left, 0, 0)
        elif self._deadline == math.inf and data:  # the first bytes of the next request
            self._next_head(self._loop.time())

    def _stop_reading(self) -> None:
        """Past the pipelining bound: nothing more of this connection is read or answered (but
        the request already in the handler), and it is reset when the answer deadline passes.
        Reset at once, it would be dialled again at once, a TLS handshake for each: held, it
        costs its client the deadline and this process a parsed queue, evictable at the cap."""
        self._force_close = True  # aiohttp's loop ends after the request in hand; reads are ignored
        if not self._request_in_progress:
            # The request aiohttp takes next (the first of the queue) gets a 429, not its answer:
            # a client that sends this many before reading is answered nothing costly.
            self._request_handler = self._past_pipelining_bound
        if self._socket is not None:
            self._socket.pause_reading()  # type: ignore[attr-defined]
        self._set_deadline(self._loop.time() + self._answer_timeout_s, PIPELINE_LIMIT)

    async def _past_pipelining_bound(self, _: web.BaseRequest) -> web.StreamResponse:
        response = web.json_response(
            {"error": f"more than {self._max_pipelined} requests sent ahead of their answers"},
            status=429,
            headers=dict([NOSNIFF, NO_STORE]),
        )
        response.force_close()
        return response

    def _request_ended(self, data: bytes, carry: bytes, body_left: int | None, heads: int, length: int | None) -> None:
        """A request is complete; the read that completed it may have begun the next one."""
        if bytes_after_request(data, carry, body_left, heads, length):
            self._next_head(self._loop.time())
        else:
            self._deadline = math.inf

    def _next_head(self, now: float) -> None:
        self._since = now
        self._set_deadline(now + self._header_timeout_s, HEADER_TIMEOUT)

    def _set_deadline(self, at: float, reason: str) -> None:
        self._deadline = at
        self._deadline_reason = reason
        if at < self._timer_at:  # rare: the timer would tick too late for this deadline
            self._arm(at)

    def _expect_answer_taken(self) -> None:
        """An answer is being written: unless an older one is still due, it is due within
        `answer_timeout_s`."""
        self._latest_write = self._loop.time()
        if self._answer_by == math.inf or not self.unsent_bytes():
            # No answer before this one is still held: a deadline left from one already taken up
            # (the timer clears it only when it ticks) must not cut this one short.
            self._answer_probe = None
            self._answer_by = self._latest_write + self._answer_timeout_s
            if self._answer_by < self._timer_at:
                self._arm(self._answer_by)

    async def finish_response(
        self, request: Any, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        if self._listener.draining:
            # "Connection: close" on the answer: the client stops using this connection when it
            # reads it, so this server never has to close a keep-alive connection under a client
            # that may be sending on it (see Listener.begin_drain).
            resp.force_close()
        self._answering = True
        self._expect_answer_taken()
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._answering = False

    def pause_writing(self) -> None:
        # Writes outside an answer (a "100 Continue") are held to the same deadline.
        super().pause_writing()
        self._expect_answer_taken()

    def unsent_bytes(self) -> int:
        """Answer bytes the client has not taken: in the kernel's send queue, unacknowledged
        (SIOCOUTQ; a reader acknowledges within a round trip, or a delayed ACK's 40-200 ms), or
        still in this process's buffers once that queue is full."""
        return unacknowledged_bytes(self._sock) + self.buffered_bytes()

    def not_reading(self, now: float) -> bool:
        """Whether the client has stopped reading its answers: this process holds some of them
        (the kernel's queue is full), or what was written `NOT_READING_AFTER_S` ago or more is
        still unacknowledged."""
        if self._paused or self.buffered_bytes():
            return True
        return now - self._latest_write >= NOT_READING_AFTER_S and unacknowledged_bytes(self._sock) > 0

    def buffered_bytes(self) -> int:
        """Answer bytes still in this process's buffers (the TLS layer's and the socket's)."""
        unsent = 0
        if self._socket is not None and isinstance(self._socket, asyncio.WriteTransport):
            unsent += self._socket.get_write_buffer_size()
        transport = self.transport
        if transport is not None and transport is not self._socket and isinstance(transport, asyncio.WriteTransport):
            unsent += transport.get_write_buffer_size()
        return unsent

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        if self._force_close and self._deadline_reason != PIPELINE_LIMIT:
            return  # closing already
        now = self._loop.time()
        if now >= self._answer_by:
            if self.not_reading(now):
                unsent = self.unsent_bytes()
                probe, self._answer_probe = self._answer_probe, (unsent, self._latest_write)
                if probe is None:  # due: look again in a moment before judging
                    self._answer_by = now + NOT_READING_AFTER_S
                elif unsent < probe[0] or self._latest_write > probe[1]:
                    self._answer_probe = None  # still taking its answer up, slowly: due afresh
                    self._answer_by = now + self._answer_timeout_s
                else:
                    self._close_now(ANSWER_TIMEOUT)
                    return
            else:
                self._answer_probe = None
                if self._answering:  # its bytes gone already: the answer being written is due afresh
                    self._answer_by = now + self._answer_timeout_s
                elif unacknowledged_bytes(self._sock):  # written this very moment: look again soon
                    self._answer_by = self._latest_write + NOT_READING_AFTER_S
                else:
                    self._answer_by = math.inf
        if now < self._deadline:
            self._arm(min(self._deadline, self._answer_by, now + self._tick_s))
            return
        if self._deadline_reason == HEADER_TIMEOUT and (self._messages or self._request_in_progress):
            # A pipelined head behind a request still being answered: its clock starts later.
            self._set_deadline(now + self._header_timeout_s, HEADER_TIMEOUT)
            if self._answer_by < self._timer_at:
                self._arm(self._answer_by)
            return
        self._close_now(self._deadline_reason)

    def _close_now(self, reason: str) -> None:
        self._listener._closed(reason)
        self.abort()

    def abort(self) -> None:
        """Close the connection now (no TLS goodbye): a deadline passed, or the cap needs room."""
        if self._socket is not None:
            # A reset, not a FIN: the kernel drops the unsent answers at once instead of holding
            # them, and the closed socket, for a client that may never read again.
            sock = self._socket.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_NONE)
            self._socket.abort()  # type: ignore[attr-defined]
        elif self.transport is not None:
            self.transport.abort()

    def eviction_rank(self) -> tuple[int, float] | None:
        """How soon to close this one to make room (see webhook.http.connections)."""
        if self._socket is None:
            return None  # accepted this very moment, not yet attached to its socket
        if self._force_close or self._close or self.not_reading(self._loop.time()):
            return (NEVER_SERVED, self._since)  # closing, or not reading its answers
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


def bound_send_buffer(transport: asyncio.BaseTransport) -> Any:
    """Fix the socket's send buffer (SOCKET_SEND_BUFFER_BYTES); the socket, or None if not TCP."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_SEND_BUFFER_BYTES)
    return sock


def unacknowledged_bytes(sock: Any) -> int:
    """Bytes in a TCP socket's send queue that the peer has not acknowledged (Linux SIOCOUTQ);
    0 where that cannot be read."""
    if sock is None or SIOCOUTQ is None:
        return 0
    try:
        queued: int = struct.unpack("i", fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\0\0\0\0"))[0]
    except (OSError, ValueError):  # closed meanwhile
        return 0
    return queued


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
        self._handler._sock = bound_send_buffer(transport)
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
        self.draining = False  # answers close their connection (begin_drain)
        self._emptied: asyncio.Event | None = None  # set when the last connection ends, while awaited
        # From accept (handshakes included) until lost.
        self._table: ConnectionTable[BoundedRequestHandler] = ConnectionTable(
            served_batch=max(1, limits.max_connections // 64)
        )
        self.accepted = 0  # TCP connections accepted, shed ones included
        self._shedding = False  # since a newcomer was refused, until one is accepted again
        # The admission routes without the router, the rest through it (webhook.http.app).
        self.request_handler = request_handler(runner.app)
        self._gauge = CONNECTIONS_OPEN.labels(name)
        self._closed_counters = {reason: CONNECTIONS_CLOSED.labels(name, reason) for reason in CLOSE_REASONS}

    @property
    def open_connections(self) -> int:
        return len(self._table)

    def connections(self) -> list[BoundedRequestHandler]:
        """The open connections, oldest accepted first."""
        return list(self._table)

    async def start(self) -> None:
        asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER_BYTES
        loop = asyncio.get_running_loop()
        # TLS is layered by _accept (TlsConnection), not by asyncio: see TlsConnection.
        self.server = await loop.create_server(
            self._accept, self.host, self.port, backlog=128, reuse_port=self.reuse_port or None
        )
        if self.port == 0:
            self.port = self.server.sockets[0].getsockname()[1]

    def begin_drain(self) -> None:
        """From now on every answer says "Connection: close".

        HTTP/1.1 has no safe way for a server to close an idle keep-alive connection: a client
        may be sending a request on it at that moment, and the kube-apiserver's Go client does not
        resend a POST that met the close (the admission fails with "EOF"). Only the client can
        close one safely, after an answer that says so, or by its own idle timeout."""
        self.draining = True

    async def wait_connections_closed(self, within: float) -> int:
        """Until every connection is closed (by its client, after an answer of the drain) or
        `within` seconds pass; the number still open."""
        if self._table:
            self._emptied = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._emptied.wait(), within)
        return len(self._table)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def no_room(self) -> str | None:
        """A readiness check: None while a new connection would be accepted (there is room, or a
        connection to close for it), else why not."""
        if self._table.has_room(self.limits.max_connections):
            return None
        return f"connections: all {self.limits.max_connections} on the {self.name} port have a request in flight"

    def _accept(self) -> asyncio.BaseProtocol:
        self.accepted += 1
        if len(self._table) >= self.limits.max_connections:
            victims = self._table.make_room()
            if not victims:  # every connection has a request in flight: real load, shed it
                self._closed(SHED)
                if not self._shedding:
                    self._shedding = True
                    log.warning(
                        "%s listener: all %d connections have a request in flight; refusing new ones until one ends",
                        self.name, self.limits.max_connections,
                    )  # fmt: skip
                raise Shed(f"{self.name} listener: {self.limits.max_connections} connections busy")
            for victim in victims:
                self._closed(EVICTED)
                victim.abort()
        if self._shedding:
            self._shedding = False
            log.info("%s listener: accepting new connections again", self.name)
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
        if not self._table and self._emptied is not None:
            self._emptied.set()
