"""What a namespace's pods get when they choose nothing, worked out once per namespace.

Pod mutation (`core.scheduling`) resolves, for every pod, the same things from the same cluster
objects: the project's scheduling offer, its default affinity terms, its default priority class,
and its queue's placement (LocalQueue -> ClusterQueue -> flavors -> Topologies). These change only
when a Namespace, a PriorityClass, the settings, a LocalQueue or a Kueue object is written, so a
`NamespacePlan` holds them and the snapshot's `NamespaceMemo` keeps one per namespace until the
store writes such an object (it empties the memo then; Pods and ReplicaSets do not).

The memo is keyed by cluster objects only: a plan by the name of a namespace the snapshot holds,
and a plan's Kueue resolutions by queue names the namespace's project or LocalQueues define and by
topology units the settings define. What a pod writes that is none of these is resolved afresh
and never kept, so a pod cannot grow the memo. A plan also checks that it was made from the
namespace record and the settings in force, so a snapshot changed without the store is not served
a stale plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from webhook.core.choices import KueueResolution, resolve_kueue, resolve_priority_class
from webhook.core.offer import SchedulingOffer, scheduling_offer
from webhook.settings import ClusterSettings
from webhook.snapshot import ClusterSnapshot, NamespaceInfo, PriorityClassInfo

# key -> values of one node-affinity expression; `expressions` makes fresh dicts of them.
Grouped = tuple[tuple[str, tuple[str, ...]], ...]


def grouped(labels: Sequence[str]) -> Grouped:
    """key=value labels -> one (key, values) per key, in first-seen order (values of one key ORed)."""
    by_key: dict[str, dict[str, None]] = {}
    for label in labels:
        key, _, value = label.partition("=")
        by_key.setdefault(key.strip(), {})[value.strip()] = None
    return tuple((key, tuple(values)) for key, values in by_key.items())


def match_expressions(groups: Grouped, operator: str) -> list[dict[str, object]]:
    """Fresh match expressions (they end up in a patch, which its reader may change)."""
    return [{"key": key, "operator": operator, "values": list(values)} for key, values in groups]


def fresh_terms(affinity: Grouped, anti_affinity: Grouped) -> list[dict[str, Any]]:
    """Required node-selector terms for a pod that has none: one term per affinity key, each with
    every exclusion (keys are distinct: nothing to deduplicate or bound)."""
    excluded = match_expressions(anti_affinity, "NotIn")
    if not affinity:
        return [{"matchExpressions": excluded}]
    return [{"matchExpressions": [group, *excluded]} for group in match_expressions(affinity, "In")]


def affinity_audit(affinity: Sequence[str], anti_affinity: Sequence[str]) -> dict[str, str]:
    """The audit annotations of the node labels a pod gets."""
    audit = {}
    if affinity:
        audit["affinity"] = ",".join(affinity)
    if anti_affinity:
        audit["anti-affinity"] = ",".join(anti_affinity)
    return audit


@dataclass(slots=True)
class NamespacePlan:
    """A project namespace's defaults, resolved against the cluster objects of one memo generation."""

    namespace: NamespaceInfo  # the record it was made from
    settings: ClusterSettings
    offer: SchedulingOffer
    # The default node labels (a pod that chose neither affinity nor anti-affinity), grouped by
    # key, and their audit annotations (empty: no default labels).
    affinity_groups: Grouped
    anti_affinity_groups: Grouped
    affinity_audit: dict[str, str]
    max_terms: int  # the settings' bound on a pod's node selector terms
    # What a pod without affinity of its own gets as /spec/affinity, serialised: orjson.loads makes
    # the fresh dicts a patch needs in C, cheaper than building them (None: no default labels, or
    # more terms than `max_terms`, which the rules refuse).
    spec_affinity: bytes | None
    # The default priority class (a pod that chose none): its record, or why none is set.
    default_class: PriorityClassInfo | None
    default_class_warning: str | None
    # (queue chosen, unit chosen, system job) -> resolution, filled as pods ask; only for choices
    # that name the cluster's objects (see `kueue_resolution`).
    kueue: dict[tuple[str | None, str | None, bool], KueueResolution]


def namespace_plan(namespace: NamespaceInfo, snapshot: ClusterSnapshot) -> NamespacePlan:
    """The plan of `namespace` (a record of `snapshot`), from the memo when it has a current one."""
    memo = snapshot.memo
    if memo is not None:
        plan = memo.plans.get(namespace.name)
        if type(plan) is NamespacePlan and plan.namespace is namespace and plan.settings is snapshot.settings:
            return plan
    plan = make_plan(namespace, snapshot)
    if memo is not None and snapshot.namespaces.get(namespace.name) is namespace:
        memo.plans[namespace.name] = plan  # one per namespace the snapshot holds
    return plan


def make_plan(namespace: NamespaceInfo, snapshot: ClusterSnapshot) -> NamespacePlan:
    offer = scheduling_offer(namespace, snapshot)
    default_class: PriorityClassInfo | None = None
    warning: str | None = None
    effective = resolve_priority_class(offer, None).value  # a default cannot be refused
    if effective is not None:
        default_class = snapshot.priority_classes.get(effective)
        if default_class is None:
            warning = f"default priority class {effective} does not exist in the cluster; none set"
    affinity, anti_affinity = grouped(offer.default_affinity), grouped(offer.default_anti_affinity)
    max_terms = snapshot.settings.scheduler.max_node_selector_terms
    spec_affinity = None
    if (affinity or anti_affinity) and len(terms := fresh_terms(affinity, anti_affinity)) <= max_terms:
        required = {"nodeSelectorTerms": terms}
        spec_affinity = orjson.dumps({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}})
    return NamespacePlan(
        namespace,
        snapshot.settings,
        offer,
        affinity,
        anti_affinity,
        affinity_audit(offer.default_affinity, offer.default_anti_affinity),
        max_terms,
        spec_affinity,
        default_class,
        warning,
        {},
    )


def kueue_resolution(
    plan: NamespacePlan,
    snapshot: ClusterSnapshot,
    chosen_queue: str | None,
    chosen_topology: str | None,
    kind: str | None,
) -> KueueResolution:
    """`choices.resolve_kueue` for the plan's namespace, kept in the plan when the choices name
    cluster objects: a queue the project offers or a LocalQueue of the namespace, a unit of the
    settings. Any other choice (a refusal) is resolved each time and not kept."""
    offer = plan.offer
    if (chosen_queue is None or chosen_queue in offer.queues or chosen_queue in _local_queues(snapshot, offer)) and (
        chosen_topology is None or chosen_topology in offer.topologies
    ):
        key = (chosen_queue, chosen_topology, kind == "system-job")
        resolved = plan.kueue.get(key)
        if resolved is None:
            # resolve_kueue reads `kind` only to tell a system job from the rest.
            resolved = resolve_kueue(offer, snapshot, chosen_queue, chosen_topology, kind)
            plan.kueue[key] = resolved
        return resolved
    return resolve_kueue(offer, snapshot, chosen_queue, chosen_topology, kind)


def _local_queues(snapshot: ClusterSnapshot, offer: SchedulingOffer) -> frozenset[str]:
    return snapshot.local_queues.get(offer.namespace, frozenset())
