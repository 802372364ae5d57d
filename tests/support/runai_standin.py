"""A stateful stand-in for the NVIDIA Run:ai control plane, for tests.

It serves the paths in `openapi_check.USED_PATHS` with the field names and status codes of
runai-openapi.json, on 127.0.0.1 with an ephemeral port. Every request it receives and every
response it sends is checked against the spec (`violations`); every request is logged
(`requests`). State is kept in the API's own JSON shapes so answers need no translation.

Faults: `stop_listening()`/`resume()` (connection refused, same port), `fail_next()` (status for
the next N matching calls), `fail_when()` (status while a predicate holds, e.g. project creation
in one department), `drop_next()` (connection closed without an answer), `latency`/`set_latency()`,
`hold_next()` (the answer is computed from the state as it is, then kept back until released).
"""

from __future__ import annotations

import asyncio
import fnmatch
import itertools
import json
import re
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from .openapi_check import Violation, spec_middleware

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# (method, path, parsed JSON body or None) -> should this request fail?
Predicate = Callable[[str, str, Any], bool]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_FILTER = re.compile(r"^(?P<field>[A-Za-z0-9]+)(?P<op>==|!=|<=|>=|=@|!@|=\^|=\$)(?P<value>.+)$")
_SHUTDOWN_S = 0.2


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"code": status, "message": message}, status=status)


def _quota_status(allocated: float = 0, non_preemptible: float = 0, requested: float = 0) -> dict[str, Any]:
    return {
        "allocated": {"gpu": allocated, "cpu": 0, "memory": 0},
        "allocatedNonPreemptible": {"gpu": non_preemptible, "cpu": 0, "memory": 0},
        "requested": {"gpu": requested, "cpu": 0, "memory": 0},
    }


class _Dropped(Exception):
    """The stand-in closed the connection on purpose instead of answering."""


@dataclass
class LoggedRequest:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    authorized: bool  # carried a valid, unexpired token
    status: int | None = None  # None: dropped or refused before answering
    at: float = field(default_factory=time.monotonic)


@dataclass
class Fault:
    """Answer `status` (or drop the connection) for matching requests, `remaining` times (None: always)."""

    status: int = 503
    method: str | None = None
    path: str | None = None  # fnmatch pattern on the path, e.g. "/api/v1/org-unit/projects*"
    predicate: Predicate | None = None
    remaining: int | None = 1
    drop: bool = False  # close the connection instead of answering
    after: bool = False  # with drop: let the handler act first (the answer is lost, the effect is not)

    def matches(self, method: str, path: str, body: Any) -> bool:
        if self.remaining is not None and self.remaining <= 0:
            return False
        if self.method is not None and self.method.upper() != method:
            return False
        if self.path is not None and not fnmatch.fnmatchcase(path, self.path):
            return False
        return self.predicate is None or self.predicate(method, path, body)


@dataclass
class Hold:
    """The next matching request is answered from the state at its arrival, but the answer is kept
    back until `release()`: a page of a list read before a change and received after it."""

    method: str
    path: str
    query: Callable[[Mapping[str, str]], bool]
    armed: bool = True
    answered: asyncio.Event = field(default_factory=asyncio.Event)  # the held answer is computed
    _released: asyncio.Event = field(default_factory=asyncio.Event)

    def matches(self, method: str, path: str, query: Mapping[str, str]) -> bool:
        return self.armed and method == self.method.upper() and path == self.path and self.query(query)

    def release(self) -> None:
        self._released.set()


@dataclass
class _Latency:
    seconds: float
    method: str | None = None
    path: str | None = None


