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

# The labels and annotations on namespaces that make a project and carry its scheduling choices.
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
# Kueue's plain-pod group (pkg/controller/jobs/pod/constants at v0.17.0): the pods carrying one name
# and one total count are admitted as one Workload, so Topology-Aware Scheduling places them together.
KUEUE_POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_POD_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_POD_GROUP_SERVING_ANNOTATION = "kueue.x-k8s.io/pod-group-serving"
KUEUE_POD_GROUP_FAST_ADMISSION_ANNOTATION = "kueue.x-k8s.io/pod-group-fast-admission"
# Written by `core.owners` into the pod template of a Deployment that chose a topology unit: its
# replica count, so that a new count is a new template, a new ReplicaSet and a new pod group.
GROUP_REPLICAS_ANNOTATION = "scheduling.hopsworks.ai/group-replicas"
# What Kueue's pod webhook sets on a pod it manages: the label and the scheduling gate it lifts on
# admission (constants.ManagedByKueueLabelKey, podconstants.SchedulingGateName).
KUEUE_MANAGED_LABEL = "kueue.x-k8s.io/managed"
KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"
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


# -- Kueue's objects, as its v1beta2 API (v0.15+) has them; v1beta1 field names are read too --------
# Quantities are kept as Kueue wrote them (shown, never added up here), and only when they are
# short strings: a stored object of any shape must not stop a cache from syncing.
_MAX_QUANTITY_CHARS = 40


