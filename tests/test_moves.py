"""The pure department-move plan (`webhook.core.moves.plan_move`): one row per outcome.

Each row gives the facts as the saga would have read them so far and the plan it must get back:
unchanged, relabel only (Run:ai off, not bound, same Run:ai department, adopted -> drift, already
there), a read of Run:ai, a refusal, or a move with an intent.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from webhook.core.moves import (
    MoveFacts,
    MovePlan,
    MoveWithIntent,
    ReadRunaiDepartments,
    ReadRunaiProject,
    Refusal,
    Refused,
    RelabelOnly,
    RunaiDepartmentRef,
    RunaiProjectRef,
    Unchanged,
    plan_move,
    takeover_due,
)
from webhook.settings import ClusterSettings
from webhook.snapshot import (
    DEPARTMENT_LABEL,
    PROJECT_LABEL,
    RUNAI_MOVE_ANNOTATION,
    RUNAI_PROJECT_ID_LABEL,
    RUNAI_QUEUE_LABEL,
    NamespaceInfo,
)

ON = ClusterSettings(run_ai_enable=True, run_ai_default_department="default")
OFF = ClusterSettings(run_ai_enable=False)
DEFAULT = RunaiDepartmentRef("d0", "default")
RESEARCH = RunaiDepartmentRef("d1", "research")
MARKETING = RunaiDepartmentRef("d2", "marketing")
LIVE = (DEFAULT, RESEARCH, MARKETING)


def namespace(
    department: str | None = None,
    *,
    project: bool = True,
    queue: str | None = "churn",
    project_id: str | None = "p1",
    deleting: bool = False,
    moving: bool = False,
) -> NamespaceInfo:
    labels = {PROJECT_LABEL: "churn"} if project else {}
    if department:
        labels[DEPARTMENT_LABEL] = department
    if queue:
        labels[RUNAI_QUEUE_LABEL] = queue
    if project_id:
        labels[RUNAI_PROJECT_ID_LABEL] = project_id
    annotations = {RUNAI_MOVE_ANNOTATION: "{}"} if moving else {}
    return NamespaceInfo(name="churn", labels=labels, annotations=annotations, deleting=deleting)


def facts(ns: NamespaceInfo, target: str | None, **kwargs: object) -> MoveFacts:
    base = MoveFacts(namespace=ns, target=target, settings=ON, cached_departments={"default", "research"})
    return replace(base, **kwargs)  # type: ignore[arg-type]


def project(parent_id: str | None = "d0", bound_here: bool = True) -> RunaiProjectRef:
    return RunaiProjectRef(id="p1", name="churn", parent_id=parent_id, bound_here=bound_here)


@dataclass(frozen=True)
class Case:
    name: str
    facts: MoveFacts
    plan: MovePlan


CASES = [
    Case("invalid department", facts(namespace(), "Bad_Name"), Refused(Refusal.INVALID_DEPARTMENT, "")),
    Case("not a project", facts(namespace(project=False), "research"), Refused(Refusal.NOT_A_PROJECT, "")),
    Case("being deleted", facts(namespace(deleting=True), "research"), Refused(Refusal.DELETING, "")),
    Case("another move under way", facts(namespace(moving=True), "research"), Refused(Refusal.IN_PROGRESS, "")),
    Case("same department", facts(namespace("research"), "research"), Unchanged("")),
    Case("default to default (no label either side)", facts(namespace(), None), Unchanged("")),
    Case(
        "Run:ai off: label only",
        facts(namespace(queue=None, project_id=None), "research", settings=OFF),
        RelabelOnly("", drift=False),
    ),
    Case(
        "Run:ai off, project created here: label only, drift",
        facts(namespace(), "research", settings=OFF),
        RelabelOnly("", drift=True),
    ),
    Case(
        "Run:ai off, adopted project: label only, no drift reported here",
        facts(namespace(project_id=None), "research", settings=OFF),
        RelabelOnly("", drift=False),
    ),
    Case("not bound to Run:ai yet", facts(namespace(queue=None), "research"), RelabelOnly("", drift=False)),
    Case(
        "both map to the same Run:ai department (cached names)",
        facts(namespace("marketing"), None),  # marketing is not a Run:ai department: it maps to default
        RelabelOnly("", False, "default", "default"),
    ),
    Case(
        "adopted project stays: drift",
        facts(namespace(project_id=None), "research"),
        RelabelOnly("", True, "default", "research"),
    ),
    Case(
        "adopted project, departments not known yet: drift",
        facts(namespace(project_id=None), "research", cached_departments=None),
        RelabelOnly("", True, "default", None),
    ),
    Case("created here, different departments: read Run:ai", facts(namespace(), "research"), ReadRunaiDepartments()),
    Case(
        "departments not cached yet: read Run:ai",
        facts(namespace(), "research", cached_departments=None),
        ReadRunaiDepartments(),
    ),
    Case(
        "live departments say both map to the same one",
        facts(namespace(), "marketing", cached_departments=None, runai_departments=(DEFAULT, RESEARCH)),
        RelabelOnly("", False, "default", "default"),
    ),
    Case(
        "busy pods refuse before the project is read",
        facts(namespace(), "research", runai_departments=LIVE, busy_pods=("nb-0",)),
        Refused(Refusal.BUSY, ""),
    ),
    Case(
        "read the recorded project",
        facts(namespace(), "research", runai_departments=LIVE),
        ReadRunaiProject("p1", "default", "research"),
    ),
    Case(
        "recorded project gone from Run:ai",
        facts(namespace(), "research", runai_departments=LIVE, project_read=True),
        Refused(Refusal.PROJECT_GONE, ""),
    ),
    Case(
        "recorded project bound to another namespace",
        facts(namespace(), "research", runai_departments=LIVE, project=project(bound_here=False), project_read=True),
        Refused(Refusal.PROJECT_NOT_BOUND_HERE, ""),
    ),
    Case(
        "target Run:ai department does not exist",
        facts(
            namespace("research"),
            None,
            runai_departments=(RESEARCH,),
            project=project(parent_id="d1"),
            project_read=True,
        ),
        Refused(Refusal.NO_RUNAI_DEPARTMENT, ""),
    ),
    Case(
        "project already in the target Run:ai department",
        facts(namespace(), "research", runai_departments=LIVE, project=project(parent_id="d1"), project_read=True),
        RelabelOnly("", False, "default", "research"),
    ),
    Case(
        "move with an intent",
        facts(namespace(), "research", runai_departments=LIVE, project=project(), project_read=True),
        MoveWithIntent(DEFAULT, RESEARCH),
    ),
    Case(
        "move with an intent from a department Run:ai no longer lists",
        facts(namespace(), "research", runai_departments=LIVE, project=project(parent_id="gone"), project_read=True),
        MoveWithIntent(None, RESEARCH),
    ),
]


def _without_message(plan: MovePlan) -> MovePlan:
    return replace(plan, message="") if isinstance(plan, (Unchanged, RelabelOnly, Refused)) else plan


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_plan_move(case: Case) -> None:
    assert _without_message(plan_move(case.facts)) == case.plan


def test_messages_say_why() -> None:
    ns = namespace()
    gone = plan_move(facts(ns, "research", runai_departments=LIVE, project_read=True))
    assert isinstance(gone, Refused) and "(id p1) recorded on churn no longer exists in Run:ai" in gone.message
    adopted = plan_move(facts(namespace(project_id=None), "research"))
    assert isinstance(adopted, RelabelOnly) and "RUN_AI_DEPARTMENT_DRIFT" in adopted.message
    off = plan_move(facts(ns, "research", settings=OFF))
    assert isinstance(off, RelabelOnly) and off.message == "nothing to move in Run:ai: Run:ai is off"
    same = plan_move(facts(ns, None, cached_departments=set()))  # no label either side
    assert same == Unchanged("churn is already in (default)")
    invalid = plan_move(facts(ns, "Bad_Name"))
    assert isinstance(invalid, Refused) and "'Bad_Name' is not a valid name" in invalid.message


# -- when a recorded move whose holder may be gone is taken over ------------------------------------

NOW = 1_000_000.0
TAKEOVER_CASES = [
    # (holder, heartbeat age s, running here, holders gone, due: "now", "later" or None)
    ("r1", 1.0, True, (), None),  # the move runs in this process
    ("r1", 1.0, False, (), "now"),  # this process's own move, cut short here
    ("dead-leader", 1.0, False, ("dead-leader",), "now"),  # the Lease was taken over from it
    ("r2", 1.0, False, (), "later"),  # another live holder: once its heartbeat would lapse
    ("r2", 25.0, False, (), "now"),  # its heartbeat has lapsed: gone
    ("", 1.0, False, ("",), "later"),  # an empty holder is not "gone" by the Lease
]


@pytest.mark.parametrize(("holder", "age", "running", "gone", "due"), TAKEOVER_CASES)
def test_takeover_due(holder: str, age: float, running: bool, gone: tuple[str, ...], due: str | None) -> None:
    at = takeover_due(holder, NOW - age, me="r1", running_here=running, holders_gone=gone, stale_after_s=20.0)
    if due is None:
        assert at is None
    elif due == "now":
        assert at is not None and at <= NOW
    else:
        assert at == NOW - age + 20.0
