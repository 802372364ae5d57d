"""Department moves and department deletes (R5 in docs/RULES.md).

Run:ai cannot change a project's department in place, so moving a project namespace to a platform
department that maps to another Run:ai department deletes its Run:ai project and creates it again
there, bound to the same namespace, without GPU quota; only then does the namespace's department
label change. A failed create puts the project back in its old department with its old settings.

What to do is decided by the pure `webhook.core.moves.plan_move`; this module reads what the plan
asks for and tells the forward story (`_carry_out`). The rest has a module each:
`move_intent` (the intent recorded on the namespace before Run:ai is touched: the move's lock and
its crash record, kept alive by a heartbeat), `move_steps` (the Run:ai steps and endings the
story and the recovery share), `move_recovery` (resuming a move whose holder is gone) and
`move_outcomes` (results and errors, as the admin API answers them).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from typing import Protocol

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
from webhook.runai.client import RunaiClient, RunaiError, RunaiNotFound
from webhook.runai.models import Project
from webhook.runai.move_intent import (
    HEARTBEAT_S,
    MOVE_ANNOTATION,
    SNAPSHOT_FIELDS,
    IntentRecords,
    MoveIntent,
    RecordConflict,
    intent_of,
    now_rfc3339,
)
from webhook.runai.move_outcomes import (
    DepartmentDeleteResult,
    DependencyUnavailable,
    InvalidDepartment,
    MoveError,
    MoveInProgress,
    MovePending,
    MoveResult,
    MoveRolledBack,
    ProjectBusy,
    UnknownNamespace,
    label_text,
)
from webhook.runai.move_recovery import STALE_AFTER_S, MoveRecoverer
from webhook.runai.move_steps import Checkpoint, MoveSteps, ProjectNotes, RunaiSource, no_checkpoint
from webhook.settings import ClusterSettings
from webhook.snapshot import DEPARTMENT_LABEL, PROJECT_LABEL, NamespaceInfo, PodRecord

__all__ = [
    "MOVE_ANNOTATION",
    "DepartmentDeleteResult",
    "DepartmentMover",
    "DependencyUnavailable",
    "InvalidDepartment",
    "MoveError",
    "MoveInProgress",
    "MovePending",
    "MoveResult",
    "MoveRolledBack",
    "ProjectBusy",
    "UnknownNamespace",
]

# Pod phases that block a Run:ai move: deleting the Run:ai project under them would strand them.
BLOCKING_POD_PHASES = frozenset({"Pending", "Running", "Unknown"})
MAX_LISTED_PODS = 10


class ClusterView(Protocol):
    """What the mover reads from the watch-fed caches (`ClusterState` is one)."""

    @property
    def settings(self) -> ClusterSettings: ...

    @property
    def pods(self) -> Mapping[str, Mapping[str, PodRecord]]: ...


class DepartmentMover:
    """Moves project namespaces between departments, with their Run:ai projects.

    `runai`: the client, or a callable returning the current one (None: Run:ai not configured).
    `runai_departments` returns the Run:ai department names a cache knows (None when it knows
    none); it only serves to see, without a Run:ai call, that two departments map to the same
    Run:ai department. `directory` hears of deleted and created projects. `instance` names this
    process in the intents it holds (its Lease identity); `holders_gone` returns the holders
    proven gone (those it took the Lease over from). `checkpoint` is awaited after each recorded
    phase ("intent", "deleted", "created"): tests stop a move there as a crash would.
    """

    def __init__(
        self,
        kube: KubeApi,
        runai: RunaiSource,
        cluster: ClusterView,
        *,
        runai_departments: Callable[[], Collection[str] | None] = lambda: None,
        directory: ProjectNotes | None = None,
        cluster_name: str | None = None,
        instance: str | None = None,
        holders_gone: Callable[[], Collection[str]] = tuple,
        delete_wait_s: float = 30.0,
        stale_after_s: float = STALE_AFTER_S,
        heartbeat_s: float = HEARTBEAT_S,
        checkpoint: Checkpoint = no_checkpoint,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self._cluster = cluster
        self._runai_departments = runai_departments
        self._clock = clock
        self.instance = instance or kube.instance
        self.records = IntentRecords(kube, clock, heartbeat_s)
        self.steps = MoveSteps(
            kube,
            runai,
            self.records,
            lambda: cluster.settings,
            directory=directory,
            cluster_name=cluster_name,
            delete_wait_s=delete_wait_s,
            checkpoint=checkpoint,
        )
        self.recovery = MoveRecoverer(
            self.steps,
            self.records,
            self._list_namespaces,
            instance=self.instance,
            holders_gone=holders_gone,
            stale_after_s=stale_after_s,
            clock=clock,
        )

    # -- public API ----------------------------------------------------------------------------

    async def move_project(
        self, namespace: str, department: str | None, *, requested_by: str = "", dry_run: bool = False
    ) -> MoveResult:
        """Move `namespace` to `department` (None: the default department, i.e. no label).

        Raises MoveError subclasses; their `status` is the admin API's answer. `dry_run`: the same
        reads and checks (Run:ai's departments and project, the pods), then the answer the move
        would give, with nothing written, as kubectl's `--dry-run=server` promises.
        """
        if department is not None:
            error = department_name_error(department)
            if error:
                raise InvalidDepartment(error, namespace=namespace)
        for _ in range(3):
            try:
                return await self._move_once(namespace, department, requested_by, dry_run)
            except RecordConflict:
                continue
        raise MoveInProgress(
            f"{namespace} kept changing while the move was being recorded; try again", namespace=namespace
        )

    async def delete_department(
        self, name: str, *, requested_by: str = "", dry_run: bool = False
    ) -> DepartmentDeleteResult:
        """Move the department's projects to the default department, one at a time.

        "The default department" is the absent department label, not a label set to
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
        result = DepartmentDeleteResult(department=name, dry_run=dry_run)
        for index, namespace in enumerate(namespaces):
            try:
                result.moved.append(
                    await self.move_project(namespace, None, requested_by=requested_by, dry_run=dry_run)
                )
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
        """Finish or roll back an interrupted move of `namespace` whose holder is gone (`move_recovery`)."""
        return await self.recovery.recover(namespace)

    async def recover_all(self, namespaces: Iterable[NamespaceInfo] | None = None) -> list[MoveResult | MoveError]:
        return await self.recovery.recover_all(namespaces)

    @property
    def next_check_at(self) -> float | None:
        """When a move seen held by a live holder may be taken over (epoch seconds), if any."""
        return self.recovery.next_check_at

    # -- the decision --------------------------------------------------------------------------

    async def _move_once(self, namespace: str, target: str | None, by: str, dry_run: bool = False) -> MoveResult:
        obj = await self.records.read_namespace(namespace)
        ns = NamespaceInfo.from_object(obj)
        base = MoveResult(namespace, ns.department, target, "label-only", "", runai_project=ns.runai_queue)
        # The decision is `core.moves.plan_move`; this reads what it asks for and carries it out.
        facts = MoveFacts(ns, target, self._cluster.settings, self._runai_departments())
        plan = plan_move(facts)
        runai: RunaiClient | None = None
        cluster_id = ""
        if isinstance(plan, ReadRunaiDepartments):
            runai = self.steps.require_runai(namespace)
            try:
                cluster_id = await self.steps.cluster_id(runai)
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
            return replace(base, outcome="unchanged", message=plan.message, dry_run=dry_run)
        if isinstance(plan, RelabelOnly):
            base = replace(base, runai_from=plan.runai_from, runai_to=plan.runai_to)
            if dry_run:
                return replace(
                    base,
                    dry_run=True,
                    drift=plan.drift,
                    message=f"would move {namespace} from {label_text(base.from_department)} to "
                    f"{label_text(base.to_department)}; {plan.message}",
                )
            return await self._relabel(obj, base, plan.message, drift=plan.drift)
        if isinstance(plan, Refused):
            raise self._refusal(plan, namespace, obj, facts)
        assert isinstance(plan, MoveWithIntent) and runai is not None and old is not None, plan
        if dry_run:
            busy = self._busy_pods(namespace)
            if busy:
                raise self._busy_error(namespace, busy)
            runai_from = plan.runai_from.name if plan.runai_from is not None else old.parent_id
            return replace(
                base,
                outcome="moved",
                dry_run=True,
                runai_from=runai_from,
                runai_to=plan.runai_to.name,
                old_project_id=old.id,
                message=f"would move {namespace} from {label_text(base.from_department)} to "
                f"{label_text(base.to_department)}: its Run:ai project {old.name} would be deleted in Run:ai "
                f"department {runai_from} and created again in {plan.runai_to.name}, without GPU quota",
            )
        intent = self._new_intent(ns, target, plan, old, cluster_id, by)
        async with self.records.holding(namespace):
            obj = await self.records.record(obj, intent)
            # A pod may have started while Run:ai was read; the cache is cheap to look at again.
            busy = self._busy_pods(namespace)
            if busy:
                await self.records.clear(namespace, obj, intent)
                raise self._busy_error(namespace, busy)
            await self.steps.checkpoint("intent")
            return await self._carry_out(namespace, intent, runai)

    # -- the forward story ---------------------------------------------------------------------

    async def _carry_out(self, namespace: str, intent: MoveIntent, runai: RunaiClient) -> MoveResult:
        """Delete the old project, create it in the new department (else again in the old one),
        then relabel the namespace. Every step is recorded in the intent before the next begins."""
        # The delete is the one step that cannot be undone as it was: check, with a fresh
        # heartbeat, that no recoverer took this move over while this process was slow.
        intent = await self.records.update(namespace, intent, phase="started")
        try:
            await runai.delete_project(intent.old_project_id)  # a 404 is "already gone"
            await self.steps.wait_gone(runai, intent.old_project_id)
        except RunaiError as exc:
            return await self.steps.settle(namespace, intent, cause=exc)  # landed or not: Run:ai says
        if self.steps.directory is not None:
            self.steps.directory.forget_project(intent.old_project_id)
        intent = await self.records.update(namespace, intent, phase="deleted")
        await self.steps.checkpoint("deleted")
        return await self.steps.create_or_rollback(namespace, intent)

    def _new_intent(
        self, ns: NamespaceInfo, target: str | None, plan: MoveWithIntent, old: Project, cluster_id: str, by: str
    ) -> MoveIntent:
        now = now_rfc3339(self._clock)
        return MoveIntent(
            id=uuid.uuid4().hex,
            from_department=ns.department,
            to_department=target,
            runai_from=_ref(plan.runai_from, old.parent_id),
            runai_to=_ref(plan.runai_to, plan.runai_to.id),
            cluster_id=cluster_id,
            project={k: old.raw[k] for k in SNAPSHOT_FIELDS if old.raw.get(k) is not None},
            phase="started",
            started=now,
            heartbeat=now,
            holder=self.instance,
            by=by,
        )

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
            raise RecordConflict() from None
        except KubeNotFound:
            raise UnknownNamespace(f"no namespace {namespace}", namespace=namespace) from None
        except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
            raise DependencyUnavailable(f"Kubernetes API: {exc}; nothing changed", namespace=namespace) from None
        message = (
            f"moved {namespace} from {label_text(base.from_department)} to {label_text(base.to_department)}; {why}"
        )
        if drift:
            await self.steps.event(namespace, "RunaiDepartmentDrift", message, warning=True)
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

    # -- the namespace -------------------------------------------------------------------------

    async def _list_namespaces(self, label_selector: str) -> list[Obj]:
        try:
            # KubeApi checks the status: a refused or failed list must never read as "no namespaces".
            return await self._kube.list_namespaces(label_selector)
        except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
            raise DependencyUnavailable(f"Kubernetes API: listing namespaces failed: {exc}") from None

    def _in_progress_message(self, namespace: str, obj: Obj) -> str:
        intent = intent_of(obj)
        assert intent is not None
        return (
            f"a move of {namespace} from {label_text(intent.from_department)} to {label_text(intent.to_department)} "
            f"is in progress (started {intent.started} by {intent.by or intent.holder}, phase {intent.phase}); "
            "wait for it to finish, or for the reconciler to finish or roll it back"
        )


def _ref(department: RunaiDepartmentRef | None, fallback_id: str | None) -> dict[str, str]:
    if department is None:
        return {"id": str(fallback_id or ""), "name": str(fallback_id or "")}
    return {"id": department.id, "name": department.name}
