"""The in-memory cluster state that admission reads.

Two feeders write to it: a folder of YAML (`serve --state DIR`, the embedded default) and the
Kubernetes watches (`webhook.kube.watch`). Both call the same `apply`/`delete` methods with raw
Kubernetes objects, so admission cannot tell them apart.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from webhook.core.kinds import UNREADABLE_POD_GPUS, classify_workload, pod_controller, pod_gpu_request
from webhook.core.preemptibility import runai_preemptibility
from webhook.kube.watch import HeldListing, Listing
from webhook.metrics import PODS_UNREADABLE_GPUS, RUNAI_ADMISSION_AVAILABLE, SETTINGS_REJECTED, log_skipped
from webhook.settings import SETTINGS_CONFIGMAP, ClusterSettings, SettingsError
from webhook.snapshot import (
    RUNAI_ADMISSION_DEPLOYMENTS,
    RUNAI_NAMESPACE,
    ClusterQueueInfo,
    ClusterSnapshot,
    DeploymentInfo,
    FreedPod,
    HeldGpus,
    LocalQueueInfo,
    NamespaceInfo,
    NamespaceMemo,
    PodRecord,
    PriorityClassInfo,
    ReplicaSetInfo,
    ResourceFlavorInfo,
    TopologyInfo,
)

log = logging.getLogger(__name__)

# How long a deleted or finished GPU pod is remembered. It must outlast a GPU reservation (its TTL,
# `webhook.quota.reservations.DEFAULT_TTL_S`), so that a reservation for a pod already gone never
# counts again, and the Run:ai directory's refresh interval, so that Run:ai's allocation sampled
# before the pod left can be corrected by it.
FREED_RETENTION_S = 300.0

# Told of every write of a kind this store caches, after it: the event, the kind, the object. A
# pod list is the exception: its pods are made records as the pages arrive, and nothing listens
# for pods (they are the cache's bulk), so they are not told one by one.
Listener = Callable[[str, str, Mapping[str, Any]], None]

# Kueue's cluster-scoped kinds this store keeps, each a record of its name. Their kind names are
# generic ("Topology"), so an object of another API group with the same kind is not taken for one.
KUEUE_GROUP = "kueue.x-k8s.io"
_KUEUE_RECORDS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "ClusterQueue": ClusterQueueInfo.from_object,
    "ResourceFlavor": ResourceFlavorInfo.from_object,
    "Topology": TopologyInfo.from_object,
}


# The kinds the namespace plans (`core.namespace_plan`) are made of, besides the settings ConfigMap:
# a write of any of them empties the memo. Pods and ReplicaSets, the frequent writes, do not.
PLAN_KINDS = frozenset({"Namespace", "PriorityClass", "LocalQueue", *_KUEUE_RECORDS})


def _foreign(obj: Mapping[str, Any], group: str) -> bool:
    """An object whose apiVersion names another group than the one its kind is cached for (a
    folder's object may leave apiVersion out)."""
    api_version = obj.get("apiVersion")
    return isinstance(api_version, str) and "/" in api_version and api_version.split("/")[0] != group


class ClusterState:
    """Mutable caches plus the snapshot view over them."""

    def __init__(
        self,
        install_namespace: str = "hopsworks",
        settings: ClusterSettings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.install_namespace = install_namespace
        self.clock = clock  # stamps NamespaceInfo.runai_queue_seen_at
        self.namespaces: dict[str, NamespaceInfo] = {}
        self.priority_classes: dict[str, PriorityClassInfo] = {}
        self.local_queues: dict[str, frozenset[str]] = {}
        self.local_queue_info: dict[str, dict[str, LocalQueueInfo]] = {}
        # Kueue's cluster-scoped objects, by kind then name (ClusterQueue, ResourceFlavor, Topology).
        self.kueue: dict[str, dict[str, Any]] = {kind: {} for kind in _KUEUE_RECORDS}
        self.replica_sets: dict[str, dict[str, ReplicaSetInfo]] = {}
        self.pods: dict[str, dict[str, PodRecord]] = {}
        # `pods`' held GPUs per namespace: every write to `pods` below tells it (quota reads it).
        self.held_gpus = HeldGpus()
        self.freed_pods: dict[str, dict[str, FreedPod]] = {}
        # Uids of cached pods whose GPU request cannot be read (counted as UNREADABLE_POD_GPUS).
        self.unreadable_gpu_pods: set[str] = set()
        # Run:ai's admission Deployments (namespace runai), once their watch has listed.
        self.runai_admission: dict[str, DeploymentInfo] = {}
        # What decisions derive per namespace (`core.namespace_plan`); emptied by `_forget_plans`.
        self.memo = NamespaceMemo()
        self._snapshot = ClusterSnapshot(
            settings=settings or ClusterSettings(),
            namespaces=self.namespaces,
            priority_classes=self.priority_classes,
            local_queues=self.local_queues,
            local_queue_info=self.local_queue_info,
            cluster_queues=self.kueue["ClusterQueue"],
            resource_flavors=self.kueue["ResourceFlavor"],
            topologies=self.kueue["Topology"],
            replica_sets=self.replica_sets,
            pods=self.pods,
            held_gpus_index=self.held_gpus,
            freed_pods=self.freed_pods,
            memo=self.memo,
        )
        # Which resource kinds have finished their initial list; /readyz waits for all of them.
        self.synced: dict[str, bool] = {}
        self.listeners: list[Listener] = []
        self._listing = False  # inside replace_all: what a full list shows is not news

    # -- views -------------------------------------------------------------------------------
    def snapshot(self) -> ClusterSnapshot:
        return self._snapshot

    @property
    def settings(self) -> ClusterSettings:
        return self._snapshot.settings

    def ready(self) -> bool:
        return bool(self.synced) and all(self.synced.values())

    # -- writes ------------------------------------------------------------------------------
    def apply(self, obj: Mapping[str, Any]) -> None:
        """Insert or replace one object (any kind this system caches; others are ignored)."""
        kind = obj.get("kind")
        self._forget_plans(kind)
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        if kind == "Namespace":
            self.namespaces[name] = self._stamped(NamespaceInfo.from_object(obj))
        elif kind == "PriorityClass":
            self.priority_classes[name] = PriorityClassInfo.from_object(obj)
            self._classify_gpu_pods(self._snapshot.settings)  # Run:ai reads the class's value
        elif kind == "ConfigMap":
            if self._is_settings(meta):
                self._apply_settings(obj.get("data") or {})
        elif kind == "LocalQueue":
            if _foreign(obj, KUEUE_GROUP):
                return
            info = LocalQueueInfo.from_object(obj)
            self.local_queue_info.setdefault(info.namespace, {})[name] = info
            names = self.local_queues.get(info.namespace, frozenset())
            if name not in names:  # a status update keeps the set (the offer cache keys on it)
                self.local_queues[info.namespace] = names | {name}
        elif kind in _KUEUE_RECORDS:
            if _foreign(obj, KUEUE_GROUP):
                return
            self.kueue[kind][name] = _KUEUE_RECORDS[kind](obj)
        elif kind == "ReplicaSet":
            if _foreign(obj, "apps"):
                return
            rs = ReplicaSetInfo.from_object(obj)
            self.replica_sets.setdefault(rs.namespace, {})[rs.name] = rs
        elif kind == "Deployment":
            if not self._is_runai_admission(meta):
                return
            self._runai_admission()[name] = DeploymentInfo.from_object(obj)
            self._publish_runai_admission()
        elif kind == "Pod":
            record = pod_record(obj, self._snapshot.settings, self.priority_classes)
            pods = self.pods.setdefault(record.namespace, {})
            previous = pods.get(record.uid)
            pods[record.uid] = record
            self.held_gpus.replace(previous, record)
            self._mark_unreadable(record.uid, record.gpus_unreadable)
            if record.finished and previous is not None and not previous.finished:
                self._freed(previous)
        else:
            return
        self._notify("apply", kind, obj)

    def delete(self, obj: Mapping[str, Any]) -> None:
        kind = obj.get("kind")
        self._forget_plans(kind)
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        if kind == "Namespace":
            self.namespaces.pop(name, None)
            for uid in self.pods.pop(name, {}):
                self._mark_unreadable(uid, False)
            self.held_gpus.drop(name)
            self.freed_pods.pop(name, None)
            self.local_queues.pop(name, None)
            self.local_queue_info.pop(name, None)
            self.replica_sets.pop(name, None)
        elif kind == "PriorityClass":
            if self.priority_classes.pop(name, None) is not None:
                self._classify_gpu_pods(self._snapshot.settings)
        elif kind == "ConfigMap":
            if self._is_settings(meta):
                self._apply_settings({})
        elif kind == "Deployment":
            if not self._is_runai_admission(meta):
                return
            self._runai_admission().pop(name, None)
            self._publish_runai_admission()
        elif kind == "LocalQueue":
            if _foreign(obj, KUEUE_GROUP):
                return
            ns = meta.get("namespace", "")
            remaining = self.local_queues.get(ns, frozenset()) - {name}
            if remaining:
                self.local_queues[ns] = remaining
            else:
                self.local_queues.pop(ns, None)
            infos = self.local_queue_info.get(ns)
            if infos is not None:
                infos.pop(name, None)
                if not infos:
                    self.local_queue_info.pop(ns, None)
        elif kind in _KUEUE_RECORDS:
            if _foreign(obj, KUEUE_GROUP):
                return
            self.kueue[kind].pop(name, None)
        elif kind == "ReplicaSet":
            ns = meta.get("namespace", "")
            sets = self.replica_sets.get(ns)
            if sets is not None:
                sets.pop(name, None)
                if not sets:
                    self.replica_sets.pop(ns, None)
        elif kind == "Pod":
            ns = meta.get("namespace", "")
            uid = meta.get("uid") or f"{ns}/{name}"
            pods = self.pods.get(ns)
            record = pods.pop(uid, None) if pods is not None else None
            self.held_gpus.replace(record, None)
            if pods is not None and not pods:
                self.pods.pop(ns, None)
            self._mark_unreadable(uid, False)
            if record is None:  # never seen (e.g. deleted during a re-list): its reservation ends here too
                record = pod_record(obj, self._snapshot.settings, self.priority_classes)
            if not record.finished:  # a finished pod's GPUs were freed when it finished
                self._freed(record)
        else:
            return
        self._notify("delete", kind, obj)

    def replace_all(self, kind: str, objects: Sequence[Mapping[str, Any]]) -> None:
        """A fresh list (initial sync or re-list after 410 Gone): drop what is no longer there."""
        self._forget_plans(kind)
        if kind == "Namespace":
            self.namespaces.clear()
        elif kind == "PriorityClass":
            self.priority_classes.clear()
        elif kind == "LocalQueue":
            self.local_queues.clear()
            self.local_queue_info.clear()
        elif kind in _KUEUE_RECORDS:
            self.kueue[kind].clear()
        elif kind == "ReplicaSet":
            self.replica_sets.clear()
        elif kind == "Deployment":
            self._runai_admission().clear()  # listed: from now on, a missing one is known missing
            self._publish_runai_admission()
        elif kind == "Pod":
            listing = _PodListing(self)
            listing.add(objects)
            listing.finish()
            return
        elif kind == "ConfigMap" and not any(
            isinstance(o.get("metadata"), Mapping) and o["metadata"].get("name") == SETTINGS_CONFIGMAP for o in objects
        ):
            self._apply_settings({})
        self._listing = True
        try:
            apply_each(kind, objects, self.apply)
        finally:
            self._listing = False

    def listing(self, kind: str) -> Listing:
        """Where a fresh list of `kind` goes as its pages arrive (`webhook.kube.watch.Listing`):
        pods become records at once, so a page is let go as soon as it is read; any other kind is
        held for `replace_all`."""
        return _PodListing(self) if kind == "Pod" else HeldListing(self, kind)

    def replace_pods(self, records: Iterable[PodRecord]) -> None:
        """The pods of a fresh list, as records made while it arrived: what is no longer there is
        dropped (a GPU pod's GPUs freed), and the GPU pods are classified again under the settings
        and PriorityClasses of now, which may have changed since their page came."""
        before = [record for pods in self.pods.values() for record in pods.values()]
        self.pods.clear()
        self.unreadable_gpu_pods.clear()
        for record in records:
            self.pods.setdefault(record.namespace, {})[record.uid] = record
            if record.gpus_unreadable:
                self.unreadable_gpu_pods.add(record.uid)
            else:
                self.unreadable_gpu_pods.discard(record.uid)
        PODS_UNREADABLE_GPUS.set(len(self.unreadable_gpu_pods))
        self._classify_gpu_pods(self._snapshot.settings)  # and the held GPUs counted afresh
        for record in before:  # deleted while the watch was down
            if not record.finished and record.uid not in self.pods.get(record.namespace, {}):
                self._freed(record)

    def _stamped(self, info: NamespaceInfo) -> NamespaceInfo:
        """Carry over (or set) when the namespace's current Run:ai binding was first seen here."""
        queue = info.runai_queue
        if queue is None:
            return info
        old = self.namespaces.get(info.name)
        if old is not None and old.runai_queue == queue:
            seen = old.runai_queue_seen_at
        else:
            seen = 0.0 if self._listing else self.clock()
        return dataclasses.replace(info, runai_queue_seen_at=seen) if seen else info

    def _mark_unreadable(self, uid: str, unreadable: bool) -> None:
        if unreadable:
            self.unreadable_gpu_pods.add(uid)
        else:
            self.unreadable_gpu_pods.discard(uid)
        PODS_UNREADABLE_GPUS.set(len(self.unreadable_gpu_pods))

    def _freed(self, record: PodRecord) -> None:
        """Remember that a GPU pod left, so its reservation stops counting now rather than at its TTL."""
        if not record.gpus:
            return
        now = self.clock()
        freed = self.freed_pods.setdefault(record.namespace, {})
        for uid in [uid for uid, f in freed.items() if f.at < now - FREED_RETENTION_S]:
            del freed[uid]
        freed[record.uid] = FreedPod(
            uid=record.uid,
            gpus=record.gpus,
            kind=record.kind,
            scheduled=record.scheduled,
            at=now,
            preemptible=record.preemptible,
        )

    @staticmethod
    def _is_runai_admission(meta: Mapping[str, Any]) -> bool:
        return meta.get("namespace") == RUNAI_NAMESPACE and meta.get("name") in RUNAI_ADMISSION_DEPLOYMENTS

    def _runai_admission(self) -> dict[str, DeploymentInfo]:
        self._snapshot.runai_admission = self.runai_admission  # known from the first list or event on
        return self.runai_admission

    def _publish_runai_admission(self) -> None:
        known = self._snapshot.runai_admission or {}
        for name in RUNAI_ADMISSION_DEPLOYMENTS:
            found = known.get(name)
            RUNAI_ADMISSION_AVAILABLE.labels(name).set(1 if found is not None and found.available else 0)

    def _forget_plans(self, kind: object) -> None:
        """Empty the namespace plans before a write they may depend on (emptied first, so a write
        that fails half-way leaves none behind either)."""
        if isinstance(kind, str) and kind in PLAN_KINDS:  # a hostile object's kind may be unhashable
            self.memo.clear()

    def _is_settings(self, meta: Mapping[str, Any]) -> bool:
        """The settings ConfigMap in the install namespace (a folder's object may omit the namespace)."""
        return bool(
            meta.get("name", "") == SETTINGS_CONFIGMAP
            and meta.get("namespace", self.install_namespace) == self.install_namespace
        )

    def _apply_settings(self, data: Mapping[str, Any]) -> None:
        try:
            settings = ClusterSettings.from_configmap_data(data)
        except SettingsError as exc:
            # Keep serving with the last good settings: a typo must not block every pod.
            log.error("settings ConfigMap rejected, keeping the previous settings: %s", exc)
            self._snapshot.settings_error = str(exc)
            SETTINGS_REJECTED.set(1)
            return
        conflict = settings.exclusion_error() or settings.runai_error()
        if conflict:
            # G1: never act on both; nor tell Run:ai otherwise than the quota check assumes. Keep
            # what was in force and report it.
            log.error("settings ConfigMap rejected, keeping the previous settings: %s", conflict)
            self._snapshot.settings_error = conflict
            SETTINGS_REJECTED.set(1)
            return
        self.memo.clear()  # the plans hold the settings they were made with
        previous, self._snapshot.settings = self._snapshot.settings, settings
        self._snapshot.settings_error = None
        SETTINGS_REJECTED.set(0)
        if (
            settings.scheduler.workload_kinds != previous.scheduler.workload_kinds
            or settings.scheduler.runai != previous.scheduler.runai
        ):
            self._classify_gpu_pods(settings)

    def _classify_gpu_pods(self, settings: ClusterSettings) -> None:
        """Pods cached under other workload kind rules or Run:ai settings (or listed before the
        settings arrived), or whose priority class changed: kind and preemptibility again."""
        rules = settings.scheduler.workload_kinds
        for pods in self.pods.values():
            for uid, record in pods.items():
                if record.gpus:
                    kind = classify_workload(record.labels, rules, record.controller)
                    seen = runai_preemptibility(record.labels, record.priority_class, self.priority_classes, settings)
                    pods[uid] = dataclasses.replace(record, kind=kind, preemptible=seen.preemptible)
        self.held_gpus.rebuild(self.pods)

    def _notify(self, event: str, kind: str, obj: Mapping[str, Any]) -> None:
        for listener in self.listeners:
            listener(event, kind, obj)


class _PodListing:
    """A fresh pod list on its way into the store: each pod a record as its page arrives."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.records: list[PodRecord] = []

    def add(self, objects: Sequence[Mapping[str, Any]]) -> None:
        settings, classes = self.state.settings, self.state.priority_classes
        for obj in objects:
            try:
                self.records.append(pod_record(obj, settings, classes))
            except Exception:  # one pod the cache cannot take must not keep it from syncing
                log_skipped("Pod", "list", obj)

    def finish(self) -> None:
        self.state.replace_pods(self.records)


def apply_each(kind: str, objects: Sequence[Mapping[str, Any]], apply: Callable[[Mapping[str, Any]], None]) -> int:
    """Apply every object of a fresh list; one a cache cannot take is skipped, logged and counted,
    so no single object stops a cache from syncing. Returns how many were skipped."""
    skipped = 0
    for obj in objects:
        try:
            apply(obj if "kind" in obj else {"kind": kind, **obj})
        except Exception:
            skipped += 1
            log_skipped(kind, "list", obj)
    return skipped


def pod_record(
    obj: Mapping[str, Any], settings: ClusterSettings, classes: Mapping[str, PriorityClassInfo] | None = None
) -> PodRecord:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace", "")
    name = meta.get("name") or meta.get("generateName") or ""
    labels = meta.get("labels") or {}
    uid = meta.get("uid") or f"{ns}/{name}"
    unreadable = False
    try:
        gpus = pod_gpu_request(obj)
    except ValueError as exc:
        # Admission refuses such a pod; one created around it (webhook down, or a namespace that
        # became a project later) must not hide GPUs it may hold, so it counts as the most a pod
        # may ask for. The metric and this line tell the operator which pod to fix.
        log.warning(
            "pod %.100s/%.100s: GPU request unreadable, counted as %g GPUs: %s", ns, name, UNREADABLE_POD_GPUS, exc
        )
        gpus, unreadable = UNREADABLE_POD_GPUS, True
    controller = pod_controller(meta)  # as admission classified it (`kinds.pod_kind`)
    phase = (obj.get("status") or {}).get("phase") or "Pending"
    priority_class = (obj.get("spec") or {}).get("priorityClassName")
    priority_class = priority_class if isinstance(priority_class, str) else None
    # The pod as stored, labelled by the webhook: Run:ai classifies it from the same labels.
    seen = runai_preemptibility(labels, priority_class, classes or {}, settings)
    return PodRecord(
        namespace=ns,
        name=name,
        uid=uid,
        phase=phase,
        kind=classify_workload(labels, settings.scheduler.workload_kinds, controller),
        gpus=gpus,
        labels=labels if gpus else _NO_LABELS,
        controller=controller if gpus else None,
        priority_class=priority_class if gpus else None,
        preemptible=seen.preemptible,
        scheduled=bool((obj.get("spec") or {}).get("nodeName")) or phase == "Running",
        gpus_unreadable=unreadable,
    )


_NO_LABELS: Mapping[str, Any] = {}
