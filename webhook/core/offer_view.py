"""The answer of `GET /api/v1/projects/{namespace}/scheduling`: a project's scheduling offer
(`webhook.core.offer`) for people and forms, with priority values and whether GPUs may be asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from webhook.core.choices import ResolvedChoices, ResolvedLabels, ResolvedName, WorkloadChoices, resolve_choices
from webhook.core.gpu_view import GpuAvailability, GpuCode
from webhook.core.offer import CLUSTER, Level, SchedulingOffer
from webhook.settings import WORKLOAD_KINDS, quota_checked
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


class QueueChoices(BaseModel):
    choices: list[str]
    existing: list[str]  # LocalQueues of the namespace (a listed queue may not exist yet)
    default: str
    level: Level


class TopologyChoice(BaseModel):
    name: str
    node_label: str


class TopologyChoices(BaseModel):
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


def gpu_offer(view: GpuAvailability, kind: str | None) -> GpuOffer:
    """Whether a workload of `kind` may ask for GPUs, from the GPU view, as admission decides it:
    Run:ai off, GPUs are Kubernetes' to schedule; on, nothing starts in a project not bound yet,
    and a kind Run:ai does not preempt (notebook, terminal, app, deployment, and a pod no kind rule
    recognises: `kind` None) gets GPUs only in a project with deserved GPUs. Jobs are not held to
    the quota; nor is anything while Run:ai is unreachable (Run:ai enforces it then). A project
    whose Run:ai project is gone from Run:ai, or not known here yet, gets none: admission refuses
    those too."""
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
    if not quota_checked(kind):
        return answer(True, False, f"{kind}s are preemptible: not held to the deserved GPUs")
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
    if offer.kueue:
        queue = QueueChoices(
            choices=offer.queue_choices(),
            existing=sorted(snapshot.local_queues.get(offer.namespace, ())),
            default=offer.default_queue_for(kind),
            level=CLUSTER if kind == "system-job" else offer.default_queue_level,
        )
        topology = TopologyChoices(
            choices=[TopologyChoice(name=n, node_label=label) for n, label in offer.topologies.items()],
            default=offer.default_topology,
            level=offer.default_topology_level,
        )
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
        gpus=gpu_offer(gpus, kind),
        notes=list(offer.notes),
        workload=None if choices is None else workload_view(resolve_choices(offer, choices, kind)),
    )


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
    )


def _labels(choices: Sequence[str], default: Sequence[str], level: Level) -> LabelChoices:
    return LabelChoices(choices=list(choices), default=list(default), level=level)
