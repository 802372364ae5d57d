"""The cluster as admission sees it: read-only views over the watch-fed caches.

Decision functions take a `ClusterSnapshot` and never call out. The caches (a Kubernetes watch or
a folder of YAML) own the mutable dicts; asyncio runs one decision at a time, so a decision reads a
consistent view without copying.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.settings import ClusterSettings

log = logging.getLogger(__name__)

# Namespace keys (DESIGN §2).
PROJECT_LABEL = "hopsworks.ai/project"
DEPARTMENT_LABEL = "hopsworks.ai/department"
RUNAI_QUEUE_LABEL = "runai/queue"
RUNAI_PROJECT_ID_LABEL = "hopsworks.ai/runai-project-id"
AVAILABLE_ANNOTATION = "scheduling.hopsworks.ai/available"
DEFAULTS_ANNOTATION = "scheduling.hopsworks.ai/defaults"
# A department move in progress (intent + lock, written only by this system).
RUNAI_MOVE_ANNOTATION = "scheduling.hopsworks.ai/runai-move"
# Pod keys.
AFFINITY_ANNOTATION = "scheduling.hopsworks.ai/affinity"
ANTI_AFFINITY_ANNOTATION = "scheduling.hopsworks.ai/anti-affinity"
TOPOLOGY_ANNOTATION = "scheduling.hopsworks.ai/topology"
# Says the workload chose its priority class itself, for a class the Priority admission plugin
# could have filled in (the cluster's globalDefault class); see `core.scheduling._priority`.
PRIORITY_CLASS_ANNOTATION = "scheduling.hopsworks.ai/priority-class"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"


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
            labels=_strings(meta, "labels"),
            annotations=_strings(meta, "annotations"),
            deleting=bool(meta.get("deletionTimestamp")),
            resource_version=str(meta.get("resourceVersion") or ""),
        )


def _strings(meta: Mapping[str, Any], key: str) -> dict[str, str]:
    """Labels or annotations, keeping only string values: an apiserver stores nothing else, and a
    value of another type (a 5,000-digit number, deep nesting) must not block the project's pods."""
    values = meta.get(key) or {}
    kept = {k: v for k, v in values.items() if isinstance(k, str) and isinstance(v, str)}
    if len(kept) != len(values):
        log.warning("namespace %.100s: %s that are not strings ignored", meta.get("name"), key)
    return kept


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


@dataclass(frozen=True, slots=True)
class RunaiProjectInfo:
    """A Run:ai project bound to a namespace, as the last refresh saw it."""

    id: str
    name: str
    namespace: str
    deserved_gpus: float = 0.0  # on `node_pool`
    node_pool: str | None = None  # the project's default node pool (see `core.gpu_view.default_node_pool`)
    allocated_non_preemptible: float = 0.0  # Run:ai's count on `node_pool`
    sampled_at: float = 0.0  # epoch seconds Run:ai's answer arrived


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
    expires_at: float  # epoch seconds; a pod that never appears stops counting then


@dataclass(slots=True)
class ClusterSnapshot:
    """Read-only view handed to decision functions."""

    settings: ClusterSettings
    namespaces: Mapping[str, NamespaceInfo] = field(default_factory=dict)
    priority_classes: Mapping[str, PriorityClassInfo] = field(default_factory=dict)
    # namespace -> names of Kueue LocalQueues in it
    local_queues: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # namespace -> pod uid -> record
    pods: Mapping[str, Mapping[str, PodRecord]] = field(default_factory=dict)
    # Why the settings ConfigMap is refused (the last good settings serve): logged, and
    # `webhook_settings_rejected` is 1 while it is set.
    settings_error: str | None = None
    # Run:ai projects by namespace, from the timed refresh; None until a refresh succeeded.
    runai_projects: Mapping[str, RunaiProjectInfo] | None = None
    # Whether Run:ai answered the last directory refresh; None: not known (never refreshed, or no
    # Run:ai directory in this process at all, e.g. `serve --state`).
    runai_reachable: bool | None = None
    # Bound namespaces whose Run:ai project Run:ai did not have, as of the last refresh or lookup:
    # namespace -> the runai/queue it named then.
    runai_missing: Mapping[str, str] = field(default_factory=dict)
    # namespace -> reservation key -> reservation
    gpu_reservations: Mapping[str, Mapping[str, GpuReservation]] = field(default_factory=dict)
    # namespace -> pod uid -> GPU pods seen deleted or finished lately (kept `FREED_RETENTION_S`)
    freed_pods: Mapping[str, Mapping[str, FreedPod]] = field(default_factory=dict)
