"""R2/R3 as pure decisions: is the pod's project bound, and does its GPU request fit the quota.

`validate_pod(request, snapshot, now)` never calls out. Binding happens in the mutating phase
(`webhook.http.pod_webhook`); here an unbound project, or a pod without its project's `runai/queue`
label, is refused: such a pod did not pass Run:ai's admission (defence in depth for S5). What it
cannot decide alone it says with a reason the shell acts on: `Reason.RUNAI_PROJECT_NOT_KNOWN_HERE` (Run:ai
answers, but this replica has no record of the project yet, e.g. another replica bound it moments
ago: look that one project up, or refuse and let the user retry). With Kueue on instead, it refuses
a pod that names a queue but that Kueue neither gated nor admits through its owner (S4's defence in
depth, `core.kueue.ungated_pod_refusal`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.decision import Decision, Reason
from webhook.core.kinds import UNREADABLE_POD_GPUS, controller_owner, dra_claims, pod_gpu_request
from webhook.core.kueue import ungated_pod_refusal
from webhook.core.preemptibility import runai_preemptibility
from webhook.core.runai_admission import project_not_bound, runai_pod_refusal
from webhook.core.scheduling import pod_target
from webhook.snapshot import (
    RUNAI_QUEUE_LABEL,
    ClusterSnapshot,
    RunaiProjectInfo,
    department_namespaces,
    holds_gpus,
)

EPSILON = 1e-9  # fractions add up in floating point


def request_key(request: Mapping[str, Any]) -> str:
    """How a reservation names the pod: its uid when the apiserver set one, else the request uid."""
    meta = (request.get("object") or {}).get("metadata") or {}
    return str(meta.get("uid") or request.get("uid") or "")


def gpus_in_use(snapshot: ClusterSnapshot, namespace: str, now: float, exclude: str = "") -> float:
    """GPUs held by the namespace's running or waiting non-preemptible pods, plus live reservations
    for pods the cache does not show yet. A reservation of a pod the cache saw deleted or finished
    no longer counts: its GPUs are free once the cache learns it, not when the reservation expires."""
    used = pods_holding(snapshot, namespace, exclude)
    reservations = snapshot.gpu_reservations.get(namespace)
    if not reservations:
        return used
    pods = snapshot.pods.get(namespace, {})
    freed = snapshot.freed_pods.get(namespace, {})
    pending = sum(
        r.gpus
        for key, r in reservations.items()
        if key != exclude and key not in pods and key not in freed and r.expires_at > now
    )
    return used + pending


def pods_holding(snapshot: ClusterSnapshot, namespace: str, exclude: str = "") -> float:
    """GPUs held by the namespace's cached pods that are neither finished nor preemptible (what
    counts against deserved GPUs), less pod `exclude`'s: their exact sum, correctly rounded. The
    pod cache keeps it as it changes (`snapshot.HeldGpus`); a snapshot without one sums the pods."""
    index = snapshot.held_gpus_index
    if index is None:
        pods = snapshot.pods.get(namespace) or {}
        return math.fsum(p.gpus for uid, p in pods.items() if uid != exclude and holds_gpus(p))
    excluded = snapshot.pods.get(namespace, {}).get(exclude) if exclude else None
    return index.get(namespace) if excluded is None else index.without(namespace, excluded)


# The deserved GPUs of a queue that Run:ai's scheduler (KAI) holds to no quota. Any other value is
# a limit, 0 included: KAI refuses every non-preemptible GPU of a queue whose deserved GPUs are 0.
UNLIMITED_GPUS = -1.0


@dataclass(frozen=True, slots=True)
class DepartmentLeft:
    """The non-preemptible GPUs a project's department has left on the project's node pool: Run:ai's
    scheduler holds a non-preemptible pod to every queue up its hierarchy, the department's too."""

    name: str
    deserved: float
    runai_in_use: float  # Run:ai's allocatedNonPreemptible of the department, less pods that left since
    pods_in_use: float  # `gpus_in_use` summed over the department's projects this replica has records of

    @property
    def in_use(self) -> float:
        return max(self.runai_in_use, self.pods_in_use)

    @property
    def left(self) -> float:
        return self.deserved - self.in_use


