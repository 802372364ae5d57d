"""A workload's own choices resolved against its project's offer (rule S1): the workload's choice
beats the project's default, which beats the cluster's, and each answer says which level it came
from. Pod mutation applies what this resolves; the scheduling API shows it for choices given as
query parameters, so a form can show what a workload would get before it is created.

Choices arrive parsed (`None`: not chosen); a choice outside the offer is an error worded as
admission refuses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from webhook.core.kueue import queue_placement, queue_refusal, queue_warning, topology_refusal
from webhook.core.offer import CLUSTER, WORKLOAD, Level, SchedulingOffer
from webhook.snapshot import ClusterSnapshot


def not_allowed(what: str, chosen: Iterable[str], allowed: Sequence[str], project: str) -> str:
    listed = ", ".join(allowed) if allowed else "none"
    return f"{what} {', '.join(chosen)} not available in project {project}; allowed: {listed}"


# Immutable like a frozen dataclass, but made for every review: a NamedTuple is built in a fifth
# of the time (a frozen dataclass sets each field through object.__setattr__).
class ResolvedLabels(NamedTuple):
    value: tuple[str, ...]
    level: Level
    error: str | None = None


# Immutable like a frozen dataclass, but made for every review: a NamedTuple is built in a fifth
# of the time (a frozen dataclass sets each field through object.__setattr__).
class ResolvedName(NamedTuple):
    value: str | None  # None: nothing to set
    level: Level | None
    error: str | None = None


def resolve_affinity(offer: SchedulingOffer, chosen: Sequence[str] | None, *, anti: bool = False) -> ResolvedLabels:
    """Affinity (or anti-affinity) labels: the workload's list when it gave one (even empty)."""
    allowed = offer.anti_affinity if anti else offer.affinity
    if chosen is None:
        if anti:
            return ResolvedLabels(offer.default_anti_affinity, offer.default_anti_affinity_level)
        return ResolvedLabels(offer.default_affinity, offer.default_affinity_level)
    outside = [v for v in chosen if v not in allowed]
    what = "anti-affinity" if anti else "affinity"
    error = not_allowed(what, outside, allowed, offer.namespace) if outside else None
    return ResolvedLabels(tuple(chosen), WORKLOAD, error)


def resolve_priority_class(offer: SchedulingOffer, chosen: str | None) -> ResolvedName:
    if chosen is not None:
        if chosen not in offer.priority_classes:
            return ResolvedName(
                None, None, not_allowed("priority class", [chosen], offer.priority_classes, offer.namespace)
            )
        return ResolvedName(chosen, WORKLOAD)
    return ResolvedName(offer.default_priority_class, offer.default_priority_class_level)


def resolve_queue(offer: SchedulingOffer, chosen: str | None, kind: str | None) -> ResolvedName:
    """Kueue's LocalQueue: system jobs default to the cluster's system-jobs queue."""
    if chosen is not None:
        if chosen not in offer.queues:
            return ResolvedName(None, None, not_allowed("queue", [chosen], offer.queue_choices(), offer.namespace))
        return ResolvedName(chosen, WORKLOAD)
    level = CLUSTER if kind == "system-job" else offer.default_queue_level
    return ResolvedName(offer.default_queue_for(kind), level)


def resolve_topology(offer: SchedulingOffer, chosen: str | None) -> ResolvedName:
    units = offer.topologies
    if chosen is not None:
        if chosen not in units:
            return ResolvedName(None, None, f"topology {chosen} is not a topology unit; allowed: {', '.join(units)}")
        return ResolvedName(chosen, WORKLOAD)
    return ResolvedName(offer.default_topology, offer.default_topology_level)


# Immutable like a frozen dataclass, but made for every review: a NamedTuple is built in a fifth
# of the time (a frozen dataclass sets each field through object.__setattr__).
class KueueResolution(NamedTuple):
    """A workload's queue and topology unit, resolved against the offer and then checked against
    the cluster's Kueue objects (`core.kueue`): the queue must be a LocalQueue of the namespace, the
    unit a level of the Topology behind it. A default unit the queue cannot place is dropped
    (value None) with a warning rather than refused: a default must not block a project's pods."""

    queue: ResolvedName
    topology: ResolvedName
    warnings: tuple[str, ...] = ()
    node_label: str | None = None  # what `kueue.x-k8s.io/podset-required-topology` gets (None: nothing)


def resolve_kueue(
    offer: SchedulingOffer,
    snapshot: ClusterSnapshot,
    chosen_queue: str | None,
    chosen_topology: str | None,
    kind: str | None,
) -> KueueResolution:
    warnings: list[str] = []
    queue = resolve_queue(offer, chosen_queue, kind)
    placement = None  # read once: the warning and the topology check both need it
    if queue.error is None and (name := queue.value) is not None:
        refusal = queue_refusal(snapshot, offer.namespace, name, kind)
        if refusal is not None:
            queue = ResolvedName(None, None, refusal)
        else:
            placement = queue_placement(snapshot, offer.namespace, name)
            if (warning := queue_warning(placement)) is not None:
                warnings.append(warning)
    topology = resolve_topology(offer, chosen_topology)
    unit = topology.value
    if topology.error is not None or unit is None or queue.value is None:
        return KueueResolution(queue, topology, tuple(warnings))
    if unit not in offer.topologies:  # a default the cluster no longer offers
        warnings.append(f"default topology {unit} is not a topology unit; none set")
        return KueueResolution(queue, ResolvedName(None, None), tuple(warnings))
    if placement is None:
        placement = queue_placement(snapshot, offer.namespace, queue.value)
    why = topology_refusal(placement, unit, offer.topologies, chosen=chosen_topology is not None)
    if why is not None:
        if chosen_topology is not None:
            return KueueResolution(queue, ResolvedName(None, None, why), tuple(warnings))
        warnings.append(f"{why}; none set")
        return KueueResolution(queue, ResolvedName(None, None), tuple(warnings))
    return KueueResolution(queue, topology, tuple(warnings), offer.topologies[unit])


@dataclass(frozen=True, slots=True)
class WorkloadChoices:
    affinity: tuple[str, ...] | None = None
    anti_affinity: tuple[str, ...] | None = None
    priority_class: str | None = None
    queue: str | None = None
    topology: str | None = None


@dataclass(frozen=True, slots=True)
class ResolvedChoices:
    affinity: ResolvedLabels
    anti_affinity: ResolvedLabels
    priority_class: ResolvedName
    queue: ResolvedName | None  # None: Kueue off
    topology: ResolvedName | None
    warnings: tuple[str, ...] = ()  # what admission would warn about the queue and topology

    @property
    def errors(self) -> list[str]:
        parts = (self.affinity, self.anti_affinity, self.priority_class, self.queue, self.topology)
        return [p.error for p in parts if p is not None and p.error is not None]


def resolve_choices(
    offer: SchedulingOffer, choices: WorkloadChoices, snapshot: ClusterSnapshot, kind: str | None = None
) -> ResolvedChoices:
    """Every choice at once, in the order admission judges them."""
    kueue = resolve_kueue(offer, snapshot, choices.queue, choices.topology, kind) if offer.kueue else None
    return ResolvedChoices(
        affinity=resolve_affinity(offer, choices.affinity),
        anti_affinity=resolve_affinity(offer, choices.anti_affinity, anti=True),
        priority_class=resolve_priority_class(offer, choices.priority_class),
        queue=kueue.queue if kueue else None,
        topology=kueue.topology if kueue else None,
        warnings=kueue.warnings if kueue else (),
    )