class RunaiStandin:
    """Run:ai control plane stand-in. `async with RunaiStandin() as runai: runai.url ...`."""

    def __init__(
        self,
        *,
        client_id: str = "hopsworks-sa",
        client_secret: str = "standin-client-secret",
        token_lifetime_s: int = 3600,
        cluster_name: str = "hopsworks",
        default_node_pool_gpus: float = 8,
        delete_status: int = 204,
        delete_delay_s: float = 0.0,
        check_spec: bool = True,
        echo_errors: bool = False,
    ) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.token_lifetime_s = token_lifetime_s  # expiresIn of tokens issued from now on
        self.delete_status = delete_status  # 204 (gone) or 202 (accepted; phase Deleting for delete_delay_s)
        self.delete_delay_s = delete_delay_s
        self.check_spec = check_spec
        # A careless server echoes what it got in its error messages; clients must not pass that on.
        self.echo_errors = echo_errors
        self.latency = 0.0  # added to every answer
        self.requests: list[LoggedRequest] = []
        self.violations: list[Violation] = []
        self.tokens: dict[str, float] = {}  # token -> monotonic expiry
        self.tokens_issued = 0
        self.clusters: dict[str, dict[str, Any]] = {}
        self.departments: dict[str, dict[str, Any]] = {}  # by id
        self.projects: dict[str, dict[str, Any]] = {}  # by id
        self.node_pools: dict[str, dict[str, Any]] = {}  # by id
        self.node_pool_gpus: dict[str, dict[str, float | None]] = {}  # node pool id -> total/allocated
        self._faults: list[Fault] = []
        self._holds: list[Hold] = []
        self._latencies: list[_Latency] = []
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._deleting: set[asyncio.TimerHandle] = set()
        self.cluster_id = self.add_cluster(cluster_name)
        self.add_node_pool("default", total_gpus=default_node_pool_gpus, is_default=True)
        self.add_department("default")  # every Run:ai installation has it

    # ---- lifecycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    async def __aenter__(self) -> RunaiStandin:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> None:
        await self._listen()

    async def stop(self) -> None:
        for hold in self._holds:
            hold.release()  # a held answer must not keep the server from stopping
        await self.stop_listening()
        for handle in self._deleting:
            handle.cancel()
        self._deleting.clear()

    async def stop_listening(self) -> None:
        """Close the socket and every open connection: new calls get 'connection refused'."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def resume(self) -> None:
        """Listen again on the same port, with the same state."""
        if self._runner is None:
            await self._listen()

    @property
    def listening(self) -> bool:
        return self._runner is not None

    async def _listen(self) -> None:
        app = web.Application(middlewares=self._middlewares())
        app.router.add_post("/api/v1/token", self._token)
        app.router.add_get("/api/v1/clusters", self._clusters)
        app.router.add_get("/api/v1/org-unit/departments", self._list_departments)
        app.router.add_get("/api/v1/org-unit/projects", self._list_projects)
        app.router.add_post("/api/v1/org-unit/projects", self._create_project)
        app.router.add_get("/api/v1/org-unit/projects/{projectId}", self._get_project)
        app.router.add_delete("/api/v1/org-unit/projects/{projectId}", self._delete_project)
        app.router.add_get("/api/v1/node-pools", self._list_node_pools)
        app.router.add_get("/api/v1/clusters/{clusterUuid}/nodepools/{nodepoolName}/metrics", self._metrics)
        runner = web.AppRunner(app, shutdown_timeout=_SHUTDOWN_S, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self._port, reuse_address=True)
        await site.start()
        if not self._port:
            self._port = runner.addresses[0][1]
        self._runner = runner

    # ---- state helpers --------------------------------------------------------------------

    def add_cluster(self, name: str) -> str:
        cluster_uuid = str(uuid.uuid4())
        self.clusters[cluster_uuid] = {
            "uuid": cluster_uuid,
            "tenantId": 1001,
            "name": name,
            "createdAt": _now(),
            "domain": None,
            "version": "2.21.0",
            "status": {"state": "Connected"},
            "updatedAt": _now(),
            "lastLiveness": _now(),
        }
        return cluster_uuid

    def add_node_pool(
        self,
        name: str,
        *,
        total_gpus: float = 0,
        allocated_gpus: float | None = None,
        is_default: bool = False,
        cluster_id: str | None = None,
    ) -> dict[str, Any]:
        cluster_id = cluster_id or self.cluster_id
        pool_id = str(next(self._ids))
        pool = {
            "id": pool_id,
            "name": name,
            "labelKey": "runai/node-pool",  # the spec wants both non-empty
            "labelValue": name,
            "clusterId": cluster_id,
            "clusterName": self.clusters[cluster_id]["name"],
            "tenantId": 1001,
            "createdBy": "system",
            "createdAt": _now(),
            "updatedBy": "system",
            "updatedAt": _now(),
            "isDefault": is_default,
            "phase": "Ready",
            "phaseMessage": "",
        }
        self.node_pools[pool_id] = pool
        self.node_pool_gpus[pool_id] = {"total": total_gpus, "allocated": allocated_gpus}
        return pool

    def node_pool(self, name: str, cluster_id: str | None = None) -> dict[str, Any] | None:
        cluster_id = cluster_id or self.cluster_id
        return next((p for p in self.node_pools.values() if p["name"] == name and p["clusterId"] == cluster_id), None)

    def default_node_pool(self, cluster_id: str | None = None) -> dict[str, Any]:
        cluster_id = cluster_id or self.cluster_id
        return next(p for p in self.node_pools.values() if p["isDefault"] and p["clusterId"] == cluster_id)

    def set_node_pool_gpus(
        self, name: str, *, total: float | None = None, allocated: float | None = None, cluster_id: str | None = None
    ) -> None:
        """Set the metric numbers. Without `allocated`, allocation is the sum of the projects' allocations."""
        pool = self.node_pool(name, cluster_id)
        assert pool is not None, f"no node pool {name}"
        gpus = self.node_pool_gpus[pool["id"]]
        if total is not None:
            gpus["total"] = total
        gpus["allocated"] = allocated

    def add_department(self, name: str, *, gpu_quota: float = -1, cluster_id: str | None = None) -> dict[str, Any]:
        """A department as a Run:ai admin creates one. Without `gpu_quota` its deserved GPUs are -1,
        no quota: Run:ai's scheduler holds a non-preemptible pod to its department's deserved GPUs
        too, and reads 0 as a limit of none, so a department meant not to limit its projects is -1."""
        cluster_id = cluster_id or self.cluster_id
        pool = self.default_node_pool(cluster_id)
        department = {
            "id": str(next(self._ids)),
            "name": name,
            "clusterId": cluster_id,
            "description": "",
            "createdAt": _now(),
            "updatedAt": _now(),
            "createdBy": "admin@example.com",
            "updatedBy": "admin@example.com",
            "resources": [
                {
                    "nodePool": {"id": pool["id"], "name": pool["name"]},
                    "gpu": {"deserved": gpu_quota, "limit": -1, "overQuotaWeight": 1},
                }
            ],
            "totalResources": {"gpuQuota": gpu_quota, "cpuQuota": None, "memoryQuota": None},
        }
        self.departments[department["id"]] = department
        return department

    def department(self, name: str, cluster_id: str | None = None) -> dict[str, Any] | None:
        cluster_id = cluster_id or self.cluster_id
        return next((d for d in self.departments.values() if d["name"] == name and d["clusterId"] == cluster_id), None)

    def remove_department(self, name: str, cluster_id: str | None = None) -> None:
        department = self.department(name, cluster_id)
        if department is not None:
            del self.departments[department["id"]]

    def add_project(
        self,
        name: str,
        *,
        department: str = "default",
        namespace: str | None = None,
        gpu_quota: float = 0,
        node_pool: str | None = None,
        phase: str = "Ready",
        cluster_id: str | None = None,
    ) -> dict[str, Any]:
        """Put a project in place directly, as a Run:ai admin would (adoption, drift tests)."""
        cluster_id = cluster_id or self.cluster_id
        parent = self.department(department, cluster_id)
        assert parent is not None, f"no department {department}"
        pool = self.node_pool(node_pool, cluster_id) if node_pool else self.default_node_pool(cluster_id)
        assert pool is not None, f"no node pool {node_pool}"
        resources = [{"nodePool": {"id": pool["id"], "name": pool["name"]}, "gpu": {"deserved": gpu_quota}}]
        project = self._new_project(name, cluster_id, parent["id"], namespace, resources, {})
        project["status"]["phase"] = phase
        return project

    def project(self, name: str, cluster_id: str | None = None) -> dict[str, Any] | None:
        cluster_id = cluster_id or self.cluster_id
        return next((p for p in self.projects.values() if p["name"] == name and p["clusterId"] == cluster_id), None)

    def set_project_usage(
        self,
        name: str,
        *,
        allocated: float = 0,
        allocated_non_preemptible: float = 0,
        requested: float = 0,
        node_pool: str | None = None,
    ) -> None:
        """GPUs Run:ai reports as allocated/requested for the project on one node pool (default pool)."""
        project = self.project(name)
        assert project is not None, f"no project {name}"
        pool = self.node_pool(node_pool, project["clusterId"]) if node_pool else self.default_node_pool()
        assert pool is not None
        statuses = [s for s in project["status"]["nodePoolQuotaStatuses"] if s["nodePoolId"] != pool["id"]]
        statuses.append(
            {
                "nodePoolName": pool["name"],
                "nodePoolId": pool["id"],
                **_quota_status(allocated, allocated_non_preemptible, requested),
            }
        )
        project["status"]["nodePoolQuotaStatuses"] = statuses
        project["status"]["quotaStatus"] = self._sum_status(statuses)

    # ---- the cluster side: KAI Queues ---------------------------------------------------------

    def kai_queues(self, cluster_id: str | None = None) -> list[tuple[str, str | None, float]]:
        """The KAI Queues Run:ai's cluster side keeps for this state, as (name, parent, deserved GPUs):
        a department is a parent queue, each of its projects a child queue, and deserved GPUs are
        the quota on the default node pool (the pool KAI schedules onto here)."""
        cluster_id = cluster_id or self.cluster_id
        pool = self.default_node_pool(cluster_id)["id"]

        def deserved(resources: Iterable[Mapping[str, Any]]) -> float:
            return sum(float((r.get("gpu") or {}).get("deserved") or 0) for r in resources
                       if (r.get("nodePool") or {}).get("id") == pool)  # fmt: skip

        departments = {d["id"]: d for d in self.departments.values() if d["clusterId"] == cluster_id}
        queues: list[tuple[str, str | None, float]] = [
            (d["name"], None, deserved(d["resources"])) for d in departments.values()
        ]
        for p in self.projects.values():
            parent = departments.get(p["parentId"])
            if p["clusterId"] == cluster_id and parent is not None:
                queues.append((p["name"], parent["name"], deserved(p["resources"])))
        return queues

    def take_queue_usage(self, usage: Mapping[str, tuple[float, float, float]]) -> None:
        """Each project's GPUs from its Queue's status (allocated, allocatedNonPreemptible,
        requested): what Run:ai reports is what the scheduler allocated."""
        for project in list(self.projects.values()):
            if project["clusterId"] != self.cluster_id:
                continue
            allocated, non_preemptible, requested = usage.get(project["name"], (0.0, 0.0, 0.0))
            self.set_project_usage(
                project["name"], allocated=allocated, allocated_non_preemptible=non_preemptible, requested=requested
            )

    # ---- tokens ---------------------------------------------------------------------------

    def expire_tokens(self) -> None:
        """Every token issued so far is now expired (401 on use)."""
        for token in self.tokens:
            self.tokens[token] = 0.0

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        expiry = self.tokens.get(token) if scheme.lower() == "bearer" else None
        return expiry is not None and time.monotonic() < expiry

    # ---- faults ---------------------------------------------------------------------------

    def fail_next(self, n: int = 1, status: int = 503, *, method: str | None = None, path: str | None = None) -> Fault:
        """Answer `status` to the next `n` requests matching method/path (fnmatch pattern)."""
        fault = Fault(status=status, method=method, path=path, remaining=n)
        self._faults.append(fault)
        return fault

    def fail_when(self, predicate: Predicate, status: int = 503, *, times: int | None = None) -> Fault:
        """Answer `status` while `predicate(method, path, body)` holds (`times` times, or always)."""
        fault = Fault(status=status, predicate=predicate, remaining=times)
        self._faults.append(fault)
        return fault

    def fail_project_create_in(self, department: str, status: int = 503, *, times: int | None = None) -> Fault:
        """Project creation in `department` (by name) fails; elsewhere it works."""
        target = self.department(department)
        assert target is not None, f"no department {department}"
        department_id = target["id"]

        def creating_there(method: str, path: str, body: Any) -> bool:
            return (
                method == "POST"
                and path == "/api/v1/org-unit/projects"
                and isinstance(body, dict)
                and body.get("parentId") == department_id
            )

        return self.fail_when(creating_there, status, times=times)

    def drop_next(self, n: int = 1, *, method: str | None = None, path: str | None = None) -> Fault:
        """Close the connection without answering the next `n` matching requests."""
        fault = Fault(method=method, path=path, remaining=n, drop=True)
        self._faults.append(fault)
        return fault

    def lose_next_answer(self, n: int = 1, *, method: str | None = None, path: str | None = None) -> Fault:
        """Handle the next `n` matching requests, then close the connection instead of answering."""
        fault = Fault(method=method, path=path, remaining=n, drop=True, after=True)
        self._faults.append(fault)
        return fault

    def set_latency(self, seconds: float, *, method: str | None = None, path: str | None = None) -> None:
        """Delay answers to matching requests (all requests: set `latency`)."""
        self._latencies.append(_Latency(seconds, method, path))

    def hold_next(self, method: str, path: str, *, query: Callable[[Mapping[str, str]], bool] = lambda _: True) -> Hold:
        """Keep back the answer to the next request to exactly `path` whose query `query` accepts."""
        hold = Hold(method, path, query)
        self._holds.append(hold)
        return hold

    def clear_faults(self) -> None:
        self._faults.clear()
        for hold in self._holds:
            hold.release()
        self._holds.clear()
        self._latencies.clear()
        self.latency = 0.0

    # ---- request log ----------------------------------------------------------------------

    def calls(self, method: str | None = None, path: str | None = None) -> list[LoggedRequest]:
        """Logged requests matching method and path (fnmatch pattern)."""
        return [
            r
            for r in self.requests
            if (method is None or r.method == method.upper()) and (path is None or fnmatch.fnmatchcase(r.path, path))
        ]

    # ---- middlewares ----------------------------------------------------------------------

    def _middlewares(self) -> list[Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]]:
        chain: list[Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]] = [self._log_mw]
        if self.check_spec:
            chain.append(spec_middleware(self.violations))
        chain.append(self._fault_mw)
        return chain

    @web.middleware
    async def _log_mw(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        entry = LoggedRequest(
            request.method, request.path, dict(request.query), body, authorized=self._authorized(request)
        )
        self.requests.append(entry)
        response = await handler(request)
        entry.status = response.status
        return response

    @web.middleware
    async def _fault_mw(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        delay = self.latency + sum(
            lat.seconds
            for lat in self._latencies
            if (lat.method is None or lat.method.upper() == request.method)
            and (lat.path is None or fnmatch.fnmatchcase(request.path, lat.path))
        )
        if delay:
            await asyncio.sleep(delay)
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        for fault in self._faults:
            if fault.matches(request.method, request.path, body):
                if fault.remaining is not None:
                    fault.remaining -= 1
                if fault.drop:
                    if fault.after:
                        await handler(request)
                    if request.transport is not None:
                        request.transport.close()
                    raise _Dropped()
                return _error(fault.status, "injected failure")
        hold = next((h for h in self._holds if h.matches(request.method, request.path, request.query)), None)
        if hold is None:
            return await handler(request)
        hold.armed = False
        response = await handler(request)  # the state as it is now
        hold.answered.set()
        await hold._released.wait()
        return response

    # ---- handlers -------------------------------------------------------------------------

    async def _token(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not JSON")
        if not isinstance(body, dict) or body.get("grantType") != "client_credentials":
            return _error(400, "unsupported grantType")
        if body.get("clientID") != self.client_id or body.get("clientSecret") != self.client_secret:
            # The spec documents 400, 500 and 503 for this operation, not 401.
            echo = f": {json.dumps(body)}" if self.echo_errors else ""
            return _error(400, f"invalid client credentials{echo}")
        token = secrets.token_urlsafe(24)
        self.tokens[token] = time.monotonic() + self.token_lifetime_s
        self.tokens_issued += 1
        return web.json_response({"accessToken": token, "expiresIn": int(self.token_lifetime_s)})

    def _unauthorized(self, request: web.Request) -> web.Response | None:
        if self._authorized(request):
            return None
        return _error(401, "Unauthorized: missing, unknown or expired token")

    async def _clusters(self, request: web.Request) -> web.Response:
        if denied := self._unauthorized(request):
            return denied
        return web.json_response(list(self.clusters.values()))

    async def _list_departments(self, request: web.Request) -> web.Response:
        if denied := self._unauthorized(request):
            return denied
        verbose = request.query.get("verbosity") == "verbose"
        items = [self._department_view(d, verbose) for d in self.departments.values()]
        return self._page(request, "departments", items, {"name": "name", "clusterId": "clusterId"})

    async def _list_projects(self, request: web.Request) -> web.Response:
        if denied := self._unauthorized(request):
            return denied
        fields = {"name": "name", "clusterId": "clusterId", "parentId": "parentId", "departmentId": "parentId"}
        items = [self._project_view(p) for p in self.projects.values()]
        for item in items:  # fields filterBy knows that are not top-level
            item["_parentName"] = self.departments.get(item["parentId"], {}).get("name", "")
            item["_phase"] = item["status"]["phase"]
        return self._page(request, "projects", items, {**fields, "parentName": "_parentName", "phase": "_phase"})

    async def _list_node_pools(self, request: web.Request) -> web.Response:
        if denied := self._unauthorized(request):
            return denied
        items = [dict(p) for p in self.node_pools.values()]
        return self._page(
            request, "nodepools", items, {"name": "name", "clusterId": "clusterId", "phase": "phase"}, paged=False
        )

    def _page(
        self,
        request: web.Request,
        key: str,
        items: list[dict[str, Any]],
        fields: Mapping[str, str],
        *,
        paged: bool = True,
    ) -> web.Response:
        for expression in filter(None, request.query.get("filterBy", "").split(",")):
            match = _FILTER.match(expression)
            if match is None or match["field"] not in fields:
                return _error(400, f"unsupported filter {expression!r}")
            items = [i for i in items if _compare(str(i.get(fields[match["field"]], "")), match["op"], match["value"])]
        for item in items:
            for hidden in [k for k in item if k.startswith("_")]:
                del item[hidden]
        offset = int(request.query.get("offset", "0"))
        limit = int(request.query.get("limit", "50"))
        page: dict[str, Any] = {key: items[offset : offset + limit]}
        if paged and offset + limit < len(items):
            page["next"] = offset + limit
        return web.json_response(page)

    async def _get_project(self, request: web.Request) -> web.Response:
        if denied := self._unauthorized(request):
            return denied
        project = self.projects.get(request.match_info["projectId"])
        if project is None:
            return _error(404, "Resource id not found.")
        return web.json_response(self._project_view(project))

    async def _create_project(self, request: web.Request) -> web.Response:
        if denied := self._unauthorized(request):
            return denied
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "request body is not an object")
        name, cluster_id = body.get("name"), body.get("clusterId")
        if not isinstance(name, str) or not _DNS_LABEL.match(name):
            return _error(400, f"invalid project name {name!r}")
        if cluster_id not in self.clusters:
            return _error(400, f"unknown cluster {cluster_id!r}")
        parent_id = body.get("parentId") or (self.department("default", cluster_id) or {}).get("id")
        parent = self.departments.get(str(parent_id))
        if parent is None or parent["clusterId"] != cluster_id:
            return _error(400, f"unknown department {parent_id!r}")
        if self.project(name, cluster_id) is not None:
            return _error(409, "Resource with this name already exists")
        namespace = body.get("requestedNamespace")
        if namespace and any(
            p["clusterId"] == cluster_id and p["status"].get("namespace") == namespace for p in self.projects.values()
        ):
            return _error(409, f"namespace {namespace} is already bound to a project")
        resources = []
        for entry in body.get("resources") or ():
            pool_ref = entry.get("nodePool") or {}
            pool = self.node_pools.get(str(pool_ref.get("id"))) if pool_ref else self.default_node_pool(cluster_id)
            if pool is None or pool["clusterId"] != cluster_id:
                return _error(400, f"unknown node pool {pool_ref!r}")
            gpu = {"deserved": 0, **(entry.get("gpu") or {})}
            resources.append({**entry, "nodePool": {"id": pool["id"], "name": pool["name"]}, "gpu": gpu})
        project = self._new_project(name, cluster_id, parent["id"], namespace, resources, body)
        created = self._project_view(project)
        created["status"]["phase"] = "Creating"  # Ready from the next read on
        return web.json_response(created, status=201)

    async def _delete_project(self, request: web.Request) -> web.Response:
        if denied := self._unauthorized(request):
            return denied
        project_id = request.match_info["projectId"]
        project = self.projects.get(project_id)
        if project is None:
            return _error(404, "Resource id not found.")
        if self.delete_status == 202 and self.delete_delay_s > 0:
            project["status"]["phase"] = "Deleting"
            loop = asyncio.get_running_loop()
            handle = loop.call_later(self.delete_delay_s, self.projects.pop, project_id, None)
            self._deleting.add(handle)
        else:
            del self.projects[project_id]
        return web.Response(status=self.delete_status)

    async def _metrics(self, request: web.Request) -> web.Response:
        if denied := self._unauthorized(request):
            return denied
        cluster_id = request.match_info["clusterUuid"]
        pool = self.node_pool(request.match_info["nodepoolName"], cluster_id) if cluster_id in self.clusters else None
        if pool is None:
            return _error(404, "Resource id not found.")
        numbers = self.node_pool_gpus[pool["id"]]
        total = numbers["total"] or 0
        allocated = numbers["allocated"]
        if allocated is None:
            allocated = sum(
                s["allocated"]["gpu"]
                for p in self.projects.values()
                for s in p["status"]["nodePoolQuotaStatuses"]
                if s["nodePoolId"] == pool["id"]
            )
        values = {"TOTAL_GPU": total, "ALLOCATED_GPU": allocated, "UNALLOCATED_GPU": max(0, total - allocated)}
        stamp = _now()
        wanted = [t for t in request.query.get("metricType", "").split(",") if t]
        measurements = [
            {"type": t, "labels": None, "values": [{"value": _fmt(values[t]), "timestamp": stamp}]}
            for t in wanted
            if t in values
        ]
        return web.json_response({"measurements": measurements})

    # ---- views ----------------------------------------------------------------------------

    def _new_project(
        self,
        name: str,
        cluster_id: str,
        parent_id: str,
        namespace: str | None,
        resources: list[dict[str, Any]],
        body: Mapping[str, Any],
    ) -> dict[str, Any]:
        project_id = str(next(self._ids))
        project: dict[str, Any] = {
            "id": project_id,
            "name": name,
            "clusterId": cluster_id,
            "parentId": parent_id,
            "requestedNamespace": namespace,
            "description": body.get("description") or "",
            "enforceRunaiScheduler": body.get("enforceRunaiScheduler", True),
            "schedulingRules": body.get("schedulingRules"),
            "defaultNodePools": body.get("defaultNodePools"),
            "nodeTypes": body.get("nodeTypes") or {},
            "resources": resources,
            "createdAt": _now(),
            "updatedAt": _now(),
            "createdBy": "hopsworks-sa",
            "updatedBy": "hopsworks-sa",
            "status": {
                "namespace": namespace or f"runai-{name}",
                "phase": "Ready",
                "phaseMessage": None,
                "nodePoolQuotaStatuses": [],
                "quotaStatus": _quota_status(),
            },
        }
        self.projects[project_id] = project
        return project

    def _project_view(self, project: Mapping[str, Any]) -> dict[str, Any]:
        view = json.loads(json.dumps(project))
        total = sum(float(r.get("gpu", {}).get("deserved") or 0) for r in view["resources"])
        view["totalResources"] = {"gpuQuota": total, "cpuQuota": None, "memoryQuota": None}
        view["effective"] = {
            "schedulingRules": view.get("schedulingRules"),
            "defaultNodePools": view.get("defaultNodePools"),
            "nodeTypes": view.get("nodeTypes") or {},
        }
        return view

    def _department_view(self, department: Mapping[str, Any], verbose: bool) -> dict[str, Any]:
        view = json.loads(json.dumps(department))
        if verbose:  # the spec: status only with verbosity=verbose
            statuses = [
                s
                for p in self.projects.values()
                if p["parentId"] == department["id"]
                for s in p["status"]["nodePoolQuotaStatuses"]
            ]
            view["status"] = {"quotaStatus": self._sum_status(statuses)}
        return view

    @staticmethod
    def _sum_status(statuses: list[Mapping[str, Any]]) -> dict[str, Any]:
        return _quota_status(
            sum(s["allocated"]["gpu"] for s in statuses),
            sum(s["allocatedNonPreemptible"]["gpu"] for s in statuses),
            sum(s["requested"]["gpu"] for s in statuses),
        )


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _compare(actual: str, op: str, expected: str) -> bool:
    if op == "==":
        return actual == expected
    if op == "!=":
        return actual != expected
    if op == "=@":
        return expected in actual
    if op == "!@":
        return expected not in actual
    if op == "=^":
        return actual.startswith(expected)
    if op == "=$":
        return actual.endswith(expected)
    try:  # <= and >= on numbers
        return float(actual) <= float(expected) if op == "<=" else float(actual) >= float(expected)
    except ValueError:
        return actual <= expected if op == "<=" else actual >= expected
