"""The intent of a department move, recorded on its namespace, and every write of it.

Before Run:ai is touched, the move writes its intent on the namespace (annotation
`MOVE_ANNOTATION`, with a resourceVersion precondition). It names the old Run:ai project with
everything needed to create it again, and it is the move's lock: a second move of the namespace
is refused while it is there. Each later write is made only while the namespace still carries
the same move held by the same process (`IntentRecords`), so a process whose move was taken
over cannot write again.

Who holds it and whether that process lives: `holder` is the process's Lease identity, and
`heartbeat` the last time it showed it was alive. While this process holds a move it renews the
heartbeat every `HEARTBEAT_S`, between the move's own steps too (a Run:ai delete may take its
time). `webhook.runai.move_recovery` takes a move over when its holder is proven gone: the Lease
was taken over from it, or its heartbeat has lapsed.

Intent annotation, JSON:
    {"v": 1, "id": "<uuid of this move>", "from": "<label or null>", "to": "<label or null>",
     "runaiFrom": {"id": "...", "name": "..."}, "runaiTo": {"id": "...", "name": "..."},
     "clusterId": "...", "project": {<old Run:ai project: id, name, resources (quota per node
     pool: deserved, limit, overQuotaWeight, priority), schedulingRules, defaultNodePools, ...>},
     "phase": "started|deleted|created|rolling-back", "newProjectId": null, "error": null,
     "started": "<RFC 3339>", "heartbeat": "<RFC 3339>", "holder": "<Lease identity>", "by": "<who>"}
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp

from webhook.kube.api import KubeApi, KubeConflict, KubeError, KubeNotFound, Obj
from webhook.runai.move_outcomes import DependencyUnavailable, MoveInProgress, MovePending, UnknownNamespace
from webhook.snapshot import RUNAI_MOVE_ANNOTATION
from webhook.tasks import cancel_and_wait

log = logging.getLogger(__name__)

MOVE_ANNOTATION = RUNAI_MOVE_ANNOTATION
# How often a holder renews its heartbeat; a fifth of the lapse below, so that a slow write or
# two does not let a live holder's move be taken over.
HEARTBEAT_S = 4.0
# The old project's fields the intent keeps: what re-creating it in its old department needs.
SNAPSHOT_FIELDS = (
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


def now_rfc3339(clock: Callable[[], float]) -> str:
    return datetime.fromtimestamp(clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> float:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return 0.0  # unreadable: treat as long ago, so the intent can be taken over


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

    @property
    def heartbeat_at(self) -> float:
        return parse_time(self.heartbeat)

    def held_like(self, other: MoveIntent | None) -> bool:
        """The same move, held by the same process. A takeover keeps the id but changes the holder,
        which the old holder must notice before it writes again."""
        return other is not None and other.id == self.id and other.holder == self.holder

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


def intent_of(obj: Obj) -> MoveIntent | None:
    """The intent a namespace object carries; MoveInProgress when it carries one this code cannot read."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(MOVE_ANNOTATION)
    if raw is None:
        return None
    try:
        return MoveIntent.from_annotation(raw)
    except ValueError as exc:
        name = (obj.get("metadata") or {}).get("name")
        raise MoveInProgress(f"{name}: {exc}; fix or remove it by hand after checking Run:ai") from None


class RecordConflict(Exception):
    """The namespace changed between the read and the intent write: decide again."""


class LostHold(Exception):
    """Another process took the intent over (or cleared it)."""


def taken_over(namespace: str) -> MovePending:
    return MovePending(f"the move of {namespace} was taken over by another process", namespace=namespace)


