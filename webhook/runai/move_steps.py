"""The Run:ai steps a department move is made of, shared by the forward saga and the recovery.

`create_or_rollback` creates the project in its new department and, if that fails, again in its
old one with its old settings; `settle` looks at what Run:ai holds under the project's name and
finishes or rolls back from there (a move whose delete may or may not have landed, or one taken
over from a dead holder); the endings write the outcome on the namespace, publish the project to
the directory, and record an Event carrying the same text as the answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from webhook.kube.api import KubeApi, Obj
from webhook.runai.client import RunaiClient, RunaiError, RunaiNotFound, RunaiUnreachable
from webhook.runai.models import Project
from webhook.runai.move_intent import MOVE_ANNOTATION, IntentRecords, MoveIntent
from webhook.runai.move_outcomes import (
    DependencyUnavailable,
    MovePending,
    MoveResult,
    MoveRolledBack,
    Outcome,
    label_text,
    reminder_text,
    rollback_text,
)
from webhook.settings import ClusterSettings
from webhook.snapshot import DEPARTMENT_LABEL, RUNAI_PROJECT_ID_LABEL, RUNAI_QUEUE_LABEL, NamespaceInfo

log = logging.getLogger(__name__)

Checkpoint = Callable[[str], Awaitable[None]]
RunaiSource = RunaiClient | Callable[[], RunaiClient | None] | None


async def no_checkpoint(_: str) -> None:
    return None


class ProjectNotes(Protocol):
    """Where the moved project is published before the next refresh (`RunaiDirectory` is one)."""

    def note_project(self, namespace: str, project: Project) -> None: ...

    def forget_project(self, project_id: str) -> None: ...


class MoveSteps:
    """`runai`: the client, or a callable returning the current one (None: Run:ai not configured).
    `checkpoint` is awaited after each recorded phase ("intent", "deleted", "created"): tests stop
    a move there as a crash would."""

    def __init__(
        self,
        kube: KubeApi,
        runai: RunaiSource,
        records: IntentRecords,
        settings: Callable[[], ClusterSettings],
        *,
        directory: ProjectNotes | None,
        cluster_name: str | None,
        delete_wait_s: float,
        checkpoint: Checkpoint,
    ) -> None:
        self._kube = kube
        self._runai = runai
        self.records = records
        self._settings = settings
        self.directory = directory
        self._cluster_name = cluster_name
        self.delete_wait_s = delete_wait_s
        self.checkpoint = checkpoint

    async def create_or_rollback(self, namespace: str, intent: MoveIntent) -> MoveResult:
        runai = self.require_runai(namespace)
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
            found = await self.lookup(runai, intent, quiet=True)
            if found is not None and found.bound_to(namespace) and found.parent_id == intent.runai_to["id"]:
                created = found
        if created is not None:
            intent = await self.records.update(namespace, intent, phase="created", new_project_id=created.id)
            await self.checkpoint("created")
            return await self.finish_moved(namespace, intent, created)

        reason = str(create_error)
        log.warning("creating %s in Run:ai department %s failed: %s; rolling back", name, intent.runai_to, reason)
        intent = await self.records.update(namespace, intent, phase="rolling-back", error=reason)
        try:
            restored = await runai.create_project(
                name,
                cluster_id=intent.cluster_id,
                department_id=intent.runai_from["id"],
                namespace=namespace,
                template=Project.from_api(intent.project),
            )
        except RunaiError as exc:
            found = await self.lookup(runai, intent, quiet=True)
            if found is not None and found.bound_to(namespace) and found.parent_id == intent.runai_from["id"]:
                restored = found
            else:
                message = (
                    f"the Run:ai project {name} was deleted and could not be created in Run:ai department "
                    f"{intent.runai_to['name']} ({reason}) nor again in {intent.runai_from['name']} ({exc}); it does "
                    f"not exist in Run:ai now. The move's intent stays on the namespace ({MOVE_ANNOTATION}) and the "
                    "reconciler retries it"
                )
                await self.event(namespace, "RunaiProjectMovePending", message, warning=True)
                raise MovePending(message, namespace=namespace) from None
        unreachable = isinstance(create_error, RunaiUnreachable)
        return await self.finish_rolled_back(namespace, intent, restored, reason, unreachable=unreachable)

    async def settle(self, namespace: str, intent: MoveIntent, cause: RunaiError | None) -> MoveResult:
        """Finish or roll back from what Run:ai holds under the project's name."""
        runai = self.require_runai(namespace)
        obj = await self.records.read_namespace(namespace)
        try:
            found = await self.lookup(runai, intent, quiet=False)
            if found is not None and found.id == intent.old_project_id:
                if intent.phase == "started" and (found.phase or "").lower() != "deleting":
                    return await self.abandon(namespace, obj, intent, cause)
                await self.wait_gone(runai, found.id)
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
                await self.records.clear(namespace, obj, intent)
                return self.result(
                    namespace, intent, "abandoned", f"{namespace} is being deleted; no Run:ai project created"
                )
            intent = await self.records.update(namespace, intent, phase="deleted")
            return await self.create_or_rollback(namespace, intent)
        if found.bound_to(namespace) and found.parent_id == intent.runai_to["id"]:
            return await self.finish_moved(namespace, intent, found)
        if found.bound_to(namespace) and found.parent_id == intent.runai_from["id"]:
            reason = intent.error or "the move was interrupted"
            return await self.finish_rolled_back(namespace, intent, found, reason, unreachable=False)
        message = (
            f"a Run:ai project named {found.name} (id {found.id}) exists that this move did not make (department "
            f"id {found.parent_id}, namespace {found.namespace or found.requested_namespace}); the move of "
            f"{namespace} cannot finish. Resolve it in Run:ai; the intent stays on the namespace ({MOVE_ANNOTATION})"
        )
        await self.event(namespace, "RunaiProjectMovePending", message, warning=True)
        raise MovePending(message, namespace=namespace)

    async def finish_moved(self, namespace: str, intent: MoveIntent, project: Project) -> MoveResult:
        labels: dict[str, str | None] = {
            DEPARTMENT_LABEL: intent.to_department,
            RUNAI_PROJECT_ID_LABEL: project.id,
            RUNAI_QUEUE_LABEL: project.name,
        }
        await self._settle_on(namespace, intent, project, labels)
        reminder = reminder_text(project.name, intent.runai_to["name"])
        message = (
            f"moved {namespace} from {label_text(intent.from_department)} to {label_text(intent.to_department)}; "
            f"its Run:ai project {project.name} moved from Run:ai department {intent.runai_from['name']} to "
            f"{intent.runai_to['name']} (new id {project.id})"
        )
        await self.event(namespace, "RunaiProjectMoved", f"{message}. {reminder}")
        return self.result(namespace, intent, "moved", message, new_project_id=project.id, reminder=reminder)

    async def finish_rolled_back(
        self, namespace: str, intent: MoveIntent, project: Project, reason: str, *, unreachable: bool
    ) -> MoveResult:
        # The re-created project has a new id: keep owning it, or R4 would never delete it.
        await self._settle_on(namespace, intent, project, {RUNAI_PROJECT_ID_LABEL: project.id})
        note = rollback_text(project.name, intent.runai_from["name"])
        message = (
            f"the move of {namespace} to {label_text(intent.to_department)} failed: the Run:ai project {project.name} "
            f"could not be created in Run:ai department {intent.runai_to['name']}: {reason}. {note} The namespace "
            f"stays in {label_text(intent.from_department)}"
        )
        await self.event(namespace, "RunaiProjectMoveFailed", message, warning=True)
        result = self.result(namespace, intent, "rolled-back", message, new_project_id=project.id, reminder=note)
        raise MoveRolledBack(message, namespace=namespace, result=result, unreachable=unreachable)

    async def _settle_on(
        self, namespace: str, intent: MoveIntent, project: Project, labels: dict[str, str | None]
    ) -> None:
        """The move's end written (labels set, intent removed), and `project` known to the directory now."""
        await self.records.settle(namespace, intent, labels)
        if self.directory is not None:
            self.directory.note_project(namespace, project)

    async def abandon(self, namespace: str, obj: Obj, intent: MoveIntent, cause: RunaiError | None) -> MoveResult:
        # The old project was never deleted: nothing happened in Run:ai, so dropping the intent is the rollback.
        await self.records.clear(namespace, obj, intent)
        if cause is not None:
            raise DependencyUnavailable(
                f"Run:ai: deleting the Run:ai project {intent.project_name} failed ({cause}); nothing changed",
                namespace=namespace,
            )
        message = (
            f"the move of {namespace} to {label_text(intent.to_department)} was interrupted before its Run:ai "
            "project was deleted; nothing changed. Run the move again"
        )
        await self.event(namespace, "RunaiProjectMoveAbandoned", message, warning=True)
        return self.result(namespace, intent, "abandoned", message)

    @staticmethod
    def result(namespace: str, intent: MoveIntent, outcome: Outcome, message: str, **extra: Any) -> MoveResult:
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

    def require_runai(self, namespace: str) -> RunaiClient:
        client = self._runai() if callable(self._runai) else self._runai
        if client is None:
            raise DependencyUnavailable("Run:ai is not configured on this server; nothing changed", namespace=namespace)
        return client

    async def cluster_id(self, runai: RunaiClient) -> str:
        # Per move, not cached: the settings may point the client at another control plane.
        name = self._cluster_name or self._settings().run_ai_cluster_name or None
        return (await runai.get_cluster(name)).uuid

    async def lookup(self, runai: RunaiClient, intent: MoveIntent, *, quiet: bool) -> Project | None:
        try:
            return await runai.find_project(intent.project_name, cluster_id=intent.cluster_id)
        except RunaiError:
            if quiet:
                return None
            raise

    async def wait_gone(self, runai: RunaiClient, project_id: str) -> None:
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

    async def event(self, namespace: str, reason: str, message: str, *, warning: bool = False) -> None:
        # The move's answer carries the same text: a lost Event must not fail the move.
        try:
            obj = await self._kube.get_namespace(namespace)
            involved = {"apiVersion": "v1", "kind": "Namespace", "metadata": obj.get("metadata") or {}}
            await self._kube.create_event(involved, reason, message, type_="Warning" if warning else "Normal")
        except Exception as exc:
            log.warning("could not record the %s event on %s: %s", reason, namespace, exc)
