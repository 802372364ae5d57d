"""A small, stateful Kubernetes API server for tests, reached by the real client over HTTP.

What it keeps real (because the webhook depends on it): one global, monotonically increasing
resourceVersion; 409 on a stale update and on a create that exists; 404/409/410/422 as proper
`Status` objects; label and field selectors; merge and JSON patches; finalizers and namespace
termination; watches replayed from a resourceVersion out of a bounded history, with `410 Gone`
(an ERROR event inside the stream, as the apiserver's watch cache sends it) once that history
is gone; consistent paginated lists; items of built-in lists without kind/apiVersion.

Deliberate simplifications (say so when a test relies on them):
- strategic-merge-patch knows list merge keys by field name, not from schemas (see
  `strategic_merge_patch`); on custom resources it is applied as a JSON merge patch;
  server-side apply is refused with 415;
- pods are deleted at once (no kubelet, no grace period) unless they carry finalizers;
- the namespace controller runs inline: deleting a namespace deletes its content immediately and
  the namespace goes once its content is gone and `metadata.finalizers` is empty
  (`spec.finalizers` is not emulated);
- a create keeps the `status` it is given (handy for tests; the apiserver resets pod status), while
  updates of the main resource keep the stored status for kinds with a status subresource;
- no admission, defaulting or schema validation of its own beyond names. What the real apiserver
  does on a write (admission, webhooks, policies, schemas) is tested against the real one
  (tests/e2e, docs/admission-chain.md); this emulator stays for what a real apiserver cannot be
  made to do on demand: faults (500s, latency, dropped streams), 410 Gone, slow lists.

The pieces: `kube_emulator_types` (resource types, `Status` errors), `kube_emulator_selectors`
(label and field selectors), `kube_emulator_store` (objects, resourceVersion, history, watches'
bookkeeping, patches), `kube_emulator_rbac` (users, the RBAC authorizer, review APIs) and this
module, the HTTP server. Names are re-exported here, so tests import from `kube_emulator`.

RBAC (opt-in, `KubeEmulator(rbac=True)`): every request from a non-superuser token is authorized
as the apiserver's RBAC authorizer does it, from the Role/ClusterRole/RoleBinding/ClusterRoleBinding
objects stored here (rbac.authorization.k8s.io/v1). Denials answer 403 with the apiserver's
message and are recorded in `denials`; allowed requests are recorded in `granted`. Not emulated:
aggregated ClusterRoles, impersonation, the escalation check on writes of RBAC objects, and the
default bindings beyond discovery (any authenticated user may GET /api, /apis, /version).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from tests.support.kube_emulator_rbac import (
    ADMIN,
    AccessRequest,
    AccessRule,
    Denial,
    KubeRbac,
    User,
    forbidden_message,
    request_attributes,
)
from tests.support.kube_emulator_selectors import Requirement, Selector, parse_field_selector, parse_label_selector
from tests.support.kube_emulator_store import _CLOSE, _DROP, KubeStore, Observer, _Watch, merge_patch
from tests.support.kube_emulator_types import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    CONFIGMAPS,
    DEFAULT_RESOURCES,
    DEPLOYMENTS,
    EVENTS,
    LEASES,
    LOCAL_QUEUES,
    NAMESPACES,
    PODS,
    PRIORITY_CLASSES,
    RBAC_GROUP,
    RBAC_RESOURCES,
    ROLE_BINDINGS,
    ROLES,
    SECRETS,
    SUBJECT_ACCESS_REVIEWS,
    TOKEN_REVIEWS,
    ApiError,
    Obj,
    ObjKey,
    ResourceType,
    _not_found,
    _truthy,
)

__all__ = [
    "ADMIN",
    "CLUSTER_ROLES",
    "CLUSTER_ROLE_BINDINGS",
    "CONFIGMAPS",
    "DEFAULT_RESOURCES",
    "DEPLOYMENTS",
    "EVENTS",
    "LEASES",
    "LOCAL_QUEUES",
    "NAMESPACES",
    "PODS",
    "PRIORITY_CLASSES",
    "RBAC_GROUP",
    "RBAC_RESOURCES",
    "ROLES",
    "ROLE_BINDINGS",
    "SECRETS",
    "SUBJECT_ACCESS_REVIEWS",
    "TOKEN_REVIEWS",
    "AccessRequest",
    "AccessRule",
    "ApiError",
    "Denial",
    "KubeEmulator",
    "KubeStore",
    "Obj",
    "ObjKey",
    "Observer",
    "RecordedRequest",
    "Requirement",
    "ResourceType",
    "Selector",
    "User",
    "eventually",
    "forbidden_message",
    "merge_patch",
    "parse_field_selector",
    "parse_label_selector",
    "request_attributes",
]  # fmt: skip


# -- recorded requests and watches -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    query: Mapping[str, str]
    body: Any

    @property
    def is_watch(self) -> bool:
        return _truthy(self.query.get("watch"))


_BODY = web.RequestKey("body", object)  # the parsed request body, read once by the middleware


@dataclass(slots=True)
class _Fault:
    remaining: int
    status: int
    path_prefix: str | None
    method: str | None
    delay: float = 0.0  # seconds before answering; with status 0 the request then proceeds normally


class KubeEmulator(KubeRbac):
    """Start with `async with KubeEmulator() as kube:`; point a client at `kube.client_config()`."""

    def __init__(
        self,
        *,
        token: str | None = None,
        resources: Iterable[ResourceType] = DEFAULT_RESOURCES,
        history_limit: int = 1000,
        strict_namespaces: bool = True,
        default_watch_timeout: float = 1800.0,
        bookmark_interval: float | None = None,
        gone_in_stream: bool = True,
        rbac: bool = False,
    ) -> None:
        self.token = token  # when set, every request needs `Authorization: Bearer <token>` (or a user's)
        # In RBAC mode `token` is a superuser; other users are authorized by the stored RBAC objects.
        super().__init__((*resources, *(RBAC_RESOURCES if rbac else ())), history_limit, strict_namespaces, rbac)
        self.default_watch_timeout = default_watch_timeout
        self.bookmark_interval = bookmark_interval
        # True: a too-old watch gets 200 and an ERROR event (the watch cache); False: HTTP 410.
        self.gone_in_stream = gone_in_stream
        self.latency = 0.0  # seconds added to every request
        # Seconds added to every list (a GET without watch=true) whose path starts with the key:
        # a large cluster's slow first list, e.g. {"/api/v1/pods": 5.0}. Read while waiting, so
        # removing the entry lets the lists under way finish at once.
        self.list_latency: dict[str, float] = {}
        self.requests: list[RecordedRequest] = []
        self._faults: list[_Fault] = []
        # Kinds whose watch events are held back (kept, in order) until released: a watch that lags.
        self._held: dict[str, asyncio.Event] = {}
        self._runner: web.AppRunner | None = None
        self._port = 0
        # Every cluster has `default`; Events about cluster-scoped objects live there.
        self.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware], client_max_size=16 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        for watch in list(self._watches):
            watch.queue.put_nowait(_CLOSE)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> KubeEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def client_config(self, token: str | None = None) -> Configuration:
        config = Configuration(host=self.url)
        bearer = token or self.token
        if bearer:
            config.api_key = {"BearerToken": bearer}
            config.api_key_prefix = {"BearerToken": "Bearer"}
        return config

    def api_client(self, token: str | None = None) -> ApiClient:
        return ApiClient(self.client_config(token))

    # -- fault injection and inspection ------------------------------------------------------------
    def fail_next(
        self, n: int = 1, status: int = 500, path_prefix: str | None = None, method: str | None = None
    ) -> None:
        """The next `n` requests (matching the path prefix and method, if given) fail with `status`."""
        self._faults.append(_Fault(n, status, path_prefix, method.upper() if method else None))

    def slow_next(
        self, n: int = 1, seconds: float = 40.0, path_prefix: str | None = None, method: str | None = None
    ) -> None:
        """The next `n` matching requests hang for `seconds`, then are answered normally."""
        self._faults.append(_Fault(n, 0, path_prefix, method.upper() if method else None, seconds))

    def clear_faults(self) -> None:
        self._faults.clear()

    def hold_watch_events(self, kind: str) -> None:
        """Watches of `kind` deliver nothing more until `release_watch_events(kind)`; lists and
        every other request answer as before (the apiserver has the object, the watcher lags)."""
        self._held.setdefault(kind, asyncio.Event())

    def release_watch_events(self, kind: str) -> None:
        held = self._held.pop(kind, None)
        if held is not None:
            held.set()

    async def _delivered(self, rt: ResourceType) -> None:
        while (held := self._held.get(rt.kind)) is not None:
            await held.wait()

    def drop_watches(self) -> int:
        """Abort every open watch connection without a clean end; returns how many."""
        for watch in self._watches:
            watch.queue.put_nowait(_DROP)
        return len(self._watches)

    def close_watches(self) -> int:
        """End every open watch cleanly, as the apiserver does at timeoutSeconds."""
        for watch in self._watches:
            watch.queue.put_nowait(_CLOSE)
        return len(self._watches)

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    def calls(
        self, method: str | None = None, path_prefix: str | None = None, watch: bool | None = None
    ) -> list[RecordedRequest]:
        return [
            r
            for r in self.requests
            if (method is None or r.method == method.upper())
            and (path_prefix is None or r.path.startswith(path_prefix))
            and (watch is None or r.is_watch == watch)
        ]

    def _authorize(self, request: web.Request, user: User) -> ApiError | None:
        groups = tuple(dict.fromkeys((*user.groups, "system:authenticated")))
        req = request_attributes(request.method, request.path, request.query, user.username, groups)
        allowed, reason = self._rbac_decision(req)
        if allowed:
            self.granted.append(req)
            return None
        message = forbidden_message(req) + (f": {reason}" if reason else "")
        self.denials.append(Denial(req, message))
        details = {"name": req.name, "group": req.group, "kind": req.resource} if req.resource else None
        return ApiError(403, message, details=details)

    def _list_latency(self, path: str) -> float:
        return max((d for prefix, d in self.list_latency.items() if path.startswith(prefix)), default=0.0)

    # -- HTTP --------------------------------------------------------------------------------------
    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        raw = await request.read() if request.can_read_body else b""
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
        request[_BODY] = body
        self.requests.append(RecordedRequest(request.method, request.path, dict(request.query), body))
        if self.latency:
            await asyncio.sleep(self.latency)
        if request.method == "GET" and request.query.get("watch") not in ("true", "1"):
            started = time.monotonic()
            for _ in range(1_000_000):  # polled: the entry can be removed meanwhile
                if time.monotonic() - started >= self._list_latency(request.path):
                    break
                await asyncio.sleep(0.01)
        for fault in self._faults:
            if fault.remaining > 0 and (fault.path_prefix is None or request.path.startswith(fault.path_prefix)) and (
                fault.method is None or fault.method == request.method
            ):  # fmt: skip
                fault.remaining -= 1
                self._faults = [f for f in self._faults if f.remaining > 0]
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.status:
                    return self._status_response(ApiError(fault.status, "injected fault"))
                break
        if self.token is not None or self.rbac:
            auth = request.headers.get("Authorization", "")
            bearer = auth[7:] if auth.startswith("Bearer ") else None
            if bearer is None or (bearer != self.token and bearer not in self.users):
                return self._status_response(ApiError(401, "Unauthorized"))
            if self.rbac and bearer != self.token:
                denied = self._authorize(request, self.users[bearer])
                if denied is not None:
                    return self._status_response(denied)
        try:
            return await handler(request)
        except ApiError as exc:
            return self._status_response(exc)

    @staticmethod
    def _status_response(exc: ApiError) -> web.Response:
        return web.json_response(exc.status(), status=exc.code)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if parts == ["version"]:
            return web.json_response({"major": "1", "minor": "31", "gitVersion": "v1.31.0-emulator"})
        if parts and parts[0] == "api":
            if len(parts) == 1:
                return web.json_response({"kind": "APIVersions", "versions": ["v1"],
                                          "serverAddressByClientCIDRs": []})  # fmt: skip
            group, version, rest = "", parts[1], parts[2:]
        elif parts and parts[0] == "apis":
            if len(parts) == 1:
                return web.json_response(self._group_list())
            if len(parts) == 2:
                groups = [g for g in self._group_list()["groups"] if g["name"] == parts[1]]
                if not groups:
                    raise ApiError(404, "the server could not find the requested resource")
                return web.json_response({"kind": "APIGroup", "apiVersion": "v1", **groups[0]})
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource")
        if not rest:
            return web.json_response(self._resource_list(group, version))
        return await self._resource_request(request, group, version, rest)

    def _group_list(self) -> Obj:
        versions: dict[str, list[str]] = {}
        for rt in self._types.values():
            if rt.group and rt.version not in versions.setdefault(rt.group, []):
                versions[rt.group].append(rt.version)
        groups = [
            {
                "name": g,
                "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
            }
            for g, vs in sorted(versions.items())
        ]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _resource_list(self, group: str, version: str) -> Obj:
        resources: list[Obj] = []
        for rt in self._types.values():
            if rt.group != group or rt.version != version:
                continue
            resource: Obj = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                             "kind": rt.kind, "verbs": list(rt.verbs)}  # fmt: skip
            if rt.short_names:
                resource["shortNames"] = list(rt.short_names)
            resources.append(resource)
            if rt.status_subresource:
                resources.append({"name": f"{rt.plural}/status", "singularName": "", "namespaced": rt.namespaced,
                                  "kind": rt.kind, "verbs": ["get", "patch", "update"]})  # fmt: skip
        if not resources:
            raise ApiError(404, "the server could not find the requested resource")
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}

    def _type(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self._types.get((group, plural))
        if rt is None or rt.version != version:
            raise ApiError(404, "the server could not find the requested resource")
        return rt

    async def _resource_request(
        self, request: web.Request, group: str, version: str, rest: list[str]
    ) -> web.StreamResponse:
        # Shapes: {plural}[/{name}[/{sub}]] and namespaces/{ns}/{plural}[/{name}[/{sub}]].
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
            ns, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise ApiError(404, "the server could not find the requested resource")
        rt = self._type(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        if rt.namespaced and ns is None and (name is not None or request.method not in ("GET",)):
            raise ApiError(404, "the server could not find the requested resource")
        if not rt.namespaced and ns is not None:
            raise ApiError(404, "the server could not find the requested resource")
        if sub and (sub not in ("status", "finalize") or (sub == "status" and not rt.status_subresource)):
            raise ApiError(404, "the server could not find the requested resource")
        obj_ns = ns or ""
        q = request.query
        dry_run = q.get("dryRun") == "All"
        body = request.get(_BODY)
        method = request.method
        if rt.virtual:
            if method != "POST" or name is not None:
                raise ApiError(405, f"{method} is not supported on {rt.plural}")
            return web.json_response(self._review(rt, body), status=201)
        if name is None:
            if method == "GET":
                selector = self._selector(rt, q)
                if _truthy(q.get("watch")):
                    return await self._watch(request, rt, ns, selector)
                return web.json_response(self._list(rt, ns, selector, q))
            if method == "POST":
                return web.json_response(self._create(rt, obj_ns, body, dry_run), status=201)
            if method == "DELETE":
                selector = self._selector(rt, q)
                deleted = [self._delete(rt, o["metadata"].get("namespace", ""), o["metadata"]["name"], {}, dry_run)
                           for o in self._select(rt, list(self._bucket(rt).values()), ns, selector)]  # fmt: skip
                return web.json_response(self._list_body(rt, deleted, self._rv))
            raise ApiError(405, f"{method} is not supported on a collection")
        if method == "GET":
            obj = self._bucket(rt).get((obj_ns, name))
            if obj is None:
                raise _not_found(rt, name)
            return web.json_response(obj)
        if method == "PUT":
            if sub == "finalize":  # namespaces/{name}/finalize: spec.finalizers only, not emulated
                return web.json_response(self._bucket(rt).get((obj_ns, name)) or self._missing(rt, name))
            return web.json_response(self._update(rt, obj_ns, name, body, sub, dry_run=dry_run))
        if method == "PATCH":
            return web.json_response(self._patch(rt, obj_ns, name, request.content_type, body, sub, dry_run))
        if method == "DELETE":
            options = body if isinstance(body, dict) else {}
            return web.json_response(self._delete(rt, obj_ns, name, options, dry_run))
        raise ApiError(405, f"{method} is not supported")

    async def _watch(
        self, request: web.Request, rt: ResourceType, ns: str | None, selector: Selector
    ) -> web.StreamResponse:
        q = request.query
        requested = q.get("resourceVersion", "")
        timeout = float(q.get("timeoutSeconds") or self.default_watch_timeout)
        bookmarks = _truthy(q.get("allowWatchBookmarks"))
        watch = _Watch(rt, ns, selector)
        initial: list[tuple[str, Obj]] = []
        gone: ApiError | None = None
        # No await between reading history and registering: no event can fall in between.
        if requested in ("", "0"):
            items = self._select(rt, [self._bucket(rt)[k] for k in sorted(self._bucket(rt))], ns, selector)
            initial = [("ADDED", o) for o in items]
        else:
            try:
                since = int(requested)
            except ValueError:
                raise ApiError(400, f"invalid resource version: {requested}") from None
            if since < self._floor:
                gone = ApiError(410, f"too old resource version: {since} ({self._floor})", reason="Expired")
                if not self.gone_in_stream:
                    raise gone
            else:
                for event in self._history:
                    if event.rv > since and event.rt_key == rt.key:
                        out = self._filter(watch, event)
                        if out is not None:
                            initial.append(out)
        if gone is None:
            self._watches[watch] = request  # before the first await: no event can slip in between
        # A bookmark may only claim what this watch has delivered: the global version once its queue
        # is drained, else the version of the last event sent.
        sent = self._rv

        def bookmark() -> bytes:
            rv = self._rv if watch.queue.empty() else sent
            meta = {"resourceVersion": str(rv)}
            return self._line("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta})

        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            if gone is not None:
                await response.write(self._line("ERROR", gone.status()))
                await response.write_eof()
                return response
            for etype, obj in initial:
                await self._delivered(rt)
                await response.write(self._line(etype, obj))
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                wait = min(remaining, self.bookmark_interval) if bookmarks and self.bookmark_interval else remaining
                try:
                    item = await asyncio.wait_for(watch.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and self.bookmark_interval and deadline - time.monotonic() > 0:
                        await response.write(bookmark())
                    continue
                if item is _DROP:
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                if item is _CLOSE:
                    break
                etype, obj = item
                await self._delivered(rt)
                await response.write(self._line(etype, obj))
                sent = int(obj["metadata"]["resourceVersion"])
            if bookmarks:  # like the apiserver: a last bookmark so the client resumes from there
                await response.write(bookmark())
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self._watches.pop(watch, None)
        return response

    @staticmethod
    def _line(etype: str, obj: Obj) -> bytes:
        return json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n"


async def eventually(
    condition: Callable[[], Any], within_s: float = 5.0, interval_s: float = 0.01, message: str = ""
) -> Any:
    """Poll until `condition()` is truthy (returns it); fail the test after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(message or f"condition not met within {within_s}s")
        await asyncio.sleep(interval_s)
