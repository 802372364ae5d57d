"""Department moves and department deletes (DESIGN R5, issue 4 parts 1, 3 and 4).

Run:ai cannot change a project's department in place, so moving a project namespace to a platform
department that maps to another Run:ai department deletes its Run:ai project and creates it again
there, bound to the same namespace, without GPU quota; only then does the namespace's department
label change. A failed create puts the project back in its old department with its old settings.

Crash safety: before Run:ai is touched the move's intent is written on the namespace (annotation
`MOVE_ANNOTATION`, with a resourceVersion precondition). It names the old project with everything
needed to re-create it, and doubles as a lock: a second move of the namespace is refused while it
is there. Whoever finds an intent whose holder has gone quiet (`recover`, `recover_all`: the
leader's reconciler) looks at what Run:ai holds under the project's name and finishes the move or
rolls it back, so a Run:ai project is never lost, duplicated or left unbound.

Over ~450 lines, on purpose for now: what to do is decided by the pure `webhook.core.moves.plan_move`;
what is left here is one state machine (intent and lock, delete, create, roll back, recover a move
whose holder died, and the department delete that repeats the move) whose forward steps and recovery
read and write the same intent record and must change together. Splitting recovery into its own
module is the next step once the intent record has its own small module.

Intent annotation, JSON:
    {"v": 1, "id": "<uuid of this move>", "from": "<label or null>", "to": "<label or null>",
     "runaiFrom": {"id": "...", "name": "..."}, "runaiTo": {"id": "...", "name": "..."},
     "clusterId": "...", "project": {<old Run:ai project: id, name, resources (quota per node
     pool: deserved, limit, overQuotaWeight, priority), schedulingRules, defaultNodePools, ...>},
     "phase": "started|deleted|created|rolling-back", "newProjectId": null, "error": null,
     "started": "<RFC 3339>", "heartbeat": "<RFC 3339>", "holder": "<instance>", "by": "<who>"}
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import aiohttp

from webhook.core.departments import department_name_error
from webhook.core.moves import (
    MoveFacts,
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
)
from webhook.kube.api import KubeApi, KubeConflict, KubeError, KubeNotFound, Obj
from webhook.runai.client import RunaiClient, RunaiError, RunaiNotFound, RunaiUnreachable
from webhook.runai.models import Project
from webhook.settings import ClusterSettings
from webhook.snapshot import (
    DEPARTMENT_LABEL,
    PROJECT_LABEL,
    RUNAI_MOVE_ANNOTATION,
    RUNAI_PROJECT_ID_LABEL,
    RUNAI_QUEUE_LABEL,
    NamespaceInfo,
    PodRecord,
)

log = logging.getLogger(__name__)

MOVE_ANNOTATION = RUNAI_MOVE_ANNOTATION
# Pod phases that block a Run:ai move: deleting the Run:ai project under them would strand them.
BLOCKING_POD_PHASES = frozenset({"Pending", "Running", "Unknown"})
MAX_LISTED_PODS = 10
# What the move's settings of the old project are (quota and scheduling), kept in the intent.
_SNAPSHOT_FIELDS = (
    "id",
    "name",
    "clusterId",
    "parentId",
    "requestedNamespace",
    "description",
    "resources",
    "schedulingRules",
    "defaultNodePools",
    "nodeTypes",
    "enforceRunaiScheduler",
)
Outcome = Literal["moved", "label-only", "unchanged", "rolled-back", "abandoned"]


def reminder_text(project: str, department: str) -> str:
    return (
        f"Re-add GPU quota and access rules in Run:ai: the Run:ai project {project} was created again in "
        f"Run:ai department {department} with no GPU quota, and Run:ai deleted the old project's access "
        "rules, limits and node-pool settings, and the assets created in its scope (credentials, templates)."
    )


def rollback_text(project: str, department: str) -> str:
    return (
        f"The Run:ai project {project} was created again in its old Run:ai department {department} with its "
        "old GPU quota and scheduling settings, but its access rules were deleted with it and are not "
        "restored: re-add them in Run:ai."
    )


# -- errors ------------------------------------------------------------------------------------


class MoveError(Exception):
    """A move or delete did not complete. `status` is the HTTP status the admin API answers with."""

    status = 409
    code = "Conflict"

    def __init__(self, message: str, *, namespace: str | None = None, result: MoveResult | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.namespace = namespace
        self.result = result


class InvalidDepartment(MoveError):
    status, code = 400, "InvalidDepartment"


class UnknownNamespace(MoveError):
    status, code = 404, "NotFound"


class ProjectBusy(MoveError):
    """Pods run or wait in the namespace."""

    status, code = 409, "ProjectBusy"

    def __init__(self, message: str, *, namespace: str, pods: list[str]) -> None:
        super().__init__(message, namespace=namespace)
        self.pods = pods


class MoveInProgress(MoveError):
    status, code = 409, "MoveInProgress"


class MoveRolledBack(MoveError):
    """The project could not be created in the new department and is back in the old one."""

    code = "MoveRolledBack"

    def __init__(self, message: str, *, namespace: str, result: MoveResult, unreachable: bool) -> None:
        super().__init__(message, namespace=namespace, result=result)
        self.status = 503 if unreachable else 409


class DependencyUnavailable(MoveError):
    """Run:ai or the Kubernetes API could not be used; nothing changed."""

    status, code = 503, "Unavailable"


class MovePending(MoveError):
    """Run:ai was changed but the move could not be settled now; the intent stays for `recover`."""

    status, code = 503, "MovePending"


class _Retry(Exception):
    """The namespace changed between the read and the intent write: decide again."""


class _LostLock(Exception):
    """Another process took the intent over (or cleared it)."""


# -- inputs ------------------------------------------------------------------------------------


class ClusterView(Protocol):
    """What the mover reads from the watch-fed caches (`ClusterState` is one)."""

    @property
    def settings(self) -> ClusterSettings: ...

    @property
    def pods(self) -> Mapping[str, Mapping[str, PodRecord]]: ...


class ProjectNotes(Protocol):
    """Where the moved project is published before the next refresh (`RunaiDirectory` is one)."""

    def note_project(self, namespace: str, project: Project) -> None: ...

    def forget_project(self, project_id: str) -> None: ...


Checkpoint = Callable[[str], Awaitable[None]]


async def _no_checkpoint(_: str) -> None:
    return None


# -- records -----------------------------------------------------------------------------------


def _now_rfc3339(clock: Callable[[], float]) -> str:
    return datetime.fromtimestamp(clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: str) -> float:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return 0.0  # unreadable: treat as long ago, so the intent can be taken over


def _label(value: str | None) -> str:
    return value if value else "(default)"


@dataclass(frozen=True, slots=True)
class MoveIntent:
    id: str
    from_department: str | None
    to_department: str | None
    runai_from: Mapping[str, str]
    runai_to: Mapping[str, str]
    cluster_id: str
    project: Mapping[str, Any]
    phase: str
    started: str
    heartbeat: str
    holder: str
    by: str = ""
    new_project_id: str | None = None
    error: str | None = None

    @property
    def project_name(self) -> str:
        return str(self.project["name"])

    @property
    def old_project_id(self) -> str:
        return str(self.project["id"])

    def to_annotation(self) -> str:
        return json.dumps(
            {
                "v": 1,
                "id": self.id,
                "from": self.from_department,
                "to": self.to_department,
                "runaiFrom": dict(self.runai_from),
                "runaiTo": dict(self.runai_to),
                "clusterId": self.cluster_id,
                "project": dict(self.project),
                "phase": self.phase,
                "newProjectId": self.new_project_id,
                "error": self.error,
                "started": self.started,
                "heartbeat": self.heartbeat,
                "holder": self.holder,
                "by": self.by,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_annotation(cls, raw: str) -> MoveIntent:
        """Raises ValueError when the annotation is not an intent this code wrote."""
        try:
            data = json.loads(raw)
            project = data["project"]
            if not isinstance(project, dict) or not project.get("id") or not project.get("name"):
                raise ValueError("project snapshot without id or name")
            return cls(
                id=str(data["id"]),
                from_department=data.get("from") or None,
                to_department=data.get("to") or None,
                runai_from={"id": str(data["runaiFrom"]["id"]), "name": str(data["runaiFrom"]["name"])},
                runai_to={"id": str(data["runaiTo"]["id"]), "name": str(data["runaiTo"]["name"])},
                cluster_id=str(data["clusterId"]),
                project=project,
                phase=str(data["phase"]),
                started=str(data.get("started") or ""),
                heartbeat=str(data.get("heartbeat") or ""),
                holder=str(data.get("holder") or ""),
                by=str(data.get("by") or ""),
                new_project_id=data.get("newProjectId"),
                error=data.get("error"),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{MOVE_ANNOTATION} is not a readable move intent: {exc}") from None


@dataclass(frozen=True, slots=True)
class MoveResult:
    """The answer to one move (also one entry of a department delete)."""

    namespace: str
    from_department: str | None  # the label values; None is the default department
    to_department: str | None
    outcome: Outcome
    message: str
    runai_project: str | None = None
    runai_from: str | None = None  # Run:ai department names
    runai_to: str | None = None
    old_project_id: str | None = None
    new_project_id: str | None = None
    drift: bool = False  # the Run:ai project stays in another Run:ai department than expected
    reminder: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class DepartmentDeleteResult:
    department: str
    moved: list[MoveResult] = field(default_factory=list)
    failed: dict[str, Any] | None = None  # {"namespace", "status", "code", "reason", "pods"?}
    remaining: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.failed is None and not self.remaining

    @property
    def status(self) -> int:
        return 200 if self.failed is None else int(self.failed["status"])

    def to_json(self) -> dict[str, Any]:
        reminders = [m.reminder for m in self.moved if m.reminder]
        if self.complete:
            message = (
                f"department {self.department}: {len(self.moved)} project(s) moved to the default department; "
                "it has no projects left"
            )
        else:
            failed = self.failed or {}
            message = (
                f"department {self.department}: stopped at {failed.get('namespace')}: {failed.get('reason')}. "
                f"{len(self.moved)} project(s) moved before it stay in the default department; the department "
                f"keeps {len(self.remaining)} project(s) until it is deleted again"
            )
        return {
            "department": self.department,
            "complete": self.complete,
            "message": message,
            "moved": [m.to_json() for m in self.moved],
            "failed": self.failed,
            "remaining": list(self.remaining),
            "reminder": " ".join(dict.fromkeys(reminders)) or None,
        }


# -- the mover ---------------------------------------------------------------------------------


class DepartmentMover:
    """Moves project namespaces between departments, with their Run:ai projects.

    `runai`: the client, or a callable returning the current one (None: Run:ai not configured).
    `runai_departments` returns the Run:ai department names a cache knows (None when it knows
    none); it only serves to see, without a Run:ai call, that two departments map to the same
    Run:ai department. `directory` hears of deleted and created projects. `checkpoint` is awaited
    after each recorded phase ("intent", "deleted", "created"): tests stop a move there as a crash
    would.
    """

    def __init__(
        self,
        kube: KubeApi,
        runai: RunaiClient | Callable[[], RunaiClient | None] | None,
        cluster: ClusterView,
        *,
        runai_departments: Callable[[], Collection[str] | None] = lambda: None,
        directory: ProjectNotes | None = None,
        cluster_name: str | None = None,
        instance: str | None = None,
        delete_wait_s: float = 30.0,
        stale_after_s: float = 120.0,
        checkpoint: Checkpoint = _no_checkpoint,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self._runai = runai
        self._cluster = cluster
        self._runai_departments = runai_departments
        self._directory = directory
        self._cluster_name = cluster_name
        self.instance = instance or kube.instance
        self.delete_wait_s = delete_wait_s
        self.stale_after_s = stale_after_s
        self._checkpoint = checkpoint
        self._clock = clock
        self._active: set[str] = set()  # namespaces this process is moving right now

    # -- public API ----------------------------------------------------------------------------

    async def move_project(self, namespace: str, department: str | None, *, requested_by: str = "") -> MoveResult:
        """Move `namespace` to `department` (None: the default department, i.e. no label).

        Raises MoveError subclasses; their `status` is the admin API's answer.
        """
        if department is not None:
            error = department_name_error(department)
            if error:
                raise InvalidDepartment(error, namespace=namespace)
        for _ in range(3):
            try:
                return await self._move_once(namespace, department, requested_by)
            except _Retry:
                continue
        raise MoveInProgress(
            f"{namespace} kept changing while the move was being recorded; try again", namespace=namespace
        )

    async def delete_department(self, name: str, *, requested_by: str = "") -> DepartmentDeleteResult:
        """Move the department's projects to the default department, one at a time.

        "The default department" is the absent label (DESIGN §2), not a label set to
        `run_ai_default_department`: that setting names a Run:ai department, which need not be a
        platform department's name, and an absent label keeps following it if it changes.
        Stops at the first project that cannot be moved (busy, rolled back, Run:ai unreachable).
        """
        error = department_name_error(name)
        if error:
            raise InvalidDepartment(error)
        namespaces = sorted(
            NamespaceInfo.from_object(o).name
            for o in await self._list_namespaces(f"{PROJECT_LABEL},{DEPARTMENT_LABEL}={name}")
        )
        result = DepartmentDeleteResult(department=name)
        for index, namespace in enumerate(namespaces):
            try:
                result.moved.append(await self.move_project(namespace, None, requested_by=requested_by))
            except UnknownNamespace:
                continue  # deleted since the list: nothing to move
            except MoveError as exc:
                result.failed = {
                    "namespace": namespace,
                    "status": exc.status,
                    "code": exc.code,
                    "reason": exc.message,
                    **({"pods": exc.pods} if isinstance(exc, ProjectBusy) else {}),
                    **({"result": exc.result.to_json()} if exc.result is not None else {}),
                }
                result.remaining = namespaces[index:]
                break
        return result

    async def recover(self, namespace: str) -> MoveResult | None:
        """Finish or roll back an interrupted move of `namespace`; None when there is none to take.

        An intent is taken over only when no live process holds it: its holder is this process
        but the move is no longer running here, or its heartbeat is older than `stale_after_s`.
        """
        try:
            obj = await self._read_namespace(namespace)
        except UnknownNamespace:
            return None
        intent = self._intent_of(obj)
        if intent is None or namespace in self._active:
            return None
        held_elsewhere = intent.holder != self.instance
        if held_elsewhere and self._clock() - _parse_time(intent.heartbeat) < self.stale_after_s:
            return None
        self._active.add(namespace)
        try:
            try:
                intent = await self._write_intent_update(namespace, obj, intent, holder=self.instance)
            except _LostLock:
                return None  # another recoverer won the takeover
            log.info("recovering the department move of %s (phase %s, from %s)", namespace, intent.phase, intent.holder)
            return await self._settle(namespace, intent, cause=None)
        finally:
            self._active.discard(namespace)

    async def recover_all(self, namespaces: Iterable[NamespaceInfo] | None = None) -> list[MoveResult | MoveError]:
        """`recover` every namespace carrying an intent; the reconciler calls it on each pass.

        `namespaces`: the cache's view, to avoid a list call; by default the API is listed.
        Never raises for one namespace: its error is in the returned list (and logged).
        """
        if namespaces is None:
            candidates = [NamespaceInfo.from_object(o) for o in await self._list_namespaces(PROJECT_LABEL)]
        else:
            candidates = list(namespaces)
        outcomes: list[MoveResult | MoveError] = []
        for ns in candidates:
            if MOVE_ANNOTATION not in ns.annotations:
                continue
            try:
                result = await self.recover(ns.name)
            except MoveError as exc:
                log.warning("department move of %s not settled: %s", ns.name, exc.message)
                outcomes.append(exc)
            except Exception as exc:  # one namespace must not stop the reconciler's pass
                log.exception("department move of %s: recovery failed", ns.name)
                outcomes.append(MovePending(f"{type(exc).__name__}: {exc}", namespace=ns.name))
            else:
                if result is not None:
                    outcomes.append(result)
        return outcomes

    # -- the decision --------------------------------------------------------------------------

    async def _move_once(self, namespace: str, target: str | None, by: str) -> MoveResult:
        obj = await self._read_namespace(namespace)
        ns = NamespaceInfo.from_object(obj)
        base = MoveResult(namespace, ns.department, target, "label-only", "", runai_project=ns.runai_queue)
        # The decision is `core.moves.plan_move`; this reads what it asks for and carries it out.
        facts = MoveFacts(ns, target, self._cluster.settings, self._runai_departments())
        plan = plan_move(facts)
        runai: RunaiClient | None = None
        cluster_id = ""
        if isinstance(plan, ReadRunaiDepartments):
            runai = self._require_runai(namespace)
            try:
                cluster_id = await self._get_cluster_id(runai)
                departments = await runai.list_departments(cluster_id=cluster_id)
            except RunaiError as exc:
                raise DependencyUnavailable(f"Run:ai: {exc}; nothing changed", namespace=namespace) from None
            refs = [RunaiDepartmentRef(d.id, d.name) for d in departments]
            facts = replace(facts, runai_departments=refs, busy_pods=self._busy_pods(namespace))
            plan = plan_move(facts)
        old: Project | None = None
        if isinstance(plan, ReadRunaiProject):
            assert runai is not None
            try:
                old = await runai.get_project(plan.project_id)
            except RunaiNotFound:
                old = None
            except RunaiError as exc:
                raise DependencyUnavailable(f"Run:ai: {exc}; nothing changed", namespace=namespace) from None
            found = None if old is None else RunaiProjectRef(old.id, old.name, old.parent_id, old.bound_to(namespace))
            facts = replace(facts, project=found, project_read=True)
            plan = plan_move(facts)

        if isinstance(plan, Unchanged):
            return replace(base, outcome="unchanged", message=plan.message)
        if isinstance(plan, RelabelOnly):
            base = replace(base, runai_from=plan.runai_from, runai_to=plan.runai_to)
            return await self._relabel(obj, base, plan.message, drift=plan.drift)
        if isinstance(plan, Refused):
            raise self._refusal(plan, namespace, obj, facts)
        assert isinstance(plan, MoveWithIntent) and runai is not None and old is not None, plan

        now = _now_rfc3339(self._clock)
        intent = MoveIntent(
            id=uuid.uuid4().hex,
            from_department=ns.department,
            to_department=target,
            runai_from=_ref(plan.runai_from, old.parent_id),
            runai_to=_ref(plan.runai_to, plan.runai_to.id),
            cluster_id=cluster_id,
            project={k: old.raw[k] for k in _SNAPSHOT_FIELDS if old.raw.get(k) is not None},
            phase="started",
            started=now,
            heartbeat=now,
            holder=self.instance,
            by=by,
        )
        self._active.add(namespace)
        try:
            obj = await self._record_intent(obj, intent)
            # A pod may have started while Run:ai was read; the cache is cheap to look at again.
            busy = self._busy_pods(namespace)
            if busy:
                await self._clear_intent(namespace, obj, intent)
                raise self._busy_error(namespace, busy)
            await self._checkpoint("intent")
            return await self._run(namespace, intent, runai)
        finally:
            self._active.discard(namespace)

    def _refusal(self, plan: Refused, namespace: str, obj: Obj, facts: MoveFacts) -> MoveError:
        if plan.why is Refusal.NOT_A_PROJECT:
            return UnknownNamespace(plan.message)
        if plan.why is Refusal.INVALID_DEPARTMENT:
            return InvalidDepartment(plan.message, namespace=namespace)
        if plan.why is Refusal.DELETING:
            return MoveInProgress(plan.message, namespace=namespace)
        if plan.why is Refusal.IN_PROGRESS:
            return MoveInProgress(self._in_progress_message(namespace, obj), namespace=namespace)
        if plan.why is Refusal.BUSY:
            return self._busy_error(namespace, list(facts.busy_pods))
        return MoveError(plan.message, namespace=namespace)

    async def _run(self, namespace: str, intent: MoveIntent, runai: RunaiClient) -> MoveResult:
        # The delete is the one step that cannot be undone as it was: check, with a fresh
        # heartbeat, that no recoverer took this move over while this process was slow.
        intent = await self._set_phase(namespace, intent, "started")
        try:
            await runai.delete_project(intent.old_project_id)  # a 404 is "already gone"
            await self._wait_gone(runai, intent.old_project_id)
        except RunaiError as exc:
            # The delete may have landed or not: what Run:ai holds now decides.
            return await self._settle(namespace, intent, cause=exc)
        if self._directory is not None:
            self._directory.forget_project(intent.old_project_id)
        intent = await self._set_phase(namespace, intent, "deleted")
        await self._checkpoint("deleted")
        return await self._create_or_rollback(namespace, intent)

    async def _create_or_rollback(self, namespace: str, intent: MoveIntent) -> MoveResult:
        runai = self._require_runai(namespace)
        name = intent.project_name
        try:
            created: Project | None = await runai.create_project(
                name,
                cluster_id=intent.cluster_id,
                department_id=intent.runai_to["id"],
                namespace=namespace,
                gpu_quota=0.0,
            )
            create_error: RunaiError | None = None
        except RunaiError as exc:
            created, create_error = None, exc
            # A lost answer may hide a create that landed.
            found = await self._lookup(runai, intent, quiet=True)
            if found is not None and found.bound_to(namespace) and found.parent_id == intent.runai_to["id"]:
                created = found
        if created is not None:
            intent = await self._set_phase(namespace, intent, "created", new_project_id=created.id)
            await self._checkpoint("created")
            return await self._finish_moved(namespace, intent, created)

        reason = str(create_error)
        log.warning("creating %s in Run:ai department %s failed: %s; rolling back", name, intent.runai_to, reason)
        intent = await self._set_phase(namespace, intent, "rolling-back", error=reason)
        try:
            restored = await runai.create_project(
                name,
                cluster_id=intent.cluster_id,
                department_id=intent.runai_from["id"],
                namespace=namespace,
                template=Project.from_api(intent.project),
            )
        except RunaiError as exc:
            found = await self._lookup(runai, intent, quiet=True)
            if found is not None and found.bound_to(namespace) and found.parent_id == intent.runai_from["id"]:
                restored = found
            else:
                message = (
                    f"the Run:ai project {name} was deleted and could not be created in Run:ai department "
                    f"{intent.runai_to['name']} ({reason}) nor again in {intent.runai_from['name']} ({exc}); it does "
                    f"not exist in Run:ai now. The move's intent stays on the namespace ({MOVE_ANNOTATION}) and the "
                    "reconciler retries it"
                )
                await self._event(namespace, "RunaiProjectMovePending", message, warning=True)
                raise MovePending(message, namespace=namespace) from None
        unreachable = isinstance(create_error, RunaiUnreachable)
        return await self._finish_rolled_back(namespace, intent, restored, reason, unreachable=unreachable)

    async def _settle(self, namespace: str, intent: MoveIntent, cause: RunaiError | None) -> MoveResult:
        """Finish or roll back from what Run:ai holds under the project's name."""
        runai = self._require_runai(namespace)
        obj = await self._read_namespace(namespace)
        try:
            found = await self._lookup(runai, intent, quiet=False)
            if found is not None and found.id == intent.old_project_id:
                if intent.phase == "started" and (found.phase or "").lower() != "deleting":
                    return await self._abandon(namespace, obj, intent, cause)
                await self._wait_gone(runai, found.id)
                found = None
        except RunaiError as exc:
            raise MovePending(
                f"the move of {namespace} was interrupted and Run:ai cannot be asked what it holds ({exc}); the "
                f"intent stays on the namespace ({MOVE_ANNOTATION}) and the reconciler finishes or rolls it back",
                namespace=namespace,
            ) from None
        ns = NamespaceInfo.from_object(obj)
        if found is None:
            if ns.deleting:
                # The namespace is going away: creating a Run:ai project for it would leak one.
                await self._clear_intent(namespace, obj, intent)
                return self._result(
                    namespace, intent, "abandoned", f"{namespace} is being deleted; no Run:ai project created"
                )
            intent = await self._set_phase(namespace, intent, "deleted")
            return await self._create_or_rollback(namespace, intent)
        if found.bound_to(namespace) and found.parent_id == intent.runai_to["id"]:
            return await self._finish_moved(namespace, intent, found)
        if found.bound_to(namespace) and found.parent_id == intent.runai_from["id"]:
            reason = intent.error or "the move was interrupted"
            return await self._finish_rolled_back(namespace, intent, found, reason, unreachable=False)
        message = (
            f"a Run:ai project named {found.name} (id {found.id}) exists that this move did not make (department "
            f"id {found.parent_id}, namespace {found.namespace or found.requested_namespace}); the move of "
            f"{namespace} cannot finish. Resolve it in Run:ai; the intent stays on the namespace ({MOVE_ANNOTATION})"
        )
        await self._event(namespace, "RunaiProjectMovePending", message, warning=True)
        raise MovePending(message, namespace=namespace)

    # -- endings -------------------------------------------------------------------------------

    async def _finish_moved(self, namespace: str, intent: MoveIntent, project: Project) -> MoveResult:
        labels: dict[str, str | None] = {
            DEPARTMENT_LABEL: intent.to_department,
            RUNAI_PROJECT_ID_LABEL: project.id,
            RUNAI_QUEUE_LABEL: project.name,
        }
        await self._settle_namespace(namespace, intent, labels)
        if self._directory is not None:
            self._directory.note_project(namespace, project)
        reminder = reminder_text(project.name, intent.runai_to["name"])
        message = (
            f"moved {namespace} from {_label(intent.from_department)} to {_label(intent.to_department)}; its Run:ai "
            f"project {project.name} moved from Run:ai department {intent.runai_from['name']} to "
            f"{intent.runai_to['name']} (new id {project.id})"
        )
        await self._event(namespace, "RunaiProjectMoved", f"{message}. {reminder}")
        return self._result(namespace, intent, "moved", message, new_project_id=project.id, reminder=reminder)

    async def _finish_rolled_back(
        self, namespace: str, intent: MoveIntent, project: Project, reason: str, *, unreachable: bool
    ) -> MoveResult:
        # The re-created project has a new id: keep owning it, or R4 would never delete it.
        await self._settle_namespace(namespace, intent, {RUNAI_PROJECT_ID_LABEL: project.id})
        if self._directory is not None:
            self._directory.note_project(namespace, project)
        note = rollback_text(project.name, intent.runai_from["name"])
        message = (
            f"the move of {namespace} to {_label(intent.to_department)} failed: the Run:ai project {project.name} "
            f"could not be created in Run:ai department {intent.runai_to['name']}: {reason}. {note} The namespace "
            f"stays in {_label(intent.from_department)}"
        )
        await self._event(namespace, "RunaiProjectMoveFailed", message, warning=True)
        result = self._result(namespace, intent, "rolled-back", message, new_project_id=project.id, reminder=note)
        raise MoveRolledBack(message, namespace=namespace, result=result, unreachable=unreachable)

    async def _abandon(self, namespace: str, obj: Obj, intent: MoveIntent, cause: RunaiError | None) -> MoveResult:
        # The old project was never deleted: nothing happened in Run:ai, so dropping the intent is the rollback.
        await self._clear_intent(namespace, obj, intent)
        if cause is not None:
            raise DependencyUnavailable(
                f"Run:ai: deleting the Run:ai project {intent.project_name} failed ({cause}); nothing changed",
                namespace=namespace,
            )
        message = (
            f"the move of {namespace} to {_label(intent.to_department)} was interrupted before its Run:ai project was "
            "deleted; nothing changed. Run the move again"
        )
        await self._event(namespace, "RunaiProjectMoveAbandoned", message, warning=True)
        return self._result(namespace, intent, "abandoned", message)

    @staticmethod
    def _result(namespace: str, intent: MoveIntent, outcome: Outcome, message: str, **extra: Any) -> MoveResult:
        return MoveResult(
            namespace=namespace,
            from_department=intent.from_department,
            to_department=intent.to_department,
            outcome=outcome,
            message=message,
            runai_project=intent.project_name,
            runai_from=intent.runai_from["name"],
            runai_to=intent.runai_to["name"],
            old_project_id=intent.old_project_id,
            **extra,
        )

    async def _relabel(self, obj: Obj, base: MoveResult, why: str, *, drift: bool = False) -> MoveResult:
        """Only the department label changes (this system's own identity writes it)."""
        namespace = base.namespace
        try:
            await self._kube.patch_namespace(
                namespace,
                {"metadata": {"labels": {DEPARTMENT_LABEL: base.to_department}}},
                resource_version=obj["metadata"].get("resourceVersion"),
            )
        except KubeConflict:
            raise _Retry() from None
        except KubeNotFound:
            raise UnknownNamespace(f"no namespace {namespace}", namespace=namespace) from None
        except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
            raise DependencyUnavailable(f"Kubernetes API: {exc}; nothing changed", namespace=namespace) from None
        message = f"moved {namespace} from {_label(base.from_department)} to {_label(base.to_department)}; {why}"
        if drift:
            await self._event(namespace, "RunaiDepartmentDrift", message, warning=True)
        return replace(base, outcome="label-only", message=message, drift=drift)

    # -- pods ----------------------------------------------------------------------------------

    def _busy_pods(self, namespace: str) -> list[str]:
        pods = self._cluster.pods.get(namespace) or {}
        return sorted(p.name for p in pods.values() if p.phase in BLOCKING_POD_PHASES)

    @staticmethod
    def _busy_error(namespace: str, busy: list[str]) -> ProjectBusy:
        shown = ", ".join(busy[:MAX_LISTED_PODS])
        more = f" and {len(busy) - MAX_LISTED_PODS} more" if len(busy) > MAX_LISTED_PODS else ""
        return ProjectBusy(
            f"{namespace} has {len(busy)} running or waiting pod(s) ({shown}{more}): its Run:ai project cannot "
            "move while jobs, notebooks, terminals, apps or deployments run; stop them and try again",
            namespace=namespace,
            pods=busy,
        )

    # -- Run:ai --------------------------------------------------------------------------------

    def _require_runai(self, namespace: str) -> RunaiClient:
        client = self._runai() if callable(self._runai) else self._runai
        if client is None:
            raise DependencyUnavailable("Run:ai is not configured on this server; nothing changed", namespace=namespace)
        return client

    async def _get_cluster_id(self, runai: RunaiClient) -> str:
        # Per move, not cached: the settings may point the client at another control plane.
        name = self._cluster_name or self._cluster.settings.run_ai_cluster_name or None
        return (await runai.get_cluster(name)).uuid

    async def _lookup(self, runai: RunaiClient, intent: MoveIntent, *, quiet: bool) -> Project | None:
        try:
            return await runai.find_project(intent.project_name, cluster_id=intent.cluster_id)
        except RunaiError:
            if quiet:
                return None
            raise

    async def _wait_gone(self, runai: RunaiClient, project_id: str) -> None:
        """Run:ai may answer a delete with 202 and finish later; the name is taken until then."""
        deadline = asyncio.get_running_loop().time() + self.delete_wait_s
        delay = 0.05
        while True:
            try:
                await runai.get_project(project_id)
            except RunaiNotFound:
                return
            if asyncio.get_running_loop().time() + delay > deadline:
                raise RunaiUnreachable(
                    f"Run:ai still has project {project_id} {self.delete_wait_s:g}s after deleting it"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    # -- the namespace -------------------------------------------------------------------------

    async def _read_namespace(self, namespace: str) -> Obj:
        try:
            return await self._kube.get_namespace(namespace)
        except KubeNotFound:
            raise UnknownNamespace(f"no namespace {namespace}", namespace=namespace) from None
        except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
            raise DependencyUnavailable(f"Kubernetes API: {exc}", namespace=namespace) from None

    async def _list_namespaces(self, label_selector: str) -> list[Obj]:
        try:
            # KubeApi checks the status: a refused or failed list must never read as "no namespaces".
            return await self._kube.list_namespaces(label_selector)
        except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
            raise DependencyUnavailable(f"Kubernetes API: listing namespaces failed: {exc}") from None

    def _intent_of(self, obj: Obj) -> MoveIntent | None:
        raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(MOVE_ANNOTATION)
        if raw is None:
            return None
        try:
            return MoveIntent.from_annotation(raw)
        except ValueError as exc:
            name = (obj.get("metadata") or {}).get("name")
            raise MoveInProgress(f"{name}: {exc}; fix or remove it by hand after checking Run:ai") from None

    def _in_progress_message(self, namespace: str, obj: Obj) -> str:
        intent = self._intent_of(obj)
        assert intent is not None
        return (
            f"a move of {namespace} from {_label(intent.from_department)} to {_label(intent.to_department)} is in "
            f"progress (started {intent.started} by {intent.by or intent.holder}, phase {intent.phase}); wait for "
            "it to finish, or for the reconciler to finish or roll it back"
        )

    async def _record_intent(self, obj: Obj, intent: MoveIntent) -> Obj:
        namespace = obj["metadata"]["name"]
        try:
            return await self._kube.patch_namespace(
                namespace,
                {"metadata": {"annotations": {MOVE_ANNOTATION: intent.to_annotation()}}},
                resource_version=obj["metadata"].get("resourceVersion"),
            )
        except KubeConflict:
            raise _Retry() from None  # someone wrote first: decide again on what is there now
        except KubeNotFound:
            raise UnknownNamespace(f"no namespace {namespace}", namespace=namespace) from None
        except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
            raise DependencyUnavailable(f"Kubernetes API: {exc}; nothing changed", namespace=namespace) from None

    async def _set_phase(self, namespace: str, intent: MoveIntent, phase: str, **changes: Any) -> MoveIntent:
        obj = await self._read_namespace(namespace)
        current = self._intent_of(obj)
        if not _same_holding(current, intent):
            raise _taken_over(namespace)
        try:
            return await self._write_intent_update(namespace, obj, intent, phase=phase, **changes)
        except _LostLock:
            raise _taken_over(namespace) from None

    async def _write_intent_update(self, namespace: str, obj: Obj, intent: MoveIntent, **changes: Any) -> MoveIntent:
        """Rewrite the intent (and its heartbeat) under a resourceVersion precondition."""
        updated = replace(intent, heartbeat=_now_rfc3339(self._clock), **changes)
        patch = {"metadata": {"annotations": {MOVE_ANNOTATION: updated.to_annotation()}}}
        await self._guarded_patch(namespace, obj, patch, intent)
        return updated

    async def _settle_namespace(self, namespace: str, intent: MoveIntent, labels: Mapping[str, str | None]) -> None:
        obj = await self._read_namespace(namespace)
        patch = {"metadata": {"labels": dict(labels), "annotations": {MOVE_ANNOTATION: None}}}
        try:
            await self._guarded_patch(namespace, obj, patch, intent)
        except _LostLock:
            raise _taken_over(namespace) from None

    async def _clear_intent(self, namespace: str, obj: Obj, intent: MoveIntent) -> None:
        with contextlib.suppress(_LostLock):
            await self._guarded_patch(namespace, obj, {"metadata": {"annotations": {MOVE_ANNOTATION: None}}}, intent)

    async def _guarded_patch(self, namespace: str, obj: Obj, patch: Mapping[str, Any], intent: MoveIntent) -> None:
        """Patch while the namespace still carries this move's intent; other edits are merged around."""
        for _ in range(5):
            current = self._intent_of(obj)
            if not _same_holding(current, intent):
                raise _LostLock()
            try:
                await self._kube.patch_namespace(
                    namespace, patch, resource_version=obj["metadata"].get("resourceVersion")
                )
                return
            except KubeConflict:
                obj = await self._read_namespace(namespace)
            except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
                raise MovePending(
                    f"Kubernetes API: {exc}; the move's intent stays on {namespace} and the reconciler settles it",
                    namespace=namespace,
                ) from None
        raise MovePending(f"{namespace} kept changing; the reconciler settles the move", namespace=namespace)

    async def _event(self, namespace: str, reason: str, message: str, *, warning: bool = False) -> None:
        # The move's answer carries the same text: a lost Event must not fail the move.
        try:
            obj = await self._kube.get_namespace(namespace)
            involved = {"apiVersion": "v1", "kind": "Namespace", "metadata": obj.get("metadata") or {}}
            await self._kube.create_event(involved, reason, message, type_="Warning" if warning else "Normal")
        except Exception as exc:
            log.warning("could not record the %s event on %s: %s", reason, namespace, exc)


def _same_holding(current: MoveIntent | None, intent: MoveIntent) -> bool:
    # Same move and same holder: a takeover keeps the id but changes the holder, which the old
    # holder must notice before it writes again.
    return current is not None and current.id == intent.id and current.holder == intent.holder


def _taken_over(namespace: str) -> MovePending:
    return MovePending(f"the move of {namespace} was taken over by another process", namespace=namespace)


def _ref(department: RunaiDepartmentRef | None, fallback_id: str | None) -> dict[str, str]:
    if department is None:
        return {"id": str(fallback_id or ""), "name": str(fallback_id or "")}
    return {"id": department.id, "name": department.name}
