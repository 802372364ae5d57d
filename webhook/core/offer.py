"""What a project's workloads may choose, and what they get when they choose nothing.

`scheduling_offer(namespace, snapshot)` is the one place that decides a project's available
affinity and anti-affinity labels, priority classes, Kueue queues and topology units, and the
default of each with the level it came from. Pod mutation (rules S1, S3, S4) refuses a choice
outside it and fills in its defaults; `GET /api/v1/projects/{namespace}/scheduling` shows it, so a
form built from the API never offers what admission would refuse.

`webhook.core.offer_view` turns it into the API's answer.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from webhook.core.project_settings import ProjectSettingsError, parse_project_scheduling
from webhook.settings import ClusterSettings
from webhook.snapshot import ClusterSnapshot, NamespaceInfo

Level = Literal["cluster", "project", "workload"]
CLUSTER: Level = "cluster"
PROJECT: Level = "project"
WORKLOAD: Level = "workload"  # the workload's own choice beats both defaults


@dataclass(frozen=True, slots=True)
class SchedulingOffer:
    """A project's choices and defaults. `queues`/`topologies` apply only when `kueue` is on
    (Kueue installed and Run:ai off: with both on, Run:ai's queue wins)."""

    namespace: str
    affinity: tuple[str, ...]
    anti_affinity: tuple[str, ...]
    priority_classes: tuple[str, ...]
    kueue: bool
    # The project's own queue list when it has one, else the namespace's LocalQueues (a set: the
    # hot path only tests membership; `queue_choices` orders it for people).
    queues: Collection[str]
    queues_listed: bool  # True: `queues` is the project's list (in its order)
    topologies: Mapping[str, str]  # unit -> node label
    default_affinity: tuple[str, ...]
    default_affinity_level: Level
    default_anti_affinity: tuple[str, ...]
    default_anti_affinity_level: Level
    default_priority_class: str | None
    default_priority_class_level: Level | None
    default_queue: str  # for every kind but system jobs
    default_queue_level: Level
    system_job_queue: str
    default_topology: str | None
    default_topology_level: Level | None
    # Why part of the project's settings was ignored (admission passes these on as warnings).
    notes: tuple[str, ...] = ()

    def queue_choices(self) -> list[str]:
        return list(self.queues) if self.queues_listed else sorted(self.queues)

    def default_queue_for(self, kind: str | None) -> str:
        return self.system_job_queue if kind == "system-job" else self.default_queue


# A project's offer is a pure function of three immutable objects that change only when a watch
# event replaces them, yet parsing its JSON annotations was a third of a mutation's cost. Keyed by
# identity; holding the objects keeps their ids from being reused while cached.
_CACHE: dict[int, tuple[NamespaceInfo, ClusterSettings, Collection[str] | None, SchedulingOffer]] = {}
_CACHE_SIZE = 4096
_NO_QUEUES: frozenset[str] = frozenset()


def scheduling_offer(namespace: NamespaceInfo, snapshot: ClusterSnapshot) -> SchedulingOffer:
    settings = snapshot.settings
    local_queues = snapshot.local_queues.get(namespace.name)
    hit = _CACHE.get(id(namespace))
    if hit is not None and hit[0] is namespace and hit[1] is settings and hit[2] is local_queues:
        return hit[3]
    offer = _build(namespace, settings, local_queues or _NO_QUEUES)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.clear()  # namespaces replaced by updates leave stale entries; start over
    _CACHE[id(namespace)] = (namespace, settings, local_queues, offer)
    return offer


def _build(namespace: NamespaceInfo, settings: ClusterSettings, local_queues: Collection[str]) -> SchedulingOffer:
    notes: list[str] = []
    try:
        project = parse_project_scheduling(namespace, settings)
    except ProjectSettingsError as exc:
        # The settings guard refuses such annotations; one written before the guard must not
        # block the project's pods, so fall back to the cluster's project subset and say so.
        notes.append(f"project scheduling settings ignored: {exc}")
        project = parse_project_scheduling(NamespaceInfo(name=namespace.name), settings)
    notes.extend(project.notes)

    def level(key: str) -> Level:
        return PROJECT if key in project.project_defaults else CLUSTER

    def optional_level(key: str, value: str | None) -> Level | None:
        return None if value is None else level(key)

    queue = project.default_queue or settings.kueue_project_default_local_queue
    return SchedulingOffer(
        namespace=namespace.name,
        affinity=project.affinity,
        anti_affinity=project.anti_affinity,
        priority_classes=project.priority_classes,
        kueue=settings.kueue_installed and not settings.run_ai_enable,
        queues=project.queues if project.queues is not None else local_queues,
        queues_listed=project.queues is not None,
        topologies=settings.scheduler.available.topologies,
        default_affinity=project.default_affinity,
        default_affinity_level=level("affinity"),
        default_anti_affinity=project.default_anti_affinity,
        default_anti_affinity_level=level("antiAffinity"),
        default_priority_class=project.default_priority_class,
        default_priority_class_level=optional_level("priorityClass", project.default_priority_class),
        default_queue=queue,
        default_queue_level=level("queue") if project.default_queue else CLUSTER,
        system_job_queue=settings.kueue_system_jobs_local_queue,
        default_topology=project.default_topology,
        default_topology_level=optional_level("topology", project.default_topology),
        notes=tuple(notes),
    )
