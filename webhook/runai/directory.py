"""What Run:ai knows, refreshed on a timer on every replica: cluster id, departments, projects.

The quota check reads `snapshot.runai_projects`, which this module publishes after each refresh
(every `run_ai_directory_refresh_s`), with `runai_reachable` and the bound namespaces whose Run:ai
project is gone (`runai_missing`). A failed refresh publishes None and `runai_reachable=False`: the
quota check is then skipped for bound projects (Run:ai enforces the quota when it schedules), as
the seed asks. A project bound after the last refresh (e.g. by another replica) is fetched on
demand with `lookup`: one counted request-path call, short timeout, concurrent lookups of a
namespace sharing it. A project replaced by a department move stops being published the moment the
namespace cache shows the new project id (`follow_namespace`), and neither a refresh nor a lookup
whose list was read before the move publishes it again (`core.runai_bindings`). With
`run_ai_enable` off no call is made at all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from webhook.core.gpu_view import runai_project_info
from webhook.core.runai_bindings import project_for, projects_by_namespace, replaced
from webhook.runai.client import RunaiClient, RunaiError, RunaiUnreachable
from webhook.runai.models import Cluster, Department, NodePool, Project
from webhook.runai.records import department_record, node_pool_record, project_record
from webhook.shared_calls import SharedCalls, TooManyCalls
from webhook.snapshot import RunaiProjectInfo, department_namespaces
from webhook.state.store import ClusterState
from webhook.tasks import cancel_and_wait, wait_for_event

log = logging.getLogger(__name__)

ClientProvider = Callable[[], RunaiClient | None]
# Namespaces looked up at once by one replica; more is a burst of fresh projects, not normal work.
MAX_LOOKUPS_IN_FLIGHT = 32


@dataclass(frozen=True, slots=True)
class DirectoryView:
    """One consistent refresh result (replaced as a whole, never mutated)."""

    cluster: Cluster
    departments: tuple[Department, ...]
    projects: tuple[Project, ...]
    default_node_pool: NodePool | None
    refreshed_at: float  # epoch seconds
    # Built once per refresh: the settings webhook reads it on every request.
    department_names: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "department_names", frozenset(d.name for d in self.departments))

    def department_by_id(self, department_id: str | None) -> Department | None:
        return next((d for d in self.departments if d.id == department_id), None)


class RunaiDirectory:
    """Timed refresh of Run:ai's org units, published into the cluster snapshot.

    `start()` refreshes at once and then every `interval_s` (None: `run_ai_directory_refresh_s`,
    read before each wait); `refresh_now()` refreshes on demand (the reconciler does before each
    pass); `lookup()` fetches one bound namespace's project. Readers: `view`, `reachable`,
    `department_names()`, `project_for_namespace()`, `cluster_id`.
    """

    def __init__(
        self,
        state: ClusterState,
        client: ClientProvider,
        *,
        interval_s: float | None = None,
        cluster_name: str | None = None,
    ) -> None:
        self.state = state
        self._client = client
        self._interval_s = interval_s
        self._cluster_name = cluster_name
        self.view: DirectoryView | None = None
        # None: never tried (or Run:ai is off); True/False: outcome of the last refresh.
        self.reachable: bool | None = None
        self.last_error: str | None = None
        # Called (synchronously, cheap) after every refresh with the new `reachable` value.
        self.listeners: list[Callable[[bool | None], None]] = []
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lookups: SharedCalls[str, None] = SharedCalls(MAX_LOOKUPS_IN_FLIGHT, "Run:ai project lookups")

    @property
    def interval_s(self) -> float:
        return self._interval_s or float(self.state.settings.run_ai_directory_refresh_s)

    @property
    def cluster_name(self) -> str | None:
        """The Run:ai cluster to use: the constructor's, else `run_ai_cluster_name`, else the only one."""
        return self._cluster_name or self.state.settings.run_ai_cluster_name or None

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="runai-directory")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def poke(self) -> None:
        """Refresh soon, without waiting for it (settings changed, a binder created a project)."""
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            try:
                await self.refresh_now()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not stop the refreshes for good
                log.exception("Run:ai directory refresh failed unexpectedly")
            await wait_for_event(self._wake, self.interval_s)
            self._wake.clear()

    # -- refresh ------------------------------------------------------------------------------
    async def refresh_now(self) -> bool:
        """Refresh now; True when Run:ai answered (False when it did not or the integration is off)."""
        async with self._lock:
            return await self._refresh()

    async def _refresh(self) -> bool:
        client = self._client() if self.state.settings.run_ai_enable else None
        if client is None:
            # Off: forget everything, call nothing. Admission skips Run:ai entirely when off.
            self.view = None
            self.reachable = None
            self.last_error = None
            self._publish(None, None)
            self._notify()
            return False
        # Bound before the calls below: a project missing from their answer is really gone (a
        # binder creates the project before it labels the namespace).
        bound_before = {ns.name: ns.runai_queue for ns in self.state.namespaces.values() if ns.runai_queue}
        try:
            cluster = await client.get_cluster(self.cluster_name, call_path="background")
            departments = await client.list_departments(cluster_id=cluster.uuid, call_path="background")
            pool = await client.default_node_pool(cluster.uuid, call_path="background")
            # Projects last, and the time taken after their answer: a pod the cache sees leave
            # after it may still be in Run:ai's allocation (`core.quota.gpus_left` corrects that).
            projects = await client.list_projects(cluster_id=cluster.uuid, call_path="background")
            sampled_at = time.time()
        except RunaiError as exc:
            if self.reachable is not False:
                log.warning("Run:ai directory refresh failed: %s", exc)
            self.reachable = False
            self.last_error = str(exc)
            # Stale quota numbers would refuse or admit on old data; None means "not checked".
            self._publish(None, False)
            self._notify()
            return False
        if not self.state.settings.run_ai_enable:
            return False  # turned off while we were asking: do not publish
        self.view = DirectoryView(cluster, tuple(departments), tuple(projects), pool, sampled_at)
        self.reachable = True
        self.last_error = None
        by_namespace = self._by_namespace(self.view)
        names = {p.name for p in self.view.projects}
        missing = {ns: q for ns, q in bound_before.items() if q not in names and ns not in by_namespace}
        self._publish(by_namespace, True, missing)
        self._notify()
        return True

    def _publish(
        self,
        projects: dict[str, RunaiProjectInfo] | None,
        reachable: bool | None,
        missing: dict[str, str] | None = None,
    ) -> None:
        snapshot = self.state.snapshot()
        self._set_projects(projects)
        snapshot.runai_reachable = reachable
        snapshot.runai_missing = missing or {}

    def _set_projects(self, projects: Mapping[str, RunaiProjectInfo] | None) -> None:
        # With the index that goes with it (`ClusterSnapshot.runai_department_namespaces`).
        snapshot = self.state.snapshot()
        snapshot.runai_projects = projects
        snapshot.runai_department_namespaces = department_namespaces(projects) if projects is not None else None

    def _notify(self) -> None:
        for listener in list(self.listeners):
            try:
                listener(self.reachable)
            except Exception:
                log.exception("Run:ai directory listener failed")

    def _by_namespace(self, view: DirectoryView) -> dict[str, RunaiProjectInfo]:
        # The namespace cache as it is now, not as it was when the list was asked for: a project
        # a department move replaced meanwhile is left out (`core.runai_bindings`).
        by_id = {p.id: p for p in view.projects}
        chosen = projects_by_namespace(self.state.namespaces, [project_record(p) for p in view.projects])
        return {ns: self.info(by_id[record.id], ns, view) for ns, record in chosen.items()}

    @staticmethod
    def info(
        project: Project, namespace: str, view: DirectoryView | None, sampled_at: float | None = None
    ) -> RunaiProjectInfo:
        """The snapshot record of `project`: deserved GPUs and Run:ai's non-preemptible allocation
        on the project's default node pool (the rule the GPU view uses too), as sampled at
        `sampled_at` (default: the view's refresh), and its department's from the view's refresh."""
        pools = (view.default_node_pool,) if view is not None and view.default_node_pool is not None else ()
        if sampled_at is None:
            sampled_at = view.refreshed_at if view is not None else 0.0
        department = view.department_by_id(project.parent_id) if view is not None else None
        return runai_project_info(
            project_record(project),
            namespace,
            [node_pool_record(p) for p in pools],
            sampled_at,
            department=department_record(department) if department is not None else None,
            department_sampled_at=view.refreshed_at if view is not None else None,
        )

    def note_project(self, namespace: str, project: Project, sampled_at: float | None = None) -> None:
        """A binder just bound `namespace` to `project`, or a lookup found it (at `sampled_at`):
        publish it before the next refresh (Run:ai just answered, so also when the last refresh
        failed or never ran)."""
        snapshot = self.state.snapshot()
        if self.view is not None:
            self.view = DirectoryView(
                self.view.cluster,
                self.view.departments,
                (*(p for p in self.view.projects if p.id != project.id), project),
                self.view.default_node_pool,
                self.view.refreshed_at,
            )
        self._set_projects(
            {**(snapshot.runai_projects or {}), namespace: self.info(project, namespace, self.view, sampled_at)}
        )
        snapshot.runai_missing = {ns: q for ns, q in snapshot.runai_missing.items() if ns != namespace}

    # -- one project on demand ---------------------------------------------------------------
    async def lookup(self, namespace: str, *, timeout_s: float) -> None:
        """Fetch the Run:ai project that bound `namespace`'s runai/queue label names (of several, the
        one its project-id label names; never one that label says was replaced), and publish it
        (or that Run:ai has no such project, in `runai_missing`). One counted request-path call
        (two before the first refresh: the cluster id), all within `timeout_s`; concurrent lookups
        of one namespace share it. Raises RunaiError (RunaiUnreachable: no answer in time)."""
        try:
            await self._lookups.call(namespace, lambda: self._lookup(namespace, timeout_s))
        except TooManyCalls as exc:
            raise RunaiError(str(exc)) from None

    async def _lookup(self, namespace: str, timeout_s: float) -> None:
        info = self.state.namespaces.get(namespace)
        queue = info.runai_queue if info is not None else None
        client = self._client() if self.state.settings.run_ai_enable else None
        if queue is None or client is None:
            return  # unbound or turned off meanwhile: the decision made again says what follows
        quick = client.with_options(timeout_s=timeout_s, connect_timeout_s=timeout_s, retries=0, deadline_s=timeout_s)
        try:
            async with asyncio.timeout(timeout_s):
                cluster_id = self.cluster_id or (await quick.get_cluster(self.cluster_name, call_path="request")).uuid
                named = await quick.list_projects(cluster_id=cluster_id, name=queue, call_path="request")
                sampled_at = time.time()
        except TimeoutError:
            raise RunaiUnreachable(f"the Run:ai control plane did not answer within {timeout_s:g} s") from None
        # The namespace as it is now, not as it was when the list was asked for: a move may have
        # replaced the project meanwhile (the same rule as a refresh's, `core.runai_bindings`).
        chosen = project_for(namespace, self.state.namespaces.get(namespace), [project_record(p) for p in named])
        if chosen is not None:
            self.note_project(namespace, next(p for p in named if p.id == chosen.id), sampled_at)
            return
        if named:
            return  # only projects its id label says were replaced: nothing to publish, the decision retries
        snapshot = self.state.snapshot()
        snapshot.runai_missing = {**snapshot.runai_missing, namespace: queue}

    def follow_namespace(self, namespace: str) -> None:
        """The namespace cache changed `namespace`. When its label hopsworks.ai/runai-project-id now
        names another project than the one published for it, that project was replaced (a
        department move, carried out by any replica, deletes it and creates another): stop
        publishing it at once, so that admission looks the current one up instead of counting
        against the replaced project's quota until the next refresh."""
        info = self.state.namespaces.get(namespace)
        published = (self.state.snapshot().runai_projects or {}).get(namespace)
        if info is None or published is None or not replaced(info, published.id):
            return
        log.info(
            "namespace %s is bound to Run:ai project id %s, not %s: the published record is dropped",
            namespace,
            info.runai_project_id,
            published.id,
        )
        self.forget_project(published.id)

    def forget_project(self, project_id: str) -> None:
        """A binder deleted a project: stop publishing it."""
        current = self.state.snapshot().runai_projects
        if current is not None:
            self._set_projects({ns: p for ns, p in current.items() if p.id != project_id})
        if self.view is not None:
            self.view = DirectoryView(
                self.view.cluster,
                self.view.departments,
                tuple(p for p in self.view.projects if p.id != project_id),
                self.view.default_node_pool,
                self.view.refreshed_at,
            )

    def invalidate(self) -> None:
        """The client changed (another control plane, other credentials): drop what the old one said."""
        self.view = None
        self.reachable = None
        self._publish(None, None)
        self.poke()

    # -- readers ------------------------------------------------------------------------------
    @property
    def cluster_id(self) -> str | None:
        return self.view.cluster.uuid if self.view is not None else None

    def department_names(self) -> frozenset[str] | None:
        """Names of Run:ai's departments in our cluster; None when not known (off or unreachable)."""
        if self.view is None or not self.reachable:
            return None
        return self.view.department_names

    def project_for_namespace(self, namespace: str) -> Project | None:
        """The Run:ai project `namespace` is bound to, as of the last refresh; never one its
        project-id label says a move replaced (the refresh may have listed it before the move)."""
        if self.view is None:
            return None
        ns = self.state.namespaces.get(namespace)
        current = [p for p in self.view.projects if ns is None or not replaced(ns, p.id)]
        queue = ns.runai_queue if ns is not None else None
        if queue:
            named = next((p for p in current if p.name == queue), None)
            if named is not None:
                return named
        return next((p for p in current if p.bound_to(namespace)), None)
