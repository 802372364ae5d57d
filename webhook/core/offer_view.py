"""The answer of `GET /api/v1/projects/{namespace}/scheduling`: a project's scheduling offer
(`webhook.core.offer`) for people and forms, with priority values and whether GPUs may be asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from webhook.core.choices import (
    ResolvedChoices,
    ResolvedLabels,
    ResolvedName,
    WorkloadChoices,
    resolve_choices,
    resolve_kueue,
)
from webhook.core.gpu_view import GpuAvailability, GpuCode
from webhook.core.kueue import queue_placement, queue_warning
from webhook.core.offer import CLUSTER, Level, SchedulingOffer
from webhook.core.preemptibility import RunaiPreemptibility, admitted_preemptibility
from webhook.settings import WORKLOAD_KINDS
from webhook.snapshot import ClusterSnapshot


class LabelChoices(BaseModel):
    choices: list[str]
    default: list[str]
    level: Level


class PriorityClassChoice(BaseModel):
    name: str
    value: int | None  # None: no PriorityClass of that name exists (admission sets nothing then)
    preemption_policy: str | None = None


class PriorityChoices(BaseModel):
    choices: list[PriorityClassChoice]
    default: str | None
    level: Level | None


class FlavorView(BaseModel):
    """One ResourceFlavor of a queue's ClusterQueue: its Topology, and quota and usage per
    resource as Kueue reports them (quantities as Kueue writes them)."""

    name: str
    topology: str | None
    nominal_quota: dict[str, str]
    usage: dict[str, str]
    borrowed: dict[str, str]


class QueueView(BaseModel):
    """A queue a workload may choose, and what its ClusterQueue holds, from Kueue's own status."""

    name: str
    cluster_queue: str | None  # None: the LocalQueue does not exist
    cohort: str | None = None
    active: bool | None = None  # the ClusterQueue's Active condition (None: not reported)
    pending_workloads: int | None = None  # the ClusterQueue's
    admitted_workloads: int | None = None
    local_pending_workloads: int | None = None  # this LocalQueue's own
    flavors: list[FlavorView] = []
    topologies: list[str] = []  # the topology units this queue can place a workload by
    problems: list[str] = []  # why it offers no topology unit, or will not admit


class QueueChoices(BaseModel):
    choices: list[str]  # what a workload may choose: the project's queues that are LocalQueues here
    existing: list[str]  # LocalQueues of the namespace
    unavailable: list[str] = []  # listed for the project but no LocalQueue here: admission refuses them
    default: str
    level: Level
    default_refused: str | None = None  # why a workload choosing no queue is refused (None: it is not)
    queues: list[QueueView] = []  # `choices`, and the default queue when it is not one of them


class TopologyChoice(BaseModel):
    name: str
    node_label: str


class TopologyChoices(BaseModel):
    """The units a workload may choose with the default queue (another queue: its `topologies`)."""

    choices: list[TopologyChoice]
    default: str | None
    level: Level | None


class GpuOffer(BaseModel):
    """Whether a workload of this kind may ask for GPUs (Run:ai on: only within deserved GPUs)."""

    allowed: bool
    quota_checked: bool  # admission refuses GPUs beyond `available_non_preemptible`
    deserved: float | None = None
    available_non_preemptible: float | None = None
    status: str  # the GPU view's status
    reason: str


class ChosenLabels(BaseModel):
    value: list[str]
    level: Level  # workload: its own choice


class ChosenName(BaseModel):
    value: str | None  # None: nothing is set
    level: Level | None


class WorkloadScheduling(BaseModel):
    """What a workload with the given choices gets, each with the level it came from (`workload`
    for its own choice); `errors` are the refusals admission would give."""

    affinity: ChosenLabels
    anti_affinity: ChosenLabels
    priority_class: ChosenName
    queue: ChosenName | None = None  # None: Kueue off
    topology: ChosenName | None = None
    errors: list[str] = []
    warnings: list[str] = []  # what admission would warn (a default topology its queue cannot place)


