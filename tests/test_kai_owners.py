"""Owners read as Run:ai's pod grouper reads them: the first ownerReference, up to the top.

KAI v0.17.0 takes a pod's preemptibility from the labels of its owners before its own, following
`ownerReferences[0]` whatever its kind and whether or not it is the controller. The platform
decides what a pod is (a job, preemptible, or not) from the owner `core.kinds.kai_owner` reads,
and refuses a pod whose first owner is an object of Kubernetes' own kinds whose labels it never
reviews. Each row is one pod asking for 8 GPUs in a project with 2 deserved: the promise is that
no pod Run:ai reads as non-preemptible starts unchecked. `checked` says how KAI's pod grouper reads
the row's pod (read in `pkg/podgrouper` of v0.17.0); tests/e2e/test_kai.py shows the grouper's
real PodGroups for the kinds of owner a project's pods have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.cluster import cluster_state, namespace
from tests.support.reviews import apply_patch, assert_decision, pod_review
from webhook.core.decision import Reason
from webhook.core.kinds import kai_owner, pod_controller
from webhook.core.preemptibility import unreviewed_owner
from webhook.core.quota import validate_pod
from webhook.core.scheduling import mutate_pod
from webhook.snapshot import RunaiProjectInfo

BOUND = namespace("vision", labels={"runai/queue": "vision", "hopsworks.ai/runai-project-id": "7"})
LABEL = "kai.scheduler/preemptibility"


def obj(api_version: str, kind: str, name: str, labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": "vision", "uid": f"uid-{kind}-{name}", "labels": labels or {}, **meta},
    }


def ref(owner: dict[str, Any], *, controller: bool = False) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
    }


JOB = obj("batch/v1", "Job", "train")
CONFIGMAP_NON_PREEMPTIBLE = obj("v1", "ConfigMap", "cm", {LABEL: "non-preemptible"})
CONFIGMAP_QUEUE = obj("v1", "ConfigMap", "cm", {"runai/queue": "other-project"})
SECRET = obj("v1", "Secret", "s", {LABEL: "non-preemptible"})
ROLE = obj("rbac.authorization.k8s.io/v1", "Role", "r", {LABEL: "non-preemptible"})
RAYCLUSTER = obj("ray.io/v1", "RayCluster", "rc", {LABEL: "non-preemptible"})
JOBSET = obj("jobset.x-k8s.io/v1alpha2", "JobSet", "js")
OTHER_JOB = obj("example.com/v1", "Job", "train")
REPLICASET = obj("apps/v1", "ReplicaSet", "api-1")
DRIVER = obj("v1", "Pod", "driver")


@dataclass
class Case:
    id: str
    owners: list[dict[str, Any]]  # the pod's ownerReferences
    objects: list[dict[str, Any]] = field(default_factory=list)  # what they point at, with labels
    labels: dict[str, str] = field(default_factory=lambda: {"job-name": "train"})
    kind: str | None = None  # the platform's workload kind of the pod
    refused: str = ""  # in the refusal of a pod whose first owner is never reviewed
    checked: bool = True  # held to the quota (refused here: 8 GPUs against 2)


CASES = [
    Case("no owner: the pod's labels", [], labels={"jupyter": "true"}, kind="notebook"),
    Case("a Job's pod is a job", [ref(JOB, controller=True)], [JOB], kind="job", checked=False),
    Case(
        "issue: [ConfigMap labelled non-preemptible, Job (controller)] is refused, not a job over quota",
        [ref(CONFIGMAP_NON_PREEMPTIBLE), ref(JOB, controller=True)],
        [CONFIGMAP_NON_PREEMPTIBLE, JOB],
        refused="first ownerReference is ConfigMap cm",
    ),
    Case(
        "a ConfigMap labelled with another project's queue as the only owner is refused",
        [ref(CONFIGMAP_QUEUE, controller=True)],
        [CONFIGMAP_QUEUE],
        refused="first ownerReference is ConfigMap cm",
    ),
    Case(
        "a Secret first is refused",
        [ref(SECRET), ref(JOB, controller=True)],
        [SECRET, JOB],
        refused="Secret s",
    ),
    Case(
        "a Role (rbac.authorization.k8s.io) first is refused",
        [ref(ROLE), ref(JOB, controller=True)],
        [ROLE, JOB],
        refused="Role r",
    ),
    Case(
        "a custom resource first that is not the controller: no job, so checked as Run:ai reads it",
        [ref(RAYCLUSTER), ref(JOB, controller=True)],
        [RAYCLUSTER, JOB],
    ),
    Case(
        "a Job reference that is not the controller makes no job",
        [ref(JOB)],
        [JOB],
    ),
    Case(
        "a Job first but the controller second makes no job",
        [ref(JOB), ref(REPLICASET, controller=True)],
        [JOB, REPLICASET],
    ),
    Case("a Job of another API group is no batch Job", [ref(OTHER_JOB, controller=True)], [OTHER_JOB]),
    Case(
        "a JobSet (a custom resource) first is not judged here",
        [ref(JOBSET, controller=True)],
        [JOBSET],
    ),
    Case(
        "a ReplicaSet's pod is reviewed through its ReplicaSet",
        [ref(REPLICASET, controller=True)],
        [REPLICASET],
        labels={"hopsworks.ai/workload-type": "deployment"},
        kind="deployment",
    ),
    Case("an executor owned by its driver pod", [ref(DRIVER, controller=True)], [DRIVER], labels={}),
]


def snapshot() -> Any:
    state = cluster_state(namespaces=[BOUND], run_ai_enable=True)
    snap = state.snapshot()
    snap.runai_reachable = True
    snap.runai_projects = {"vision": RunaiProjectInfo(id="7", name="vision", namespace="vision", deserved_gpus=2)}
    return snap


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_owners_as_run_ai_reads_them(case: Case) -> None:
    snap = snapshot()
    data = pod_review("vision", labels=case.labels, gpus=8, owners=case.owners)
    request = data["request"]
    meta = request["object"]["metadata"]
    first = kai_owner(meta)
    assert (first.name if first else None) == (case.owners[0]["name"] if case.owners else None)

    mutated = mutate_pod(request, snap)
    if case.refused:
        assert unreviewed_owner(meta) is not None
        assert_decision(mutated, allowed=False, reason=Reason.FORBIDDEN, message=(case.refused,))
        # The validating phase refuses it too, whatever labels it arrives with.
        for said in ("preemptible", "non-preemptible"):
            meta["labels"].update({"runai/queue": "vision", LABEL: said})
            assert_decision(validate_pod(request, snap, now=0), allowed=False, message=(case.refused,))
        return
    assert unreviewed_owner(meta) is None
    assert mutated.allowed, mutated.message
    patched = apply_patch(request["object"], list(mutated.patch))
    assert patched["metadata"]["labels"][LABEL] == ("non-preemptible" if case.checked else "preemptible")
    assert (pod_controller(meta) in (("batch", "Job"),)) is (case.kind == "job")

    request["object"] = patched
    decision = validate_pod(request, snap, now=0)
    if case.checked:
        assert_decision(decision, allowed=False, reason=Reason.GPU_QUOTA_EXCEEDED, message=("asks for 8",))
    else:
        assert_decision(decision, allowed=True)


def test_kai_owner_reads_the_first_reference_whatever_its_kind() -> None:
    meta = {"ownerReferences": [ref(CONFIGMAP_NON_PREEMPTIBLE), ref(JOB, controller=True)]}
    owner = kai_owner(meta)
    assert owner is not None and (owner.group, owner.kind, owner.name, owner.controller) == (
        "",
        "ConfigMap",
        "cm",
        False,
    )
    assert pod_controller(meta) is None
    assert kai_owner({"ownerReferences": []}) is None and kai_owner({}) is None
    garbled = kai_owner({"ownerReferences": ["x"]})
    assert garbled is not None and unreviewed_owner({"ownerReferences": ["x"]}) is not None
