"""R3 at `kubectl apply` time: pod owners asking for more GPUs than their project has left.

`validate_workload(request, snapshot, now, parent)` is pure. It is a pre-check for a better answer
(a refused `kubectl apply` instead of ReplicaSet events nobody reads); the binding rule and the
hard quota check stay with the pods, which reserve GPUs when they are created. That is why nothing
is reserved here: a Deployment's pods do not exist yet, and reserving for them would hold quota
that the pods themselves reserve again moments later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.decision import Decision, Reason
from webhook.core.enforcement import PREEMPTIBILITY, warns, with_would_refuse
from webhook.core.gpu_sharing import gpu_sharing_error
from webhook.core.kinds import classify_workload, dra_claims, kai_owner, pod_gpu_request
from webhook.core.owners import scale_refusal, statefulset_warning
from webhook.core.preemptibility import (
    RUNAI_PRIORITY_LABEL,
    SKIP_POD_GROUPER_ANNOTATION,
    admitted_preemptibility,
    intended,
    unreviewed_owner,
)
from webhook.core.quota import EPSILON, check_quota, format_gpus, uncounted_claims_message
from webhook.core.scheduling import request_namespace
from webhook.settings import ClusterSettings
from webhook.snapshot import RUNAI_QUEUE_LABEL, ClusterSnapshot, NamespaceInfo, PriorityClassInfo, RunaiProjectInfo

# (API group, kind) of the pod owners this check reads, every kind of Kubernetes' own whose labels
# reach a pod's PodGroup (`preemptibility.REVIEWED_OWNERS` but the pod); the value is the plural
# its resource is addressed by (`deployments/scale`). A DaemonSet counts as one pod: how many
# nodes it runs on is the scheduler's to say.
WORKLOAD_KINDS: dict[tuple[str, str], str] = {
    ("apps", "Deployment"): "deployments",
    ("apps", "StatefulSet"): "statefulsets",
    ("apps", "ReplicaSet"): "replicasets",
    ("apps", "DaemonSet"): "daemonsets",
    ("", "ReplicationController"): "replicationcontrollers",
    ("batch", "Job"): "jobs",
    ("batch", "CronJob"): "cronjobs",
}
SCALABLE: dict[str, tuple[str, str]] = {
    plural: key
    for key, plural in WORKLOAD_KINDS.items()
    if key in (("apps", "Deployment"), ("apps", "StatefulSet"), ("apps", "ReplicaSet"))
}  # resource plural -> (group, kind)
# An object whose first owner, and controller, is one of these was checked when that owner was
# applied. Checking it again would refuse the Deployment controller's own ReplicaSet writes
# mid-rollout, where the old pods still hold their GPUs; the pods are checked (and reserve) when
# they are created anyway. That owner is also the one Run:ai reads first (`kai_owner`).
CHECKED_OWNERS = frozenset({("apps", "Deployment"), ("batch", "CronJob")})


@dataclass(frozen=True, slots=True)
class Demand:
    """What a pod owner asks for: `replicas` pods at once, each holding `gpus_per_pod`."""

    kind: str | None  # the platform's workload kind of its pods
    replicas: int
    gpus_per_pod: float
    quota_checked: bool  # its pods are non-preemptible to Run:ai once labelled (`core.preemptibility`)
    claims: tuple[str, ...] = ()  # the DRA claims of its pods (`kinds.dra_claims`), whose GPUs no one here counts

    @property
    def total(self) -> float:
        return self.replicas * self.gpus_per_pod if self.quota_checked else 0.0


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _count(value: Any, default: int = 1) -> int:
    """A replica count; nil means the API default. The apiserver validated it already."""
    if value is None or isinstance(value, bool):
        return default
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return default


def pod_template(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    spec = _map(obj.get("spec"))
    if kind == "CronJob":
        spec = _map(_map(spec.get("jobTemplate")).get("spec"))
    return _map(spec.get("template"))


def concurrent_pods(obj: Mapping[str, Any], kind: str) -> int:
    """How many pods the object runs at once."""
    spec = _map(obj.get("spec"))
    if kind in ("Job", "CronJob"):
        if kind == "CronJob":
            spec = _map(_map(spec.get("jobTemplate")).get("spec"))
        parallelism = _count(spec.get("parallelism"))
        completions = spec.get("completions")
        return parallelism if completions is None else min(parallelism, _count(completions))
    return _count(spec.get("replicas"))


def demand(
    obj: Mapping[str, Any],
    kind: str,
    settings: ClusterSettings,
    classes: Mapping[str, PriorityClassInfo],
    replicas: int | None = None,
) -> Demand:
    """Raises ValueError on a malformed GPU request in the template (Run:ai's grammar included)."""
    template = pod_template(obj, kind)
    labels = _map(_map(template.get("metadata")).get("labels"))
    # The Job controller will own these pods (a CronJob's through its Jobs).
    controller = ("batch", "Job") if kind in ("Job", "CronJob") else None
    pod_kind = classify_workload(labels, settings.scheduler.workload_kinds, controller)
    sharing = gpu_sharing_error(template)
    if sharing is not None:
        raise ValueError(sharing)
    spec = _map(template.get("spec"))
    seen = admitted_preemptibility(pod_kind, labels, spec.get("priorityClassName"), classes, settings)
    return Demand(
        kind=pod_kind,
        replicas=concurrent_pods(obj, kind) if replicas is None else replicas,
        gpus_per_pod=pod_gpu_request(template),
        quota_checked=seen.quota_checked,
        claims=tuple(dra_claims(spec)),
    )


def owner_label_error(
    obj: Mapping[str, Any], kind: str, pod_kind: str | None, settings: ClusterSettings, queue: str | None
) -> tuple[str | None, str] | None:
    """Run:ai reads a pod's preemptibility, its priority class and its queue from the pod's owners
    before the pod (`kinds.kai_owner`): an owner label that says otherwise than the pods are
    labelled would win over ours. A CronJob's Jobs carry its job template's labels and
    annotations, and Run:ai reads a CronJob's pods from their Job, so those are read too.

    (family, message): the family is `PREEMPTIBILITY` for a label overriding the preemptibility
    or Run:ai priority class the platform gives (warn mode may admit it), None for a refusal of
    every mode (another project's queue, the pod grouper kept away)."""
    metas = [_map(obj.get("metadata"))]
    if kind == "CronJob":
        metas.append(_map(_map(_map(obj.get("spec")).get("jobTemplate")).get("metadata")))
    for meta in metas:
        found = _owner_meta_error(meta, pod_kind, settings, queue)
        if found is not None:
            family, error = found
            return family, error if meta is metas[0] else f"its job template's {error}"
    return None


def _owner_meta_error(
    meta: Mapping[str, Any], pod_kind: str | None, settings: ClusterSettings, queue: str | None
) -> tuple[str | None, str] | None:
    labels = _map(meta.get("labels"))
    runai = settings.scheduler.runai
    said = labels.get(runai.preemptibility_label) if runai.preemptibility_label else None
    wanted = intended(pod_kind, settings)
    if said is not None and said != wanted:
        return PREEMPTIBILITY, (
            f"label {runai.preemptibility_label}={str(said)[:60]} on this object would make Run:ai treat its pods "
            f"({pod_kind or 'of no known kind'}) as {said}; the platform makes them {wanted}: remove the label"
        )
    named = labels.get(RUNAI_PRIORITY_LABEL)
    ours = runai.priority_classes.get(pod_kind or "unknown")
    if named is not None and not runai.preemptibility_label and named != ours:
        return PREEMPTIBILITY, (
            f"label {RUNAI_PRIORITY_LABEL}={str(named)[:60]} on this object would give its pods Run:ai priority class "
            f"{named} instead of {ours}: remove the label"
        )
    owner_queue = labels.get(RUNAI_QUEUE_LABEL)
    if owner_queue is not None and owner_queue != queue:
        return None, (
            f"label {RUNAI_QUEUE_LABEL}={str(owner_queue)[:63]} on this object would put its pods in that Run:ai queue "
            f"instead of {queue or 'the one of this project'}: remove the label"
        )
    if str(_map(meta.get("annotations")).get(SKIP_POD_GROUPER_ANNOTATION, "")) == "true":
        return None, (
            f"annotation {SKIP_POD_GROUPER_ANNOTATION}: true keeps Run:ai's pod grouper away from its pods, and so "
            "the preemptibility the platform gives them: remove the annotation"
        )
    return None


def _controlled_by_checked_owner(obj: Mapping[str, Any]) -> bool:
    owner = kai_owner(_map(obj.get("metadata")))
    return owner is not None and owner.controller and (owner.group, owner.kind) in CHECKED_OWNERS


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    """A pod owner write this check reads: the object that carries the template, and the replica
    counts before and after (the scale subresource carries the counts but not the template)."""

    kind: str  # Deployment, StatefulSet, ...
    name: str
    owner: Mapping[str, Any]  # the object with the pod template
    old: Mapping[str, Any] | None  # the old owner (UPDATE), None on CREATE
    new_replicas: int | None = None  # from a Scale; None: from the owner
    old_replicas: int | None = None


def workload_request(request: Mapping[str, Any], parent: Mapping[str, Any] | None = None) -> WorkloadRequest | None:
    """The pod owner write in this request, or None when it is not one this check reads.

    For `<workloads>/scale`, `parent` is the owner object (the Scale has no pod template); without
    it the scale is not checked here.
    """
    operation = request.get("operation")
    if operation not in ("CREATE", "UPDATE"):
        return None
    obj = _map(request.get("object"))
    old = _map(request.get("oldObject")) if operation == "UPDATE" else None
    sub = request.get("subResource") or ""
    if sub == "scale":
        resource = _map(request.get("resource")).get("resource", "")
        if operation != "UPDATE" or resource not in SCALABLE or parent is None:
            return None
        return WorkloadRequest(
            kind=SCALABLE[resource][1],
            name=str(request.get("name") or _map(obj.get("metadata")).get("name") or ""),
            owner=parent,
            old=parent,
            new_replicas=_count(_map(obj.get("spec")).get("replicas"), 0),
            old_replicas=_count(_map((old or {}).get("spec")).get("replicas"), 0),
        )
    if sub:
        return None  # status and other subresources do not change what the pods ask for
    kind = _map(request.get("kind"))
    key = (str(kind.get("group", "")), str(kind.get("kind", "")))
    if key not in WORKLOAD_KINDS or not obj:
        return None
    return WorkloadRequest(
        kind=key[1], name=str(_map(obj.get("metadata")).get("name") or request.get("name") or ""), owner=obj, old=old
    )


def unseen_workload_namespace(request: Mapping[str, Any], snapshot: ClusterSnapshot) -> str | None:
    """The namespace of a pod owner write this check reads that the snapshot has no record of: the
    apiserver sends them only from project namespaces, so it is one this replica has not seen yet
    (a namespace and its Deployment in one `kubectl apply`)."""
    if workload_request(request) is None:
        return None
    name = request_namespace(request)
    return name if name and name not in snapshot.namespaces else None


def is_scale(request: Mapping[str, Any]) -> bool:
    return request.get("subResource") == "scale" and _map(request.get("resource")).get("resource") in SCALABLE


def scale_up(request: Mapping[str, Any]) -> bool:
    """A scale subresource UPDATE to more replicas: the only scale that can ask for more GPUs."""
    if not is_scale(request) or request.get("operation") != "UPDATE":
        return False
    new = _count(_map(_map(request.get("object")).get("spec")).get("replicas"), 0)
    old = _count(_map(_map(request.get("oldObject")).get("spec")).get("replicas"), 0)
    return new > old


def project_to_be(namespace: NamespaceInfo, snapshot: ClusterSnapshot, now: float) -> RunaiProjectInfo | None:
    """The Run:ai project this system creates (or created moments ago) for a project namespace
    whose record the directory does not have yet: `run_ai_project_gpu_quota` deserved GPUs,
    nothing allocated. So a Deployment applied together with its namespace is judged at apply
    time, as it is once the binding lands.

    None when that cannot be known here: Run:ai was unreachable at the last refresh (a Run:ai
    project bound to the namespace, which binding would adopt with its own quota, could be
    missing from the directory), or the namespace is bound without this system's project-id label
    (adopted: the quota is that project's, not the setting's)."""
    if snapshot.runai_reachable is not True:
        return None
    if namespace.runai_queue is not None and namespace.runai_project_id is None:
        return None
    return RunaiProjectInfo(
        id=namespace.runai_project_id or "",
        name=namespace.runai_queue or namespace.name,
        namespace=namespace.name,
        deserved_gpus=snapshot.settings.run_ai_project_gpu_quota,
        sampled_at=now,
    )


def validate_workload(
    request: Mapping[str, Any],
    snapshot: ClusterSnapshot,
    now: float = 0.0,
    parent: Mapping[str, Any] | None = None,
) -> Decision:
    settings = snapshot.settings
    if not settings.run_ai_enable:
        return scale_refusal(request, snapshot) or statefulset_warning(request, snapshot) or Decision.allow()
    namespace = snapshot.namespaces.get(request_namespace(request))
    if namespace is None or not namespace.is_project:
        return Decision.allow()
    if is_scale(request) and parent is None:
        if not scale_up(request):
            return Decision.allow()
        return Decision.allow(warnings=["GPU quota not checked for this scale: its pods are checked when they start"])
    target = workload_request(request, parent)
    if target is None or _controlled_by_checked_owner(target.owner):
        return Decision.allow()
    unseen = unreviewed_owner(_map(target.owner.get("metadata")))
    if unseen is not None:
        return Decision.deny(f"{target.kind} {target.name}: {unseen}", code=403, reason=Reason.FORBIDDEN)
    classes = snapshot.priority_classes
    try:
        new = demand(target.owner, target.kind, settings, classes, target.new_replicas)
        old = demand(target.old, target.kind, settings, classes, target.old_replicas) if target.old else None
    except ValueError as exc:
        return Decision.deny(f"GPU request in the pod template: {exc}", code=400, reason=Reason.INVALID)
    labelled = owner_label_error(target.owner, target.kind, new.kind, settings, namespace.runai_queue)
    if labelled is not None:
        family, error = labelled
        message = f"{target.kind} {target.name}: {error}"
        if family is None or not warns(settings, family):
            return Decision.deny(message, code=403, reason=Reason.FORBIDDEN)
        # In warn mode the quota is still checked, as with an owner that carries no such label. An
        # update of an owner that said the same before is not counted again: controllers update
        # the objects they own (a Deployment's revision annotation) without anyone asking for it.
        before = None
        if target.old is not None:
            before = owner_label_error(
                target.old, target.kind, old.kind if old else new.kind, settings, namespace.runai_queue
            )
        decision = _demand_decision(target, namespace, snapshot, new, old, now)
        return with_would_refuse(decision, [(family, message)], count=before != labelled)
    return _demand_decision(target, namespace, snapshot, new, old, now)


def _demand_decision(
    target: WorkloadRequest,
    namespace: NamespaceInfo,
    snapshot: ClusterSnapshot,
    new: Demand,
    old: Demand | None,
    now: float,
) -> Decision:
    """The owner's GPUs against its project's quota (R3)."""
    if new.quota_checked and new.claims and new.replicas > 0:
        what = f"the pods of {target.kind} {target.name}"
        return Decision.deny(uncounted_claims_message(what, list(new.claims)), code=403, reason=Reason.FORBIDDEN)
    increase = new.total - (old.total if old is not None else 0.0)
    if increase <= EPSILON:
        return Decision.allow()  # jobs, no GPUs, unchanged or scaled down: nothing more asked
    ns = namespace.name
    more = " more" if old is not None and old.total > 0 else ""
    asks = (
        f"{target.kind} {target.name} ({new.kind or 'pods of no known kind'}) asks for "
        f"{format_gpus(increase)}{more} "
        f"({new.replicas} × {format_gpus(new.gpus_per_pod)} GPUs). Lower its replicas, stop another GPU "
        "workload or ask an administrator for more Run:ai quota"
    )
    if namespace.runai_queue is None and ns not in (snapshot.runai_projects or {}):
        # Binding calls Run:ai; the pods do it when they start (and are refused if it fails). The
        # quota is known already when this system will create the project (`project_to_be`).
        to_be = project_to_be(namespace, snapshot, now)
        if to_be is None:
            return Decision.allow(
                warnings=[f"project {ns} is not bound to Run:ai yet: GPU quota is checked when its pods start"]
            )
        return check_quota(snapshot, ns, increase, now, asks=asks, project=to_be)
    # Bound, or about to adopt a Run:ai project bound to the namespace: the snapshot has its record.
    decision = check_quota(snapshot, ns, increase, now, asks=asks)
    if decision.reason == Reason.RUNAI_PROJECT_NOT_KNOWN_HERE and (to_be := project_to_be(namespace, snapshot, now)):
        return check_quota(snapshot, ns, increase, now, asks=asks, project=to_be)
    if decision.reason == Reason.RUNAI_PROJECT_NOT_KNOWN_HERE:
        # This check makes no remote call; the pods look the project up when they start.
        return Decision.allow(
            warnings=[
                f"GPU quota not checked yet: project {ns} was bound to Run:ai moments ago; its pods are "
                "checked when they start"
            ]
        )
    return decision
