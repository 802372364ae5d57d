"""R6 as pure functions: a project's GPU view and the admin view of Run:ai departments and projects.

No I/O and no clock: the shell hands in the cluster snapshot, what the Run:ai directory cached
(`RunaiData`) plus one node-pool metrics sample, and the time. Reading never binds anything.

Numbers of the project view are for the project's default node pool (`view_node_pool`):

* `available_non_preemptible` = max(0, `validation.gpus_left(...).left`), the very number admission
  checks against: deserved minus the larger of Run:ai's `allocatedNonPreemptible` and the pod
  cache's non-preemptible GPUs (running or waiting pods of any kind but jobs, plus reservations of
  admitted pods not yet seen). Run:ai counts only what it has allocated; admission also counts what
  waits, so the view never promises a GPU that admission would refuse. Null when there is no Run:ai
  project to take the quota from.
* `available_preemptible` = the node pool's unallocated GPUs (idle GPUs a job can use over quota),
  capped by the project's GPU limit minus its allocation when Run:ai sets a limit. Null without a
  metrics sample.

The admin view sums quota and allocation over node pools, as the platform's admin pages do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from webhook.core.validation import gpus_in_use, gpus_left, project_missing_message
from webhook.runai.models import Department, GpuUsage, NodePool, NodePoolGpuQuota, NodePoolMetrics, Project
from webhook.settings import quota_checked
from webhook.snapshot import ClusterSnapshot, LeftProject, NamespaceInfo, RunaiProjectInfo

# Status and warning codes. `status` is the most important code that applies, else OK.
OK = "OK"
RUNAI_DISABLED = "RUN_AI_DISABLED"  # integration off, namespace not bound: pod-cache numbers only
BINDING_LEFT = "RUN_AI_BINDING_LEFT"  # integration off, namespace still labelled runai/queue
NOT_BOUND = "RUN_AI_PROJECT_NOT_BOUND"  # integration on, namespace not bound yet (reading never binds)
UNREACHABLE = "RUN_AI_UNREACHABLE"  # no fresh Run:ai data: numbers are from the last refresh, or absent
PROJECT_MISSING = "RUN_AI_PROJECT_MISSING"  # runai/queue names a project Run:ai does not have
NOT_KNOWN_YET = "RUN_AI_PROJECT_NOT_KNOWN_YET"  # bound after the last refresh, and no lookup answered
DEPARTMENT_DRIFT = "RUN_AI_DEPARTMENT_DRIFT"  # the Run:ai project is in another department than expected
PROJECTS_LEFT = "RUN_AI_PROJECTS_LEFT"  # admin view: namespaces deleted while off left Run:ai projects
_SEVERITY = (BINDING_LEFT, NOT_BOUND, UNREACHABLE, PROJECT_MISSING, NOT_KNOWN_YET, DEPARTMENT_DRIFT)


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


class AdminDepartment(BaseModel):
    name: str
    platform: bool  # a platform department: a label of some project namespace, or the default
    linked: bool  # Run:ai has a department of this name; else shown "Not linked"
    maps_to: str | None = None  # platform departments: the Run:ai department their projects go to
    runai_id: str | None = None
    quota: float | None = None  # summed over node pools; None when not linked
    allocated: float | None = None
    allocated_non_preemptible: float | None = None
    requested: float | None = None


class AdminProject(BaseModel):
    namespace: str
    department: str  # platform department (the label, else the default)
    linked: bool  # bound and Run:ai has the project; else shown "Not linked"
    runai_project: str | None = None
    runai_project_id: str | None = None
    runai_department: str | None = None  # where the Run:ai project is
    expected_department: str | None = None  # where it belongs (Run:ai on)
    created_by_platform: bool = False  # hopsworks.ai/runai-project-id names it: moves/deletes allowed
    phase: str | None = None
    quota: float | None = None  # summed over node pools
    allocated: float | None = None
    allocated_non_preemptible: float | None = None
    requested: float | None = None
    warnings: list[GpuWarning] = []


class LeftInRunai(BaseModel):
    """A Run:ai project this system created for a namespace that was deleted while the integration
    was off, as the namespace said then (`webhook.runai.left`)."""

    namespace: str
    runai_project: str | None = None
    runai_project_id: str | None = None  # None: its creation was unfinished
    namespace_deleted_at: str
    in_runai: bool | None = None  # None: cannot know now (Run:ai off or unreachable)


class RunaiAdminView(BaseModel):
    """`GET /api/v1/admin/runai`."""

    status: str  # OK, RUN_AI_DISABLED or RUN_AI_UNREACHABLE
    runai_enabled: bool
    reachable: bool
    default_department: str
    departments: list[AdminDepartment] = []
    projects: list[AdminProject] = []
    left_in_runai: list[LeftInRunai] = []
    warnings: list[GpuWarning] = []


# ---- input ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunaiData:
    """What the view reads of Run:ai: the directory's cached org units and one live metrics sample.

    `projects`/`departments`/`node_pools` are None until the directory's first successful refresh.
    """

    reachable: bool = False
    projects: Sequence[Project] | None = None
    departments: Sequence[Department] | None = None
    node_pools: Sequence[NodePool] | None = None
    metrics: NodePoolMetrics | None = None
    metrics_error: str | None = None  # why `metrics` is missing, when a fetch was tried

    @property
    def has_data(self) -> bool:
        return self.projects is not None and self.departments is not None


# ---- pieces ---------------------------------------------------------------------------------------


def platform_department(ns: NamespaceInfo, default: str) -> str:
    return ns.department or default


def expected_department(ns: NamespaceInfo, default: str, departments: Iterable[Department]) -> str:
    """The Run:ai department named like the platform department when Run:ai has it, else the default."""
    wanted = platform_department(ns, default)
    return wanted if any(d.name == wanted for d in departments) else default


def find_project(ns: NamespaceInfo, projects: Iterable[Project]) -> Project | None:
    """The Run:ai project the namespace's `runai/queue` label names (one bound to it preferred)."""
    queue = ns.runai_queue
    if queue is None:
        return None
    named = [p for p in projects if p.name == queue]
    return next((p for p in named if p.bound_to(ns.name)), named[0] if named else None)


