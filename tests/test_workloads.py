"""R3 at `kubectl apply` time: pod owners asking for replicas × GPUs beyond what the project has left.

Table tests of the pure `validate_workload`, built from the real Deployment fixtures. The scale
subresource carries no pod template: with its owner given (`parent`) it is checked, without it (the
server's case: no read on the request path) it is allowed with a warning.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.cluster import cluster_state, namespace
from tests.support.reviews import assert_decision, review
from webhook.core.decision import Reason
from webhook.core.workloads import validate_workload
from webhook.snapshot import GpuReservation, RunaiProjectInfo
from webhook.state.store import ClusterState

NOW = 1_000_000.0
BOUND = namespace("vision", labels={"runai/queue": "vision", "hopsworks.ai/runai-project-id": "7"})
UNBOUND = namespace("nlp")
ADOPTED = namespace("cv", labels={"runai/queue": "cv"})  # bound to a Run:ai project it did not create
DEPLOYMENT_KIND = {"hopsworks.ai/workload-type": "deployment"}
UNSET = object()

Request = dict[str, Any]


def set_template(obj: dict[str, Any], *, replicas: Any, gpus: float | None, labels: dict[str, str] | None,
                 annotations: dict[str, str] | None) -> None:  # fmt: skip
    spec = obj["spec"]
    if replicas is None:
        spec.pop("replicas", None)
    elif replicas is not UNSET:
        spec["replicas"] = replicas
    template = spec["template"]
    meta = template.setdefault("metadata", {})
    if labels:
        meta.setdefault("labels", {}).update(labels)
    if annotations:
        meta.setdefault("annotations", {}).update(annotations)
    if gpus is not None:
        limits = template["spec"]["containers"][0].setdefault("resources", {}).setdefault("limits", {})
        limits["nvidia.com/gpu"] = str(gpus)


def workload(
    base: str = "deployment-create.json",
    *,
    ns: str = "vision",
    replicas: Any = UNSET,
    gpus: float | None = 1,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    old_replicas: Any = UNSET,
    old_gpus: float | None = None,
    dry_run: bool = False,
) -> Request:
    """A real Deployment review moved into `ns`, with the pod template asking for `gpus`."""
    request = review(base)["request"]
    request["namespace"] = ns
    request["dryRun"] = dry_run
    labels = DEPLOYMENT_KIND if labels is None else labels
    obj = request["object"]
    if "namespace" in obj["metadata"]:
        obj["metadata"]["namespace"] = ns
    set_template(obj, replicas=replicas, gpus=gpus, labels=labels, annotations=annotations)
    if request.get("oldObject"):
        old = request["oldObject"]
        old["metadata"]["namespace"] = ns
        set_template(old, replicas=old_replicas, gpus=old_gpus, labels=labels, annotations=annotations)
    return request


def as_kind(request: Request, group: str, kind: str, resource: str) -> Request:
    request["kind"] = {"group": group, "version": "v1", "kind": kind}
    request["resource"] = {"group": group, "version": "v1", "resource": resource}
    for key in ("object", "oldObject"):
        if request.get(key):
            request[key]["apiVersion"] = f"{group}/v1" if group else "v1"
            request[key]["kind"] = kind
    return request


def as_job(request: Request, parallelism: int | None = None, completions: int | None = None) -> Request:
    request = as_kind(request, "batch", "Job", "jobs")
    spec = request["object"]["spec"]
    spec.pop("replicas", None)
    spec.pop("selector", None)
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if completions is not None:
        spec["completions"] = completions
    return request


def as_cronjob(request: Request) -> Request:
    request = as_job(request, parallelism=4)
    job_spec = request["object"].pop("spec")
    request["object"]["spec"] = {"schedule": "*/5 * * * *", "jobTemplate": {"spec": job_spec}}
    return as_kind(request, "batch", "CronJob", "cronjobs")


def owned_by(request: Request, kind: str) -> Request:
    request["object"]["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": kind, "name": "api", "uid": "u-1", "controller": True}
    ]
    return request


def first_owned_by(request: Request, api_version: str, kind: str, *, controller: bool = False) -> Request:
    """`request`'s object with one more ownerReference, put first: the one Run:ai's pod grouper reads."""
    refs = request["object"]["metadata"].setdefault("ownerReferences", [])
    refs.insert(0, {"apiVersion": api_version, "kind": kind, "name": "x", "uid": "u-x", "controller": controller})
    return request


def labelled(request: Request, labels: dict[str, str], annotations: dict[str, str] | None = None) -> Request:
    """`request`'s object with these labels (and annotations) of its own (not its template's)."""
    meta = request["object"]["metadata"]
    meta.setdefault("labels", {}).update(labels)
    meta.setdefault("annotations", {}).update(annotations or {})
    return request


def job_template_labelled(
    request: Request, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> Request:
    """A CronJob whose job template carries these labels (and annotations): its Jobs' own."""
    template = request["object"]["spec"]["jobTemplate"]
    template["metadata"] = {"labels": labels, "annotations": annotations or {}}
    return request


