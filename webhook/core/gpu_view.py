"""R6 as pure functions: a project's GPU view (the admin view is `core.admin_view`).

No I/O and no clock: the shell hands in the cluster snapshot, what the Run:ai directory cached
(`core.runai_data.RunaiData`: records the Run:ai adapter fills) plus one node-pool metrics sample,
and the time. Reading never binds anything.

Numbers of the project view are for the project's default node pool (`view_node_pool`):

* `available_non_preemptible` = max(0, `quota.gpus_left(...).left`), the very number admission
  checks against: deserved minus the larger of Run:ai's `allocatedNonPreemptible` and the pod
  cache's non-preemptible GPUs (running or waiting pods of any kind but jobs, plus reservations of
  admitted pods not yet seen). Run:ai counts only what it has allocated; admission also counts what
  waits, so the view never promises a GPU that admission would refuse. No more than the project's
  department has left, counted alike (Run:ai's scheduler checks both). Null when there is no Run:ai
  project to take the quota from.
* `available_preemptible` = the node pool's unallocated GPUs (idle GPUs a job can use over quota),
  capped by the project's GPU limit minus its allocation when Run:ai sets a limit. Null without a
  metrics sample.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel

from webhook.core.quota import gpus_in_use, gpus_left, project_missing_message
from webhook.core.runai_data import (
    GpuUsage,
    PoolMetrics,
    PoolQuota,
    RunaiData,
    RunaiDepartment,
    RunaiNodePool,
    RunaiOrgUnit,
    RunaiProject,
)
from webhook.snapshot import ClusterSnapshot, NamespaceInfo, RunaiDepartmentInfo, RunaiProjectInfo


class GpuCode(StrEnum):
    """Status and warning codes (the API's strings). `status` is the most important code that
    applies, else OK; the scheduling offer branches on them."""

    OK = "OK"
    RUNAI_DISABLED = "RUN_AI_DISABLED"  # integration off, namespace not bound: pod-cache numbers only
    BINDING_LEFT = "RUN_AI_BINDING_LEFT"  # integration off, namespace still labelled runai/queue
    NOT_BOUND = "RUN_AI_PROJECT_NOT_BOUND"  # integration on, namespace not bound yet (reading never binds)
    UNREACHABLE = "RUN_AI_UNREACHABLE"  # no fresh Run:ai data: numbers are from the last refresh, or absent
    PROJECT_MISSING = "RUN_AI_PROJECT_MISSING"  # runai/queue names a project Run:ai does not have
    NOT_KNOWN_YET = "RUN_AI_PROJECT_NOT_KNOWN_YET"  # bound after the last refresh, and no lookup answered
    DEPARTMENT_DRIFT = "RUN_AI_DEPARTMENT_DRIFT"  # the Run:ai project is in another department than expected
    PROJECTS_LEFT = "RUN_AI_PROJECTS_LEFT"  # admin view: namespaces deleted while off left Run:ai projects
    ADMISSION_DOWN = "RUN_AI_ADMISSION_DOWN"  # admin view: Run:ai's admission Deployments are not available


_SEVERITY = (
    GpuCode.BINDING_LEFT,
    GpuCode.NOT_BOUND,
    GpuCode.UNREACHABLE,
    GpuCode.PROJECT_MISSING,
    GpuCode.NOT_KNOWN_YET,
    GpuCode.DEPARTMENT_DRIFT,
)


# ---- answers (also the client's types) -----------------------------------------------------------


class GpuWarning(BaseModel):
    code: str
    message: str
    expected: str | None = None  # drift: the Run:ai department the project should be in
    actual: str | None = None  # drift: where it is; binding left: the Run:ai project still bound


class ProjectGpus(BaseModel):
    """The Run:ai project on the view's node pool."""

    name: str
    id: str | None = None
    phase: str | None = None
    quota: float = 0.0  # deserved GPUs
    limit: float | None = None  # None: no limit
    allocated: float = 0.0
    allocated_non_preemptible: float = 0.0
    requested: float = 0.0


class DepartmentGpus(ProjectGpus):
    """The Run:ai department of the project (unbound: the one it would go to) on the view's node pool."""

    expected: str = ""  # the Run:ai department the project belongs in (drift when != name)


class NodePoolGpus(BaseModel):
    total: float | None = None
    allocated: float | None = None
    unallocated: float | None = None
    sampled_at: datetime | None = None


class PodGpus(BaseModel):
    """From the Kubernetes pod cache (what the platform reports with Run:ai off): not-finished pods."""

    non_preemptible: float = 0.0  # notebooks, terminals, apps, deployments, plus pending reservations
    preemptible: float = 0.0  # jobs and everything else


class GpuAvailability(BaseModel):
    """`GET /api/v1/projects/{namespace}/gpu`."""

    namespace: str
    status: str
    runai_enabled: bool
    project: ProjectGpus | None = None
    department: DepartmentGpus | None = None
    node_pool: str | None = None
    node_pool_gpus: NodePoolGpus | None = None
    available_non_preemptible: float | None = None
    available_preemptible: float | None = None
    pod_gpus: PodGpus = PodGpus()
    warnings: list[GpuWarning] = []


# ---- pieces ---------------------------------------------------------------------------------------


def platform_department(ns: NamespaceInfo, default: str) -> str:
    return ns.department or default


def expected_department(ns: NamespaceInfo, default: str, departments: Iterable[RunaiDepartment]) -> str:
    """The Run:ai department named like the platform department when Run:ai has it, else the default."""
    wanted = platform_department(ns, default)
    return wanted if any(d.name == wanted for d in departments) else default


def find_project(ns: NamespaceInfo, projects: Iterable[RunaiProject]) -> RunaiProject | None:
    """The Run:ai project the namespace's `runai/queue` label names (one bound to it preferred)."""
    queue = ns.runai_queue
    if queue is None:
        return None
    named = [p for p in projects if p.name == queue]
    return next((p for p in named if p.bound_to(ns.name)), named[0] if named else None)


def default_node_pool(project: RunaiProject | None, node_pools: Iterable[RunaiNodePool] | None) -> str | None:
    """The project's first default node pool (where a notebook's GPUs come from), else the
    cluster's default node pool."""
    if project is not None and project.default_node_pool:
        return project.default_node_pool
    return next((p.name for p in node_pools or () if p.is_default), None)


def runai_project_info(
    project: RunaiProject,
    namespace: str,
    node_pools: Iterable[RunaiNodePool] | None,
    sampled_at: float,
    department: RunaiDepartment | None = None,
    department_sampled_at: float | None = None,
) -> RunaiProjectInfo:
    """The snapshot record of `project` that `quota.gpus_left` reads: deserved GPUs and Run:ai's
    non-preemptible allocation on the project's default node pool, for the project and for its
    `department` (sampled at `department_sampled_at`, by default `sampled_at`)."""
    pool = default_node_pool(project, node_pools)
    deserved, usage = _pool_quota(project, pool)
    parent: RunaiDepartmentInfo | None = None
    # A department with no quota entry on the pool says nothing about it: no department limit there
    # (unlike a project, whose missing entry is 0 deserved GPUs, Run:ai's default for a project).
    if department is not None and (pool is None or department.quota_on(pool) is not None):
        department_deserved, department_usage = _pool_quota(department, pool)
        parent = RunaiDepartmentInfo(
            id=department.id,
            name=department.name,
            deserved_gpus=department_deserved,
            allocated_non_preemptible=department_usage.allocated_non_preemptible,
            sampled_at=sampled_at if department_sampled_at is None else department_sampled_at,
        )
    return RunaiProjectInfo(
        id=project.id,
        name=project.name,
        namespace=namespace,
        deserved_gpus=deserved,
        node_pool=pool,
        allocated_non_preemptible=usage.allocated_non_preemptible,
        sampled_at=sampled_at,
        department=parent,
    )


def _pool_quota(unit: RunaiOrgUnit, pool: str | None) -> tuple[float, GpuUsage]:
    # With no pool known, the unit's totals are the best there is.
    if pool is None:
        return unit.gpu_quota, unit.usage
    quota = unit.quota_on(pool)
    return (quota.deserved if quota is not None else 0.0), unit.usage_on(pool)


def view_node_pool(ns: NamespaceInfo, snapshot: ClusterSnapshot, runai: RunaiData | None) -> str | None:
    """The node pool whose metrics the project view needs (None: no Run:ai call is to be made)."""
    if not snapshot.settings.run_ai_enable or runai is None or not runai.has_data:
        return None
    return default_node_pool(find_project(ns, runai.projects or ()), runai.node_pools)


def pod_gpus(snapshot: ClusterSnapshot, namespace: str, now: float) -> PodGpus:
    pods = snapshot.pods.get(namespace, {}).values()
    preemptible = sum(p.gpus for p in pods if not p.finished and p.preemptible)
    return PodGpus(non_preemptible=gpus_in_use(snapshot, namespace, now), preemptible=preemptible)


def _limit(quota: PoolQuota | None) -> float | None:
    # Run:ai writes "no limit" as null or -1.
    if quota is None or quota.limit is None or quota.limit < 0:
        return None
    return quota.limit


def _project_gpus(project: RunaiProject, pool: str | None) -> ProjectGpus:
    quota = project.quota_on(pool) if pool else None
    usage = project.usage_on(pool) if pool else project.usage
    return ProjectGpus(
        name=project.name,
        id=project.id,
        phase=project.phase,
        quota=quota.deserved if quota else 0.0,
        limit=_limit(quota),
        allocated=usage.allocated,
        allocated_non_preemptible=usage.allocated_non_preemptible,
        requested=usage.requested,
    )


def _department_gpus(department: RunaiDepartment, pool: str | None, expected: str) -> DepartmentGpus:
    quota = department.quota_on(pool) if pool else None
    usage = department.usage_on(pool) if pool else department.usage
    return DepartmentGpus(
        name=department.name,
        id=department.id,
        phase=None,  # Run:ai departments have no phase
        quota=quota.deserved if quota else 0.0,
        limit=_limit(quota),
        allocated=usage.allocated,
        allocated_non_preemptible=usage.allocated_non_preemptible,
        requested=usage.requested,
        expected=expected,
    )


def _node_pool_gpus(metrics: PoolMetrics) -> NodePoolGpus:
    unallocated = metrics.unallocated
    if unallocated is None and metrics.total is not None and metrics.allocated is not None:
        unallocated = max(0.0, metrics.total - metrics.allocated)
    return NodePoolGpus(
        total=metrics.total, allocated=metrics.allocated, unallocated=unallocated, sampled_at=metrics.sampled_at
    )


def status_of(warnings: list[GpuWarning], fallback: str = GpuCode.OK) -> str:
    codes = [w.code for w in warnings]
    return next((c for c in _SEVERITY if c in codes), fallback)


def sorted_warnings(warnings: list[GpuWarning]) -> list[GpuWarning]:
    order: dict[str, int] = {code: i for i, code in enumerate(_SEVERITY)}
    return sorted(warnings, key=lambda w: order.get(w.code, len(order)))


def binding_left_warning(ns: NamespaceInfo) -> GpuWarning:
    return GpuWarning(
        code=GpuCode.BINDING_LEFT,
        message=(
            f"the Run:ai integration is off, but namespace {ns.name} is still bound to Run:ai project "
            f"{ns.runai_queue}, so Run:ai keeps scheduling its pods; remove the Run:ai project and the "
            "runai/queue label to leave Run:ai"
        ),
        actual=ns.runai_queue,
    )


def drift_warning(project: RunaiProject, actual: str, expected: str) -> GpuWarning:
    return GpuWarning(
        code=GpuCode.DEPARTMENT_DRIFT,
        message=(
            f"Run:ai project {project.name} is in Run:ai department {actual}, but the project belongs in "
            f"{expected}; a Run:ai administrator can move it"
        ),
        expected=expected,
        actual=actual,
    )


def project_not_found_warning(ns: NamespaceInfo, snapshot: ClusterSnapshot) -> GpuWarning:
    """A bound namespace whose Run:ai project this replica's data does not show: gone from Run:ai
    (the refresh or a lookup saw that), or bound after the last refresh."""
    queue = ns.runai_queue or ""
    if snapshot.runai_missing.get(ns.name) == queue:
        return GpuWarning(code=GpuCode.PROJECT_MISSING, message=project_missing_message(ns.name, queue), actual=queue)
    return GpuWarning(
        code=GpuCode.NOT_KNOWN_YET,
        message=(
            f"namespace {ns.name} was bound to Run:ai project {queue} after this server last read Run:ai; its "
            "numbers show after the next refresh"
        ),
        actual=queue,
    )


def unreachable_warning(runai: RunaiData) -> GpuWarning | None:
    if not runai.has_data:
        return GpuWarning(code=GpuCode.UNREACHABLE, message="Run:ai control plane unreachable: no Run:ai data yet")
    if not runai.reachable:
        return GpuWarning(
            code=GpuCode.UNREACHABLE,
            message="Run:ai control plane unreachable: quota and allocation are from the last successful refresh",
        )
    if runai.metrics_error is not None:
        return GpuWarning(
            code=GpuCode.UNREACHABLE, message=f"Run:ai node pool metrics unavailable: {runai.metrics_error}"
        )
    return None


# ---- the project view -----------------------------------------------------------------------------


def project_gpu_view(
    ns: NamespaceInfo, snapshot: ClusterSnapshot, runai: RunaiData | None, now: float
) -> GpuAvailability:
    """The GPU view of one project namespace. `runai.metrics` should be for `view_node_pool(...)`."""
    settings = snapshot.settings
    pods = pod_gpus(snapshot, ns.name, now)
    if not settings.run_ai_enable:
        # No Run:ai call at all; a namespace still bound is the operator's to clean up.
        warnings: list[GpuWarning] = [binding_left_warning(ns)] if ns.runai_queue else []
        return GpuAvailability(
            namespace=ns.name,
            status=status_of(warnings, GpuCode.RUNAI_DISABLED),
            runai_enabled=False,
            pod_gpus=pods,
            warnings=warnings,
        )
    runai = runai or RunaiData()
    warnings = []
    if (problem := unreachable_warning(runai)) is not None:
        warnings.append(problem)
    departments = runai.departments or ()
    default = settings.run_ai_default_department
    expected = expected_department(ns, default, departments)
    by_id = {d.id: d for d in departments}
    project = find_project(ns, runai.projects or ())
    department: RunaiDepartment | None
    if ns.runai_queue is None:
        warnings.append(
            GpuWarning(
                code=GpuCode.NOT_BOUND,
                message=(
                    f"namespace {ns.name} is not bound to a Run:ai project yet; it is bound by the background "
                    "pass or on its first workload start"
                ),
            )
        )
        department = next((d for d in departments if d.name == expected), None)
    else:
        if project is None and runai.has_data:
            warnings.append(project_not_found_warning(ns, snapshot))
        department = by_id.get(project.parent_id or "") if project is not None else None
        if project is not None and department is not None and department.name != expected:
            warnings.append(drift_warning(project, department.name, expected))
    pool = default_node_pool(project, runai.node_pools) if runai.has_data else None
    project_gpus = _project_gpus(project, pool) if project is not None else None
    available_np: float | None = None
    if project is not None:
        # Admission's record when it is this project (same refresh, same node pool rule); else the
        # directory's last answer, with nothing taken off Run:ai's count.
        info = (snapshot.runai_projects or {}).get(ns.name)
        if info is None or info.id != project.id:
            parent = by_id.get(project.parent_id or "")
            info = runai_project_info(project, ns.name, runai.node_pools, sampled_at=now, department=parent)
        quota = gpus_left(snapshot, ns.name, now, project=info)
        available_np = max(0.0, quota.left) if quota is not None else None
    node_pool_gpus = _node_pool_gpus(runai.metrics) if runai.metrics is not None else None
    available_p: float | None = None
    if node_pool_gpus is not None and node_pool_gpus.unallocated is not None:
        available_p = max(0.0, node_pool_gpus.unallocated)
        if project_gpus is not None and project_gpus.limit is not None:
            available_p = min(available_p, max(0.0, project_gpus.limit - project_gpus.allocated))
    warnings = sorted_warnings(warnings)
    return GpuAvailability(
        namespace=ns.name,
        status=status_of(warnings),
        runai_enabled=True,
        project=project_gpus,
        department=_department_gpus(department, pool, expected) if department is not None else None,
        node_pool=pool,
        node_pool_gpus=node_pool_gpus,
        available_non_preemptible=_clean(available_np),
        available_preemptible=_clean(available_p),
        pod_gpus=pods,
        warnings=warnings,
    )


def _clean(value: float | None) -> float | None:
    # Fractions add up in floating point: 0.30000000000000004 helps no one.
    return None if value is None else round(value, 6) + 0.0
