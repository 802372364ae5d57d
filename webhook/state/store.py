"""The in-memory cluster state that admission reads.

Two feeders write to it: a folder of YAML (`serve --state DIR`, the embedded default) and the
Kubernetes watches (`webhook.state.kube`). Both call the same `apply`/`delete` methods with raw
Kubernetes objects, so admission cannot tell them apart.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from webhook.core.kinds import classify_workload, pod_gpu_request
from webhook.metrics import SETTINGS_REJECTED
from webhook.settings import SETTINGS_CONFIGMAP, ClusterSettings, SettingsError
from webhook.snapshot import ClusterSnapshot, NamespaceInfo, PodRecord, PriorityClassInfo

log = logging.getLogger(__name__)

Listener = Callable[[str, str, Mapping[str, Any]], None]


class ClusterState:
    """Mutable caches plus the snapshot view over them."""

    def __init__(self, install_namespace: str = "hopsworks", settings: ClusterSettings | None = None) -> None:
        self.install_namespace = install_namespace
        self.namespaces: dict[str, NamespaceInfo] = {}
        self.priority_classes: dict[str, PriorityClassInfo] = {}
        self.local_queues: dict[str, frozenset[str]] = {}
        self.pods: dict[str, dict[str, PodRecord]] = {}
        self._snapshot = ClusterSnapshot(
            settings=settings or ClusterSettings(),
            namespaces=self.namespaces,
            priority_classes=self.priority_classes,
            local_queues=self.local_queues,
            pods=self.pods,
        )
        # Which resource kinds have finished their initial list; /readyz waits for all of them.
        self.synced: dict[str, bool] = {}
        # G1: the last settings ConfigMap seen turned both Kueue and Run:ai on (and was not applied).
        self.settings_conflict: str | None = None
        self.listeners: list[Listener] = []

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
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        if kind == "Namespace":
            self.namespaces[name] = NamespaceInfo.from_object(obj)
        elif kind == "PriorityClass":
            self.priority_classes[name] = PriorityClassInfo.from_object(obj)
        elif kind == "ConfigMap":
            if self._is_settings(meta):
                self._apply_settings(obj.get("data") or {})
        elif kind == "LocalQueue":
            ns = meta.get("namespace", "")
            self.local_queues[ns] = self.local_queues.get(ns, frozenset()) | {name}
        elif kind == "Pod":
            record = pod_record(obj, self._snapshot.settings)
            self.pods.setdefault(record.namespace, {})[record.uid] = record
        else:
            return
        self._notify("apply", kind, obj)

    def delete(self, obj: Mapping[str, Any]) -> None:
        kind = obj.get("kind")
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        if kind == "Namespace":
            self.namespaces.pop(name, None)
            self.pods.pop(name, None)
            self.local_queues.pop(name, None)
        elif kind == "PriorityClass":
            self.priority_classes.pop(name, None)
        elif kind == "ConfigMap":
            if self._is_settings(meta):
                self._apply_settings({})
        elif kind == "LocalQueue":
            ns = meta.get("namespace", "")
            remaining = self.local_queues.get(ns, frozenset()) - {name}
            if remaining:
                self.local_queues[ns] = remaining
            else:
                self.local_queues.pop(ns, None)
        elif kind == "Pod":
            ns = meta.get("namespace", "")
            uid = meta.get("uid") or f"{ns}/{name}"
            pods = self.pods.get(ns)
            if pods is not None:
                pods.pop(uid, None)
                if not pods:
                    self.pods.pop(ns, None)
        else:
            return
        self._notify("delete", kind, obj)

    def replace_all(self, kind: str, objects: list[Mapping[str, Any]]) -> None:
        """A fresh list (initial sync or re-list after 410 Gone): drop what is no longer there."""
        if kind == "Namespace":
            self.namespaces.clear()
        elif kind == "PriorityClass":
            self.priority_classes.clear()
        elif kind == "LocalQueue":
            self.local_queues.clear()
        elif kind == "Pod":
            self.pods.clear()
        elif kind == "ConfigMap" and not any(
            (o.get("metadata") or {}).get("name") == SETTINGS_CONFIGMAP for o in objects
        ):
            self._apply_settings({})
        for obj in objects:
            self.apply({"kind": kind, **obj} if "kind" not in obj else obj)

    def _is_settings(self, meta: Mapping[str, Any]) -> bool:
        """The settings ConfigMap in the install namespace (a folder's object may omit the namespace)."""
        return (
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
        self.settings_conflict = conflict = settings.exclusion_error()
        if conflict:
            # G1: never act on both; keep what was in force and report it.
            log.error("settings ConfigMap rejected, keeping the previous settings: %s", conflict)
            self._snapshot.settings_error = conflict
            SETTINGS_REJECTED.set(1)
            return
        previous, self._snapshot.settings = self._snapshot.settings, settings
        self._snapshot.settings_error = None
        SETTINGS_REJECTED.set(0)
        if settings.scheduler.workload_kinds != previous.scheduler.workload_kinds:
            self._classify_gpu_pods(settings)

    def _classify_gpu_pods(self, settings: ClusterSettings) -> None:
        """Pods cached under other workload kind rules (or listed before the settings arrived)."""
        rules = settings.scheduler.workload_kinds
        for pods in self.pods.values():
            for uid, record in pods.items():
                if record.gpus:
                    pods[uid] = dataclasses.replace(record, kind=classify_workload(record.labels, rules))

    def _notify(self, event: str, kind: str, obj: Mapping[str, Any]) -> None:
        for listener in self.listeners:
            listener(event, kind, obj)


def pod_record(obj: Mapping[str, Any], settings: ClusterSettings) -> PodRecord:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace", "")
    name = meta.get("name") or meta.get("generateName") or ""
    labels = meta.get("labels") or {}
    gpus = _gpus_or_zero(obj)
    return PodRecord(
        namespace=ns,
        name=name,
        uid=meta.get("uid") or f"{ns}/{name}",
        phase=(obj.get("status") or {}).get("phase") or "Pending",
        kind=classify_workload(labels, settings.scheduler.workload_kinds),
        gpus=gpus,
        labels=labels if gpus else _NO_LABELS,
    )


_NO_LABELS: Mapping[str, Any] = {}


def _gpus_or_zero(obj: Mapping[str, Any]) -> float:
    # The apiserver validated the resources; only Run:ai's free-form annotations can be malformed,
    # and Run:ai refuses such pods itself.
    try:
        return pod_gpu_request(obj)
    except ValueError:
        return 0.0
