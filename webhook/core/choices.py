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

from webhook.core.offer import CLUSTER, WORKLOAD, Level, SchedulingOffer


def not_allowed(what: str, chosen: Iterable[str], allowed: Sequence[str], project: str) -> str:
    listed = ", ".join(allowed) if allowed else "none"
    return f"{what} {', '.join(chosen)} not available in project {project}; allowed: {listed}"


@dataclass(frozen=True, slots=True)
class ResolvedLabels:
    value: tuple[str, ...]
    level: Level
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ResolvedName:
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

    @property
    def errors(self) -> list[str]:
        parts = (self.affinity, self.anti_affinity, self.priority_class, self.queue, self.topology)
        return [p.error for p in parts if p is not None and p.error is not None]


def resolve_choices(offer: SchedulingOffer, choices: WorkloadChoices, kind: str | None = None) -> ResolvedChoices:
    """Every choice at once, in the order admission judges them."""
    return ResolvedChoices(
        affinity=resolve_affinity(offer, choices.affinity),
        anti_affinity=resolve_affinity(offer, choices.anti_affinity, anti=True),
        priority_class=resolve_priority_class(offer, choices.priority_class),
        queue=resolve_queue(offer, choices.queue, kind) if offer.kueue else None,
        topology=resolve_topology(offer, choices.topology) if offer.kueue else None,
    )
