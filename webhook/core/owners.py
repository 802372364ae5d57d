"""Rule S4 where Kueue reads it: on the pod owners Kueue integrates, at their CREATE.

Kueue queues a batch Job by the Job's own `kueue.x-k8s.io/queue-name` label and takes its topology
from the pod template's annotations, both read when the Job is created (and suspended by Kueue's
job webhook); the pods of a queued Job are left alone by Kueue's pod webhook. A Deployment is
queued through its pods, but only those whose template Kueue's deployment webhook marked, which it
does for a Deployment carrying the queue label. A queue label put on the pods alone reaches
nothing: the Job runs outside Kueue's quota, the Deployment's pods are never gated.

So with Kueue on, `/mutate/workloads` gives the owner what `/mutate/pods` gives its pods: the
template is judged as the pod it becomes (`core.scheduling.mutate_target`: queue, topology,
affinity, priority class), the owner gets the queue label, and a refusal comes at `kubectl apply`
instead of pods gated forever. A Deployment that chose a unit also gets its replica count in the
template: its pods form one Kueue pod group per ReplicaSet (`core.pod_groups`), and only a
Recreate rollout can fill a group, so any other strategy is refused with what to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from webhook.core.decision import Decision, Reason
from webhook.core.kinds import classify_workload, controller_owner
from webhook.core.kueue import KUEUE_OWNER_KINDS
from webhook.core.patch import PodPatch
from webhook.core.scheduling import PodTarget, mutate_target, request_namespace
from webhook.snapshot import (
    GROUP_REPLICAS_ANNOTATION,
    KUEUE_QUEUE_LABEL,
    TOPOLOGY_ANNOTATION,
    ClusterSnapshot,
)

# (API group, kind) of the owners this mutates -> the (API group, kind) of the controller of their pods.
OWNER_KINDS: dict[tuple[str, str], tuple[str, str]] = {
    ("batch", "Job"): ("batch", "Job"),
    ("apps", "Deployment"): ("apps", "ReplicaSet"),
}
# The Priority admission plugin computes these on each pod from its class: a value frozen into a
# template would be refused on every pod should the class ever be recreated with another value.
POD_ONLY_SPEC_FIELDS = frozenset({"priority", "preemptionPolicy"})


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class OwnerRequest:
    kind: str
    name: str
    owner: Mapping[str, Any]
    old: Mapping[str, Any] | None  # UPDATE: the object before
    pods_controller: tuple[str, str]


def owner_request(request: Mapping[str, Any]) -> OwnerRequest | None:
    """The owner write this rule reads: a Job's CREATE, a Deployment's CREATE or UPDATE."""
    if request.get("subResource"):
        return None
    kind = _map(request.get("kind"))
    key = (str(kind.get("group", "")), str(kind.get("kind", "")))
    controller = OWNER_KINDS.get(key)
    operation = request.get("operation")
    if controller is None or operation not in ("CREATE", "UPDATE"):
        return None
    if operation == "UPDATE" and key[1] != "Deployment":
        return None  # a Job's template is immutable, and Kueue read its queue at CREATE
    obj = _map(request.get("object"))
    if not obj:
        return None
    old = _map(request.get("oldObject")) if operation == "UPDATE" else None
    name = str(_map(obj.get("metadata")).get("name") or request.get("name") or "")
    return OwnerRequest(key[1], name, obj, old, controller)


def unseen_owner_namespace(request: Mapping[str, Any], snapshot: ClusterSnapshot) -> str | None:
    """The namespace of an owner write this rule reads that the snapshot has no record of: the
    apiserver sends them only from project namespaces, so it is one this replica has not seen yet."""
    if owner_request(request) is None:
        return None
    name = request_namespace(request)
    return name if name and name not in snapshot.namespaces else None


def _replicas(obj: Mapping[str, Any]) -> int:
    value = _map(obj.get("spec")).get("replicas", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 1


def mutate_owner(request: Mapping[str, Any], snapshot: ClusterSnapshot) -> Decision:
    settings = snapshot.settings
    if settings.run_ai_enable or not settings.kueue_installed:
        return Decision.allow()  # Run:ai reads its queue from the pods
    target = owner_request(request)
    if target is None:
        return Decision.allow()
    namespace = snapshot.namespaces.get(request_namespace(request))
    if namespace is None or not namespace.is_project:
        return Decision.allow()
    meta = _map(target.owner.get("metadata"))
    parent = controller_owner(meta)
    if parent in KUEUE_OWNER_KINDS and parent != ("", "Pod"):
        return Decision.allow()  # a JobSet's Jobs and the like: Kueue admits them through that parent
    spec = target.owner.get("spec")
    template = _map(spec).get("template") if isinstance(spec, dict) else None
    if not isinstance(template, dict):
        return Decision.allow()  # no template: the apiserver refuses the object itself
    decision = _mutate(target, snapshot, namespace.name, meta, template)
    if not decision.allowed and target.old is not None and _map(target.old).get("spec") == spec:
        # The Deployment controller's own writes (its revision annotation) must never be refused.
        return Decision.allow(warnings=[decision.message])
    return decision


def _mutate(
    target: OwnerRequest,
    snapshot: ClusterSnapshot,
    namespace: str,
    meta: Mapping[str, Any],
    template: Mapping[str, Any],
) -> Decision:
    owner_labels = _map(meta.get("labels"))
    tmeta = _map(template.get("metadata"))
    labels = dict(_map(tmeta.get("labels")))
    annotations = dict(_map(tmeta.get("annotations")))
    # The owner's own choices count when its template has none: Kueue's documented place for the
    # queue is the Job's label. An update that drops the label keeps the one the owner had (Kueue
    # refuses a Deployment update removing it).
    old_labels = _map(_map(_map(target.old).get("metadata")).get("labels")) if target.old is not None else {}
    chosen_queue = (
        owner_labels.get(KUEUE_QUEUE_LABEL) or labels.get(KUEUE_QUEUE_LABEL) or old_labels.get(KUEUE_QUEUE_LABEL)
    )
    if chosen_queue and KUEUE_QUEUE_LABEL not in labels:
        labels[KUEUE_QUEUE_LABEL] = chosen_queue
    owner_unit = _map(meta.get("annotations")).get(TOPOLOGY_ANNOTATION)
    if owner_unit is not None and TOPOLOGY_ANNOTATION not in annotations:
        annotations[TOPOLOGY_ANNOTATION] = owner_unit
    pod = {
        "metadata": {**tmeta, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": _map(template.get("spec")),
    }
    rules = snapshot.settings.scheduler.workload_kinds
    pod_target = PodTarget(
        pod=pod,
        namespace=snapshot.namespaces[namespace],
        kind=classify_workload(labels, rules, target.pods_controller),
        labels=labels,
        annotations=annotations,
        spec=pod["spec"],
    )
    decision, pod_patch = mutate_target(pod_target, snapshot)
    what = f"{target.kind} {target.name}"
    if pod_patch is None:
        return decision
    if not decision.allowed:
        reason = decision.reason or Reason.FORBIDDEN
        return Decision.deny(
            f"{what}: {decision.message}", code=decision.code, reason=reason, warnings=decision.warnings
        )
    template_patch = PodPatch(template)
    pod_patch.replay_onto(template_patch, POD_ONLY_SPEC_FIELDS)
    # The choices taken from the owner go into the template too, so that its pods say the same.
    if chosen_queue and KUEUE_QUEUE_LABEL not in _map(tmeta.get("labels")):
        template_patch.set_label(KUEUE_QUEUE_LABEL, str(chosen_queue))
    if TOPOLOGY_ANNOTATION in annotations and TOPOLOGY_ANNOTATION not in _map(tmeta.get("annotations")):
        template_patch.set_annotation(TOPOLOGY_ANNOTATION, str(annotations[TOPOLOGY_ANNOTATION]))
    queue = decision.audit.get("queue")
    grouped = target.kind == "Deployment" and "topology" in decision.audit
    if grouped:
        refusal = _rollout_refusal(target, decision.audit["topology"])
        if refusal is not None:
            return Decision.deny(f"{what}: {refusal}", warnings=decision.warnings)
        template_patch.set_annotation(GROUP_REPLICAS_ANNOTATION, str(_replicas(target.owner)))
    owner_patch = PodPatch(target.owner)
    if queue is not None:
        owner_patch.set_label(KUEUE_QUEUE_LABEL, queue)
    ops = owner_patch.operations() + [_under("/spec/template", op) for op in template_patch.operations()]
    allowed = Decision.allow(warnings=decision.warnings, audit=decision.audit, patch=ops)
    return replace(allowed, would_refuse=decision.would_refuse)


def _rollout_refusal(target: OwnerRequest, unit: str) -> str | None:
    """A grouped Deployment can only roll out by Recreate: Kueue admits a group once all of its
    pods exist, and a rolling update creates the new ReplicaSet's pods a few at a time while the old
    ones run (and Kueue deletes pods beyond a group's count)."""
    replicas = _replicas(target.owner)
    strategy = _map(_map(target.owner.get("spec")).get("strategy"))
    if replicas <= 1 or strategy.get("type") == "Recreate":
        return None
    return (
        f"topology {unit} over {replicas} replicas makes its pods one Kueue pod group, which a rolling update "
        "can never fill (its new pods start a few at a time while the old ones run): set spec.strategy.type: "
        "Recreate, or choose no topology unit"
    )


def _under(prefix: str, op: Mapping[str, Any]) -> dict[str, Any]:
    return {**op, "path": prefix + str(op["path"])}


def scale_refusal(request: Mapping[str, Any], snapshot: ClusterSnapshot) -> Decision | None:
    """With Kueue on, a Deployment whose pods are one pod group cannot change its replicas through
    the scale subresource (`kubectl scale`, an autoscaler): the template, and so the ReplicaSet and
    the group, stay the same, and the new pods would wait for a group of the new size that never
    fills. Scaling to 0, or back to the group's size, is fine. None: not this rule's to refuse."""
    settings = snapshot.settings
    if settings.run_ai_enable or not settings.kueue_installed:
        return None
    resource = _map(request.get("resource"))
    if request.get("subResource") != "scale" or resource.get("resource") != "deployments":
        return None
    if request.get("operation") != "UPDATE":
        return None
    namespace = snapshot.namespaces.get(request_namespace(request))
    if namespace is None or not namespace.is_project:
        return None
    name = str(request.get("name") or "")
    new = _replicas(_map(request.get("object")))
    sizes = {
        rs.group_replicas
        for rs in snapshot.replica_sets.get(namespace.name, {}).values()
        if rs.deployment == name and rs.group_replicas is not None and rs.group_replicas > 1
    }
    if not sizes or new == 0 or new in sizes:
        return None
    size = max(sizes)
    return Decision.deny(
        f"Deployment {name}: its pods are one Kueue pod group of {size} (it chose a topology unit), and a scale "
        f"through the scale subresource would leave new pods waiting for a group of {new} that never fills: change "
        f"spec.replicas in the Deployment itself (kubectl apply, or kubectl patch deployment {name}), which "
        "recreates its pods as one group of the new size"
    )


def statefulset_warning(request: Mapping[str, Any], snapshot: ClusterSnapshot) -> Decision | None:
    """With Kueue on, a StatefulSet of several replicas choosing a unit is warned at apply time: its
    pods are not grouped here (Kueue's `statefulset` integration would group them), so each is a
    Workload of its own and the unit co-locates nothing."""
    settings = snapshot.settings
    if settings.run_ai_enable or not settings.kueue_installed or request.get("subResource"):
        return None
    kind = _map(request.get("kind"))
    if (kind.get("group"), kind.get("kind")) != ("apps", "StatefulSet"):
        return None
    if request.get("operation") not in ("CREATE", "UPDATE"):
        return None
    namespace = snapshot.namespaces.get(request_namespace(request))
    obj = _map(request.get("object"))
    if namespace is None or not namespace.is_project or _replicas(obj) <= 1:
        return None
    template = _map(_map(obj.get("spec")).get("template"))
    unit = _map(_map(template.get("metadata")).get("annotations")).get(TOPOLOGY_ANNOTATION)
    unit = unit or _map(_map(obj.get("metadata")).get("annotations")).get(TOPOLOGY_ANNOTATION)
    if not unit:
        return None
    name = str(_map(obj.get("metadata")).get("name") or request.get("name") or "")
    return Decision.allow(
        warnings=[
            f"StatefulSet {name}: topology {str(unit)[:63]} places each of its {_replicas(obj)} pods by itself (Kueue "
            "admits every pod alone), so it does not keep them together; use a Deployment with strategy Recreate "
            "for pods that must share a domain"
        ]
    )
