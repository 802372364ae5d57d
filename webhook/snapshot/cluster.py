"""`ClusterSnapshot`: the cluster as a decision sees it, handed to every pure decision.

It is not frozen: the caches own its mappings and write them (and replace some) as watch events
arrive, and the pod cache keeps `held_gpus_index` up to date in place. A decision reads it and
writes nothing; asyncio runs one decision at a time, so a decision reads a consistent view
without copying.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from webhook.settings import ClusterSettings
from webhook.snapshot.held_gpus import HeldGpus
from webhook.snapshot.kueue import ClusterQueueInfo, LocalQueueInfo, ResourceFlavorInfo, TopologyInfo
from webhook.snapshot.memo import NamespaceMemo
from webhook.snapshot.records import (
    DeploymentInfo,
    FreedPod,
    GpuReservation,
    NamespaceInfo,
    PodRecord,
    PriorityClassInfo,
    ReplicaSetInfo,
)
from webhook.snapshot.runai import RunaiProjectInfo


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