def default_node_pool(project: Project | None, node_pools: Iterable[NodePool] | None) -> str | None:
    """The project's first `defaultNodePools` entry, else the cluster's default node pool.

    Run:ai's spec: a project's `defaultNodePools` is the order of node pools its workloads are
    scheduled on when they name none, so its first entry is where a notebook's GPUs come from."""
    if project is not None:
        for source in (project.raw, project.raw.get("effective")):
            pools = source.get("defaultNodePools") if isinstance(source, Mapping) else None
            if isinstance(pools, list) and pools and isinstance(pools[0], str) and pools[0]:
                return pools[0]
    return next((p.name for p in node_pools or () if p.is_default), None)


def runai_project_info(
    project: Project, namespace: str, node_pools: Iterable[NodePool] | None, sampled_at: float
) -> RunaiProjectInfo:
    """The snapshot record of `project` that `validation.gpus_left` reads: deserved GPUs and
    Run:ai's non-preemptible allocation on the project's default node pool."""
    pool = default_node_pool(project, node_pools)
    if pool is None:  # no pool known: the project's totals are the best there is
        deserved, usage = project.gpu_quota, project.usage
    else:
        quota = project.quota_on(pool)
        deserved = quota.deserved if quota is not None else 0.0
        usage = _usage_on(project.usage_by_node_pool, project.usage, pool)
    return RunaiProjectInfo(
        id=project.id,
        name=project.name,
        namespace=namespace,
        deserved_gpus=deserved,
        node_pool=pool,
        allocated_non_preemptible=usage.allocated_non_preemptible,
        sampled_at=sampled_at,
    )


def view_node_pool(ns: NamespaceInfo, snapshot: ClusterSnapshot, runai: RunaiData | None) -> str | None:
    """The node pool whose metrics the project view needs (None: no Run:ai call is to be made)."""
    if not snapshot.settings.run_ai_enable or runai is None or not runai.has_data:
        return None
    return default_node_pool(find_project(ns, runai.projects or ()), runai.node_pools)


