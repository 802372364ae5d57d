"""Rule S4 against the cluster's Kueue objects: a queue must be a LocalQueue of the namespace, and a
topology unit must be a level of the Topology behind that queue.

Kueue admits a workload through its LocalQueue's ClusterQueue, on one of the ClusterQueue's
ResourceFlavors; with a required topology it only takes a flavor that names a Topology
(`spec.topologyName`) holding that node label among its levels (Kueue v0.17.0,
pkg/scheduler/flavorassigner; the levels are `Topology.spec.levels[].nodeLabel`). Anything else
leaves the Workload inadmissible and its pods gated for good, so admission refuses it here, and the
scheduling offer shows per queue only the units it can place. Everything comes from the watch-fed
caches in the snapshot; nothing here calls out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from webhook.snapshot import (
    KUEUE_ADMISSION_GATE,
    KUEUE_MANAGED_LABEL,
    KUEUE_QUEUE_LABEL,
    ClusterQueueInfo,
    ClusterSnapshot,
    LocalQueueInfo,
)

SYSTEM_JOB = "system-job"


# Immutable like a frozen dataclass, but made for every review: a NamedTuple is built in a fifth
# of the time (a frozen dataclass sets each field through object.__setattr__).
class QueuePlacement(NamedTuple):
    """What one LocalQueue of a namespace leads to: its ClusterQueue, the Topologies of the
    ClusterQueue's flavors, and the node labels those Topologies can place pods by."""

    namespace: str
    queue: str
    local_queue: LocalQueueInfo | None
    cluster_queue: ClusterQueueInfo | None
    # flavor -> its Topology's name (None: the flavor has no Topology, or it is not known here)
    flavor_topologies: Mapping[str, str | None]
    levels: frozenset[str]  # node labels of every level of those Topologies
    # Why the queue can place nothing by topology (empty when `levels` is not).
    problems: tuple[str, ...] = ()

    def units(self, topologies: Mapping[str, str]) -> list[str]:
        """The topology units (of `topologies`: unit -> node label) this queue can place by."""
        return [unit for unit, label in topologies.items() if label in self.levels]


def queue_placement(snapshot: ClusterSnapshot, namespace: str, queue: str) -> QueuePlacement:
    local = snapshot.local_queue_info.get(namespace, {}).get(queue)
    if local is None:
        return QueuePlacement(namespace, queue, None, None, {}, frozenset(), (f"no LocalQueue {queue} in {namespace}",))
    cq = snapshot.cluster_queues.get(local.cluster_queue) if local.cluster_queue else None
    if cq is None:
        why = (
            f"LocalQueue {queue} names no ClusterQueue"
            if not local.cluster_queue
            else f"ClusterQueue {local.cluster_queue} of LocalQueue {queue} does not exist"
        )
        return QueuePlacement(namespace, queue, local, None, {}, frozenset(), (why,))
    flavor_topologies: dict[str, str | None] = {}
    levels: set[str] = set()
    problems: list[str] = []
    for name in cq.flavor_names:
        flavor = snapshot.resource_flavors.get(name)
        topology_name = flavor.topology if flavor is not None else None
        flavor_topologies[name] = topology_name
        if flavor is None:
            problems.append(f"ResourceFlavor {name} does not exist")
        elif topology_name is None:
            problems.append(f"ResourceFlavor {name} names no Topology")
        elif (topology := snapshot.topologies.get(topology_name)) is None:
            problems.append(f"Topology {topology_name} of ResourceFlavor {name} does not exist")
        else:
            levels.update(topology.levels)
    if not cq.flavors:
        problems.append(f"ClusterQueue {cq.name} has no flavors")
    return QueuePlacement(
        namespace, queue, local, cq, flavor_topologies, frozenset(levels), () if levels else tuple(problems)
    )


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "none"


def queue_refusal(snapshot: ClusterSnapshot, namespace: str, queue: str, kind: str | None) -> str | None:
    """Why a workload of `kind` cannot go to `queue` in `namespace`, or None. A system job keeps
    its system queue even where it is missing (the warning is `queue_warning`'s)."""
    in_namespace = snapshot.local_queue_info.get(namespace, {})
    if queue in in_namespace or kind == SYSTEM_JOB:
        return None
    local_queues = sorted(in_namespace)  # only a refusal lists them
    if not local_queues:
        return (
            f"namespace {namespace} has no Kueue LocalQueue, and Kueue admits nothing without one: create "
            f"LocalQueue {queue} in {namespace} (spec.clusterQueue: a ClusterQueue with quota for this project), "
            "or set the project's default queue to a LocalQueue that exists"
        )
    return f"queue {queue} is not a LocalQueue of namespace {namespace}; LocalQueues there: {_listed(local_queues)}"