def template_spec(request: Request, **fields: Any) -> Request:
    request["object"]["spec"]["template"]["spec"].update(fields)
    return request


def template_resources(request: Request, limits: dict[str, str]) -> Request:
    container = request["object"]["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"limits": limits}
    return request


DRA = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}
NON_PREEMPTIBLE = {"kai.scheduler/preemptibility": "non-preemptible"}


def scale(old: int, new: int, ns: str = "vision", name: str = "api", resource: str = "deployments") -> Request:
    """A `kubectl scale` as the apiserver sends it: UPDATE of the scale subresource, autoscaling/v1 Scale."""

    def obj(replicas: int) -> dict[str, Any]:
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas},
            "status": {"replicas": old, "selector": "app=api"},
        }

    request = review("deployment-create.json")["request"]
    request.update(
        kind={"group": "autoscaling", "version": "v1", "kind": "Scale"},
        resource={"group": "apps", "version": "v1", "resource": resource},
        subResource="scale",
        operation="UPDATE",
        namespace=ns,
        name=name,
        object=obj(new),
        oldObject=obj(old),
    )
    return request


def parent_deployment(gpus: float, replicas: int = 1) -> dict[str, Any]:
    obj = copy.deepcopy(review("deployment-create.json")["request"]["object"])
    obj["metadata"]["namespace"] = "vision"
    set_template(obj, replicas=replicas, gpus=gpus, labels=DEPLOYMENT_KIND, annotations=None)
    return obj


def running_pod(name: str, gpus: float, kind: str = "notebook") -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "vision", "uid": f"uid-{name}",
                     "labels": {"hopsworks.ai/workload-type": kind}},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


def status_update() -> Request:
    request = workload("reqonly-deployment-update-oldobject.json", replicas=9, old_replicas=1, gpus=4, old_gpus=4)
    request["subResource"] = "status"
    return request


def delete() -> Request:
    request = workload("reqonly-deployment-update-oldobject.json", replicas=9, gpus=4)
    request["operation"] = "DELETE"
    return request


@dataclass
class Case:
    id: str
    request: Callable[[], Request]
    deserved: float | None = 4
    reachable: bool | None = True  # what the last Run:ai directory refresh found
    used: float = 0  # GPUs of running notebooks in the project
    reserved: float = 0  # GPUs reserved for pods the cache does not show yet
    run_ai: bool = True
    parent: dict[str, Any] | None = None
    allowed: bool = True
    reason: str = ""
    message: tuple[str, ...] = ()
    warning: str = ""
    audit: dict[str, str] = field(default_factory=dict)
    new_project_quota: float = 0  # run_ai_project_gpu_quota: what a project this system creates gets
    adoptable: float | None = None  # deserved GPUs of a Run:ai project bound to the unbound nlp


