"""S4 where Kueue reads it (`core.owners`, `/mutate/workloads`): with Kueue on, a Job gets its queue
label and its template the topology at CREATE; a Deployment gets the queue label (so that Kueue's
deployment webhook marks its pods) and, when it chose a unit, its replica count in the template
(one pod group per ReplicaSet, `core.pod_groups`), and must roll out by Recreate. Refusals name
what to change.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.cluster import cluster_queue, local_queue, namespace, resource_flavor, snapshot, topology
from tests.support.reviews import apply_patch, assert_decision, owned_by
from webhook.core.owners import mutate_owner
from webhook.core.workloads import validate_workload

QUEUE = "kueue.x-k8s.io/queue-name"
REQUIRED = "kueue.x-k8s.io/podset-required-topology"
CHOICE = "scheduling.hopsworks.ai/topology"
GROUP_REPLICAS = "scheduling.hopsworks.ai/group-replicas"
HOST = "kubernetes.io/hostname"
ZONE_LEVELS = ("topology.kubernetes.io/zone", "kubernetes.io/hostname")


def template(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "metadata": meta,
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "python:3.12", "resources": {"requests": {"cpu": "1"}}}],
        },
    }


def job(
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    tlabels: dict[str, str] | None = None,
    tannotations: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "train", "namespace": "churn"}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    if owners:
        meta["ownerReferences"] = owners
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {"parallelism": 2, "completions": 2, "template": template(tlabels, tannotations)},
    }


def deployment(
    replicas: int = 3,
    *,
    strategy: str | None = "Recreate",
    labels: dict[str, str] | None = None,
    tannotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    t = template({"app": "model"}, tannotations)
    t["spec"]["restartPolicy"] = "Always"
    spec: dict[str, Any] = {"replicas": replicas, "selector": {"matchLabels": {"app": "model"}}, "template": t}
    if strategy is not None:
        spec["strategy"] = {"type": strategy}
    meta: dict[str, Any] = {"name": "model", "namespace": "churn"}
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


def review(obj: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None) -> dict[str, Any]:
    group, _, version = obj["apiVersion"].rpartition("/")
    plural = {"Job": "jobs", "Deployment": "deployments"}[obj["kind"]]
    request: dict[str, Any] = {
        "uid": "owner-1",
        "kind": {"group": group, "version": version, "kind": obj["kind"]},
        "resource": {"group": group, "version": version, "resource": plural},
        "namespace": obj["metadata"]["namespace"],
        "name": obj["metadata"]["name"],
        "operation": operation,
        "object": copy.deepcopy(obj),
    }
    if old is not None:
        request["oldObject"] = copy.deepcopy(old)
    return request


@dataclass
class Case:
    id: str
    obj: dict[str, Any]
    allowed: bool = True
    message: tuple[str, ...] = ()
    # After the patch: the owner's labels, the template's labels and annotations (a subset each).
    owner_labels: dict[str, str] = field(default_factory=dict)
    template_labels: dict[str, str] = field(default_factory=dict)
    template_annotations: dict[str, str] = field(default_factory=dict)
    absent: tuple[str, ...] = ()  # template annotations that must not be there
    unchanged: bool = False  # no patch at all
    settings: dict[str, Any] = field(default_factory=lambda: {"kueue_installed": True})
    operation: str = "CREATE"
    old: dict[str, Any] | None = None


def _renamed(obj: dict[str, Any], **meta: Any) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"].update(meta)
    return obj


CASES = [
    Case("a Job without a queue label gets the project's queue, on the Job and its template", job(),
         owner_labels={QUEUE: "default"}, template_labels={QUEUE: "default"}, absent=(REQUIRED,)),
    Case("a Job's unit goes into its template as Kueue's required topology", job(tannotations={CHOICE: "host"}),
         owner_labels={QUEUE: "default"}, template_annotations={REQUIRED: HOST}),
    Case("the unit on the Job itself counts too", job(annotations={CHOICE: "zone"}),
         template_annotations={REQUIRED: "topology.kubernetes.io/zone", CHOICE: "zone"}),
    Case("the queue on the Job's label is kept, and copied to the template", job(labels={QUEUE: "gpu"}),
         owner_labels={QUEUE: "gpu"}, template_labels={QUEUE: "gpu"}),
    Case("the queue in the template's labels goes on the Job", job(tlabels={QUEUE: "gpu"}),
         owner_labels={QUEUE: "gpu"}),
    Case("a queue that is not a LocalQueue of the namespace is refused, naming those there",
         job(labels={QUEUE: "nope"}), allowed=False,
         message=("Job train:", "queue nope not available in project churn", "default, gpu")),
    Case("a unit that is not a topology unit is refused", job(tannotations={CHOICE: "rack"}), allowed=False,
         message=("Job train:", "topology rack is not a topology unit")),
    Case("a unit the queue's Topology has no level for is refused, naming what it offers",
         job(labels={QUEUE: "zonal"}, tannotations={CHOICE: "region"}), allowed=False,
         message=("topology region", "is not a level of the Topology behind queue zonal", "it offers: host, zone")),
    Case("a Job of a CronJob is queued like any other", job(owners=owned_by("CronJob", "batch/v1", "nightly")),
         owner_labels={QUEUE: "default"}),
    Case("a Job of a JobSet: Kueue admits it through the JobSet",
         job(owners=owned_by("JobSet", "jobset.x-k8s.io/v1beta2")), unchanged=True),
    Case("Kueue off: nothing", job(tannotations={CHOICE: "host"}), settings={}, unchanged=True),
    Case("Run:ai on: nothing (its queue is the pods')", job(), settings={"run_ai_enable": True}, unchanged=True),
    Case("not a project namespace", _renamed(job(), namespace="plain"), unchanged=True),
    Case("a Deployment choosing a unit over 3 replicas: its count in the template, Recreate",
         deployment(tannotations={CHOICE: "host"}), owner_labels={QUEUE: "default"},
         template_labels={QUEUE: "default"}, template_annotations={REQUIRED: HOST, GROUP_REPLICAS: "3"}),
    Case("a Deployment rolling out otherwise is refused, saying what to set",
         deployment(strategy=None, tannotations={CHOICE: "host"}), allowed=False,
         message=("Deployment model:", "one Kueue pod group", "spec.strategy.type: Recreate")),
    Case("one replica rolls out any way it likes",
         deployment(1, strategy="RollingUpdate", tannotations={CHOICE: "host"}),
         template_annotations={REQUIRED: HOST, GROUP_REPLICAS: "1"}),
    Case("a Deployment without a unit: the queue label only, any strategy", deployment(strategy=None),
         owner_labels={QUEUE: "default"}, absent=(REQUIRED, GROUP_REPLICAS)),
    Case("a scale by UPDATE writes the new count", deployment(5, tannotations={CHOICE: "host", GROUP_REPLICAS: "3"}),
         operation="UPDATE", old=deployment(3, tannotations={CHOICE: "host", GROUP_REPLICAS: "3"}),
         template_annotations={GROUP_REPLICAS: "5"}),
    Case("an UPDATE dropping the queue label gets it back (Kueue refuses its removal)",
         deployment(1), operation="UPDATE", old=deployment(1, labels={QUEUE: "gpu"}), owner_labels={QUEUE: "gpu"}),
    Case("an UPDATE leaving the spec alone is never refused (the Deployment controller's writes)",
         deployment(labels={QUEUE: "nope"}), operation="UPDATE", old=deployment(labels={QUEUE: "nope"}),
         unchanged=True),
    Case("an UPDATE changing the spec to a wrong queue is refused",
         deployment(2, labels={QUEUE: "nope"}), operation="UPDATE", old=deployment(labels={QUEUE: "nope"}),
         allowed=False, message=("Deployment model:", "queue nope not available",)),
]  # fmt: skip


def kueue_snapshot(extra: tuple[dict[str, Any], ...] = (), **settings: Any) -> Any:
    return snapshot(
        namespaces=[namespace("churn"), namespace("plain", project=False)],
        extra=[
            topology(),
            topology("zonal", ZONE_LEVELS),
            resource_flavor(),
            resource_flavor("zonal", "zonal"),
            cluster_queue(),
            cluster_queue("zonal-cq", ("zonal",)),
            local_queue("churn", "default"),
            local_queue("churn", "gpu"),
            local_queue("churn", "zonal", "zonal-cq"),
            *extra,
        ],
        **settings,
    )


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_owners_get_what_kueue_reads(case: Case) -> None:
    snap = kueue_snapshot(**case.settings)
    decision = mutate_owner(review(case.obj, case.operation, case.old), snap)
    assert_decision(decision, allowed=case.allowed, message=case.message)
    if not case.allowed:
        assert decision.code == 403
        return
    if case.unchanged:
        assert decision.patch == (), decision.patch
        return
    patched = apply_patch(case.obj, list(decision.patch))
    tmeta = patched["spec"]["template"]["metadata"]
    assert case.owner_labels.items() <= patched["metadata"].get("labels", {}).items()
    assert case.template_labels.items() <= tmeta.get("labels", {}).items()
    assert case.template_annotations.items() <= tmeta.get("annotations", {}).items()
    for key in case.absent:
        assert key not in tmeta.get("annotations", {}), key
    # What the Priority plugin computes per pod stays out of the template; the class goes in.
    assert "priority" not in patched["spec"]["template"]["spec"]
    assert patched["spec"]["template"]["spec"].get("priorityClassName") == "normal"
    # Mutating the result again adds nothing (the apiserver may call us again).
    again = mutate_owner(review(patched, case.operation, case.old), snap)
    assert again.allowed and again.patch == (), again.patch


def test_a_template_without_metadata_gets_it_whole() -> None:
    obj = job()
    del obj["spec"]["template"]["metadata"]
    decision = mutate_owner(review(obj), kueue_snapshot(kueue_installed=True))
    patched = apply_patch(obj, list(decision.patch))
    assert patched["spec"]["template"]["metadata"]["labels"] == {QUEUE: "default"}


def scale_review(name: str, old: int, new: int, namespace: str = "churn") -> dict[str, Any]:
    def scale(replicas: int) -> dict[str, Any]:
        return {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": replicas}}  # fmt: skip

    return {
        "uid": "scale-1", "kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"}, "subResource": "scale",
        "namespace": namespace, "name": name, "operation": "UPDATE", "object": scale(new), "oldObject": scale(old),
    }  # fmt: skip


def grouped_replica_set(name: str, deployment: str, group: int | None) -> dict[str, Any]:
    template: dict[str, Any] = {"metadata": {"annotations": {GROUP_REPLICAS: str(group)}}} if group else {}
    return {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": "churn", "uid": f"uid-{name}",
                     "ownerReferences": owned_by("Deployment", "apps/v1", deployment),
                     "annotations": {"deployment.kubernetes.io/desired-replicas": str(group or 1)}},
        "spec": {"replicas": group or 1, "template": template},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("name", "old", "new", "refused"),
    [
        ("model", 3, 4, True),  # a group of 3 would get pods of a group of 4 that never fills
        ("model", 3, 2, True),  # a replacement pod would be a group of 2 alone
        ("model", 3, 0, False),  # stopping it is fine
        ("model", 0, 3, False),  # and back to the group's size
        ("plain", 1, 5, False),  # no group: its pods are admitted one by one
    ],
)
def test_a_grouped_deployment_is_scaled_by_its_spec(name: str, old: int, new: int, refused: bool) -> None:
    sets = (grouped_replica_set("model-5d8f", "model", 3), grouped_replica_set("plain-77aa", "plain", None))
    snap = kueue_snapshot(sets, kueue_installed=True)
    decision = validate_workload(scale_review(name, old, new), snap)
    assert decision.allowed is not refused, decision.message
    if refused:
        for part in ("Kueue pod group of 3", f"a group of {new} that never fills", "change spec.replicas"):
            assert part in decision.message


@pytest.mark.parametrize(("replicas", "unit", "warned"), [(3, "host", True), (1, "host", False), (3, None, False)])
def test_a_statefulset_choosing_a_unit_is_told_it_co_locates_nothing(
    replicas: int, unit: str | None, warned: bool
) -> None:
    obj = deployment(replicas, tannotations={CHOICE: unit} if unit else None)
    obj["kind"] = "StatefulSet"
    request = review({**obj, "kind": "Deployment"})
    request["kind"] = {"group": "apps", "version": "v1", "kind": "StatefulSet"}
    request["resource"] = {"group": "apps", "version": "v1", "resource": "statefulsets"}
    request["object"] = obj
    decision = validate_workload(request, kueue_snapshot(kueue_installed=True))
    assert decision.allowed
    assert bool(decision.warnings) is warned, decision.warnings
    if warned:
        assert "places each of its 3 pods by itself" in decision.warnings[0]
