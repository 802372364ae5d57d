"""R6 as pure functions: a project's GPU view and the Run:ai admin view, driven by tables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.support.cluster import cluster_state, namespace
from tests.support.reviews import admitted_labels, owned_by
from webhook.core.admin_view import admin_view, platform_departments
from webhook.core.gpu_view import GpuCode, project_gpu_view, view_node_pool
from webhook.core.runai_data import RunaiData
from webhook.runai.models import Department, NodePool, NodePoolMetrics, Project
from webhook.runai.records import pool_metrics, runai_data
from webhook.snapshot import LeftProject

NOW = 1_000_000.0
CLUSTER = "6f0e6a43-7c57-4c39-9a52-8d1d8a4d2a11"
SAMPLED = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
POOLS = [
    NodePool.from_api({"id": "9", "name": "a100", "clusterId": CLUSTER, "isDefault": False}),
    NodePool.from_api({"id": "1", "name": "default", "clusterId": CLUSTER, "isDefault": True}),
]


def department(dept_id: str, name: str, quotas: Mapping[str, float] | None = None, **usage: float) -> Department:
    quotas = {"default": 0.0} if quotas is None else quotas
    return Department.from_api(
        {
            "id": dept_id,
            "name": name,
            "clusterId": CLUSTER,
            "resources": [{"nodePool": {"name": p}, "gpu": {"deserved": q, "limit": -1}} for p, q in quotas.items()],
            "status": {"quotaStatus": _usage(**usage)},
        }
    )


def _usage(allocated: float = 0, non_preemptible: float = 0, requested: float = 0) -> dict[str, Any]:
    return {
        "allocated": {"gpu": allocated},
        "allocatedNonPreemptible": {"gpu": non_preemptible},
        "requested": {"gpu": requested},
    }


def project(
    name: str,
    dept_id: str = "d-default",
    *,
    namespace_: str | None = None,
    quotas: Mapping[str, float] | None = None,
    limit: float | None = None,
    usage: Mapping[str, tuple[float, float, float]] | None = None,
    default_node_pools: list[str] | None = None,
    project_id: str | None = None,
) -> Project:
    """`usage`: node pool -> (allocated, allocated non-preemptible, requested)."""
    quotas = {"default": 0.0} if quotas is None else quotas
    usage = usage or {}
    raw: dict[str, Any] = {
        "id": project_id or f"p-{name}",
        "name": name,
        "clusterId": CLUSTER,
        "parentId": dept_id,
        "requestedNamespace": namespace_ or name,
        "resources": [
            {"nodePool": {"name": p}, "gpu": {"deserved": q, **({"limit": limit} if limit is not None else {})}}
            for p, q in quotas.items()
        ],
        "status": {
            "phase": "Ready",
            "namespace": namespace_ or name,
            "nodePoolQuotaStatuses": [{"nodePoolName": p, **_usage(*u)} for p, u in usage.items()],
            "quotaStatus": _usage(*(sum(x) for x in zip(*usage.values(), strict=True))) if usage else _usage(),
        },
    }
    if default_node_pools is not None:
        raw["defaultNodePools"] = default_node_pools
    return Project.from_api(raw)


def metrics(pool: str = "default", total: float = 8, allocated: float = 5, unallocated: float | None = 3):
    return NodePoolMetrics(CLUSTER, pool, total, allocated, unallocated, SAMPLED)


DEPARTMENTS = [department("d-default", "default", {"default": 6}, allocated=3), department("d-research", "research")]


def pod(name: str, gpus: float | None = None, kind: str = "notebook", phase: str = "Running", fraction: str = ""):
    resources = {"limits": {"nvidia.com/gpu": str(int(gpus))}} if gpus else {}
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "churn",
            "uid": f"uid-{name}",
            "labels": {"hopsworks.ai/workload-type": kind, **admitted_labels(kind)},
            "annotations": {"gpu-fraction": fraction} if fraction else {},
            **({"ownerReferences": owned_by("Job", name=name)} if kind in ("job", "system-job") else {}),
        },
        "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]},
        "status": {"phase": phase},
    }


def bound(**labels: str) -> dict[str, Any]:
    return namespace("churn", labels={"runai/queue": "churn", **labels})


@dataclass
class Case:
    id: str
    ns: dict[str, Any] = field(default_factory=bound)
    run_ai: bool = True
    runai: RunaiData | None = None
    pods: list[dict[str, Any]] = field(default_factory=list)
    status: str = GpuCode.OK
    codes: tuple[str, ...] = ()
    expect: dict[str, Any] = field(default_factory=dict)  # dotted path in the JSON answer -> value
    missing: dict[str, str] = field(default_factory=dict)  # snapshot.runai_missing


def data(*projects: Project, departments: list[Department] = DEPARTMENTS, **kwargs: Any) -> RunaiData:
    """Run:ai's JSON through the adapter's models and records, as the GPU API reads them."""
    fields: dict[str, Any] = {"reachable": True, "node_pools": POOLS, "metrics": metrics(), **kwargs}
    sample = fields.pop("metrics")
    extra = {k: fields.pop(k) for k in ("metrics_error",) if k in fields}
    read = runai_data(projects=projects, departments=departments, **fields)
    return replace(read, metrics=pool_metrics(sample) if sample is not None else None, **extra)


CHURN = project("churn", quotas={"default": 4}, usage={"default": (3, 1, 3)})

CASES = [
    Case(
        "bound: Run:ai's numbers on the default node pool",
        runai=data(CHURN),
        expect={
            "project.name": "churn",
            "project.phase": "Ready",
            "project.quota": 4,
            "project.limit": None,
            "project.allocated": 3,
            "project.allocated_non_preemptible": 1,
            "project.requested": 3,
            "department.name": "default",
            "department.expected": "default",
            "department.quota": 6,
            "department.allocated": 3,
            "node_pool": "default",
            "node_pool_gpus.total": 8,
            "node_pool_gpus.unallocated": 3,
            "node_pool_gpus.sampled_at": "2025-01-02T03:04:05Z",
            "available_non_preemptible": 3,  # 4 deserved - 1 non-preemptible
            "available_preemptible": 3,  # idle GPUs of the node pool
            "runai_enabled": True,
        },
    ),
    Case(
        "the department is the limit: what it has left is what the view offers",
        runai=data(CHURN, departments=[department("d-default", "default", {"default": 6}, non_preemptible=4)]),
        expect={"available_non_preemptible": 2, "project.quota": 4, "department.allocated_non_preemptible": 4},
    ),
    Case(
        "the department's deserved GPUs used up by its projects: nothing left, though the project has 3",
        runai=data(CHURN, departments=[department("d-default", "default", {"default": 1}, non_preemptible=1)]),
        expect={"available_non_preemptible": 0, "department.quota": 1},
    ),
    Case(
        "the project's waiting pods count against the department too",
        runai=data(CHURN, departments=[department("d-default", "default", {"default": 2})]),
        pods=[pod("nb", 1), pod("app", 1, kind="app", phase="Pending")],
        expect={"available_non_preemptible": 0},
    ),
    Case(
        "a department quota of -1 limits nothing",
        runai=data(CHURN, departments=[department("d-default", "default", {"default": -1}, non_preemptible=9)]),
        expect={"available_non_preemptible": 3},
    ),
    Case(
        "a department with a quota of 0 on the project's node pool leaves nothing there",
        runai=data(CHURN, departments=[department("d-default", "default", {"default": 0, "a100": 8})]),
        expect={"available_non_preemptible": 0},
    ),
    Case(
        "a department with no quota entry on the project's node pool sets no limit there",
        runai=data(CHURN, departments=[department("d-default", "default", {"a100": 0})]),
        expect={"available_non_preemptible": 3},
    ),
    Case(
        "waiting non-preemptible pods Run:ai has not allocated yet count, like admission counts them",
        runai=data(CHURN),
        pods=[pod("nb", 1), pod("app", 2, kind="app", phase="Pending"), pod("job", 4, kind="job")],
        expect={
            "available_non_preemptible": 1,
            "pod_gpus.non_preemptible": 3,
            "pod_gpus.preemptible": 4,
            "project.allocated_non_preemptible": 1,
        },
    ),
    Case(
        "finished pods do not count",
        runai=data(CHURN),
        pods=[pod("nb", 2, phase="Succeeded")],
        expect={"available_non_preemptible": 3, "pod_gpus.non_preemptible": 0},
    ),
    Case(
        "fractions add up without floating-point noise",
        runai=data(project("churn", quotas={"default": 1.5}, usage={"default": (0.5, 0.5, 0.5)})),
        pods=[pod("a", fraction="0.5"), pod("b", fraction="0.2"), pod("c", fraction="0.1")],
        expect={"available_non_preemptible": 0.7, "pod_gpus.non_preemptible": pytest.approx(0.8)},
    ),
    Case(
        "no quota on the node pool: nothing non-preemptible left, jobs still see idle GPUs",
        runai=data(project("churn", quotas={})),
        expect={"project.quota": 0, "available_non_preemptible": 0, "available_preemptible": 3},
    ),
    Case(
        "over quota (quota lowered under running notebooks): zero left, never negative",
        runai=data(project("churn", quotas={"default": 1}, usage={"default": (3, 3, 3)})),
        expect={"available_non_preemptible": 0},
    ),
    Case(
        "a GPU limit caps what jobs can take over quota",
        runai=data(project("churn", quotas={"default": 1}, limit=3, usage={"default": (2, 1, 2)})),
        expect={"project.limit": 3, "available_preemptible": 1},
    ),
    Case(
        "the project's own default node pool beats the cluster's",
        runai=data(
            project(
                "churn",
                quotas={"default": 5, "a100": 2},
                usage={"default": (4, 4, 4), "a100": (1, 1, 1)},
                default_node_pools=["a100"],
            ),
            departments=[department("d-default", "default", {"default": 6, "a100": 3})],
            metrics=metrics("a100", total=4, allocated=4, unallocated=0),
        ),
        expect={
            "node_pool": "a100",
            "project.quota": 2,
            "project.allocated": 1,
            "department.quota": 3,
            "available_non_preemptible": 1,
            "available_preemptible": 0,
        },
    ),
    Case(
        "without defaultNodePools: the cluster's default node pool (not the first listed)",
        runai=data(project("churn", quotas={"default": 5, "a100": 2}, usage={"a100": (2, 2, 2)})),
        expect={"node_pool": "default", "project.quota": 5, "project.allocated": 0, "available_non_preemptible": 5},
    ),
    Case(
        "unbound with Run:ai on: reported, not bound; the department it would go to is shown",
        ns=namespace("churn", labels={"hopsworks.ai/department": "research"}),
        runai=data(project("churn")),  # Run:ai even has one bound to the namespace: still not adopted here
        status=GpuCode.NOT_BOUND,
        codes=(GpuCode.NOT_BOUND,),
        expect={"project": None, "department.name": "research", "available_non_preemptible": None},
    ),
    Case(
        "drift: the platform department exists in Run:ai, the Run:ai project sits elsewhere",
        ns=bound(**{"hopsworks.ai/department": "research"}),
        runai=data(CHURN),
        status=GpuCode.DEPARTMENT_DRIFT,
        codes=(GpuCode.DEPARTMENT_DRIFT,),
        expect={
            "department.name": "default",
            "department.expected": "research",
            "warnings.0.expected": "research",
            "warnings.0.actual": "default",
            "available_non_preemptible": 3,
        },
    ),
    Case(
        "no drift: a platform department Run:ai lacks maps to the default department",
        ns=bound(**{"hopsworks.ai/department": "marketing"}),
        runai=data(CHURN),
        expect={"department.name": "default", "department.expected": "default"},
    ),
    Case(
        "drift the other way: in a named department while the platform says default",
        runai=data(project("churn", "d-research")),
        status=GpuCode.DEPARTMENT_DRIFT,
        codes=(GpuCode.DEPARTMENT_DRIFT,),
        expect={"department.name": "research", "department.expected": "default"},
    ),
    Case(
        "Run:ai off, namespace still bound: binding left, no Run:ai numbers",
        run_ai=False,
        runai=data(CHURN),
        pods=[pod("nb", 1)],
        status=GpuCode.BINDING_LEFT,
        codes=(GpuCode.BINDING_LEFT,),
        expect={
            "runai_enabled": False,
            "project": None,
            "warnings.0.actual": "churn",
            "pod_gpus.non_preemptible": 1,
            "available_preemptible": None,
        },
    ),
    Case(
        "Run:ai off, not bound: Kubernetes numbers only",
        ns=namespace("churn"),
        run_ai=False,
        pods=[pod("nb", 1)],
        status=GpuCode.RUNAI_DISABLED,
        expect={"runai_enabled": False, "project": None, "pod_gpus.non_preemptible": 1},
    ),
    Case(
        "Run:ai unreachable, never refreshed: the pod cache is all there is",
        runai=None,
        pods=[pod("nb", 1)],
        status=GpuCode.UNREACHABLE,
        codes=(GpuCode.UNREACHABLE,),
        expect={"project": None, "available_non_preemptible": None, "pod_gpus.non_preemptible": 1},
    ),
    Case(
        "Run:ai unreachable after a refresh: last known quota, no live node-pool numbers",
        runai=data(CHURN, reachable=False, metrics=None),
        status=GpuCode.UNREACHABLE,
        codes=(GpuCode.UNREACHABLE,),
        expect={"project.quota": 4, "available_non_preemptible": 3, "node_pool_gpus": None},
    ),
    Case(
        "metrics call failed: said so, the rest stands",
        runai=data(CHURN, metrics=None, metrics_error="timed out"),
        status=GpuCode.UNREACHABLE,
        codes=(GpuCode.UNREACHABLE,),
        expect={"available_preemptible": None, "available_non_preemptible": 3},
    ),
    Case(
        "runai/queue names a project Run:ai no longer has: says so and what to do, not 'unreachable'",
        runai=data(project("other")),
        missing={"churn": "churn"},
        status=GpuCode.PROJECT_MISSING,
        codes=(GpuCode.PROJECT_MISSING,),
        expect={"project": None, "department": None, "warnings.0.actual": "churn"},
    ),
    Case(
        "bound after the last refresh, no lookup answered: not known yet, not 'missing'",
        runai=data(project("other")),
        status=GpuCode.NOT_KNOWN_YET,
        codes=(GpuCode.NOT_KNOWN_YET,),
        expect={"project": None, "warnings.0.actual": "churn"},
    ),
    Case(
        "most important code first: unreachable before drift",
        ns=bound(**{"hopsworks.ai/department": "research"}),
        runai=data(CHURN, reachable=False),
        status=GpuCode.UNREACHABLE,
        codes=(GpuCode.UNREACHABLE, GpuCode.DEPARTMENT_DRIFT),
    ),
]


def _at(answer: Any, path: str) -> Any:
    for part in path.split("."):
        answer = answer[int(part)] if isinstance(answer, list) else answer[part]
    return answer


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_project_gpu_view(case: Case) -> None:
    state = cluster_state(namespaces=[case.ns], extra=case.pods, run_ai_enable=case.run_ai)
    snap = state.snapshot()
    snap.runai_missing = case.missing
    ns = snap.namespaces["churn"]
    view = project_gpu_view(ns, snap, case.runai, NOW)
    answer = view.model_dump(mode="json")
    assert answer["status"] == case.status, answer["warnings"]
    assert tuple(w["code"] for w in answer["warnings"]) == case.codes
    if GpuCode.PROJECT_MISSING in case.codes:
        message = answer["warnings"][0]["message"]
        assert "no longer exists in Run:ai" in message and "remove the labels runai/queue" in message
        assert "unreachable" not in message
    for path, value in case.expect.items():
        assert _at(answer, path) == value, (path, answer)
    # The view reads; it never asks for a binding or any other write.
    assert ns.runai_queue == snap.namespaces["churn"].runai_queue


def test_view_node_pool_says_which_metrics_to_fetch() -> None:
    on = cluster_state(namespaces=[bound()], run_ai_enable=True).snapshot()
    off = cluster_state(namespaces=[bound()], run_ai_enable=False).snapshot()
    ns = on.namespaces["churn"]
    assert view_node_pool(ns, on, data(CHURN)) == "default"
    assert view_node_pool(ns, on, data(project("churn", default_node_pools=["a100"]))) == "a100"
    assert view_node_pool(ns, on, RunaiData()) is None  # nothing known: no call
    assert view_node_pool(ns, off, data(CHURN)) is None  # integration off: no call at all


def test_every_warning_has_a_message_naming_the_project() -> None:
    snap = cluster_state(namespaces=[bound(**{"hopsworks.ai/department": "research"})], run_ai_enable=True).snapshot()
    view = project_gpu_view(snap.namespaces["churn"], snap, data(CHURN), NOW)
    assert [w.code for w in view.warnings] == [GpuCode.DEPARTMENT_DRIFT]
    assert "churn" in view.warnings[0].message and "research" in view.warnings[0].message


# ---- admin view ---------------------------------------------------------------------------------


ADMIN_NAMESPACES = [
    namespace("churn", labels={"runai/queue": "churn", "hopsworks.ai/runai-project-id": "p-churn"}),
    namespace("fraud", labels={"hopsworks.ai/department": "research"}),  # not bound
    namespace("ads", labels={"hopsworks.ai/department": "marketing", "runai/queue": "ads"}),  # adopted
    namespace("legacy", labels={"hopsworks.ai/department": "research", "runai/queue": "legacy"}),  # drifted
    namespace("gone", labels={"runai/queue": "gone"}),  # Run:ai project deleted behind our back
    namespace("kube-system", project=False),
]
ADMIN_DEPARTMENTS = [
    department("d-default", "default", {"default": 6, "a100": 2}, allocated=4, non_preemptible=2, requested=5),
    department("d-research", "research", {"default": 3}),
    department("d-ml", "ml-only", {"a100": 1}),  # Run:ai only
]
ADMIN_PROJECTS = [
    project("churn", quotas={"default": 2, "a100": 1}, usage={"default": (1, 1, 1), "a100": (0.5, 0, 0.5)}),
    project("ads", quotas={"default": 1}),
    project("legacy", quotas={"default": 1}),
    project("fraud", "d-research"),  # bound to namespace fraud in Run:ai, but the namespace is not labelled
]


def _rows(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    return {r[key]: r for r in rows}


def test_admin_view_links_departments_and_projects_or_says_not_linked() -> None:
    snap = cluster_state(namespaces=ADMIN_NAMESPACES, run_ai_enable=True).snapshot()
    snap.runai_missing = {"gone": "gone"}  # the refresh saw it bound and Run:ai without the project
    assert platform_departments(snap) == {"default", "research", "marketing"}
    runai = data(*ADMIN_PROJECTS, departments=ADMIN_DEPARTMENTS)
    answer = admin_view(snap, runai).model_dump(mode="json")
    assert answer["status"] == GpuCode.OK and answer["reachable"] and answer["warnings"] == []
    assert answer["default_department"] == "default"

    departments = _rows(answer["departments"], "name")
    assert list(departments) == ["default", "marketing", "ml-only", "research"]
    assert departments["default"] | {"runai_id": None} == {
        "name": "default",
        "platform": True,
        "linked": True,
        "maps_to": "default",
        "runai_id": None,
        "quota": 8,  # summed over node pools
        "allocated": 4,
        "allocated_non_preemptible": 2,
        "requested": 5,
    }
    marketing = departments["marketing"]
    assert (marketing["platform"], marketing["linked"], marketing["maps_to"]) == (True, False, "default")
    assert marketing["quota"] is None and marketing["allocated"] is None  # "Not linked"
    ml = departments["ml-only"]
    assert (ml["platform"], ml["linked"], ml["maps_to"], ml["quota"]) == (False, True, None, 1)

    projects = _rows(answer["projects"], "namespace")
    assert list(projects) == ["ads", "churn", "fraud", "gone", "legacy"]  # project namespaces only
    churn = projects["churn"]
    assert churn["linked"] and churn["created_by_platform"] and churn["warnings"] == []
    assert (churn["quota"], churn["allocated"], churn["allocated_non_preemptible"]) == (3, 1.5, 1)
    assert (churn["department"], churn["runai_department"], churn["expected_department"]) == ("default",) * 3
    fraud = projects["fraud"]
    assert not fraud["linked"] and fraud["quota"] is None and fraud["runai_project"] is None
    assert [w["code"] for w in fraud["warnings"]] == [GpuCode.NOT_BOUND]
    assert (fraud["department"], fraud["expected_department"]) == ("research", "research")
    ads = projects["ads"]
    assert ads["linked"] and not ads["created_by_platform"]  # adopted: no project-id label
    assert (ads["department"], ads["expected_department"], ads["warnings"]) == ("marketing", "default", [])
    legacy = projects["legacy"]
    assert [(w["code"], w["expected"], w["actual"]) for w in legacy["warnings"]] == [
        (GpuCode.DEPARTMENT_DRIFT, "research", "default")
    ]
    gone = projects["gone"]
    assert not gone["linked"] and [w["code"] for w in gone["warnings"]] == [GpuCode.PROJECT_MISSING]


def test_admin_view_with_run_ai_off_links_nothing_and_shows_bindings_left() -> None:
    snap = cluster_state(namespaces=ADMIN_NAMESPACES, run_ai_enable=False).snapshot()
    # Data the directory may still hold is not used: with the integration off nothing comes from Run:ai.
    answer = admin_view(snap, data(*ADMIN_PROJECTS, departments=ADMIN_DEPARTMENTS)).model_dump(mode="json")
    assert (answer["status"], answer["runai_enabled"], answer["reachable"]) == (GpuCode.RUNAI_DISABLED, False, False)
    assert [d["name"] for d in answer["departments"]] == ["default", "marketing", "research"]
    assert not any(d["linked"] for d in answer["departments"])
    projects = _rows(answer["projects"], "namespace")
    assert not any(p["linked"] for p in projects.values())
    assert [w["code"] for w in projects["churn"]["warnings"]] == [GpuCode.BINDING_LEFT]
    assert projects["fraud"]["warnings"] == []


def test_admin_view_with_run_ai_unreachable_keeps_the_last_refresh_and_says_so() -> None:
    snap = cluster_state(namespaces=ADMIN_NAMESPACES, run_ai_enable=True).snapshot()
    stale = admin_view(snap, data(*ADMIN_PROJECTS, departments=ADMIN_DEPARTMENTS, reachable=False))
    assert stale.status == GpuCode.UNREACHABLE and not stale.reachable
    assert next(p for p in stale.projects if p.namespace == "churn").linked
    empty = admin_view(snap, RunaiData())
    assert empty.status == GpuCode.UNREACHABLE
    # Nothing known: no project is reported missing from Run:ai.
    gone = next(p for p in empty.projects if p.namespace == "gone")
    assert gone.warnings == [] and not gone.linked


def test_admin_view_lists_run_ai_projects_left_by_namespaces_deleted_while_off() -> None:
    left = [
        LeftProject("gone-still-there", "gone-still-there", "p-1", "2026-12-01T10:00:00Z"),
        LeftProject("gone-cleaned", "gone-cleaned", "p-2", "2026-12-01T10:01:00Z"),
        LeftProject("half-made", None, None, "2026-12-01T10:02:00Z"),  # intent recorded, never labelled
    ]
    there = project("gone-still-there", project_id="p-1")
    half = project("half-made", namespace_="half-made", project_id="p-3")
    on = cluster_state(namespaces=ADMIN_NAMESPACES, run_ai_enable=True).snapshot()
    answer = admin_view(on, data(there, half, departments=ADMIN_DEPARTMENTS), left).model_dump(mode="json")
    rows = {r["namespace"]: r["in_runai"] for r in answer["left_in_runai"]}
    assert rows == {"gone-still-there": True, "gone-cleaned": False, "half-made": True}
    assert [w["code"] for w in answer["warnings"]] == [GpuCode.PROJECTS_LEFT]
    # Unreachable or off: it cannot know, and says so (None), still listing what it recorded.
    for runai_on, runai in ((True, data(there, departments=ADMIN_DEPARTMENTS, reachable=False)), (False, None)):
        snap = cluster_state(namespaces=ADMIN_NAMESPACES, run_ai_enable=runai_on).snapshot()
        answer = admin_view(snap, runai, left).model_dump(mode="json")
        assert [r["in_runai"] for r in answer["left_in_runai"]] == [None, None, None]
        assert GpuCode.PROJECTS_LEFT in [w["code"] for w in answer["warnings"]]
    # Everything recorded is gone from Run:ai: listed as such, no warning.
    answer = admin_view(on, data(departments=ADMIN_DEPARTMENTS), left[1:2]).model_dump(mode="json")
    assert [r["in_runai"] for r in answer["left_in_runai"]] == [False] and answer["warnings"] == []