class IntentRecords:
    """The intents on namespaces, read and written through the Kubernetes API.

    `holding(namespace)` marks a move this process is carrying out; while it lasts the intent
    last written for it is kept alive by its heartbeat.
    """

    def __init__(self, kube: KubeApi, clock: Callable[[], float], heartbeat_s: float = HEARTBEAT_S) -> None:
        self._kube = kube
        self._clock = clock
        self.heartbeat_s = heartbeat_s
        self._held: dict[str, MoveIntent | None] = {}  # namespaces moved here now -> last intent written
        self._writing: dict[str, asyncio.Lock] = {}

    # -- the moves of this process ------------------------------------------------------------

    def held_here(self, namespace: str) -> bool:
        return namespace in self._held

    @contextlib.asynccontextmanager
    async def holding(self, namespace: str) -> AsyncIterator[None]:
        self._held[namespace] = None
        self._writing[namespace] = asyncio.Lock()
        beating = asyncio.create_task(self._keep_alive(namespace), name=f"move-heartbeat-{namespace}")
        try:
            yield
        finally:
            await cancel_and_wait(beating)
            self._held.pop(namespace, None)
            self._writing.pop(namespace, None)

    async def _keep_alive(self, namespace: str) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self._beat(namespace)
            except MovePending as exc:
                log.info("heartbeat of the move of %s not written: %s", namespace, exc.message)
            except Exception as exc:  # a heartbeat must never end the move it keeps alive
                log.info("heartbeat of the move of %s not written: %s", namespace, exc)

    async def _beat(self, namespace: str) -> None:
        async with self._turn(namespace):
            intent = self._held.get(namespace)  # the last one written, read under the lock
            if intent is None:
                return  # not recorded yet, or settled
            obj = await self.read_namespace(namespace)
            try:
                await self._write_update(namespace, obj, intent)
            except LostHold:
                self._remember(namespace, None)  # taken over: nothing of ours to keep alive

    def _turn(self, namespace: str) -> contextlib.AbstractAsyncContextManager[object]:
        # One write at a time per held move: a heartbeat must not write back an older phase.
        lock = self._writing.get(namespace)
        return lock if lock is not None else contextlib.nullcontext()

    # -- reads --------------------------------------------------------------------------------

    async def read_namespace(self, namespace: str) -> Obj:
        try:
            return await self._kube.get_namespace(namespace)
        except KubeNotFound:
            raise UnknownNamespace(f"no namespace {namespace}", namespace=namespace) from None
        except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
            raise DependencyUnavailable(f"Kubernetes API: {exc}", namespace=namespace) from None

    # -- writes -------------------------------------------------------------------------------

    async def record(self, obj: Obj, intent: MoveIntent) -> Obj:
        """Write a new intent on a namespace that has none (as read in `obj`)."""
        namespace = obj["metadata"]["name"]
        try:
            async with self._turn(namespace):
                written = await self._kube.patch_namespace(
                    namespace,
                    {"metadata": {"annotations": {MOVE_ANNOTATION: intent.to_annotation()}}},
                    resource_version=obj["metadata"].get("resourceVersion"),
                )
                self._remember(namespace, intent)
        except KubeConflict:
            raise RecordConflict() from None  # someone wrote first: decide again on what is there now
        except KubeNotFound:
            raise UnknownNamespace(f"no namespace {namespace}", namespace=namespace) from None
        except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
            raise DependencyUnavailable(f"Kubernetes API: {exc}; nothing changed", namespace=namespace) from None
        return written

    async def update(self, namespace: str, intent: MoveIntent, **changes: Any) -> MoveIntent:
        """Rewrite the intent with `changes` and a new heartbeat; MovePending when it was taken over."""
        async with self._turn(namespace):
            obj = await self.read_namespace(namespace)
            if not intent.held_like(intent_of(obj)):
                raise taken_over(namespace)
            try:
                return await self._write_update(namespace, obj, intent, **changes)
            except LostHold:
                raise taken_over(namespace) from None

    async def write_update(self, namespace: str, obj: Obj, intent: MoveIntent, **changes: Any) -> MoveIntent:
        """Rewrite the intent (and its heartbeat) over `obj` as read; LostHold when another holds it."""
        async with self._turn(namespace):
            return await self._write_update(namespace, obj, intent, **changes)

    async def _write_update(self, namespace: str, obj: Obj, intent: MoveIntent, **changes: Any) -> MoveIntent:
        updated = replace(intent, heartbeat=now_rfc3339(self._clock), **changes)
        patch = {"metadata": {"annotations": {MOVE_ANNOTATION: updated.to_annotation()}}}
        await self._guarded_patch(namespace, obj, patch, intent)
        self._remember(namespace, updated)
        return updated

    async def settle(self, namespace: str, intent: MoveIntent, labels: Mapping[str, str | None]) -> None:
        """The move's end: set `labels` and remove the intent, in one write."""
        async with self._turn(namespace):
            obj = await self.read_namespace(namespace)
            patch = {"metadata": {"labels": dict(labels), "annotations": {MOVE_ANNOTATION: None}}}
            try:
                await self._guarded_patch(namespace, obj, patch, intent)
            except LostHold:
                raise taken_over(namespace) from None
            self._remember(namespace, None)

    async def clear(self, namespace: str, obj: Obj, intent: MoveIntent) -> None:
        """Remove the intent (nothing changed in Run:ai); quietly nothing when another holds it."""
        async with self._turn(namespace):
            with contextlib.suppress(LostHold):
                patch = {"metadata": {"annotations": {MOVE_ANNOTATION: None}}}
                await self._guarded_patch(namespace, obj, patch, intent)
            self._remember(namespace, None)

    def _remember(self, namespace: str, intent: MoveIntent | None) -> None:
        if namespace in self._held:
            self._held[namespace] = intent

    async def _guarded_patch(self, namespace: str, obj: Obj, patch: Mapping[str, Any], intent: MoveIntent) -> None:
        """Patch while the namespace still carries this move's intent; other edits are merged around."""
        for _ in range(5):
            if not intent.held_like(intent_of(obj)):
                raise LostHold()
            try:
                await self._kube.patch_namespace(
                    namespace, patch, resource_version=obj["metadata"].get("resourceVersion")
                )
                return
            except KubeConflict:
                obj = await self.read_namespace(namespace)
            except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
                raise MovePending(
                    f"Kubernetes API: {exc}; the move's intent stays on {namespace} and the reconciler settles it",
                    namespace=namespace,
                ) from None
        raise MovePending(f"{namespace} kept changing; the reconciler settles the move", namespace=namespace)