class SchedulingOfferView(BaseModel):
    """`GET /api/v1/projects/{namespace}/scheduling`."""

    namespace: str
    kind: str | None
    affinity: LabelChoices
    anti_affinity: LabelChoices
    priority_class: PriorityChoices
    kueue_enabled: bool
    queue: QueueChoices | None = None  # None: Kueue off
    topology: TopologyChoices | None = None
    gpus: GpuOffer
    notes: list[str] = []
    # Only when the request gave choices (query parameters affinity, antiAffinity, priorityClass,
    # queue, topology): how they resolve against this offer.
    workload: WorkloadScheduling | None = None


def gpu_offer(view: GpuAvailability, kind: str | None, seen: RunaiPreemptibility) -> GpuOffer:
    """Whether a workload of `kind` may ask for GPUs, from the GPU view, as admission decides it:
    Run:ai off, GPUs are Kubernetes' to schedule; on, nothing starts in a project not bound yet,
    and a kind Run:ai does not preempt (notebook, terminal, app, deployment, and a pod no kind rule
    recognises: `kind` None) gets GPUs only in a project with deserved GPUs. Jobs are not held to
    the quota; nor is anything while Run:ai is unreachable (Run:ai enforces it then). A project
    whose Run:ai project is gone from Run:ai, or not known here yet, gets none: admission refuses
    those too. `seen`: how Run:ai will classify such a workload's pods (`core.preemptibility`)."""
    project = view.project
    deserved = project.quota if project is not None else None

    def answer(allowed: bool, checked: bool, reason: str) -> GpuOffer:
        return GpuOffer(
            allowed=allowed,
            quota_checked=checked,
            reason=reason,
            deserved=deserved,
            available_non_preemptible=view.available_non_preemptible,
            status=view.status,
        )

    if not view.runai_enabled:
        return answer(True, False, "Run:ai is off: Kubernetes schedules GPUs")
    if view.status == GpuCode.NOT_BOUND:
        return answer(False, False, "the project is not bound to Run:ai yet: its workloads start once it is")
    if seen.preemptible:
        return answer(True, False, f"{kind or 'pod'}s are preemptible to Run:ai: not held to the deserved GPUs")
    codes = {w.code for w in view.warnings}
    if project is None and GpuCode.PROJECT_MISSING in codes:
        return answer(False, False, "the project's Run:ai project no longer exists in Run:ai; see the GPU view")
    if project is None and GpuCode.NOT_KNOWN_YET in codes:
        return answer(False, False, "the project was bound to Run:ai moments ago; try again in a few seconds")
    if project is None:
        return answer(True, False, "Run:ai's view of the project is missing: the quota is not checked here")
    if not project.quota > 0:
        return answer(
            False, True, "the project has no deserved Run:ai GPUs; an administrator can assign quota in Run:ai"
        )
    return answer(True, True, "within the project's deserved Run:ai GPUs")


def offer_view(
    offer: SchedulingOffer,
    snapshot: ClusterSnapshot,
    gpus: GpuAvailability,
    kind: str | None = None,
    choices: WorkloadChoices | None = None,
) -> SchedulingOfferView:
    if kind is not None and kind not in WORKLOAD_KINDS:
        raise ValueError(f"unknown workload kind {kind!r}; known: {', '.join(WORKLOAD_KINDS)}")
    classes = snapshot.priority_classes

    def priority(name: str) -> PriorityClassChoice:
        found = classes.get(name)
        if found is None:
            return PriorityClassChoice(name=name, value=None)
        return PriorityClassChoice(name=name, value=found.value, preemption_policy=found.preemption_policy)

    queue = topology = None
    notes = list(offer.notes)
    if offer.kueue:
        queue, topology, kueue_notes = kueue_choices(offer, snapshot, kind)
        notes.extend(kueue_notes)
    return SchedulingOfferView(
        namespace=offer.namespace,
        kind=kind,
        affinity=_labels(offer.affinity, offer.default_affinity, offer.default_affinity_level),
        anti_affinity=_labels(offer.anti_affinity, offer.default_anti_affinity, offer.default_anti_affinity_level),
        priority_class=PriorityChoices(
            choices=[priority(n) for n in offer.priority_classes],
            default=offer.default_priority_class,
            level=offer.default_priority_class_level,
        ),
        kueue_enabled=offer.kueue,
        queue=queue,
        topology=topology,
        gpus=gpu_offer(
            gpus,
            kind,
            admitted_preemptibility(kind, {}, offer.default_priority_class, classes, snapshot.settings),
        ),
        notes=notes,
        workload=None if choices is None else workload_view(resolve_choices(offer, choices, snapshot, kind)),
    )


