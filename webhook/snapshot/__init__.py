"""The cluster as admission sees it: records of what the caches hold, and the snapshot a decision
reads them through.

One concept a module: `keys` (the label and annotation names), `fields` (reading a stored
object's fields leniently), `records` (frozen records of Kubernetes objects), `kueue` (of Kueue's
objects), `runai` (of Run:ai's projects and departments), `held_gpus` (GPUs held per namespace,
kept by the pod cache), `memo` (per-namespace plans kept between reviews) and `cluster` (the
mutable `ClusterSnapshot` the caches write and decisions read). Importers name this package, not
its modules, so that the records can move between modules without touching them.
"""

from webhook.snapshot.cluster import (
    ClusterSnapshot,
)
from webhook.snapshot.held_gpus import (
    HeldGpus,
    holds_gpus,
)
from webhook.snapshot.keys import (
    ADMISSION_POLICIES_LABEL,
    AFFINITY_ANNOTATION,
    ANTI_AFFINITY_ANNOTATION,
    AVAILABLE_ANNOTATION,
    DEFAULTS_ANNOTATION,
    DEPARTMENT_LABEL,
    DESIRED_REPLICAS_ANNOTATION,
    GROUP_REPLICAS_ANNOTATION,
    KUEUE_ADMISSION_GATE,
    KUEUE_MANAGED_LABEL,
    KUEUE_POD_GROUP_COUNT_ANNOTATION,
    KUEUE_POD_GROUP_FAST_ADMISSION_ANNOTATION,
    KUEUE_POD_GROUP_LABEL,
    KUEUE_POD_GROUP_SERVING_ANNOTATION,
    KUEUE_QUEUE_LABEL,
    KUEUE_TOPOLOGY_ANNOTATION,
    MIRROR_POD_ANNOTATION,
    PRIORITY_CLASS_ANNOTATION,
    PROJECT_LABEL,
    RUNAI_ADMISSION_DEPLOYMENTS,
    RUNAI_MOVE_ANNOTATION,
    RUNAI_NAMESPACE,
    RUNAI_PROJECT_ID_LABEL,
    RUNAI_QUEUE_LABEL,
    TOPOLOGY_ANNOTATION,
)
from webhook.snapshot.kueue import (
    ClusterQueueInfo,
    FlavorResources,
    LocalQueueInfo,
    ResourceFlavorInfo,
    TopologyInfo,
)
from webhook.snapshot.memo import (
    NamespaceMemo,
)
from webhook.snapshot.records import (
    DeploymentInfo,
    FreedPod,
    GpuReservation,
    LeftProject,
    NamespaceInfo,
    PodRecord,
    PriorityClassInfo,
    ReplicaSetInfo,
)
from webhook.snapshot.runai import (
    RunaiDepartmentInfo,
    RunaiProjectInfo,
    department_namespaces,
)

__all__ = [
    "ADMISSION_POLICIES_LABEL",
    "AFFINITY_ANNOTATION",
    "ANTI_AFFINITY_ANNOTATION",
    "AVAILABLE_ANNOTATION",
    "DEFAULTS_ANNOTATION",
    "DEPARTMENT_LABEL",
    "DESIRED_REPLICAS_ANNOTATION",
    "GROUP_REPLICAS_ANNOTATION",
    "KUEUE_ADMISSION_GATE",
    "KUEUE_MANAGED_LABEL",
    "KUEUE_POD_GROUP_COUNT_ANNOTATION",
    "KUEUE_POD_GROUP_FAST_ADMISSION_ANNOTATION",
    "KUEUE_POD_GROUP_LABEL",
    "KUEUE_POD_GROUP_SERVING_ANNOTATION",
    "KUEUE_QUEUE_LABEL",
    "KUEUE_TOPOLOGY_ANNOTATION",
    "MIRROR_POD_ANNOTATION",
    "PRIORITY_CLASS_ANNOTATION",
    "PROJECT_LABEL",
    "RUNAI_ADMISSION_DEPLOYMENTS",
    "RUNAI_MOVE_ANNOTATION",
    "RUNAI_NAMESPACE",
    "RUNAI_PROJECT_ID_LABEL",
    "RUNAI_QUEUE_LABEL",
    "TOPOLOGY_ANNOTATION",
    "ClusterQueueInfo",
    "ClusterSnapshot",
    "DeploymentInfo",
    "FlavorResources",
    "FreedPod",
    "GpuReservation",
    "HeldGpus",
    "LeftProject",
    "LocalQueueInfo",
    "NamespaceInfo",
    "NamespaceMemo",
    "PodRecord",
    "PriorityClassInfo",
    "ReplicaSetInfo",
    "ResourceFlavorInfo",
    "RunaiDepartmentInfo",
    "RunaiProjectInfo",
    "TopologyInfo",
    "department_namespaces",
    "holds_gpus",
]