def pod_gpus(snapshot: ClusterSnapshot, namespace: str, now: float) -> PodGpus:
    pods = snapshot.pods.get(namespace, {}).values()
    preemptible = sum(p.gpus for p in pods if not p.finished and not quota_checked(p.kind))
    return PodGpus(non_preemptible=gpus_in_use(snapshot, namespace, now), preemptible=preemptible)


def _limit(quota: NodePoolGpuQuota | None) -> float | None:
    # Run:ai writes "no limit" as null or -1.
    if quota is None or quota.limit is None or quota.limit < 0:
        return None
    return quota.limit


def _usage_on(per_pool: Mapping[str, GpuUsage], summed: GpuUsage, pool: str) -> GpuUsage:
    # Without a per-pool breakdown, Run:ai's sum is all there is.
    return per_pool.get(pool, GpuUsage()) if per_pool else summed


def _department_usage_by_pool(department: Department) -> dict[str, GpuUsage]:
    status = department.raw.get("status")
    entries = status.get("nodePoolQuotaStatuses") if isinstance(status, Mapping) else None
    return {
        str(e["nodePoolName"]): GpuUsage.from_api(e)
        for e in entries or ()
        if isinstance(e, Mapping) and e.get("nodePoolName")
    }


def _project_gpus(project: Project, pool: str | None) -> ProjectGpus:
    quota = project.quota_on(pool) if pool else None
    usage = _usage_on(project.usage_by_node_pool, project.usage, pool) if pool else project.usage
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


def _department_gpus(department: Department, pool: str | None, expected: str) -> DepartmentGpus:
    quota = department.quota_on(pool) if pool else None
    usage = _usage_on(_department_usage_by_pool(department), department.usage, pool) if pool else department.usage
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


def _node_pool_gpus(metrics: NodePoolMetrics) -> NodePoolGpus:
    unallocated = metrics.unallocated
    if unallocated is None and metrics.total is not None and metrics.allocated is not None:
        unallocated = max(0.0, metrics.total - metrics.allocated)
    return NodePoolGpus(
        total=metrics.total, allocated=metrics.allocated, unallocated=unallocated, sampled_at=metrics.sampled_at
    )


def _status(warnings: list[GpuWarning], fallback: str = OK) -> str:
    codes = [w.code for w in warnings]
    return next((c for c in _SEVERITY if c in codes), fallback)


def _sorted(warnings: list[GpuWarning]) -> list[GpuWarning]:
    order = {code: i for i, code in enumerate(_SEVERITY)}
    return sorted(warnings, key=lambda w: order.get(w.code, len(order)))


def _binding_left(ns: NamespaceInfo) -> GpuWarning:
    return GpuWarning(
        code=BINDING_LEFT,
        message=(
            f"the Run:ai integration is off, but namespace {ns.name} is still bound to Run:ai project "
            f"{ns.runai_queue}, so Run:ai keeps scheduling its pods; remove the Run:ai project and the "
            "runai/queue label to leave Run:ai"
        ),
        actual=ns.runai_queue,
    )


def _drift(project: Project, actual: str, expected: str) -> GpuWarning:
    return GpuWarning(
        code=DEPARTMENT_DRIFT,
        message=(
            f"Run:ai project {project.name} is in Run:ai department {actual}, but the project belongs in "
            f"{expected}; a Run:ai administrator can move it"
        ),
        expected=expected,
        actual=actual,
    )


def _project_not_found(ns: NamespaceInfo, snapshot: ClusterSnapshot) -> GpuWarning:
    """A bound namespace whose Run:ai project this replica's data does not show: gone from Run:ai
    (the refresh or a lookup saw that), or bound after the last refresh."""
    queue = ns.runai_queue or ""
    if snapshot.runai_missing.get(ns.name) == queue:
        return GpuWarning(code=PROJECT_MISSING, message=project_missing_message(ns.name, queue), actual=queue)
    return GpuWarning(
        code=NOT_KNOWN_YET,
        message=(
            f"namespace {ns.name} was bound to Run:ai project {queue} after this server last read Run:ai; its "
            "numbers show after the next refresh"
        ),
        actual=queue,
    )