def queue_view(snapshot: ClusterSnapshot, namespace: str, queue: str, topologies: Mapping[str, str]) -> QueueView:
    placement = queue_placement(snapshot, namespace, queue)
    local, cq = placement.local_queue, placement.cluster_queue
    problems = list(placement.problems)
    if (warning := queue_warning(placement)) is not None and warning not in problems:
        problems.append(warning)
    if cq is None:
        return QueueView(
            name=queue,
            cluster_queue=local.cluster_queue if local is not None else None,
            local_pending_workloads=local.pending if local is not None else None,
            problems=problems,
        )
    return QueueView(
        name=queue,
        cluster_queue=cq.name,
        cohort=cq.cohort,
        active=cq.active,
        pending_workloads=cq.pending,
        admitted_workloads=cq.admitted,
        local_pending_workloads=local.pending if local is not None else None,
        flavors=[
            FlavorView(
                name=f.flavor,
                topology=placement.flavor_topologies.get(f.flavor),
                nominal_quota=dict(f.nominal),
                usage=dict(f.usage),
                borrowed=dict(f.borrowed),
            )
            for f in cq.flavors
        ],
        topologies=placement.units(topologies),
        problems=problems,
    )


def kueue_choices(
    offer: SchedulingOffer, snapshot: ClusterSnapshot, kind: str | None
) -> tuple[QueueChoices, TopologyChoices, list[str]]:
    """The queues and units as admission judges them (`choices.resolve_kueue`): a queue is offered
    only when it is a LocalQueue of the namespace, a unit only when the queue can place by it."""
    ns = offer.namespace
    existing = sorted(snapshot.local_queue_info.get(ns, {}))
    listed = offer.queue_choices()
    choices = [q for q in listed if q in existing]
    defaults = resolve_kueue(offer, snapshot, None, None, kind)
    default_queue = offer.default_queue_for(kind)
    shown = choices if default_queue in choices else [*choices, default_queue]
    queues = [queue_view(snapshot, ns, q, offer.topologies) for q in shown]
    default_units: list[str] = []
    if defaults.queue.value is not None:
        default_units = next(v.topologies for v in queues if v.name == defaults.queue.value)
    queue = QueueChoices(
        choices=choices,
        existing=existing,
        unavailable=[q for q in listed if q not in existing],
        default=default_queue,
        level=CLUSTER if kind == "system-job" else offer.default_queue_level,
        default_refused=defaults.queue.error,
        queues=queues,
    )
    topology = TopologyChoices(
        choices=[TopologyChoice(name=u, node_label=offer.topologies[u]) for u in default_units],
        default=defaults.topology.value,
        level=defaults.topology.level,
    )
    return queue, topology, list(defaults.warnings)


def workload_view(resolved: ResolvedChoices) -> WorkloadScheduling:
    def labels(r: ResolvedLabels) -> ChosenLabels:
        return ChosenLabels(value=list(r.value), level=r.level)

    def name(r: ResolvedName | None) -> ChosenName | None:
        return None if r is None else ChosenName(value=r.value, level=r.level)

    priority = name(resolved.priority_class)
    assert priority is not None
    return WorkloadScheduling(
        affinity=labels(resolved.affinity),
        anti_affinity=labels(resolved.anti_affinity),
        priority_class=priority,
        queue=name(resolved.queue),
        topology=name(resolved.topology),
        errors=resolved.errors,
        warnings=list(resolved.warnings),
    )


def _labels(choices: Sequence[str], default: Sequence[str], level: Level) -> LabelChoices:
    return LabelChoices(choices=list(choices), default=list(default), level=level)
