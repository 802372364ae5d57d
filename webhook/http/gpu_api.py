"""The GPU API (R6): `GET /api/v1/projects/{namespace}/gpu` and `GET /api/v1/admin/runai`.

Thin aiohttp routes around `webhook.core.gpu_view`. Reads only: the namespace and pod caches, the
Run:ai directory's cached org units, and one live Run:ai call, the node-pool metrics, cached for a
few seconds per node pool and shared by concurrent requests, so a UI polling many projects makes
at most one metrics call per node pool per TTL.

Run:ai unreachable: the project view still answers 200 with status `RUN_AI_UNREACHABLE` (a UI's GPU
section can still show the binding state, the pod-cache numbers and the last known quota, and the
seed keeps the platform working without the control plane). The admin view answers 503 only while
there has never been Run:ai data: every department and project would otherwise show "Not linked",
which is false.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from aiohttp import web

from webhook.core.admin_view import RunaiAdminView, admin_view
from webhook.core.gpu_view import GpuAvailability, find_project, project_gpu_view, view_node_pool
from webhook.core.runai_data import RunaiData
from webhook.http.auth import AuthError, Authorizer, bearer_token
from webhook.metrics import WOULD_REFUSE_RECENT
from webhook.runai.client import RunaiClient, RunaiError
from webhook.runai.models import Department, NodePool, NodePoolMetrics, Project
from webhook.runai.records import pool_metrics, runai_data
from webhook.snapshot import LeftProject
from webhook.state.store import ClusterState

log = logging.getLogger(__name__)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class RunaiDirectoryView(Protocol):
    """What the GPU API needs of the Run:ai directory (`webhook.runai.directory.RunaiDirectory`).

    The list methods return the last successful refresh (None before the first one) and must not
    call out. `node_pool_metrics` is the one live call; it raises `RunaiError` (e.g.
    `RunaiUnreachable`) on failure and should count itself as a request-path call.
    """

    @property
    def cluster_id(self) -> str | None: ...

    @property
    def reachable(self) -> bool: ...

    def projects(self) -> Sequence[Project] | None: ...

    def departments(self) -> Sequence[Department] | None: ...

    def node_pools(self) -> Sequence[NodePool] | None: ...

    async def node_pool_metrics(self, node_pool: str) -> NodePoolMetrics: ...


class TimedDirectory(Protocol):
    """The shape of `webhook.runai.directory.RunaiDirectory` that `DirectoryAdapter` reads."""

    @property
    def view(self) -> Any: ...  # None, or has .departments, .projects, .default_node_pool

    @property
    def reachable(self) -> bool | None: ...

    @property
    def cluster_id(self) -> str | None: ...


class DirectoryAdapter:
    """`RunaiDirectoryView` over a directory that keeps its last refresh in `view`, plus the Run:ai
    client provider it refreshes with (used here only for the node-pool metrics)."""

    def __init__(self, directory: TimedDirectory, client: Callable[[], RunaiClient | None]) -> None:
        self._directory = directory
        self._client = client

    @property
    def cluster_id(self) -> str | None:
        return self._directory.cluster_id

    @property
    def reachable(self) -> bool:
        return self._directory.reachable is True

    def projects(self) -> Sequence[Project] | None:
        view = self._directory.view
        return None if view is None else tuple(view.projects)

    def departments(self) -> Sequence[Department] | None:
        view = self._directory.view
        return None if view is None else tuple(view.departments)

    def node_pools(self) -> Sequence[NodePool] | None:
        view = self._directory.view
        if view is None:
            return None
        pool = view.default_node_pool
        return (pool,) if pool is not None else ()

    async def node_pool_metrics(self, node_pool: str) -> NodePoolMetrics:
        client = self._client()
        cluster_id = self.cluster_id
        if client is None or cluster_id is None:
            raise RunaiError("no Run:ai client or cluster yet")
        return await client.node_pool_metrics(cluster_id, node_pool, call_path="request")


class MetricsCache:
    """Node-pool metrics per pool for `ttl_s` (failures too: an unreachable control plane is not
    retried per request), one fetch in flight per pool, each fetch bounded by `timeout_s`."""

    def __init__(
        self,
        fetch: Callable[[str], Any],
        *,
        ttl_s: float = 5.0,
        timeout_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._done: dict[str, tuple[float, NodePoolMetrics | str]] = {}
        self._inflight: dict[str, asyncio.Task[NodePoolMetrics | str]] = {}

    async def get(self, node_pool: str) -> NodePoolMetrics | str:
        """The metrics, or a reason why there are none."""
        cached = self._done.get(node_pool)
        if cached is not None and cached[0] > self._clock():
            return cached[1]
        task = self._inflight.get(node_pool)
        if task is None:
            task = asyncio.ensure_future(self._load(node_pool))
            self._inflight[node_pool] = task
        # A caller that goes away must not cancel the fetch the others wait for.
        return await asyncio.shield(task)

    async def _load(self, node_pool: str) -> NodePoolMetrics | str:
        result: NodePoolMetrics | str
        try:
            result = await asyncio.wait_for(self._fetch(node_pool), self.timeout_s)
        except TimeoutError:
            result = f"no answer within {self.timeout_s:g}s"
        except RunaiError as exc:
            result = str(exc)
        except Exception as exc:  # a bug in a fetcher must not fail every GPU view
            log.exception("node pool metrics for %s failed", node_pool)
            result = f"{type(exc).__name__}"
        finally:
            self._inflight.pop(node_pool, None)
        self._done[node_pool] = (self._clock() + self.ttl_s, result)
        return result


def error_response(status: int, code: str, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": reason, "code": code}, status=status, headers=headers)


def auth_error_response(exc: AuthError) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="scheduling-webhook"'} if exc.status == 401 else None
    return error_response(exc.status, exc.code, exc.reason, headers)


def private_json(payload: Any) -> web.Response:
    # Per-user answers: no shared cache may keep them.
    return web.json_response(payload, headers={"Cache-Control": "private, no-store"})


Answer = Callable[[web.Request], Awaitable[web.Response]]


def authorized(authorizer: Authorizer, answer: Answer, *, admin: bool = False) -> Answer:
    """`answer`, for a bearer token of an admin (`admin`) or of a member of the path's project
    namespace. The token is checked before anything is looked up, so that a 404 never tells a
    stranger whether a namespace exists."""

    async def handle(request: web.Request) -> web.Response:
        token = bearer_token(request.headers.get("Authorization"))
        client = request.remote or ""
        try:
            if admin:
                await authorizer.authorize_admin(token, client=client)
            else:
                await authorizer.authorize_project(token, request.match_info["namespace"], client=client)
        except AuthError as exc:
            return auth_error_response(exc)
        return await answer(request)

    return handle


class GpuViews:
    """The GPU API's answers as objects: read by its routes, the scheduling API and the console.
    `directory` None: Run:ai not configured. `lookup(namespace)` fetches the Run:ai project of a
    namespace bound since the directory's last refresh (`RunaiIntegration.lookup_project`); without
    it such a project shows as not known yet. `left_in_runai()` reads the records of Run:ai projects
    left by namespaces deleted while the integration was off (`LeftProjects.load`), for the admin view."""

    def __init__(
        self,
        state: ClusterState,
        directory: RunaiDirectoryView | None,
        *,
        metrics_ttl_s: float = 5.0,
        metrics_timeout_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        lookup: Callable[[str], Awaitable[object]] | None = None,
        left_in_runai: Callable[[], Awaitable[Sequence[LeftProject]]] | None = None,
    ) -> None:
        self.state = state
        self.directory = directory
        self._wall_clock = wall_clock
        self._lookup = lookup
        self._left_in_runai = left_in_runai

        async def fetch(node_pool: str) -> NodePoolMetrics:
            assert directory is not None
            return await directory.node_pool_metrics(node_pool)

        self.metrics = MetricsCache(fetch, ttl_s=metrics_ttl_s, timeout_s=metrics_timeout_s, clock=clock)

    def runai_data(self) -> RunaiData | None:
        if self.directory is None or not self.state.settings.run_ai_enable:
            return None  # integration off: not a single call to Run:ai
        return runai_data(
            reachable=self.directory.reachable,
            projects=self.directory.projects(),
            departments=self.directory.departments(),
            node_pools=self.directory.node_pools(),
        )

    async def project(self, namespace: str, *, with_metrics: bool = True) -> GpuAvailability | None:
        """The project's GPU view; None when `namespace` is no project namespace. `with_metrics`
        False: no node-pool metrics call (the preemptible numbers stay empty)."""
        snapshot = self.state.snapshot()
        ns = snapshot.namespaces.get(namespace) if _DNS_LABEL.match(namespace) else None
        if ns is None or not ns.is_project:
            return None
        data = self.runai_data()
        if (
            data is not None
            and data.has_data
            and data.reachable
            and ns.runai_queue
            and snapshot.runai_missing.get(namespace) != ns.runai_queue
            and find_project(ns, data.projects or ()) is None
        ):
            if self._lookup is None:
                # No lookup (e.g. a folder's Run:ai snapshot): the data is all there is to know.
                snapshot = dataclasses.replace(
                    snapshot, runai_missing={**snapshot.runai_missing, namespace: ns.runai_queue}
                )
            else:
                # Bound after the last refresh (e.g. by another replica): one bounded, shared lookup.
                try:
                    await self._lookup(namespace)
                except RunaiError as exc:
                    log.info("GPU view of %s: Run:ai project lookup failed: %s", namespace, exc)
                data = self.runai_data()
        pool = view_node_pool(ns, snapshot, data) if with_metrics else None
        if data is not None and pool is not None and data.reachable:
            # A control plane the directory cannot reach gets no extra call from here.
            got = await self.metrics.get(pool)
            if isinstance(got, NodePoolMetrics):
                data = replace(data, metrics=pool_metrics(got))
            else:
                data = replace(data, metrics_error=got)
        return project_gpu_view(ns, snapshot, data, self._wall_clock())

    def admin(self, left: Sequence[LeftProject] = ()) -> RunaiAdminView | None:
        """The admin view; None while Run:ai is on and there has never been Run:ai data. `left`:
        the records `left_in_runai()` read (`load_left`)."""
        snapshot = self.state.snapshot()
        data = self.runai_data()
        if snapshot.settings.run_ai_enable and (data is None or not data.has_data):
            return None
        return admin_view(snapshot, data, left, WOULD_REFUSE_RECENT.recent(self._wall_clock()))

    async def load_left(self) -> Sequence[LeftProject]:
        """The Run:ai projects left by namespaces deleted while the integration was off (none
        when no reader was given or the Kubernetes API fails: the rest of the view still stands)."""
        if self._left_in_runai is None:
            return ()
        try:
            return await self._left_in_runai()
        except Exception as exc:
            log.warning("admin view: cannot read the Run:ai projects left behind: %s", exc)
            return ()

    def routes(self, authorizer: Authorizer) -> list[web.RouteDef]:
        async def project_gpu(request: web.Request) -> web.Response:
            namespace = request.match_info["namespace"]
            view = await self.project(namespace)
            if view is None:
                return error_response(404, "NotFound", f"{namespace} is not a project namespace")
            return private_json(view.model_dump(mode="json"))

        async def runai_admin(request: web.Request) -> web.Response:
            view = self.admin(await self.load_left())
            if view is None:
                return error_response(503, "RUN_AI_UNREACHABLE", NO_RUNAI_DATA)
            return private_json(view.model_dump(mode="json"))

        return [
            web.get("/api/v1/projects/{namespace}/gpu", authorized(authorizer, project_gpu), allow_head=False),
            web.get("/api/v1/admin/runai", authorized(authorizer, runai_admin, admin=True), allow_head=False),
        ]


NO_RUNAI_DATA = "Run:ai control plane unreachable and no Run:ai data yet; try again once it is reachable"


def gpu_api_routes(
    state: ClusterState,
    directory: RunaiDirectoryView | None,
    authorizer: Authorizer,
    *,
    metrics_ttl_s: float = 5.0,
    metrics_timeout_s: float = 3.0,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
) -> list[web.RouteDef]:
    """Routes for `create_app(state, routes=...)`. `directory` None: Run:ai not configured."""
    views = GpuViews(
        state,
        directory,
        metrics_ttl_s=metrics_ttl_s,
        metrics_timeout_s=metrics_timeout_s,
        clock=clock,
        wall_clock=wall_clock,
    )
    return views.routes(authorizer)
