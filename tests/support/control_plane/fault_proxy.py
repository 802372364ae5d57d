"""An HTTPS reverse proxy in front of the real apiserver that injects the faults a test names.

A real apiserver cannot be told to fail the next list, to lag one watch or to cut a stream; this
proxy can, and forwards everything else untouched, so the answers a client sees are the
apiserver's own. A test starts one per test, points the client under test at it, and names each
fault:

    async with FaultProxy(cp) as proxy:     # or the fixture `fault_proxy`, on the shared control plane
        runtime, ... = await start_runtime(tmp_path, kube_scope, kubeconfig=proxy.via(kube_scope.kubeconfig))
        proxy.fail(503, n=2, verb="list", resource="pods")        # 5xx answers, n times
        proxy.delay(0.5, verb="get", resource="namespaces")       # latency, every matching call
        hang = proxy.hang(verb="list", resource="pods")           # lists that wait until released
        hang.release()
        proxy.expire(verb="watch", resource="pods")               # the next watch is told 410 Gone
        await proxy.compact()                                     # a real etcd compaction: real 410s
        proxy.cut_watches("pods")                                 # streams aborted mid-watch
        proxy.end_watches()                                       # streams ended cleanly
        proxy.hold_watches("namespaces"); proxy.release_watches("namespaces")   # a lagging watch
        proxy.rewrite(edit, resource="pods")                      # objects no apiserver would store
        proxy.calls(verb="list", resource="pods")                 # what reached the proxy

Credentials: the proxy forwards the caller's `Authorization` header, so the apiserver
authenticates and authorizes the caller itself (a ServiceAccount token is judged by the real RBAC).
A caller presenting no credentials is forwarded with none and is the apiserver's anonymous user:
the proxy never upgrades a call, so a client that lost its credentials fails as it would in a
cluster. A TLS client certificate cannot be relayed, so a caller that needs the admin through the
proxy presents `proxy.admin_token`, which the proxy alone knows and replaces by the admin's client
certificate.

Faults match requests by Kubernetes verb (get, list, watch, create, update, patch, delete,
deletecollection, as the apiserver derives them), resource (plural, e.g. "pods"), namespace, name
and path prefix; every criterion left out matches anything.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
import yarl
from aiohttp import web
from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, Configuration

from tests.support.control_plane.cluster import ControlPlane, write_kubeconfig
from tests.support.control_plane.pki import serving_cert
from tests.support.control_plane.processes import LOOPBACK
from tests.support.kube_scope import SharedCluster

# Headers of one hop, never forwarded (RFC 9110 7.6.1), and those aiohttp sets itself.
_HOP_HEADERS = frozenset(
    h.lower()
    for h in ("Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
              "Transfer-Encoding", "Upgrade", "Host", "Content-Length")
)  # fmt: skip
_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
            410: "Expired", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
            503: "ServiceUnavailable", 504: "Timeout"}  # fmt: skip
# The key where kube-apiserver's compactor records the revision it compacted etcd at; every
# apiserver watches it and drops its cached history below that revision.
COMPACT_REV_KEY = b"compact_rev_key"


@dataclass
class Call:
    """One request as the apiserver reads it (its RequestInfo), recorded when it reached the proxy,
    and the status it was answered with (None while it waits; 403: the apiserver's RBAC refused it)."""

    method: str
    path: str
    query: dict[str, str]
    verb: str
    group: str
    resource: str
    namespace: str
    name: str
    subresource: str
    status: int | None = None
    error: str = ""  # the body of an answer that is not a success, as the apiserver wrote it
    body: bytes = b""  # what the caller sent (a create's object, a patch)

    @property
    def is_watch(self) -> bool:
        return self.verb == "watch"


def request_info(method: str, path: str, query: dict[str, str]) -> Call:
    """The verb and resource the apiserver reads in a request (non-resource paths: resource "")."""
    parts = [p for p in path.split("/") if p]
    group, rest = "", []
    if parts[:1] == ["api"] and len(parts) >= 2:
        rest = parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else ""
    subresource = "/".join(rest[2:])
    if resource == "namespaces" and name:
        namespace = name
    # The apiserver reads the flag as Go's strconv.ParseBool does: kubernetes_asyncio sends "True".
    watching = query.get("watch", "").lower() in ("1", "t", "true")
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
    if method in ("GET", "HEAD"):
        verb = "watch" if watching else ("get" if name else "list")
        selected = query.get("fieldSelector", "")
        if not name and selected.startswith("metadata.name=") and "," not in selected:
            # RBAC's resourceNames apply to a list or watch of one name: the apiserver reads it so.
            name = selected.removeprefix("metadata.name=")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    return Call(method, path, dict(query), verb or method.lower(), group, resource, namespace, name, subresource)


@dataclass(frozen=True)
class Match:
    verb: str | None = None
    resource: str | None = None
    namespace: str | None = None
    name: str | None = None
    path: str | None = None  # a prefix of the URL path

    def __call__(self, call: Call) -> bool:
        return (
            (self.verb is None or self.verb == call.verb)
            and (self.resource is None or self.resource == call.resource)
            and (self.namespace is None or self.namespace == call.namespace)
            and (self.name is None or self.name == call.name)
            and (self.path is None or call.path.startswith(self.path))
        )


@dataclass(eq=False)
class Fault:
    """One named fault; `remaining` None: every matching request until `remove()`."""

    proxy: FaultProxy
    match: Match
    remaining: int | None
    status: int | None = None  # answered instead of the apiserver's
    delay_s: float = 0.0  # before forwarding
    held: asyncio.Event | None = None  # forwarded once set
    expire: str | None = None  # "stream" or "http": the resourceVersion is gone, as the apiserver says it
    edit: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # applied to each object answered
    hits: int = 0  # requests it has acted on
    waiting: int = 0  # requests it holds now

    def take(self, call: Call) -> bool:
        if not self.match(call) or self.remaining == 0:
            return False
        self.hits += 1
        if self.remaining is not None:
            self.remaining -= 1
        return True

    def release(self) -> None:
        """Let every request it holds (and every later one) through."""
        if self.held is not None:
            self.held.set()

    def remove(self) -> None:
        self.release()
        with contextlib.suppress(ValueError):
            self.proxy.faults.remove(self)


@dataclass(eq=False)
class _Watch:
    call: Call
    ended: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def end(self, how: str) -> None:
        if not self.ended.done():
            self.ended.set_result(how)


def _status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": _REASONS.get(code, ""), "code": code}  # fmt: skip


def _edited(obj: dict[str, Any], edits: list[Callable[[dict[str, Any]], dict[str, Any]]]) -> dict[str, Any]:
    for edit in edits:
        obj = edit(obj)
    return obj


def _edited_answer(body: bytes, edits: list[Callable[[dict[str, Any]], dict[str, Any]]]) -> bytes:
    answer = json.loads(body)
    if isinstance(answer.get("items"), list):
        answer["items"] = [_edited(item, edits) for item in answer["items"]]
    elif answer.get("kind") != "Status":
        answer = _edited(answer, edits)
    return json.dumps(answer).encode()


def _etcd_url(cp: ControlPlane) -> str:
    argv = cp.processes["etcd"].argv
    return argv[argv.index("--listen-client-urls") + 1]


class FaultProxy:
    """`async with FaultProxy(cp) as proxy:`; see the module's docstring."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.upstream = cp.url
        self.admin_token = secrets.token_urlsafe(24)
        self.faults: list[Fault] = []
        self.requests: list[Call] = []
        self._watches: set[_Watch] = set()
        self._held: dict[str, asyncio.Event] = {}
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._session: aiohttp.ClientSession | None = None
        self._admin_session: aiohttp.ClientSession | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        kubeconfig = yaml.safe_load(self.cp.admin_kubeconfig.read_text())
        admin = kubeconfig["users"][0]["user"]
        upstream_ctx = ssl.create_default_context(cafile=str(self.cp.pki.ca_file))
        admin_ctx = ssl.create_default_context(cafile=str(self.cp.pki.ca_file))
        admin_ctx.load_cert_chain(admin["client-certificate"], admin["client-key"])
        # No read timeout: a watch lasts as long as the caller wants; the caller's own timeouts rule.
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None, connect=10)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=upstream_ctx), timeout=timeout, auto_decompress=False
        )
        self._admin_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=admin_ctx), timeout=timeout, auto_decompress=False
        )
        cert = serving_cert(self.cp.pki, f"fault-proxy-{secrets.token_hex(4)}", ips=[LOOPBACK],
                            dns_names=("localhost",))  # fmt: skip
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(str(cert.cert_file), str(cert.key_file))
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, LOOPBACK, 0, ssl_context=server_ctx)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        for fault in list(self.faults):
            fault.remove()
        for event in self._held.values():
            event.set()
        for watch in list(self._watches):
            watch.end("end")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for session in (self._session, self._admin_session):
            if session is not None:
                await session.close()

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self._port}"

    def kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """A kubeconfig naming the proxy, as `token`'s holder (the admin when None)."""
        return write_kubeconfig(path, self.url, self.cp.pki.ca_file, {"token": token or self.admin_token})

    def via(self, kubeconfig: Path) -> Path:
        """A copy of `kubeconfig` (beside it) that reaches the apiserver through the proxy, as the
        same user: e.g. a KubeScope's kubeconfig of the webhook's ServiceAccount."""
        loaded = yaml.safe_load(kubeconfig.read_text())
        for cluster in loaded["clusters"]:
            cluster["cluster"]["server"] = self.url
        path = kubeconfig.with_name(f"{kubeconfig.name}.via-proxy-{self._port}")
        path.write_text(yaml.safe_dump(loaded))
        return path

    async def api_client_via(self, kubeconfig: Path) -> ApiClient:
        """A kubernetes_asyncio client of `kubeconfig`'s user that goes through the proxy."""
        configuration = Configuration()
        await config.load_kube_config(config_file=str(self.via(kubeconfig)), client_configuration=configuration)
        return ApiClient(configuration)

    def client_config(self, token: str | None = None) -> Configuration:
        config = Configuration(host=self.url)
        config.ssl_ca_cert = str(self.cp.pki.ca_file)
        config.api_key = {"BearerToken": token or self.admin_token}
        config.api_key_prefix = {"BearerToken": "Bearer"}
        return config

    def api_client(self, token: str | None = None) -> ApiClient:
        return ApiClient(self.client_config(token))

    # -- faults ------------------------------------------------------------------------------------
    def _add(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        return fault

    def fail(self, status: int = 500, n: int | None = 1, **match: str) -> Fault:
        """The next `n` matching requests (every one when None) are answered `status` with a
        Status body, as the apiserver writes one, and never reach it."""
        return self._add(Fault(self, Match(**match), n, status=status))

    def delay(self, seconds: float, n: int | None = None, **match: str) -> Fault:
        """Matching requests reach the apiserver `seconds` late (every one unless `n`)."""
        return self._add(Fault(self, Match(**match), n, delay_s=seconds))

    def hang(self, n: int | None = None, **match: str) -> Fault:
        """Matching requests wait at the proxy until `fault.release()` (or the caller gives up),
        then go on to the apiserver: a list of a large cluster that takes its time."""
        return self._add(Fault(self, Match(**match), n, held=asyncio.Event()))

    def expire(self, n: int | None = 1, *, in_stream: bool = True, **match: str) -> Fault:
        """The next `n` matching watches are told that their resourceVersion is gone, in the
        apiserver's words: a 200 stream of one ERROR event carrying a 410 Expired Status (what the
        watch cache sends), or with `in_stream=False` an HTTP 410 Status.

        The proxy says it because the real apiserver cannot be made to on demand: its watch cache
        (1.35) serves every resourceVersion since the cache started, and an etcd compaction does
        not shorten it; only the cache's sliding window does, once more than 100 events of the
        resource are older than 75 s. A real 410 for lists and continue tokens: `compact()`."""
        return self._add(Fault(self, Match(**match), n, expire=("stream" if in_stream else "http")))

    def rewrite(self, edit: Callable[[dict[str, Any]], dict[str, Any]], n: int | None = None, **match: str) -> Fault:
        """Every object that matching requests are answered with (a get's object, a list's items, a
        watch's events) goes through `edit` on its way back: objects the apiserver would never
        store, handed to the client as a list or a watch event would."""
        return self._add(Fault(self, Match(**match), n, edit=edit))

    def clear(self) -> None:
        for fault in list(self.faults):
            fault.remove()

    async def compact(self, *, seen_by: tuple[str, ...] = ("/api/v1/namespaces",), within_s: float = 40.0) -> int:
        """Compact the control plane's etcd at its current revision as kube-apiserver's compactor
        does (the revision recorded under `compact_rev_key`, then compacted), and wait until the
        apiserver serves no list older than it on each path of `seen_by` (each resource's cache
        takes the news in within about 16 s). A list or continue token from before then gets the
        apiserver's real 410 Expired. The compacted revision."""
        etcd = _etcd_url(self.cp)

        def b64(value: bytes) -> str:
            return base64.b64encode(value).decode()

        async with aiohttp.ClientSession() as session:
            async with session.post(f"{etcd}/v3/kv/range", json={"key": b64(b"/"), "limit": 1}) as resp:
                resp.raise_for_status()
                revision = int((await resp.json())["header"]["revision"])
            put = {"key": b64(COMPACT_REV_KEY), "value": b64(str(revision).encode())}
            async with session.post(f"{etcd}/v3/kv/put", json=put) as resp:
                resp.raise_for_status()
            async with session.post(f"{etcd}/v3/kv/compaction", json={"revision": revision, "physical": True}) as resp:
                resp.raise_for_status()
        if self._admin_session is None:
            raise RuntimeError("the proxy is not started")
        deadline = asyncio.get_running_loop().time() + within_s
        for path in seen_by:
            url = f"{self.upstream}{path}?limit=1&resourceVersionMatch=Exact&resourceVersion={revision - 1}"
            while True:
                async with self._admin_session.get(url) as resp:
                    if resp.status == 410:
                        break
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"the apiserver still serves {path} before revision {revision}")
                await asyncio.sleep(0.5)
        return revision

    def _watching(self, resource: str | None) -> Iterator[_Watch]:
        return (w for w in list(self._watches) if resource is None or w.call.resource == resource)

    def cut_watches(self, resource: str | None = None) -> int:
        """Abort the open watch streams (of `resource`) mid-stream, without the end of the chunked
        body: the client sees a broken connection. How many."""
        watches = list(self._watching(resource))
        for watch in watches:
            watch.end("cut")
        return len(watches)

    def end_watches(self, resource: str | None = None) -> int:
        """End the open watch streams cleanly, as the apiserver does at timeoutSeconds. How many."""
        watches = list(self._watching(resource))
        for watch in watches:
            watch.end("end")
        return len(watches)

    def hold_watches(self, resource: str) -> None:
        """Watches of `resource` deliver nothing more until `release_watches(resource)`, while
        every other request is answered as before: the apiserver has the object, the watcher lags."""
        self._held.setdefault(resource, asyncio.Event())

    def release_watches(self, resource: str) -> None:
        held = self._held.pop(resource, None)
        if held is not None:
            held.set()

    def open_watches(self, resource: str | None = None) -> int:
        return sum(1 for _ in self._watching(resource))

    def calls(self, **match: str) -> list[Call]:
        m = Match(**match)
        return [c for c in self.requests if m(c)]

    # -- forwarding --------------------------------------------------------------------------------
    async def _forward(self, request: web.Request) -> web.StreamResponse:
        call = request_info(request.method, request.path, dict(request.query))
        self.requests.append(call)
        edits: list[Callable[[dict[str, Any]], dict[str, Any]]] = []
        for fault in list(self.faults):
            if not fault.take(call):
                continue
            if fault.edit is not None:
                edits.append(fault.edit)
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.held is not None:
                fault.waiting += 1
                try:
                    await fault.held.wait()
                finally:
                    fault.waiting -= 1
            if fault.status is not None:
                call.status = fault.status
                return web.json_response(_status(fault.status, "injected by the test's fault proxy"),
                                         status=fault.status)  # fmt: skip
            if fault.expire is not None:
                call.status = 410
                return await self._expired(request, call, in_stream=fault.expire == "stream")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        if edits:  # a body the proxy rewrites must come uncompressed
            headers = {k: v for k, v in headers.items() if k.lower() != "accept-encoding"}
        session = self._session
        if headers.get("Authorization") == f"Bearer {self.admin_token}":
            del headers["Authorization"]
            session = self._admin_session
        assert session is not None
        # As the caller wrote it: a query re-encoded could read differently at the apiserver.
        url = yarl.URL(self.upstream + request.raw_path, encoded=True)
        body = await request.read() if request.can_read_body else None
        call.body = body or b""
        async with session.request(request.method, url, headers=headers, data=body, allow_redirects=False) as up:
            out_headers = {k: v for k, v in up.headers.items() if k.lower() not in _HOP_HEADERS}
            call.status = up.status
            if not call.is_watch:
                body = await up.read()
                if up.status >= 400:
                    call.error = body[:4000].decode(errors="replace")
                if edits and 200 <= up.status < 300:
                    body = _edited_answer(body, edits)
                return web.Response(status=up.status, body=body, headers=out_headers)
            response = web.StreamResponse(status=up.status, headers=out_headers)
            await response.prepare(request)
            watch = _Watch(call)
            self._watches.add(watch)
            pump: asyncio.Future[Any] = asyncio.create_task(self._pump(up, response, call, edits))
            try:
                done, _ = await asyncio.wait({pump, watch.ended}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._watches.discard(watch)
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pump
            if watch.ended in done and watch.ended.result() == "cut":
                if request.transport is not None:
                    request.transport.abort()
                return response
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return response

    async def _expired(self, request: web.Request, call: Call, *, in_stream: bool) -> web.StreamResponse:
        since = call.query.get("resourceVersion", "")
        status = _status(410, f"too old resource version: {since}")
        if not in_stream:
            return web.json_response(status, status=410)
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
        await response.write_eof()
        return response

    async def _pump(
        self,
        up: aiohttp.ClientResponse,
        response: web.StreamResponse,
        call: Call,
        edits: list[Callable[[dict[str, Any]], dict[str, Any]]],
    ) -> None:
        """Copy a watch stream event by event (one JSON object a line, however long), holding back
        the events of a held resource until it is released."""
        pending = b""
        async for chunk in up.content.iter_any():
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                while (held := self._held.get(call.resource)) is not None:
                    await held.wait()
                if edits and line.strip():
                    event = json.loads(line)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        event["object"] = _edited(event["object"], edits)
                    line = json.dumps(event).encode()
                await response.write(line + b"\n")


@pytest.fixture
async def fault_proxy(shared_control_plane: SharedCluster) -> AsyncIterator[FaultProxy]:
    """A proxy of the test's own in front of the session's control plane (tests/support/kube_scope.py)."""
    async with FaultProxy(shared_control_plane.cp) as proxy:
        yield proxy


def events(body: bytes) -> list[dict[str, Any]]:
    """The events of a watch body (one JSON object a line)."""
    return [json.loads(line) for line in body.splitlines() if line.strip()]