@dataclass(frozen=True, slots=True)
class GpusLeft:
    """A project's non-preemptible GPUs on its default node pool (R3): what admission checks, the
    GPU view shows and a refusal says. The smaller of what the project and its department have left."""

    node_pool: str | None
    deserved: float
    runai_in_use: float  # Run:ai's allocatedNonPreemptible, less pods that left since it was sampled
    pods_in_use: float  # `gpus_in_use`: not-finished non-preemptible pods plus pending reservations
    department: DepartmentLeft | None = None  # None: the department sets no limit (no quota, or no record)

    @property
    def in_use(self) -> float:
        return max(self.runai_in_use, self.pods_in_use)

    @property
    def project_left(self) -> float:
        return self.deserved - self.in_use

    @property
    def department_limits(self) -> bool:
        """Whether the department, not the project, leaves fewer GPUs."""
        return self.department is not None and self.department.left < self.project_left

    @property
    def left(self) -> float:
        """May be negative (over-committed); show it with `max(left, 0)`."""
        if self.department is None:
            return self.project_left
        return min(self.project_left, self.department.left)


def gpus_left(
    snapshot: ClusterSnapshot,
    namespace: str,
    now: float,
    *,
    project: RunaiProjectInfo | None = None,
    exclude: str = "",
) -> GpusLeft | None:
    """The one computation of "GPUs left" (None: no Run:ai record of the project to take the quota
    from). `project` defaults to the snapshot's record, which the directory refresh publishes.

    Run:ai's count was sampled at `project.sampled_at`; a scheduled non-preemptible pod the cache
    saw leave after that is still in it, so its GPUs are taken off: a freed GPU is available as
    soon as the pod cache learns it, not at the next refresh."""
    if project is None:
        project = (snapshot.runai_projects or {}).get(namespace)
        if project is None:
            return None
    return GpusLeft(
        node_pool=project.node_pool,
        deserved=project.deserved_gpus,
        runai_in_use=_runai_in_use(snapshot, (namespace,), project.allocated_non_preemptible, project.sampled_at),
        pods_in_use=gpus_in_use(snapshot, namespace, now, exclude=exclude),
        department=department_left(snapshot, namespace, project, now, exclude=exclude),
    )


def department_left(
    snapshot: ClusterSnapshot, namespace: str, project: RunaiProjectInfo, now: float, *, exclude: str = ""
) -> DepartmentLeft | None:
    """`GpusLeft.department`. The department's pods are those of the namespaces whose Run:ai record
    names the same department (a namespace whose project this replica has no record of is counted
    by Run:ai's figure alone)."""
    department = project.department
    if department is None or department.deserved_gpus == UNLIMITED_GPUS:
        return None
    index = snapshot.runai_department_namespaces
    if index is None:
        index = department_namespaces(snapshot.runai_projects)
    members = {namespace} | index.get(department.id, frozenset())
    return DepartmentLeft(
        name=department.name,
        deserved=department.deserved_gpus,
        runai_in_use=_runai_in_use(snapshot, members, department.allocated_non_preemptible, department.sampled_at),
        pods_in_use=math.fsum(gpus_in_use(snapshot, ns, now, exclude=exclude) for ns in sorted(members)),
    )


def _runai_in_use(snapshot: ClusterSnapshot, namespaces: Iterable[str], allocated: float, sampled_at: float) -> float:
    """Run:ai's count less the scheduled non-preemptible pods of `namespaces` that left since it was sampled."""
    freed_since = 0.0
    for namespace in namespaces:
        freed = snapshot.freed_pods.get(namespace)
        if freed:
            freed_since += sum(
                f.gpus for f in freed.values() if f.at > sampled_at and f.scheduled and not f.preemptible
            )
    return max(0.0, allocated - freed_since)


