"""The department move as a pure plan: what a move of a project namespace to another department
does, decided from plain records; the saga (`webhook.runai.departments`) reads the facts, asks
`plan_move`, and carries out the answer.

The facts come in stages, because reading Run:ai costs calls that a cheaper answer makes
unnecessary: first the namespace and the directory's cached department names; when those cannot
settle it, `ReadRunaiDepartments` asks for the live department list; then (no busy pods)
`ReadRunaiProject` asks for the project recorded on the namespace. Each stage calls `plan_move`
again with what was read.

`takeover_due` decides when a recorded move whose holder may be gone is taken over.

Answers: `Unchanged`, `RelabelOnly` (only the department label changes; the Run:ai project stays
where it is), `MoveWithIntent` (the Run:ai project moves: record the intent, then delete and
recreate), `Refused` (nothing changes; `why` says which refusal), or one of the reads above.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

from webhook.core.departments import department_name_error, runai_department_for
from webhook.settings import ClusterSettings
from webhook.snapshot import PROJECT_LABEL, RUNAI_MOVE_ANNOTATION, NamespaceInfo

ADOPTED_STAYS = (
    "the Run:ai project {queue} was adopted, not created by this system, so it stays in its Run:ai department; "
    "the GPU view reports RUN_AI_DEPARTMENT_DRIFT until a Run:ai administrator moves it"
)


class Refusal(StrEnum):
    """Why a move changes nothing (the saga turns each into its error and HTTP status)."""

    INVALID_DEPARTMENT = "invalid-department"
    NOT_A_PROJECT = "not-a-project"
    DELETING = "deleting"
    IN_PROGRESS = "in-progress"  # another move's intent is on the namespace
    BUSY = "busy"  # running or waiting pods would be stranded by the delete
    PROJECT_GONE = "project-gone"  # the recorded Run:ai project no longer exists
    PROJECT_NOT_BOUND_HERE = "project-not-bound-here"
    NO_RUNAI_DEPARTMENT = "no-runai-department"  # the target Run:ai department does not exist


@dataclass(frozen=True, slots=True)
class RunaiDepartmentRef:
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class RunaiProjectRef:
    """The Run:ai project recorded on the namespace, as Run:ai answered."""

    id: str
    name: str
    parent_id: str | None  # its Run:ai department's id
    bound_here: bool  # bound to the namespace being moved


@dataclass(frozen=True, slots=True)
class MoveFacts:
    namespace: NamespaceInfo
    target: str | None  # the department label to set; None is the default department
    settings: ClusterSettings
    cached_departments: Collection[str] | None  # Run:ai department names the directory knows; None: unknown
    # Filled in as the plan asks for them.
    runai_departments: Sequence[RunaiDepartmentRef] | None = None
    busy_pods: Sequence[str] = ()  # pods that a delete of the Run:ai project would strand
    project: RunaiProjectRef | None = None
    project_read: bool = False  # True with project None: Run:ai does not have it


@dataclass(frozen=True, slots=True)
class Unchanged:
    message: str


@dataclass(frozen=True, slots=True)
class RelabelOnly:
    message: str
    drift: bool = False  # the Run:ai project stays where it no longer belongs
    runai_from: str | None = None
    runai_to: str | None = None


@dataclass(frozen=True, slots=True)
class ReadRunaiDepartments:
    pass


@dataclass(frozen=True, slots=True)
class ReadRunaiProject:
    project_id: str
    runai_from: str | None
    runai_to: str | None


@dataclass(frozen=True, slots=True)
class MoveWithIntent:
    runai_from: RunaiDepartmentRef | None  # None: Run:ai does not list the department the project is in
    runai_to: RunaiDepartmentRef


@dataclass(frozen=True, slots=True)
class Refused:
    why: Refusal
    message: str  # empty for IN_PROGRESS and BUSY: the saga words those from the intent and the pods


MovePlan = Unchanged | RelabelOnly | ReadRunaiDepartments | ReadRunaiProject | MoveWithIntent | Refused


def _same_department(runai_department: str | None) -> str:
    return f"nothing to move in Run:ai: both map to Run:ai department {runai_department}"


def label_text(department: str | None) -> str:
    return department if department else "(default)"


def plan_move(facts: MoveFacts) -> MovePlan:
    ns, target, settings = facts.namespace, facts.target, facts.settings
    if target is not None and (error := department_name_error(target)):
        return Refused(Refusal.INVALID_DEPARTMENT, error)
    if not ns.is_project:
        return Refused(Refusal.NOT_A_PROJECT, f"{ns.name} is not a project namespace (no {PROJECT_LABEL} label)")
    if ns.deleting:
        return Refused(Refusal.DELETING, f"{ns.name} is being deleted")
    if RUNAI_MOVE_ANNOTATION in ns.annotations:
        return Refused(Refusal.IN_PROGRESS, "")
    source = ns.department
    if source == target:
        return Unchanged(f"{ns.name} is already in {label_text(target)}")
    if not settings.run_ai_enable or not ns.runai_queue:
        why = "Run:ai is off" if not settings.run_ai_enable else "it is not bound to Run:ai yet"
        drift = bool(not settings.run_ai_enable and ns.runai_queue and ns.runai_project_id)
        return RelabelOnly(f"nothing to move in Run:ai: {why}", drift=drift)

    if facts.runai_departments is None:
        old_rd = runai_department_for(source, settings, facts.cached_departments)
        new_rd = runai_department_for(target, settings, facts.cached_departments)
        if old_rd is not None and old_rd == new_rd:
            return RelabelOnly(_same_department(old_rd), False, old_rd, new_rd)
        if not ns.runai_project_id:
            return RelabelOnly(ADOPTED_STAYS.format(queue=ns.runai_queue), True, old_rd, new_rd)
        return ReadRunaiDepartments()

    by_name = {d.name: d for d in facts.runai_departments}
    old_rd = runai_department_for(source, settings, by_name)
    new_rd = runai_department_for(target, settings, by_name)
    if old_rd == new_rd:
        return RelabelOnly(_same_department(old_rd), False, old_rd, new_rd)
    if not ns.runai_project_id:  # an adopted project is never moved, whatever was read
        return RelabelOnly(ADOPTED_STAYS.format(queue=ns.runai_queue), True, old_rd, new_rd)
    if facts.busy_pods:
        return Refused(Refusal.BUSY, "")
    if not facts.project_read:
        return ReadRunaiProject(ns.runai_project_id, old_rd, new_rd)
    project = facts.project
    if project is None:
        return Refused(
            Refusal.PROJECT_GONE,
            f"the Run:ai project {ns.runai_queue} (id {ns.runai_project_id}) recorded on {ns.name} no longer "
            "exists in Run:ai; nothing changed. Bind the namespace again (reconcile pass or workload start), "
            "then move it",
        )
    if not project.bound_here:
        return Refused(
            Refusal.PROJECT_NOT_BOUND_HERE,
            f"the Run:ai project with id {project.id} ({project.name}) is not bound to {ns.name}; nothing changed",
        )
    new_department = by_name.get(new_rd or "")
    if new_department is None:
        return Refused(
            Refusal.NO_RUNAI_DEPARTMENT,
            f"Run:ai has no department {new_rd} (run_ai_default_department must exist); nothing changed",
        )
    if project.parent_id == new_department.id:
        return RelabelOnly(
            f"nothing to move in Run:ai: {project.name} is already in Run:ai department {new_rd}",
            False,
            old_rd,
            new_rd,
        )
    old_department = next((d for d in facts.runai_departments if d.id == project.parent_id), None)
    return MoveWithIntent(old_department, new_department)


def takeover_due(
    holder: str,
    heartbeat_at: float,
    *,
    me: str,
    running_here: bool,
    holders_gone: Collection[str],
    stale_after_s: float,
) -> float | None:
    """When this process may take over a recorded move (epoch seconds; 0.0: at once), None never.

    Never while the move runs in this process. At once when it names this process (a move cut
    short here by an error) or a holder proven gone: this process took the leader Lease over from
    it, so that process stopped renewing it, or released it on its way out. Otherwise once the
    holder's heartbeat is `stale_after_s` old: a holder that was not the leader shows only by its
    heartbeat that it is gone."""
    if running_here:
        return None
    if holder == me or (holder and holder in holders_gone):
        return 0.0
    return heartbeat_at + stale_after_s