def _unreachable(runai: RunaiData) -> GpuWarning | None:
    if not runai.has_data:
        return GpuWarning(code=UNREACHABLE, message="Run:ai control plane unreachable: no Run:ai data yet")
    if not runai.reachable:
        return GpuWarning(
            code=UNREACHABLE,
            message="Run:ai control plane unreachable: quota and allocation are from the last successful refresh",
        )
    if runai.metrics_error is not None:
        return GpuWarning(code=UNREACHABLE, message=f"Run:ai node pool metrics unavailable: {runai.metrics_error}")
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
        warnings = [_binding_left(ns)] if ns.runai_queue else []
        return GpuAvailability(
            namespace=ns.name,
            status=_status(warnings, RUNAI_DISABLED),
            runai_enabled=False,
            pod_gpus=pods,
            warnings=warnings,
        )
    runai = runai or RunaiData()
    warnings: list[GpuWarning] = []
    if (problem := _unreachable(runai)) is not None:
        warnings.append(problem)
    departments = runai.departments or ()
    default = settings.run_ai_default_department
    expected = expected_department(ns, default, departments)
    by_id = {d.id: d for d in departments}
    project = find_project(ns, runai.projects or ())
    department: Department | None
    if ns.runai_queue is None:
        warnings.append(
            GpuWarning(
                code=NOT_BOUND,
                message=(
                    f"namespace {ns.name} is not bound to a Run:ai project yet; it is bound by the background "
                    "pass or on its first workload start"
                ),
            )
        )
        department = next((d for d in departments if d.name == expected), None)
    else:
        if project is None and runai.has_data:
            warnings.append(_project_not_found(ns, snapshot))
        department = by_id.get(project.parent_id or "") if project is not None else None
        if project is not None and department is not None and department.name != expected:
            warnings.append(_drift(project, department.name, expected))
    pool = default_node_pool(project, runai.node_pools) if runai.has_data else None
    project_gpus = _project_gpus(project, pool) if project is not None else None
    available_np: float | None = None
    if project is not None:
        # Admission's record when it is this project (same refresh, same node pool rule); else the
        # directory's last answer, with nothing taken off Run:ai's count.
        info = (snapshot.runai_projects or {}).get(ns.name)
        if info is None or info.id != project.id:
            info = runai_project_info(project, ns.name, runai.node_pools, sampled_at=now)
        quota = gpus_left(snapshot, ns.name, now, project=info)
        available_np = max(0.0, quota.left) if quota is not None else None
    node_pool_gpus = _node_pool_gpus(runai.metrics) if runai.metrics is not None else None
    available_p: float | None = None
    if node_pool_gpus is not None and node_pool_gpus.unallocated is not None:
        available_p = max(0.0, node_pool_gpus.unallocated)
        if project_gpus is not None and project_gpus.limit is not None:
            available_p = min(available_p, max(0.0, project_gpus.limit - project_gpus.allocated))
    warnings = _sorted(warnings)
    return GpuAvailability(
        namespace=ns.name,
        status=_status(warnings),
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


# ---- the admin view -------------------------------------------------------------------------------


def project_namespaces(snapshot: ClusterSnapshot) -> list[NamespaceInfo]:
    return sorted((ns for ns in snapshot.namespaces.values() if ns.is_project), key=lambda ns: ns.name)


def platform_departments(snapshot: ClusterSnapshot) -> set[str]:
    """Distinct department labels of project namespaces, plus the default department."""
    default = snapshot.settings.run_ai_default_department
    return {platform_department(ns, default) for ns in project_namespaces(snapshot)} | {default}


def admin_view(snapshot: ClusterSnapshot, runai: RunaiData | None, left: Sequence[LeftProject] = ()) -> RunaiAdminView:
    """Every Run:ai department and platform department, every project namespace: linked or not; and
    the Run:ai projects left by namespaces deleted while the integration was off."""
    settings = snapshot.settings
    default = settings.run_ai_default_department
    enabled = settings.run_ai_enable
    runai = runai if enabled and runai is not None else RunaiData()
    departments = list(runai.departments or ())
    by_name = {d.name: d for d in departments}
    by_id = {d.id: d for d in departments}
    platform = platform_departments(snapshot)
    rows: list[AdminDepartment] = []
    for name in sorted(platform | set(by_name)):
        dept = by_name.get(name)
        rows.append(
            AdminDepartment(
                name=name,
                platform=name in platform,
                linked=dept is not None,
                maps_to=(name if dept is not None else default) if name in platform else None,
                runai_id=dept.id if dept else None,
                quota=dept.gpu_quota if dept else None,
                allocated=dept.usage.allocated if dept else None,
                allocated_non_preemptible=dept.usage.allocated_non_preemptible if dept else None,
                requested=dept.usage.requested if dept else None,
            )
        )
    projects: list[AdminProject] = []
    for ns in project_namespaces(snapshot):
        projects.append(_admin_project(ns, snapshot, runai, by_id, departments))
    warnings: list[GpuWarning] = []
    if enabled and (problem := _unreachable(runai)) is not None:
        warnings.append(problem)
    left_rows = _left_in_runai(left, runai if enabled and runai.reachable and runai.has_data else None)
    if any(row.in_runai is not False for row in left_rows):
        warnings.append(
            GpuWarning(
                code=PROJECTS_LEFT,
                message=(
                    "project namespaces were deleted while the Run:ai integration was off, leaving Run:ai projects "
                    "this system created (left_in_runai); delete them in Run:ai, or turn the integration on and "
                    "the leader deletes them"
                ),
            )
        )
    return RunaiAdminView(
        status=_status(warnings, OK if enabled else RUNAI_DISABLED),
        runai_enabled=enabled,
        reachable=enabled and runai.reachable and runai.has_data,
        default_department=default,
        departments=rows,
        projects=projects,
        left_in_runai=left_rows,
        warnings=warnings,
    )


def _left_in_runai(left: Sequence[LeftProject], runai: RunaiData | None) -> list[LeftInRunai]:
    ids = {p.id for p in runai.projects or ()} if runai is not None else set()
    rows = []
    for record in left:
        in_runai: bool | None = None
        if runai is not None:
            if record.runai_project_id:
                in_runai = record.runai_project_id in ids
            else:
                in_runai = any(p.requested_namespace == record.namespace for p in runai.projects or ())
        rows.append(
            LeftInRunai(
                namespace=record.namespace,
                runai_project=record.runai_project,
                runai_project_id=record.runai_project_id,
                namespace_deleted_at=record.deleted_at,
                in_runai=in_runai,
            )
        )
    return rows


def _admin_project(
    ns: NamespaceInfo,
    snapshot: ClusterSnapshot,
    runai: RunaiData,
    by_id: Mapping[str, Department],
    departments: Sequence[Department],
) -> AdminProject:
    settings = snapshot.settings
    default = settings.run_ai_default_department
    row: dict[str, Any] = {"namespace": ns.name, "department": platform_department(ns, default), "linked": False}
    warnings: list[GpuWarning] = []
    if not settings.run_ai_enable:
        if ns.runai_queue:
            warnings.append(_binding_left(ns))
            row["runai_project"] = ns.runai_queue
        return AdminProject(**row, warnings=warnings)
    expected = expected_department(ns, default, departments)
    row["expected_department"] = expected
    project = find_project(ns, runai.projects or ())
    if ns.runai_queue is None:
        warnings.append(GpuWarning(code=NOT_BOUND, message=f"namespace {ns.name} is not bound to Run:ai yet"))
    elif project is None:
        row["runai_project"] = ns.runai_queue
        if runai.has_data:
            warnings.append(_project_not_found(ns, snapshot))
    else:
        department = by_id.get(project.parent_id or "")
        row.update(
            linked=True,
            runai_project=project.name,
            runai_project_id=project.id,
            runai_department=department.name if department else None,
            created_by_platform=ns.runai_project_id == project.id,
            phase=project.phase,
            quota=project.gpu_quota,
            allocated=project.usage.allocated,
            allocated_non_preemptible=project.usage.allocated_non_preemptible,
            requested=project.usage.requested,
        )
        if department is not None and department.name != expected:
            warnings.append(_drift(project, department.name, expected))
    return AdminProject(**row, warnings=_sorted(warnings))