def queue_warning(placement: QueuePlacement) -> str | None:
    """What admission tells a workload whose queue Kueue will not admit it through as things stand
    (`placement`: `queue_placement` of that queue, which the caller needs too)."""
    queue, namespace = placement.queue, placement.namespace
    if placement.local_queue is None:
        return f"LocalQueue {queue} does not exist in namespace {namespace}; Kueue will hold the pod until it does"
    if placement.cluster_queue is None:
        return f"{placement.problems[0]}; Kueue will hold the pod until it does"
    if placement.cluster_queue.active is False:
        reason = placement.cluster_queue.inactive_reason or "not active"
        return f"ClusterQueue {placement.cluster_queue.name} is not active ({reason}); Kueue will hold the pod"
    return None


def topology_refusal(
    placement: QueuePlacement, unit: str, topologies: Mapping[str, str], *, chosen: bool
) -> str | None:
    """Why `unit` cannot be placed through `placement`'s queue (None: it can). `chosen` says
    whether the workload chose it or a default gave it: the message is the same, and the caller
    refuses the one and drops the other."""
    label = topologies.get(unit)
    if label is None or label in placement.levels:
        return None
    offered = placement.units(topologies)
    what = "topology" if chosen else "default topology"
    where = f"queue {placement.queue}"
    if placement.cluster_queue is not None:
        where += f" (ClusterQueue {placement.cluster_queue.name})"
    if offered:
        return f"{what} {unit} ({label}) is not a level of the Topology behind {where}; it offers: {_listed(offered)}"
    reasons = "; ".join(placement.problems) or "its flavors' Topologies have no level of a topology unit"
    return f"{what} {unit} ({label}) cannot be placed through {where}: it offers no topology unit ({reasons})"


# -- defence in depth for S4 (`/validate/pods`) ----------------------------------------------------

# (API group, kind) of a pod's controller when Kueue admits the pod through that owner's Workload
# instead of gating the pod itself: Kueue suspends these owners, and its pod webhook leaves the pods
# of a queued owner alone (Kueue v0.17.0, jobframework.FindAncestorJobManagedByKueue). A Spark
# executor's controller is its driver pod. Not here: StatefulSets, LeaderWorkerSets (whose pods a
# StatefulSet controls) and Deployments (through ReplicaSets), whose pods Kueue gates one by one
# (the `kueue.x-k8s.io/pod-suspending-parent` annotation on their template).
KUEUE_OWNER_KINDS = frozenset(
    {
        ("batch", "Job"),
        ("jobset.x-k8s.io", "JobSet"),
        ("kubeflow.org", "MPIJob"),
        ("kubeflow.org", "PyTorchJob"),
        ("kubeflow.org", "TFJob"),
        ("kubeflow.org", "XGBoostJob"),
        ("kubeflow.org", "PaddleJob"),
        ("kubeflow.org", "JAXJob"),
        ("ray.io", "RayJob"),
        ("ray.io", "RayCluster"),
        ("ray.io", "RayService"),
        ("workload.codeflare.dev", "AppWrapper"),
        ("trainer.kubeflow.org", "TrainJob"),
        ("sparkoperator.k8s.io", "SparkApplication"),
        ("", "Pod"),
    }
)


def ungated_pod_refusal(
    namespace: str,
    labels: Mapping[str, object],
    spec: Mapping[str, object],
    controller: tuple[str, str] | None,
) -> str | None:
    """With Kueue on, a pod that names a queue must be admitted by Kueue: through a Kueue-managed
    owner, or gated by Kueue's pod webhook (label `kueue.x-k8s.io/managed: "true"` and the
    `kueue.x-k8s.io/admission` scheduling gate, which Kueue lifts on admission). A pod with neither
    would run outside Kueue's quota: Kueue's pod integration is not acting on it. This is read on
    the object after every mutating webhook, Kueue's included."""
    queue = labels.get(KUEUE_QUEUE_LABEL)
    if not queue or controller in KUEUE_OWNER_KINDS:
        return None
    gates = spec.get("schedulingGates")
    gated = isinstance(gates, list) and any(
        isinstance(g, Mapping) and g.get("name") == KUEUE_ADMISSION_GATE for g in gates
    )
    if labels.get(KUEUE_MANAGED_LABEL) == "true" and gated:
        return None
    return (
        f"the pod names Kueue queue {str(queue)[:63]} but Kueue's pod integration is not acting on it (no "
        f"{KUEUE_MANAGED_LABEL} label and {KUEUE_ADMISSION_GATE} scheduling gate), so it would run outside "
        'Kueue\'s quota. Configure Kueue: list "pod" (and "deployment" for Deployments) in '
        "integrations.frameworks of its Configuration, and let its mutating webhook mpod.kb.io see pods of "
        f"namespace {namespace} (its namespaceSelector, managedJobsNamespaceSelector) after ours (our "
        "MutatingWebhookConfiguration's name must sort before Kueue's)"
    )