def _quantity(value: Any) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    return value if isinstance(value, str) and 0 < len(value) <= _MAX_QUANTITY_CHARS else None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _section(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _count_of(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


@dataclass(frozen=True, slots=True)
class LocalQueueInfo:
    """A LocalQueue: a namespace's name for a ClusterQueue (`spec.clusterQueue`)."""

    namespace: str
    name: str
    cluster_queue: str
    pending: int = 0  # status.pendingWorkloads
    admitted: int = 0  # status.admittedWorkloads

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> LocalQueueInfo:
        meta, status = _meta(obj), _section(obj, "status")
        cluster_queue = _section(obj, "spec").get("clusterQueue")
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            cluster_queue=cluster_queue if isinstance(cluster_queue, str) else "",
            pending=_count_of(status.get("pendingWorkloads")),
            admitted=_count_of(status.get("admittedWorkloads")),
        )


@dataclass(frozen=True, slots=True)
class FlavorResources:
    """One flavor of a ClusterQueue: nominal quota (spec) and usage (status.flavorsUsage) per
    resource, as Kueue writes the quantities."""

    flavor: str
    nominal: Mapping[str, str] = field(default_factory=dict)
    usage: Mapping[str, str] = field(default_factory=dict)
    borrowed: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClusterQueueInfo:
    """A ClusterQueue: its flavors in the order Kueue tries them, its cohort and Kueue's status."""

    name: str
    flavors: tuple[FlavorResources, ...] = ()
    cohort: str | None = None
    pending: int = 0  # status.pendingWorkloads
    admitted: int = 0  # status.admittedWorkloads
    active: bool | None = None  # the Active condition; None: Kueue has not reported it
    inactive_reason: str | None = None

    @property
    def flavor_names(self) -> tuple[str, ...]:
        return tuple(f.flavor for f in self.flavors)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ClusterQueueInfo:
        spec, status = _section(obj, "spec"), _section(obj, "status")
        nominal: dict[str, dict[str, str]] = {}
        for group in _items(spec.get("resourceGroups")):
            for flavor in _items(group.get("flavors")):
                name = flavor.get("name")
                if not isinstance(name, str) or name in nominal:
                    continue
                nominal[name] = {
                    str(r["name"]): q
                    for r in _items(flavor.get("resources"))
                    if isinstance(r.get("name"), str) and (q := _quantity(r.get("nominalQuota"))) is not None
                }
        usage: dict[str, dict[str, str]] = {}
        borrowed: dict[str, dict[str, str]] = {}
        for flavor in _items(status.get("flavorsUsage")):
            name = flavor.get("name")
            if not isinstance(name, str):
                continue
            for r in _items(flavor.get("resources")):
                if not isinstance(r.get("name"), str):
                    continue
                if (total := _quantity(r.get("total"))) is not None:
                    usage.setdefault(name, {})[r["name"]] = total
                if (lent := _quantity(r.get("borrowed"))) is not None:
                    borrowed.setdefault(name, {})[r["name"]] = lent
        active: bool | None = None
        reason: str | None = None
        for condition in _items(status.get("conditions")):
            if condition.get("type") == "Active":
                active = condition.get("status") == "True"
                reason = None if active else str(condition.get("reason") or "") or None
        cohort = spec.get("cohortName", spec.get("cohort"))  # v1beta2 renamed spec.cohort
        return cls(
            name=str(_meta(obj).get("name") or ""),
            flavors=tuple(FlavorResources(n, q, usage.get(n, {}), borrowed.get(n, {})) for n, q in nominal.items()),
            cohort=cohort if isinstance(cohort, str) and cohort else None,
            pending=_count_of(status.get("pendingWorkloads")),
            admitted=_count_of(status.get("admittedWorkloads")),
            active=active,
            inactive_reason=reason,
        )


@dataclass(frozen=True, slots=True)
class ResourceFlavorInfo:
    """A ResourceFlavor; `topology` names the Topology its nodes are placed by (TAS), if any."""

    name: str
    topology: str | None = None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ResourceFlavorInfo:
        topology = _section(obj, "spec").get("topologyName")
        return cls(
            name=str(_meta(obj).get("name") or ""),
            topology=topology if isinstance(topology, str) and topology else None,
        )


@dataclass(frozen=True, slots=True)
class TopologyInfo:
    """A Topology: its levels' node labels, coarsest first (`spec.levels[].nodeLabel`)."""

    name: str
    levels: tuple[str, ...] = ()

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> TopologyInfo:
        levels = [level.get("nodeLabel") for level in _items(_section(obj, "spec").get("levels"))]
        return cls(
            name=str(_meta(obj).get("name") or ""),
            levels=tuple(label for label in levels if isinstance(label, str) and label),
        )


# The Deployment controller's annotation on a ReplicaSet: the Deployment's replica count
# (k8s.io/kubernetes pkg/controller/deployment/util: DesiredReplicasAnnotation).
DESIRED_REPLICAS_ANNOTATION = "deployment.kubernetes.io/desired-replicas"


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
        meta = _meta(obj)
        deployment = None
        for ref in _items(meta.get("ownerReferences")):
            if ref.get("controller") is True and ref.get("kind") == "Deployment":
                deployment = str(ref.get("name") or "") or None
        desired = _section(meta, "annotations").get(DESIRED_REPLICAS_ANNOTATION)
        replicas = _section(obj, "spec").get("replicas", 1)
        if deployment is not None and isinstance(desired, str) and desired.isdigit() and len(desired) <= 9:
            replicas = int(desired)
        template = _section(_section(obj, "spec"), "template")
        group = _section(_section(template, "metadata"), "annotations").get(GROUP_REPLICAS_ANNOTATION)
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            replicas=_count_of(replicas),
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


# -- GPUs held per namespace, kept as the pod cache changes ------------------------------------------
# Admission asks for a project's held GPUs on every GPU review; summing its pods each time costs
# with the project's size. The pod cache (`webhook.state.store`) adds and takes off each record as
# it comes and goes instead. Sums are kept exact, as whole multiples of 2**-1074 (every float is
# one), so a pod's GPUs added and taken off any number of times leave nothing behind: the index
# always equals `math.fsum` of the records it holds (tests/test_held_gpus.py).
_EXACT_BITS = 1074
_EXACT_ONE = 1 << _EXACT_BITS


def holds_gpus(record: PodRecord) -> bool:
    """A pod whose GPUs count against its project's deserved GPUs."""
    return bool(record.gpus) and not record.finished and not record.preemptible


def _exact(gpus: float) -> int:
    numerator, denominator = gpus.as_integer_ratio()  # denominator: a power of two
    return numerator << (_EXACT_BITS + 1 - denominator.bit_length())


class HeldGpus:
    """Namespace -> GPUs held by its pod records that `holds_gpus`; written only by the pod cache.
    `core.quota.pods_holding` reads it (and sums the records itself without one)."""

    __slots__ = ("_exact", "_value")

    def __init__(self) -> None:
        self._exact: dict[str, int] = {}
        self._value: dict[str, float] = {}

    def get(self, namespace: str) -> float:
        return self._value.get(namespace, 0.0)

    def without(self, namespace: str, record: PodRecord) -> float:
        """The namespace's held GPUs less `record`'s, when it is held (a review of a pod the cache has)."""
        if not holds_gpus(record):
            return self.get(namespace)
        return (self._exact.get(namespace, 0) - _exact(record.gpus)) / _EXACT_ONE

    def replace(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """One record replaced by another (None: none), as the cache's dict was changed."""
        if old is not None:
            self._add(old, -1)
        if new is not None:
            self._add(new, 1)

    def drop(self, namespace: str) -> None:
        self._exact.pop(namespace, None)
        self._value.pop(namespace, None)

    def clear(self) -> None:
        self._exact.clear()
        self._value.clear()

    def rebuild(self, pods: Mapping[str, Mapping[str, PodRecord]]) -> None:
        self.clear()
        for records in pods.values():
            for record in records.values():
                self._add(record, 1)

    def _add(self, record: PodRecord, sign: int) -> None:
        if not holds_gpus(record):
            return
        namespace = record.namespace
        total = self._exact.get(namespace, 0) + sign * _exact(record.gpus)
        if total:
            self._exact[namespace] = total
            self._value[namespace] = total / _EXACT_ONE  # int / int: correctly rounded
        else:
            self.drop(namespace)


# Run:ai's own admission webhooks: while either Deployment is down, no pod can be created in a
# bound namespace (their webhooks fail closed). Watched read-only; see `core.runai_health`.
RUNAI_NAMESPACE = "runai"
RUNAI_ADMISSION_DEPLOYMENTS = ("runai-admission-controller", "admission")


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
class RunaiDepartmentInfo:
    """The Run:ai department of a project, on the project's default node pool, as the last refresh
    saw it: the parent queue the scheduler also holds a non-preemptible pod to."""

    id: str
    name: str
    deserved_gpus: float = 0.0  # -1: no quota (Run:ai's and the scheduler's "unlimited")
    allocated_non_preemptible: float = 0.0  # Run:ai's count, summed over the department's projects
    sampled_at: float = 0.0  # epoch seconds Run:ai's answer arrived


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
    department: RunaiDepartmentInfo | None = None  # None: no record of it, so no department limit


def department_namespaces(projects: Mapping[str, RunaiProjectInfo] | None) -> dict[str, frozenset[str]]:
    """The namespaces of `projects` (by namespace) grouped by their department's id."""
    grouped: dict[str, set[str]] = {}
    for namespace, project in (projects or {}).items():
        if project.department is not None:
            grouped.setdefault(project.department.id, set()).add(namespace)
    return {department: frozenset(names) for department, names in grouped.items()}


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


class NamespaceMemo:
    """What decisions derive from a namespace and the cluster objects around it (`core.namespace_plan`),
    kept by namespace name. The store empties it whenever it writes one of the objects the plans
    read (a Namespace, a PriorityClass, the settings, a LocalQueue or any Kueue object); `generation`
    counts those emptyings. Keyed only by namespaces the snapshot holds, so bounded by them."""

    __slots__ = ("generation", "plans")

    def __init__(self) -> None:
        self.plans: dict[str, object] = {}
        self.generation = 0

    def clear(self) -> None:
        self.plans.clear()
        self.generation += 1


@dataclass(slots=True)
class ClusterSnapshot:
    """Read-only view handed to decision functions."""

    settings: ClusterSettings
    namespaces: Mapping[str, NamespaceInfo] = field(default_factory=dict)
    priority_classes: Mapping[str, PriorityClassInfo] = field(default_factory=dict)
    # namespace -> names of Kueue LocalQueues in it
    local_queues: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Kueue's objects behind them: namespace -> LocalQueue name -> record; the cluster-scoped ones by name.
    local_queue_info: Mapping[str, Mapping[str, LocalQueueInfo]] = field(default_factory=dict)
    cluster_queues: Mapping[str, ClusterQueueInfo] = field(default_factory=dict)
    resource_flavors: Mapping[str, ResourceFlavorInfo] = field(default_factory=dict)
    topologies: Mapping[str, TopologyInfo] = field(default_factory=dict)
    # namespace -> ReplicaSet name -> record (the owners of Deployment pods, for pod groups)
    replica_sets: Mapping[str, Mapping[str, ReplicaSetInfo]] = field(default_factory=dict)
    # namespace -> pod uid -> record
    pods: Mapping[str, Mapping[str, PodRecord]] = field(default_factory=dict)
    # `pods`' held GPUs per namespace, kept by the pod cache that owns `pods` (None: summed per call).
    held_gpus_index: HeldGpus | None = None
    # Why the settings ConfigMap is refused (the last good settings serve): logged, and
    # `webhook_settings_rejected` is 1 while it is set.
    settings_error: str | None = None
    # Run:ai projects by namespace, from the timed refresh; None until a refresh succeeded.
    runai_projects: Mapping[str, RunaiProjectInfo] | None = None
    # `runai_projects`' namespaces by department id, published with it (`department_namespaces`), so
    # a department's GPUs are summed over its projects without a pass over every project; None:
    # derived from `runai_projects` per call.
    runai_department_namespaces: Mapping[str, frozenset[str]] | None = None
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
    # Run:ai's admission Deployments by name, as the watch of namespace `runai` shows them; None
    # until that watch has listed (folder mode and tests without it: nothing is known, nothing said).
    runai_admission: Mapping[str, DeploymentInfo] | None = None
    # Per-namespace plans, emptied by the store on every write they depend on; None (a snapshot
    # built by hand) computes every decision afresh.
    memo: NamespaceMemo | None = None
