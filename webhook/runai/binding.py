"""Bind a project namespace to a Run:ai project (R1, R2) and let go of it when it is deleted (R4).

`Binder.ensure_bound` is idempotent and safe to run from several places at once (the leader's
reconciler, and admission on any replica) and to be killed at any point:

1. Read the namespace. Labelled `runai/queue`: done.
2. Look in Run:ai (after that read) for a project bound to the namespace.
3. Found, and no intent recorded on the namespace: adopt it (label `runai/queue` only).
   Found, and the intent annotation is there: a binder of ours created it and died before
   labelling; finish as created by us (`runai/queue`, `hopsworks.ai/runai-project-id`).
4. Not found: record the intent (annotation + our finalizer) with a resourceVersion
   precondition, so of two binders racing only one goes on; the other re-reads and waits for
   it. Then create the project (a 409 means it exists: look it up) and label the namespace.

The finalizer is written with the intent, before the project exists, so a namespace deleted at
any point after that still waits for `unbind_deleted` to remove what was (maybe) created.
Every namespace write carries the resourceVersion of the read the decision was based on.

Why one file over ~450 lines: the numbered protocol above is one crash-safety argument, and the
binder and unbinder that follow it are read against it step by step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from webhook.core.departments import runai_department_for
from webhook.kube.api import CallPath, KubeApi, KubeConflict, KubeError, KubeNotFound, Obj
from webhook.kube.events import EventRecorder
from webhook.runai.client import RunaiAuthError, RunaiClient, RunaiConflict, RunaiError, RunaiUnreachable
from webhook.runai.directory import RunaiDirectory
from webhook.runai.models import Department, Project
from webhook.snapshot import RUNAI_PROJECT_ID_LABEL, RUNAI_QUEUE_LABEL, NamespaceInfo
from webhook.state.store import ClusterState

log = logging.getLogger(__name__)

FINALIZER = "scheduling.hopsworks.ai/runai-project"
BINDING_ANNOTATION = "scheduling.hopsworks.ai/runai-binding"
_MAX_ROUNDS = 8  # re-reads after a conflict; each round makes progress or sees someone else's


class BindingError(Exception):
    """The namespace could not be bound; the message says why, for a person."""


class BindingUnavailable(BindingError):
    """Run:ai is unreachable (or another binder is mid-way): try again later."""


class BindingBusy(BindingUnavailable):
    """Another binder recorded its intent moments ago and has not finished yet."""


class RunaiDisabled(BindingError):
    """`run_ai_enable` is false: this system makes no Run:ai call."""


@dataclass(frozen=True, slots=True)
class BindResult:
    namespace: str
    project_name: str
    project_id: str | None  # set when this system created the project
    outcome: Literal["already", "created", "adopted"]
    resumed: bool = False  # created by an earlier binder that died before labelling


@dataclass(frozen=True, slots=True)
class UnbindResult:
    namespace: str
    deleted: tuple[str, ...]  # ids of the Run:ai projects deleted
    left: str | None  # the adopted project left in place
    finalizer_removed: bool


@dataclass(frozen=True, slots=True)
class _Intent:
    by: str
    at: float

    @classmethod
    def parse(cls, raw: str | None) -> _Intent | None:
        if not raw:
            return None
        try:
            data = json.loads(raw)
            return cls(str(data.get("by", "")), float(data.get("at", 0)))
        except (ValueError, AttributeError, TypeError):
            return cls("", 0.0)  # unreadable but present: still an intent, just an old one

    def dump(self) -> str:
        return json.dumps({"state": "creating", "by": self.by, "at": round(self.at, 3)}, separators=(",", ":"))


class Binder:
    """R1/R2 binding and R4 unbinding. `client()` gives the current Run:ai client (None: off)."""

    def __init__(
        self,
        state: ClusterState,
        kube: KubeApi,
        client: Callable[[], RunaiClient | None],
        directory: RunaiDirectory,
        *,
        identity: str,
        events: EventRecorder | None = None,
        claim_ttl_s: float = 60.0,
        wait_s: Mapping[str, float] | None = None,
        poll_s: float = 0.1,
    ) -> None:
        self.state = state
        self.kube = kube
        self._client = client
        self.directory = directory
        self.identity = identity
        self.events = events or EventRecorder(kube)
        # A recorded intent older than this belongs to a binder that died: take it over. Longer
        # than one binder needs (a few Run:ai calls, each bounded by the client's deadline).
        self.claim_ttl_s = claim_ttl_s
        # How long a caller waits for another binder's fresh intent, by call path.
        self.wait_s = {"request": 3.0, "background": 10.0, **(wait_s or {})}
        self.poll_s = poll_s
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        # What `unbind_deleted` already deleted in Run:ai for a namespace whose finalizer has not
        # come off yet: namespace -> (its uid, the ids deleted). A finalizer patch that fails is
        # retried on later passes, and those must not delete in Run:ai again. One entry per
        # terminating namespace at most, dropped once it is gone (`forget_unbound`).
        self._unbound: dict[str, tuple[str, tuple[str, ...], str | None]] = {}

    # -- binding ------------------------------------------------------------------------------
    async def ensure_bound(self, namespace: str, call_path: CallPath = "background") -> BindResult:
        """Bind `namespace` to a Run:ai project unless it is already. Raises BindingError subclasses."""
        async with self._namespace_lock(namespace):
            return await self._ensure_bound(namespace, call_path)

    async def _ensure_bound(self, namespace: str, call_path: CallPath) -> BindResult:
        waited_until: float | None = None
        conflicts = 0
        while conflicts <= _MAX_ROUNDS:  # waiting for another binder is bounded by time instead
            obj = await self._read(namespace, call_path)
            info = NamespaceInfo.from_object(obj)
            if info.runai_queue:
                return BindResult(namespace, info.runai_queue, info.runai_project_id, "already")
            if info.deleting:
                raise BindingError(f"namespace {namespace} is being deleted; it is not bound to Run:ai")
            if not info.is_project:
                raise BindingError(f"namespace {namespace} is not a project namespace")
            client = self._current_client()
            intent = _Intent.parse(info.annotations.get(BINDING_ANNOTATION))
            try:
                cluster_id = await self._cluster_id(client, call_path)
                project = await self._bound_project(client, namespace, cluster_id, call_path)
            except RunaiError as exc:
                raise self._translate(namespace, exc) from None
            if project is not None:
                try:
                    if intent is not None:
                        # Created under an intent of ours (maybe by a binder that died): ours.
                        written = await self._label(obj, project, created=True, call_path=call_path)
                        result = BindResult(namespace, project.name, project.id, "created", resumed=True)
                    else:
                        written = await self._label(obj, project, created=False, call_path=call_path)
                        result = BindResult(namespace, project.name, None, "adopted")
                except KubeConflict:
                    conflicts += 1
                    continue  # the namespace changed since we read it: decide again
                self._bound(written, project, result, info.resource_version)
                return result
            if intent is not None and intent.by != self.identity and time.time() - intent.at < self.claim_ttl_s:
                # Another binder recorded its intent moments ago and has not created the project
                # yet: let it finish rather than race it (the re-read then finds its labels).
                if waited_until is None:
                    waited_until = time.monotonic() + self.wait_s.get(call_path, 3.0)
                if time.monotonic() >= waited_until:
                    raise BindingBusy(
                        f"project namespace {namespace} is being bound to Run:ai by {intent.by}; try again shortly"
                    )
                await self._wait_for_change(namespace, info.resource_version, waited_until, call_path)
                continue
            try:
                department = await self._department(client, info, cluster_id, call_path)
            except RunaiError as exc:
                raise self._translate(namespace, exc) from None
            if intent is None or intent.by != self.identity:
                try:
                    obj = await self._claim(obj, call_path)
                except KubeConflict:
                    conflicts += 1
                    continue  # someone else wrote first (maybe another binder's claim): re-read
            project = await self._create(client, namespace, cluster_id, department, call_path)
            result = BindResult(namespace, project.name, project.id, "created")
            try:
                written = await self._label(obj, project, created=True, call_path=call_path)
            except KubeConflict:
                conflicts += 1
                continue  # next round finds the project and our intent, and finishes
            self._bound(written, project, result, str((obj.get("metadata") or {}).get("resourceVersion") or ""))
            return result
        raise BindingBusy(f"project namespace {namespace} kept changing while being bound to Run:ai; try again")

    def _current_client(self) -> RunaiClient:
        client = self._client() if self.state.settings.run_ai_enable else None
        if client is None:
            raise RunaiDisabled("the Run:ai integration is off (run_ai_enable is false)")
        return client

    def _translate(self, namespace: str, exc: RunaiError) -> BindingError:
        if isinstance(exc, RunaiUnreachable):
            return BindingUnavailable(
                f"the Run:ai control plane is unreachable, so project namespace {namespace} cannot be bound "
                f"to a Run:ai project now ({exc}); it is bound once Run:ai answers again"
            )
        if isinstance(exc, RunaiAuthError):
            return BindingError(f"Run:ai refused this system's credentials or permissions: {exc}")
        return BindingError(f"Run:ai could not bind project namespace {namespace}: {exc}")

    async def _cluster_id(self, client: RunaiClient, call_path: CallPath) -> str:
        known = self.directory.cluster_id
        if known:
            return known
        cluster = await client.get_cluster(self.directory.cluster_name, call_path=call_path)
        return cluster.uuid

    async def _bound_project(
        self, client: RunaiClient, namespace: str, cluster_id: str, call_path: CallPath
    ) -> Project | None:
        """The project bound to `namespace`, or named after it with no other namespace requested."""
        projects = await client.list_projects(cluster_id=cluster_id, call_path=call_path)
        bound = [p for p in projects if p.bound_to(namespace)]
        if bound:
            if len(bound) > 1:
                log.warning("several Run:ai projects bound to %s: %s", namespace, ", ".join(p.name for p in bound))
            return next((p for p in bound if p.name == namespace), bound[0])
        named = next((p for p in projects if p.name == namespace), None)
        if named is None:
            return None
        if named.requested_namespace and named.requested_namespace != namespace:
            raise RunaiError(
                f"a Run:ai project named {namespace} exists and is bound to namespace {named.requested_namespace}; "
                "rename or unbind it in Run:ai"
            )
        return named

    async def _department(
        self, client: RunaiClient, info: NamespaceInfo, cluster_id: str, call_path: CallPath
    ) -> Department:
        departments = await client.list_departments(cluster_id=cluster_id, call_path=call_path)
        by_name = {d.name: d for d in departments}
        settings = self.state.settings
        default = settings.run_ai_default_department
        # The names are known here, so the mapping always has an answer.
        name = runai_department_for(info.department, settings, by_name) or default
        if name not in by_name:
            # Never create departments: an operator must create it (or fix the setting).
            raise RunaiError(
                f"the Run:ai department {default!r} (run_ai_default_department) does not exist in Run:ai; "
                "create it in Run:ai or change run_ai_default_department"
            )
        return by_name[name]

    async def _create(
        self, client: RunaiClient, namespace: str, cluster_id: str, department: Department, call_path: CallPath
    ) -> Project:
        try:
            return await client.create_project(
                namespace,
                cluster_id=cluster_id,
                department_id=department.id,
                namespace=namespace,
                gpu_quota=self.state.settings.run_ai_project_gpu_quota,
                call_path=call_path,
            )
        except RunaiConflict as conflict:
            # It exists: created by an earlier attempt whose answer was lost, or by a racing binder.
            existing = conflict.existing
            if existing is None:
                try:
                    existing = await self._bound_project(client, namespace, cluster_id, call_path)
                except RunaiError as exc:
                    raise self._translate(namespace, exc) from None
            if existing is not None and (existing.bound_to(namespace) or not existing.requested_namespace):
                return existing
            raise BindingError(
                f"a Run:ai project named {namespace} exists and is bound to another namespace; rename or unbind it"
            ) from None
        except RunaiError as exc:
            raise self._translate(namespace, exc) from None

    async def _claim(self, obj: Obj, call_path: CallPath) -> Obj:
        meta = obj.get("metadata") or {}
        finalizers = list(meta.get("finalizers") or ())
        if FINALIZER not in finalizers:
            finalizers.append(FINALIZER)
        patch = {
            "metadata": {
                "annotations": {BINDING_ANNOTATION: _Intent(self.identity, time.time()).dump()},
                "finalizers": finalizers,
            }
        }
        return await self._patch(meta["name"], patch, str(meta.get("resourceVersion") or ""), call_path)

    async def _label(self, obj: Obj, project: Project, *, created: bool, call_path: CallPath) -> Obj:
        meta = obj.get("metadata") or {}
        labels: dict[str, Any] = {RUNAI_QUEUE_LABEL: project.name}
        patch: Obj = {"metadata": {"labels": labels}}
        if created:
            labels[RUNAI_PROJECT_ID_LABEL] = project.id
            patch["metadata"]["annotations"] = {BINDING_ANNOTATION: None}
            finalizers = list(meta.get("finalizers") or ())
            # No new finalizer on a namespace being deleted (the apiserver refuses it); the claim
            # put ours there before the project was created.
            if FINALIZER not in finalizers and not meta.get("deletionTimestamp"):
                patch["metadata"]["finalizers"] = [*finalizers, FINALIZER]
        return await self._patch(meta["name"], patch, str(meta.get("resourceVersion") or ""), call_path)

    def _bound(self, written: Obj, project: Project, result: BindResult, read_rv: str) -> None:
        # Admission re-evaluates right after a bind: show it the label before the watch does,
        # unless the watch already delivered something other than the version we wrote over.
        cached = self.state.namespaces.get(result.namespace)
        if cached is None or cached.resource_version in ("", read_rv) or not cached.runai_queue:
            self.state.apply({"kind": "Namespace", **written})
        self.directory.note_project(result.namespace, project)
        if result.outcome == "adopted":
            message = (
                f"adopted the Run:ai project {project.name}, already bound to this namespace; it is not ours to delete"
            )
            self.events.record(written, "RunaiProjectAdopted", message)
        else:
            how = "finished binding" if result.resumed else "created and bound"
            message = f"{how} the Run:ai project {project.name} (id {project.id})"
            self.events.record(written, "RunaiProjectCreated", message)
        self.events.forget(result.namespace, "RunaiBindingFailed")
        log.info("namespace %s bound to Run:ai project %s (%s)", result.namespace, project.name, result.outcome)

    async def _wait_for_change(self, namespace: str, rv: str, until: float, call_path: CallPath) -> None:
        """Until `until`, or until the namespace is no longer at `rv` (by the watch-fed cache, or by
        reading it when the cache does not have it at `rv` either)."""
        while time.monotonic() < until:
            await asyncio.sleep(self.poll_s)
            cached = self.state.namespaces.get(namespace)
            if cached is not None and cached.resource_version == rv:
                continue  # the watch is at our version: a change shows up here first
            with contextlib.suppress(KubeError, aiohttp.ClientError, TimeoutError):
                obj = await self.kube.get_namespace(namespace, call_path=call_path)
                if str((obj.get("metadata") or {}).get("resourceVersion")) != rv:
                    return

    # -- unbinding ----------------------------------------------------------------------------
    async def unbind_deleted(self, namespace: str) -> UnbindResult:
        """For a namespace being deleted that carries our finalizer: delete the Run:ai project if we
        created it, then remove the finalizer. Raises RunaiDisabled when Run:ai would have to be
        called while the integration is off, BindingUnavailable when Run:ai or the Kubernetes API is
        unreachable, BindingError when the Kubernetes API refuses the finalizer's removal.

        Whether the namespace still carries `hopsworks.ai/project` does not matter: the finalizer is
        ours, so it comes off whatever labels are left. Run:ai's delete is called once per namespace
        by this process, however often the finalizer's removal has to be tried again."""
        async with self._namespace_lock(namespace):
            for _ in range(_MAX_ROUNDS):
                try:
                    obj = await self.kube.get_namespace(namespace)
                except KubeNotFound:
                    return self._unbound_result(namespace, removed=False)
                info = NamespaceInfo.from_object(obj)
                meta = obj.get("metadata") or {}
                uid = str(meta.get("uid") or "")
                finalizers = list(meta.get("finalizers") or ())
                if not info.deleting or FINALIZER not in finalizers:
                    return self._unbound_result(namespace, removed=False)
                done = self._unbound.get(namespace)
                if done is None or done[0] != uid:
                    found, left = await self._delete_ours(info)
                    self._unbound[namespace] = (uid, tuple(found), left)
                patch = {"metadata": {"finalizers": [f for f in finalizers if f != FINALIZER]}}
                try:
                    await self.kube.patch_namespace(
                        namespace, patch, resource_version=info.resource_version or None, call_path="background"
                    )
                except KubeConflict:
                    continue
                except KubeNotFound:
                    return self._unbound_result(namespace, removed=False)
                except KubeError as exc:
                    if 400 <= exc.status < 500:
                        # Refused, not unreachable: other namespaces go on; this one is tried
                        # again on the next pass, without a second delete in Run:ai.
                        raise BindingError(
                            f"the Kubernetes API refused to remove the finalizer {FINALIZER} from namespace "
                            f"{namespace}: {exc}"
                        ) from None
                    raise BindingUnavailable(
                        f"cannot update namespace {namespace} in the Kubernetes API: {exc}"
                    ) from None
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise BindingUnavailable(
                        f"cannot update namespace {namespace} in the Kubernetes API: {exc}"
                    ) from None
                result = self._unbound_result(namespace, removed=True)
                if result.deleted:
                    self.events.record(
                        obj,
                        "RunaiProjectDeleted",
                        f"deleted the Run:ai project {', '.join(result.deleted)} created for it",
                    )
                elif result.left:
                    self.events.record(
                        obj, "RunaiProjectLeft", f"left the adopted Run:ai project {result.left} in place"
                    )
                log.info("namespace %s: Run:ai finalizer removed (deleted: %s)", namespace, result.deleted or "nothing")
                return result
            raise BindingBusy(f"namespace {namespace} kept changing while its Run:ai finalizer was being removed")

    def _unbound_result(self, namespace: str, *, removed: bool) -> UnbindResult:
        """The outcome for a namespace this process is done with: what it deleted in Run:ai (maybe
        on an earlier try) and whether the finalizer came off now."""
        _, deleted, left = self._unbound.pop(namespace, ("", (), None))
        return UnbindResult(namespace, deleted, left, removed)

    def forget_unbound(self, terminating: Collection[str]) -> None:
        """Drop what is remembered for namespaces no longer terminating (gone, or the finalizer
        removed by someone else)."""
        for namespace in [n for n in self._unbound if n not in terminating]:
            del self._unbound[namespace]

    async def _delete_ours(self, info: NamespaceInfo) -> tuple[list[str], str | None]:
        """Delete what this system created for the namespace; returns (deleted ids, adopted left)."""
        project_id = info.runai_project_id
        intent = info.annotations.get(BINDING_ANNOTATION)
        if not project_id and not intent:
            return [], info.runai_queue  # adopted (or never bound): not ours to delete
        client = self._current_client()
        try:
            if project_id:
                # 202 (Run:ai finishes it), 204 and 404 all mean: it is gone or going.
                await client.delete_project(project_id, call_path="background")
                self.directory.forget_project(project_id)
                return [project_id], None
            # Intent without a label: a binder died between create and label; maybe it created one.
            cluster_id = await self._cluster_id(client, "background")
            projects = await client.list_projects(cluster_id=cluster_id, call_path="background")
            ours = [p for p in projects if p.requested_namespace == info.name]
            for project in ours:
                await client.delete_project(project.id, call_path="background")
                self.directory.forget_project(project.id)
            return [p.id for p in ours], None
        except RunaiError as exc:
            if isinstance(exc, RunaiUnreachable):
                raise BindingUnavailable(
                    f"the Run:ai control plane is unreachable, so the Run:ai project of namespace {info.name} "
                    f"cannot be deleted now ({exc}); the namespace is deleted once it is"
                ) from None
            raise BindingError(f"cannot delete the Run:ai project of namespace {info.name}: {exc}") from None

    async def delete_left(self, gone: NamespaceInfo) -> list[str]:
        """Delete what this system created for a namespace that no longer exists (recorded while
        Run:ai was off); returns the ids deleted. Raises like `unbind_deleted`."""
        async with self._namespace_lock(gone.name):
            deleted, _ = await self._delete_ours(gone)
            return deleted

    async def release_finalizer(self, namespace: str) -> bool:
        """Remove our finalizer without calling Run:ai (nothing of ours left there). True if removed."""
        for _ in range(_MAX_ROUNDS):
            try:
                obj = await self.kube.get_namespace(namespace)
            except KubeNotFound:
                return False
            meta = obj.get("metadata") or {}
            finalizers = list(meta.get("finalizers") or ())
            if FINALIZER not in finalizers:
                return False
            patch = {"metadata": {"finalizers": [f for f in finalizers if f != FINALIZER]}}
            try:
                await self._patch(namespace, patch, str(meta.get("resourceVersion") or ""), "background")
            except KubeConflict:
                continue
            except KubeNotFound:
                return False
            return True
        return False

    # -- plumbing -----------------------------------------------------------------------------
    async def _read(self, namespace: str, call_path: CallPath) -> Obj:
        try:
            return await self.kube.get_namespace(namespace, call_path=call_path)
        except KubeNotFound:
            raise BindingError(f"namespace {namespace} does not exist") from None
        except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
            raise BindingUnavailable(f"cannot read namespace {namespace} from the Kubernetes API: {exc}") from None

    async def _patch(self, namespace: str, patch: Obj, rv: str, call_path: CallPath) -> Obj:
        try:
            return await self.kube.patch_namespace(namespace, patch, resource_version=rv or None, call_path=call_path)
        except (KubeConflict, KubeNotFound):
            raise
        except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
            raise BindingUnavailable(f"cannot update namespace {namespace} in the Kubernetes API: {exc}") from None

    @contextlib.asynccontextmanager
    async def _namespace_lock(self, namespace: str) -> AsyncIterator[None]:
        # One binder per namespace in this process; across processes the intent annotation decides.
        lock, users = self._locks.get(namespace, (asyncio.Lock(), 0))
        self._locks[namespace] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[namespace]
            if users <= 1:
                del self._locks[namespace]
            else:
                self._locks[namespace] = (lock, users - 1)
