"""R6, the admin view: every Run:ai department and platform department, every project namespace,
linked or not, and the Run:ai projects left behind by namespaces deleted while the integration was
off. Sums quota and allocation over node pools, as the platform's admin pages do. Pure, like
`core.gpu_view`, whose warnings and codes it shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from webhook.core.gpu_view import (
    GpuCode,
    GpuWarning,
    binding_left_warning,
    drift_warning,
    expected_department,
    find_project,
    platform_department,
    project_not_found_warning,
    sorted_warnings,
    status_of,
    unreachable_warning,
)
from webhook.core.runai_data import RunaiData, RunaiDepartment
from webhook.core.runai_health import runai_admission_warning
from webhook.snapshot import ClusterSnapshot, LeftProject, NamespaceInfo


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


class WouldRefuseRow(BaseModel):
    """Reviews of a project admitted only because their refusal family is in warn mode
    (`core.enforcement`), in the last hour, as this replica counted them."""

    project: str
    rule: str  # the refusal family, e.g. gpu-quota
    count: int
    last_at: float  # Unix time of the last one


class RunaiAdminView(BaseModel):
    """`GET /api/v1/admin/runai`."""

    status: str  # OK, RUN_AI_DISABLED or RUN_AI_UNREACHABLE
    runai_enabled: bool
    reachable: bool
    default_department: str
    departments: list[AdminDepartment] = []
    projects: list[AdminProject] = []
    left_in_runai: list[LeftInRunai] = []
    would_refuse: list[WouldRefuseRow] = []
    warnings: list[GpuWarning] = []


def project_namespaces(snapshot: ClusterSnapshot) -> list[NamespaceInfo]:
    return sorted((ns for ns in snapshot.namespaces.values() if ns.is_project), key=lambda ns: ns.name)


def platform_departments(snapshot: ClusterSnapshot) -> set[str]:
    """Distinct department labels of project namespaces, plus the default department."""
    default = snapshot.settings.run_ai_default_department
    return {platform_department(ns, default) for ns in project_namespaces(snapshot)} | {default}


def admin_view(
    snapshot: ClusterSnapshot,
    runai: RunaiData | None,
    left: Sequence[LeftProject] = (),
    would_refuse: Sequence[tuple[str, str, int, float]] = (),
) -> RunaiAdminView:
    """Every Run:ai department and platform department, every project namespace: linked or not;
    the Run:ai projects left by namespaces deleted while the integration was off; and the projects
    with would-be refusals of the last hour, (project, rule, count, last) each."""
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
    if enabled and (problem := unreachable_warning(runai)) is not None:
        warnings.append(problem)
    if (down := runai_admission_warning(snapshot)) is not None:
        warnings.append(down)
    left_rows = _left_in_runai(left, runai if enabled and runai.reachable and runai.has_data else None)
    if any(row.in_runai is not False for row in left_rows):
        warnings.append(
            GpuWarning(
                code=GpuCode.PROJECTS_LEFT,
                message=(
                    "project namespaces were deleted while the Run:ai integration was off, leaving Run:ai projects "
                    "this system created (left_in_runai); delete them in Run:ai, or turn the integration on and "
                    "the leader deletes them"
                ),
            )
        )
    return RunaiAdminView(
        status=status_of(warnings, GpuCode.OK if enabled else GpuCode.RUNAI_DISABLED),
        runai_enabled=enabled,
        reachable=enabled and runai.reachable and runai.has_data,
        default_department=default,
        departments=rows,
        projects=projects,
        left_in_runai=left_rows,
        would_refuse=[WouldRefuseRow(project=p, rule=r, count=n, last_at=t) for p, r, n, t in would_refuse],
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
    by_id: Mapping[str, RunaiDepartment],
    departments: Sequence[RunaiDepartment],
) -> AdminProject:
    settings = snapshot.settings
    default = settings.run_ai_default_department
    row: dict[str, Any] = {"namespace": ns.name, "department": platform_department(ns, default), "linked": False}
    warnings: list[GpuWarning] = []
    if not settings.run_ai_enable:
        if ns.runai_queue:
            warnings.append(binding_left_warning(ns))
            row["runai_project"] = ns.runai_queue
        return AdminProject(**row, warnings=warnings)
    expected = expected_department(ns, default, departments)
    row["expected_department"] = expected
    project = find_project(ns, runai.projects or ())
    if ns.runai_queue is None:
        warnings.append(GpuWarning(code=GpuCode.NOT_BOUND, message=f"namespace {ns.name} is not bound to Run:ai yet"))
    elif project is None:
        row["runai_project"] = ns.runai_queue
        if runai.has_data:
            warnings.append(project_not_found_warning(ns, snapshot))
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
            warnings.append(drift_warning(project, department.name, expected))
    return AdminProject(**row, warnings=sorted_warnings(warnings))