CASES = [
    Case("Run:ai off: nothing checked", lambda: workload(replicas=8, gpus=8), run_ai=False),
    Case("not a project namespace", lambda: workload(ns="kube-system", replicas=8, gpus=8)),
    Case("create within quota", lambda: workload(replicas=2, gpus=1), audit={"gpus": "2", "gpus-left": "2"}),
    Case(
        "create: replicas × GPUs beyond what is left is refused",
        lambda: workload(replicas=3, gpus=2),
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
        message=("4 of 4 deserved GPUs left", "Deployment api (deployment) asks for 6", "3 × 2 GPUs"),
    ),
    Case(
        "create: running pods and reservations count",
        lambda: workload(replicas=2, gpus=1),
        used=2,
        reserved=1,
        allowed=False,
        message=("1 of 4 deserved GPUs left",),
    ),
    Case("create: exactly what is left fits", lambda: workload(replicas=2, gpus=1), used=2),
    Case("replicas nil means 1", lambda: workload(replicas=None, gpus=1), deserved=1),
    Case(
        "replicas nil means 1, not 0",
        lambda: workload(replicas=None, gpus=2),
        deserved=1,
        allowed=False,
        message=("asks for 2 ", "1 × 2 GPUs"),
    ),
    Case("replicas 0 asks for nothing", lambda: workload(replicas=0, gpus=8), deserved=0),
    Case(
        "create from the priorityclass fixture (namespace only on the request)",
        lambda: workload("reqonly-deployment-create-priorityclass.json", replicas=5, gpus=1),
        allowed=False,
        message=("Deployment deployment (deployment) asks for 5",),
    ),
    Case(
        "update: scale up counts only the increase",
        lambda: workload("reqonly-deployment-update-oldobject.json", old_replicas=1, replicas=3, gpus=1, old_gpus=1),
        deserved=2,
        used=1,  # the old replica's pod
        allowed=False,
        message=("1 of 2 deserved GPUs left", "asks for 2 more"),
    ),
    Case(
        "update: scale up within what is left",
        lambda: workload("reqonly-deployment-update-oldobject.json", old_replicas=1, replicas=2, gpus=1, old_gpus=1),
        deserved=2,
        used=1,
        audit={"gpus": "1", "gpus-left": "0"},
    ),
    Case(
        "update: scale down is allowed even over quota",
        lambda: workload("reqonly-deployment-update-oldobject.json", old_replicas=4, replicas=2, gpus=1, old_gpus=1),
        deserved=2,
        used=4,
    ),
    Case(
        "update: unchanged replicas ask for nothing more",
        lambda: workload("reqonly-deployment-update-oldobject.json", old_replicas=3, replicas=3, gpus=1, old_gpus=1),
        deserved=0,
        used=3,
    ),
    Case(
        "update: more GPUs per pod is an increase",
        lambda: workload("reqonly-deployment-update-oldobject.json", old_replicas=2, replicas=2, gpus=2, old_gpus=1),
        deserved=3,
        used=2,
        allowed=False,
        message=("1 of 3 deserved GPUs left", "asks for 2 more"),
    ),
    Case(
        "StatefulSet is checked like a Deployment",
        lambda: as_kind(workload(replicas=5, gpus=1), "apps", "StatefulSet", "statefulsets"),
        allowed=False,
        message=("StatefulSet api",),
    ),
    Case(
        "ReplicaSet of its own is checked",
        lambda: as_kind(workload(replicas=5, gpus=1), "apps", "ReplicaSet", "replicasets"),
        allowed=False,
    ),
    Case(
        "ReplicaSet controlled by a Deployment is not checked again (rollouts keep working)",
        lambda: owned_by(as_kind(workload(replicas=5, gpus=1), "apps", "ReplicaSet", "replicasets"), "Deployment"),
    ),
    # Owners as Run:ai's pod grouper reads them: the first ownerReference, with its API group.
    Case(
        "ReplicaSet controlled by a Deployment of another API group is checked",
        lambda: first_owned_by(
            as_kind(workload(replicas=5, gpus=1), "apps", "ReplicaSet", "replicasets"),
            "example.com/v1",
            "Deployment",
            controller=True,
        ),
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
    ),
    Case(
        "ReplicaSet whose first owner is a ConfigMap, its Deployment second, is refused",
        lambda: first_owned_by(
            owned_by(as_kind(workload(replicas=1, gpus=1), "apps", "ReplicaSet", "replicasets"), "Deployment"),
            "v1",
            "ConfigMap",
        ),
        allowed=False,
        reason=Reason.FORBIDDEN,
        message=("ReplicaSet api: its first ownerReference is ConfigMap x", "never reviews"),
    ),
    Case(
        "Job whose first owner is a ConfigMap is refused",
        lambda: first_owned_by(as_job(workload(gpus=4, labels={"job-name": "train"})), "v1", "ConfigMap"),
        deserved=0,
        allowed=False,
        reason=Reason.FORBIDDEN,
        message=("Job api: its first ownerReference is ConfigMap x",),
    ),
    Case(
        "Job of a JobSet (a custom resource) is not judged here",
        lambda: first_owned_by(
            as_job(workload(gpus=4, labels={"job-name": "train"})),
            "jobset.x-k8s.io/v1alpha2",
            "JobSet",
            controller=True,
        ),
        deserved=0,
    ),
    Case(
        "Deployment labelled with another project's Run:ai queue is refused",
        lambda: labelled(workload(replicas=1, gpus=1), {"runai/queue": "other"}),
        allowed=False,
        reason=Reason.FORBIDDEN,
        message=("label runai/queue=other on this object would put its pods in that Run:ai queue instead of vision",),
    ),
    Case(
        "Deployment labelled with its own project's queue passes",
        lambda: labelled(workload(replicas=1, gpus=1), {"runai/queue": "vision"}),
    ),
    Case(
        "ReplicaSet of its own labelled preemptible while its pods are not is refused",
        lambda: labelled(
            as_kind(workload(replicas=1, gpus=1, labels={}), "apps", "ReplicaSet", "replicasets"),
            {"kai.scheduler/preemptibility": "preemptible"},
        ),
        allowed=False,
        reason=Reason.FORBIDDEN,
        message=("label kai.scheduler/preemptibility=preemptible on this object",),
    ),
    Case(
        "CronJob labelled non-preemptible is refused",
        lambda: labelled(as_cronjob(workload(gpus=4, labels={"job-name": "train"})), NON_PREEMPTIBLE),
        deserved=0,
        allowed=False,
        reason=Reason.FORBIDDEN,
        message=("CronJob api: label kai.scheduler/preemptibility=non-preemptible",),
    ),
    Case(
        "CronJob whose job template is labelled non-preemptible is refused: its Jobs carry the label",
        lambda: job_template_labelled(as_cronjob(workload(gpus=4, labels={"job-name": "train"})), NON_PREEMPTIBLE),
        deserved=0,
        allowed=False,
        reason=Reason.FORBIDDEN,
        message=("CronJob api: its job template's label kai.scheduler/preemptibility=non-preemptible",),
    ),
    Case(
        "CronJob whose job template skips the pod grouper is refused",
        lambda: job_template_labelled(
            as_cronjob(workload(gpus=4, labels={"job-name": "train"})), {}, {"kai.scheduler/skip-podgrouper": "true"}
        ),
        deserved=0,
        allowed=False,
        reason=Reason.FORBIDDEN,
        message=("its job template's annotation kai.scheduler/skip-podgrouper",),
    ),
    Case(
        "DaemonSet is checked, as one pod",
        lambda: as_kind(workload(replicas=None, gpus=5), "apps", "DaemonSet", "daemonsets"),
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
        message=("DaemonSet api", "1 × 5 GPUs"),
    ),
    Case(
        "ReplicationController is checked like a ReplicaSet",
        lambda: as_kind(workload(replicas=5, gpus=1), "", "ReplicationController", "replicationcontrollers"),
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
        message=("ReplicationController api",),
    ),
    # GPUs as the scheduler counts them (tests/test_quota.py has the pod's side).
    Case(
        "MIG instances in the template count their slices",
        lambda: template_resources(workload(replicas=2, gpus=None), {"nvidia.com/mig-2g.10gb": "1"}),
        deserved=3,
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
        message=("asks for 4 ", "2 × 2 GPUs"),
    ),
    Case(
        "DRA claims in a Deployment's template are refused: their GPUs cannot be counted",
        lambda: template_spec(workload(replicas=1, gpus=None), **DRA),
        allowed=False,
        reason=Reason.FORBIDDEN,
        message=("DRA resource claims of the pods of Deployment api (gpu)", "cannot be counted"),
    ),
    Case(
        "a Job's DRA claims pass: jobs are never checked",
        lambda: template_spec(as_job(workload(gpus=None, labels={"job-name": "train"})), **DRA),
        deserved=0,
    ),
    Case(
        "Job is never checked",
        lambda: as_job(workload(gpus=4, labels={"job-name": "train"}), parallelism=8),
        deserved=0,
    ),
    Case("CronJob is never checked", lambda: as_cronjob(workload(gpus=4, labels={"job-name": "train"})), deserved=0),
    Case("a Job's unlabelled pods are jobs too", lambda: as_job(workload(gpus=4, labels={})), deserved=0),
    Case(
        "a Deployment whose pods say they are jobs is checked (only the Job controller makes jobs)",
        lambda: workload(replicas=3, gpus=2, labels={"job-name": "train", "hopsworks.ai/workload-type": "job"}),
        allowed=False,
        message=("pods of no known kind", "asks for 6 "),
    ),
    Case(
        "a Job whose pods are notebooks counts parallelism, capped by completions",
        lambda: as_job(
            workload(gpus=1, labels={"hopsworks.ai/workload-type": "notebook"}), parallelism=8, completions=3
        ),
        deserved=2,
        allowed=False,
        message=("asks for 3 ", "3 × 1 GPUs"),
    ),
    Case(
        "template without a workload kind is checked (its pods are too)",
        lambda: workload(replicas=8, gpus=8, labels={}),
        allowed=False,
        message=("asks for 64 ",),
    ),
    Case(
        "GPU fractions in template annotations count",
        lambda: workload(replicas=3, gpus=None, annotations={"gpu-fraction": "0.5"}),
        deserved=2,
        used=1,
        allowed=False,
        message=("1 of 2 deserved GPUs left", "asks for 1.5", "3 × 0.5 GPUs"),
    ),
    Case(
        "GPU fractions within what is left",
        lambda: workload(replicas=2, gpus=None, annotations={"gpu-fraction": "0.5"}),
        deserved=2,
        used=1,
        audit={"gpus": "1", "gpus-left": "0"},
    ),
    Case(
        "malformed fraction is a clear 400",
        lambda: workload(replicas=1, gpus=None, annotations={"gpu-fraction": "lots"}),
        allowed=False,
        reason="Invalid",
        message=("GPU request in the pod template", "lots"),
    ),
    Case("no GPUs: nothing checked", lambda: workload(replicas=50, gpus=None), deserved=0),
    Case(
        "unbound project this system will create: judged at apply time against run_ai_project_gpu_quota",
        lambda: workload(ns="nlp", replicas=3, gpus=1),
        new_project_quota=2,
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
        message=("project nlp has 2 of 2 deserved GPUs left", "asks for 3 (3 × 1 GPUs)"),
    ),
    Case(
        "unbound project this system will create: within run_ai_project_gpu_quota",
        lambda: workload(ns="nlp", replicas=2, gpus=1),
        new_project_quota=2,
        audit={"gpus": "2", "gpus-left": "0"},
    ),
    Case(
        "unbound project that will adopt a Run:ai project bound to it: that project's quota",
        lambda: workload(ns="nlp", replicas=3, gpus=1),
        new_project_quota=8,
        adoptable=1,
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
        message=("project nlp has 1 of 1 deserved GPUs left",),
    ),
    Case(
        "unbound project, Run:ai unreachable at the last refresh: allowed with a warning, pods bind it",
        lambda: workload(ns="nlp", replicas=8, gpus=8),
        reachable=False,
        warning="not bound to Run:ai yet",
    ),
    Case(
        "Run:ai unreachable: allowed with a warning",
        lambda: workload(replicas=8, gpus=8),
        deserved=None,
        reachable=False,
        warning="not checked",
    ),
    Case(
        "project this system bound since the last refresh: judged against run_ai_project_gpu_quota",
        lambda: workload(replicas=8, gpus=8),
        deserved=None,
        new_project_quota=2,
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
        message=("project vision has 2 of 2 deserved GPUs left",),
    ),
    Case(
        "project adopted since the last refresh: allowed with a warning, its pods look it up",
        lambda: workload(ns="cv", replicas=8, gpus=8),
        deserved=None,
        new_project_quota=64,
        warning="its pods are checked when they start",
    ),
    Case("DELETE passes", delete, deserved=0),
    Case("status subresource passes", status_update, deserved=0),
    Case(
        "dryRun gets the same answer (no side effects here)",
        lambda: workload(replicas=5, gpus=1, dry_run=True),
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
    ),
    Case(
        "scale subresource: scale up beyond what is left",
        lambda: scale(1, 3),
        parent=parent_deployment(gpus=1),
        deserved=2,
        used=1,
        allowed=False,
        message=("1 of 2 deserved GPUs left", "asks for 2 more", "3 × 1 GPUs"),
    ),
    Case("scale subresource: scale down", lambda: scale(3, 1), parent=parent_deployment(gpus=1), deserved=0, used=3),
    Case("scale subresource down without the owner: nothing to check", lambda: scale(3, 1), deserved=0, used=3),
    Case(
        "scale subresource without the owner: allowed with a warning",
        lambda: scale(1, 30),
        deserved=0,
        warning="not checked for this scale",
    ),
]