def format_gpus(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value % 1 else str(int(value))


def validate_pod(request: Mapping[str, Any], snapshot: ClusterSnapshot, now: float = 0.0) -> Decision:
    target = pod_target(request, snapshot)
    settings = snapshot.settings
    if target is None:
        return Decision.allow()
    if not settings.run_ai_enable:
        if settings.kueue_installed:
            # S4's defence in depth: a pod naming a queue that Kueue did not take would use no quota.
            meta = target.pod.get("metadata")
            controller = controller_owner(meta) if isinstance(meta, dict) else None
            refusal = ungated_pod_refusal(target.namespace.name, target.labels, target.spec, controller)
            if refusal is not None:
                return Decision.deny(refusal, code=403, reason=Reason.FORBIDDEN)
        return Decision.allow()
    ns = target.namespace
    if ns.moving:
        # Between the delete and the create of a move, no Run:ai project governs the namespace.
        return Decision.deny(
            f"project {ns.name} is moving to another department; its workloads start once the move is done",
            code=409,
            reason=Reason.PROJECT_MOVING,
        )
    queue = ns.runai_queue
    if queue is None:
        return project_not_bound(ns.name)
    if target.labels.get(RUNAI_QUEUE_LABEL) != queue:
        # Our mutating webhook labels every pod of a bound project; a pod without the label (or with
        # another) was mutated before the binding, so Run:ai's webhooks did not see it either.
        return Decision.deny(
            f"pod lacks {RUNAI_QUEUE_LABEL}={queue}, the Run:ai queue of project {ns.name}, so it did not "
            "pass Run:ai's admission; create it again (the scheduling webhook adds the label)",
            code=403,
            reason=Reason.RUNAI_QUEUE_MISSING,
        )
    refused = runai_pod_refusal(target.pod)
    if refused is not None:
        return refused
    try:
        # Every kind: a request that cannot be read would count as NaN or infinity in the caches.
        gpus = pod_gpu_request(target.pod)
    except ValueError as exc:
        return Decision.deny(f"GPU request: {exc}", code=400, reason=Reason.INVALID)
    # The apiserver admits a claim named by a container only when the pod lists it here.
    if gpus <= 0 and not target.spec.get("resourceClaims"):
        return Decision.allow()
    # As Run:ai will classify it, from the labels the mutating webhook wrote.
    seen = runai_preemptibility(
        target.labels, target.spec.get("priorityClassName"), snapshot.priority_classes, settings
    )
    if seen.preemptible:
        return Decision.allow()  # Run:ai may preempt it, so it may run over quota on idle GPUs
    claims = dra_claims(target.spec) if target.spec.get("resourceClaims") else None
    if claims:
        return Decision.deny(uncounted_claims_message("this pod", claims), code=403, reason=Reason.FORBIDDEN)
    if gpus <= 0:
        return Decision.allow()
    kind = target.kind or "pod"
    return check_quota(
        snapshot,
        ns.name,
        gpus,
        now,
        exclude=request_key(request),
        asks=lambda: (
            f"this {kind} asks for {format_gpus(gpus)}. Stop another GPU workload or ask an "
            "administrator for more Run:ai quota"
        ),
    )


def uncounted_claims_message(what: str, claims: list[str]) -> str:
    """Why a non-preemptible pod (or template) with DRA claims is refused: Run:ai counts the GPUs
    a claim allocates against the quota, and the platform, which sees only the pod, cannot."""
    shown = ", ".join(claims[:5]) + (f" and {len(claims) - 5} more" if len(claims) > 5 else "")
    return (
        f"DRA resource claims of {what} ({shown}): what a claim allocates is not written in the pod, so "
        "the GPUs it may hold cannot be counted against the project's quota, which Run:ai holds this "
        "non-preemptible workload to: ask for GPUs with nvidia.com/gpu (or a MIG profile) in the container's resources"
    )


def _unreadable_note(snapshot: ClusterSnapshot, namespace: str) -> str:
    # Such pods count as the most a pod may ask for (webhook.state.store.pod_record): say which,
    # so the refusal points at what to fix rather than at a quota that looks used up.
    names = sorted(p.name for p in snapshot.pods.get(namespace, {}).values() if p.gpus_unreadable and not p.finished)
    if not names:
        return ""
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f" (pods whose GPU request cannot be read count as {format_gpus(UNREADABLE_POD_GPUS)} GPUs each: {shown})"


def check_quota(
    snapshot: ClusterSnapshot,
    namespace: str,
    gpus: float,
    now: float,
    *,
    asks: str | Callable[[], str],
    exclude: str = "",
    project: RunaiProjectInfo | None = None,
) -> Decision:
    """R3 for a bound project: allow `gpus` more GPUs when the project has that many of its
    deserved GPUs left. A refusal says "N of M deserved GPUs left; " and then `asks` (what the
    request asks for and what the user can do; a function of nothing, to write it only for a
    refusal). `project`: the record to take the quota from, when not the snapshot's."""
    quota = gpus_left(snapshot, namespace, now, exclude=exclude, project=project)
    if quota is None:
        if (refused := runai_record_missing(snapshot, namespace)) is not None:
            return refused
        # Bound, and the last refresh found Run:ai unreachable: Run:ai enforces the quota when it schedules.
        return Decision.allow(warnings=["GPU quota not checked: Run:ai control plane unreachable"])
    left = quota.left
    if gpus > left + EPSILON:
        return Decision.deny(
            quota_left_message(namespace, quota)
            + "; "
            + (asks if isinstance(asks, str) else asks())
            + _unreadable_note(snapshot, namespace),
            code=403,
            reason=Reason.GPU_QUOTA_EXCEEDED,
        )
    return Decision.allow(audit={"gpus": format_gpus(gpus), "gpus-left": format_gpus(left - gpus)})


def quota_left_message(namespace: str, quota: GpusLeft) -> str:
    """ "N of M deserved GPUs left", said of the department when it is the limit."""
    project = f"project {namespace} has {format_gpus(max(quota.project_left, 0.0))} of {format_gpus(quota.deserved)}"
    department = quota.department
    if department is None or not quota.department_limits:
        return f"{project} deserved GPUs left"
    return (
        f"department {department.name} has {format_gpus(max(department.left, 0.0))} of "
        f"{format_gpus(department.deserved)} deserved GPUs left for its projects' non-preemptible workloads "
        f"({project})"
    )


def runai_record_missing(snapshot: ClusterSnapshot, namespace: str) -> Decision | None:
    """Why a bound namespace with no Run:ai record here cannot be checked now; None only when the last
    refresh found Run:ai unreachable (the seed then skips the check)."""
    if snapshot.runai_reachable is False:
        return None
    queue = snapshot.namespaces[namespace].runai_queue if namespace in snapshot.namespaces else None
    if queue is not None and snapshot.runai_missing.get(namespace) == queue:
        return Decision.deny(project_missing_message(namespace, queue), code=409, reason=Reason.RUNAI_PROJECT_MISSING)
    return Decision.deny(
        f"this replica has no record yet of Run:ai project {queue or namespace}, bound to namespace {namespace} "
        "moments ago, so its GPU quota cannot be checked here yet; try again in a few seconds",
        code=503,
        reason=Reason.RUNAI_PROJECT_NOT_KNOWN_HERE,
    )


def project_missing_message(namespace: str, queue: str) -> str:
    """What is true and what to do, for the refusal and the GPU view alike."""
    return (
        f"namespace {namespace} is bound (label runai/queue={queue}) to Run:ai project {queue}, which no longer "
        "exists in Run:ai, so Run:ai will not schedule its pods and GPU quota cannot be checked. An administrator "
        f"can create Run:ai project {queue} again bound to namespace {namespace}, or remove the labels runai/queue "
        "and hopsworks.ai/runai-project-id from the namespace: the next start or the background pass then binds it "
        "to a new Run:ai project with the default GPU quota"
    )
