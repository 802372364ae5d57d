"""Frozen records of the Kubernetes objects the caches keep: what the rules read of each, parsed
once as the watch event arrives (`from_object`), so that a decision reads plain fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.snapshot.fields import count_of, mappings, object_meta, section, string_map
from webhook.snapshot.keys import (
    DEPARTMENT_LABEL,
    DESIRED_REPLICAS_ANNOTATION,
    GROUP_REPLICAS_ANNOTATION,
    PROJECT_LABEL,
    RUNAI_MOVE_ANNOTATION,
    RUNAI_PROJECT_ID_LABEL,
    RUNAI_QUEUE_LABEL,
)


@dataclass(frozen=True, slots=True)
class NamespaceInfo:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    deleting: bool = False
    resource_version: str = ""
    # When this replica's cache first showed the current `runai/queue` label (time.time()); 0.0
    # when it was already there at the initial list. Admission waits a moment after a binding so
    # the apiserver's own namespace cache (which Run:ai's webhook selector reads) has it too.
    runai_queue_seen_at: float = 0.0

    @property
    def is_project(self) -> bool:
        return PROJECT_LABEL in self.labels

    @property
    def department(self) -> str | None:
        return self.labels.get(DEPARTMENT_LABEL) or None

    @property
    def runai_queue(self) -> str | None:
        return self.labels.get(RUNAI_QUEUE_LABEL) or None

    @property
    def moving(self) -> bool:
        return RUNAI_MOVE_ANNOTATION in self.annotations

    @property
    def runai_project_id(self) -> str | None:
        return self.labels.get(RUNAI_PROJECT_ID_LABEL) or None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> NamespaceInfo:
        meta = obj.get("metadata") or {}
        return cls(
            name=meta.get("name", ""),
            labels=string_map(meta, "labels"),
            annotations=string_map(meta, "annotations"),
            deleting=bool(meta.get("deletionTimestamp")),
            resource_version=str(meta.get("resourceVersion") or ""),
        )


@dataclass(frozen=True, slots=True)
class PriorityClassInfo:
    name: str
    value: int
    preemption_policy: str = "PreemptLowerPriority"
    global_default: bool = False

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PriorityClassInfo:
        return cls(
            name=(obj.get("metadata") or {}).get("name", ""),
            value=int(obj.get("value") or 0),
            preemption_policy=obj.get("preemptionPolicy") or "PreemptLowerPriority",
            global_default=bool(obj.get("globalDefault")),
        )


@dataclass(frozen=True, slots=True)
class ReplicaSetInfo:
    """What pod grouping needs of a ReplicaSet: who controls it and how many pods its owner wants."""

    namespace: str
    name: str
    uid: str
    replicas: int  # what the Deployment wants (its desired-replicas annotation), else spec.replicas
    deployment: str | None = None  # the controlling Deployment's name
    # Its template's GROUP_REPLICAS_ANNOTATION: its pods are one Kueue pod group of that size.
    group_replicas: int | None = None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ReplicaSetInfo:
        meta = object_meta(obj)
        deployment = None
        for ref in mappings(meta.get("ownerReferences")):
            if ref.get("controller") is True and ref.get("kind") == "Deployment":
                deployment = str(ref.get("name") or "") or None
        desired = section(meta, "annotations").get(DESIRED_REPLICAS_ANNOTATION)
        replicas = section(obj, "spec").get("replicas", 1)
        if deployment is not None and isinstance(desired, str) and desired.isdigit() and len(desired) <= 9:
            replicas = int(desired)
        template = section(section(obj, "spec"), "template")
        group = section(section(template, "metadata"), "annotations").get(GROUP_REPLICAS_ANNOTATION)
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            replicas=count_of(replicas),
            deployment=deployment,
            group_replicas=int(group) if isinstance(group, str) and group.isdigit() and len(group) <= 9 else None,
        )


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What quota accounting needs of a pod, nothing more (the cache holds 100k of these)."""

    namespace: str
    name: str
    uid: str
    phase: str
    kind: str | None
    gpus: float
    # Kept for GPU pods only (the kind matters only for them): a change of the settings' workload
    # kind rules classifies them again instead of leaving the kind the old rules gave.
    labels: Mapping[str, Any] = field(default_factory=dict, compare=False)
    controller: tuple[str, str] | None = field(default=None, compare=False)  # (API group, kind) of its controller
    priority_class: str | None = field(default=None, compare=False)  # spec.priorityClassName (GPU pods only)
    # How Run:ai classifies it (`core.preemptibility`): a non-preemptible pod holds deserved GPUs.
    preemptible: bool = False
    scheduled: bool = False  # bound to a node: Run:ai has allocated its GPUs
    gpus_unreadable: bool = False  # `gpus` is UNREADABLE_POD_GPUS: the request could not be read

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class FreedPod:
    """A GPU pod the pod cache saw deleted or finished: its GPUs are free from `at` on."""

    uid: str
    gpus: float
    kind: str | None
    scheduled: bool  # it was on a node, so Run:ai's allocation counted it until then
    at: float  # epoch seconds the cache learnt it
    preemptible: bool = False  # as Run:ai classified it: only non-preemptible GPUs were in its count


@dataclass(frozen=True, slots=True)
class DeploymentInfo:
    """What availability needs of a Deployment."""

    name: str
    replicas: int  # spec.replicas (default 1)
    available_replicas: int
    available: bool  # condition Available=True and at least one replica available

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> DeploymentInfo:
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        replicas = spec.get("replicas")
        replicas = replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else 1
        ready = status.get("availableReplicas")
        ready = ready if isinstance(ready, int) and not isinstance(ready, bool) else 0
        conditions = status.get("conditions") or []
        condition = any(
            isinstance(c, Mapping) and c.get("type") == "Available" and c.get("status") == "True" for c in conditions
        )
        return cls(
            name=str((obj.get("metadata") or {}).get("name") or ""),
            replicas=replicas,
            available_replicas=ready,
            available=condition and ready > 0 and replicas > 0,
        )


@dataclass(frozen=True, slots=True)
class LeftProject:
    """A Run:ai project this system created for a namespace deleted while the integration was off
    (so it could not delete it): what the namespace said when it was let go."""

    namespace: str
    runai_project: str | None  # the namespace's runai/queue
    runai_project_id: str | None  # None: creation was unfinished; look for one bound to the namespace
    deleted_at: str  # RFC 3339


@dataclass(frozen=True, slots=True)
class GpuReservation:
    """GPUs promised to an admitted pod the pod cache may not show yet (shared by all replicas)."""

    key: str  # the pod's uid when the apiserver gave one, else the admission request's uid
    namespace: str
    gpus: float
    expires_at: float  # epoch seconds; a pod the watch has not shown by then stops counting
    # Epoch seconds until which the entry is kept, counting or not: its key is remembered, so that
    # the same review sent again cannot start its count afresh.
    kept_until: float = 0.0