def state_for(case: Case) -> ClusterState:
    pods = [running_pod(f"p{i}", 1) for i in range(int(case.used))]
    state = cluster_state(
        namespaces=[BOUND, UNBOUND, ADOPTED],
        extra=pods,
        run_ai_enable=case.run_ai,
        run_ai_project_gpu_quota=case.new_project_quota,
    )
    snap = state.snapshot()
    snap.runai_reachable = case.reachable
    projects = {}
    if case.deserved is not None:
        projects["vision"] = RunaiProjectInfo(id="7", name="vision", namespace="vision", deserved_gpus=case.deserved)
    if case.adoptable is not None:
        projects["nlp"] = RunaiProjectInfo(id="9", name="nlp-old", namespace="nlp", deserved_gpus=case.adoptable)
    if projects:
        snap.runai_projects = projects
    if case.reserved:
        snap.gpu_reservations = {"vision": {"r": GpuReservation("r", "vision", case.reserved, expires_at=NOW + 60)}}
    return state


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_workload_quota(case: Case) -> None:
    state = state_for(case)
    decision = validate_workload(case.request(), state.snapshot(), NOW, case.parent)
    assert_decision(decision, allowed=case.allowed, reason=case.reason, message=case.message, warning=case.warning)
    if case.audit:
        assert dict(decision.audit) == case.audit


def test_fixtures_are_not_changed_by_the_builders() -> None:
    before = review("reqonly-deployment-update-oldobject.json")
    workload("reqonly-deployment-update-oldobject.json", replicas=7, gpus=3)
    assert review("reqonly-deployment-update-oldobject.json") == before
