"""Co-location that holds (`core.pod_groups`): with Kueue on, the pods of a Deployment that chose a
topology unit and wants more than one replica are one Kueue plain-pod group per ReplicaSet (name,
total count, serving), so Kueue admits them as one Workload and places them in one domain. The
count comes from the ReplicaSet cache; a ReplicaSet the cache does not have yet is a retryable 503.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.cluster import kueue_setup, local_queue, namespace, snapshot
from tests.support.reviews import apply_patch, assert_decision, owned_by, pod_review
from webhook.core.decision import Reason
from webhook.core.pod_groups import MAX_GROUP_NAME, group_name
from webhook.core.scheduling import mutate_pod

CHOICE = "scheduling.hopsworks.ai/topology"
GROUP = "kueue.x-k8s.io/pod-group-name"
COUNT = "kueue.x-k8s.io/pod-group-total-count"
SERVING = "kueue.x-k8s.io/pod-group-serving"


def replica_set(
    name: str, replicas: int, deployment: str | None = "model", desired: int | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "churn", "uid": f"uid-{name}"}
    if deployment is not None:
        meta["ownerReferences"] = owned_by("Deployment", "apps/v1", deployment)
        meta["annotations"] = {"deployment.kubernetes.io/desired-replicas": str(desired or replicas)}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta, "spec": {"replicas": replicas}}


@dataclass
class Case:
    id: str
    owners: list[dict[str, Any]] | None
    annotations: dict[str, str] = field(default_factory=lambda: {CHOICE: "host"})
    labels: dict[str, str] = field(default_factory=dict)
    group: tuple[str, str] | None = None  # (name, count) expected; None: no group
    allowed: bool = True
    code: int = 200
    message: tuple[str, ...] = ()


RS = owned_by("ReplicaSet", "apps/v1", "model-5d8f")
CASES = [
    Case("3 replicas choosing host: one group of 3", RS, group=("model-5d8f-n3", "3")),
    Case("the Deployment's count, not the ReplicaSet's during a rollout",
         owned_by("ReplicaSet", "apps/v1", "model-new"), group=("model-new-n3", "3")),
    Case("one replica: no pointless group", owned_by("ReplicaSet", "apps/v1", "model-one")),
    Case("no unit chosen: no group", RS, annotations={}),
    Case("a plain pod (a notebook) choosing host: no group", None),
    Case("a bare ReplicaSet's pods: no group", owned_by("ReplicaSet", "apps/v1", "bare")),
    Case("a group the workload names itself is left alone", RS, labels={GROUP: "mine"}),
    Case("a ReplicaSet not in the cache yet: created again later", owned_by("ReplicaSet", "apps/v1", "unseen"),
         allowed=False, code=503, message=("ReplicaSet unseen of this pod is not in this server's cache yet",)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_deployment_pods_are_one_group(case: Case) -> None:
    snap = snapshot(
        namespaces=[namespace("churn")],
        extra=[
            *kueue_setup(),
            local_queue("churn", "default"),
            replica_set("model-5d8f", 3),
            replica_set("model-new", 1, desired=3),
            replica_set("model-one", 1),
            replica_set("bare", 3, deployment=None),
        ],
        kueue_installed=True,
    )
    review = pod_review("churn", labels=case.labels, annotations=case.annotations, owners=case.owners)
    decision = mutate_pod(review["request"], snap)
    assert_decision(decision, allowed=case.allowed, message=case.message)
    if not case.allowed:
        assert (decision.code, decision.reason) == (case.code, Reason.OWNER_NOT_CACHED)
        return
    pod = apply_patch(review["request"]["object"], list(decision.patch))
    labels, annotations = pod["metadata"].get("labels", {}), pod["metadata"].get("annotations", {})
    if case.group is None:
        assert labels.get(GROUP) == case.labels.get(GROUP)
        assert COUNT not in annotations
        return
    assert (labels[GROUP], annotations[COUNT], annotations[SERVING]) == (*case.group, "true")


@pytest.mark.parametrize("length", [40, 55, 63, 120, 253])
def test_group_names_fit_a_label(length: int) -> None:
    rs = ("m" * (length - 11)) + "-5d8f9c7b6d"
    name = group_name(rs, 12)
    assert len(name) <= MAX_GROUP_NAME
    assert name.endswith("-n12") and name[0].isalnum()
    assert group_name(rs, 13) != name  # a new count, a new group
