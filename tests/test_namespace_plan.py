"""The per-namespace plan memo (`core.namespace_plan`): a write of any object a plan is made of is
seen by the next review, the memo stays bounded by the cluster's objects whatever pods write, and
decisions are the same with it and without it over the scheduling tables."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from tests import test_pod_groups, test_scheduling
from tests.support.cluster import (
    SCHEDULER,
    cluster_queue,
    cluster_state,
    kueue_setup,
    local_queue,
    namespace,
    priority_class,
    resource_flavor,
    settings_configmap,
    topology,
)
from tests.support.reviews import owned_by, pod_review
from webhook.core.decision import Decision
from webhook.core.namespace_plan import namespace_plan
from webhook.core.patch import PodPatch
from webhook.core.scheduling import _inject_node_affinity, mutate_pod, pod_target
from webhook.snapshot import ClusterSnapshot
from webhook.state.store import ClusterState

TOPOLOGY = "scheduling.hopsworks.ai/topology"
QUEUE = "kueue.x-k8s.io/queue-name"
# Defaults for every part a plan holds: anti-affinity, a priority class and a topology unit.
PLAN_SCHEDULER = {**SCHEDULER, "defaults": {**SCHEDULER["defaults"], "topology": "zone"}}


def kueue_cluster() -> ClusterState:
    return cluster_state(
        namespaces=[namespace("churn"), namespace("fraud")],
        extra=[*kueue_setup(), local_queue("churn", "default"), local_queue("fraud", "default")],
        scheduler=PLAN_SCHEDULER,
        kueue_installed=True,
    )


def without_memo(snapshot: ClusterSnapshot) -> ClusterSnapshot:
    return dataclasses.replace(snapshot, memo=None)


def replica_set(name: str, replicas: int) -> dict[str, Any]:
    meta = {
        "name": name,
        "namespace": "churn",
        "uid": f"uid-{name}",
        "ownerReferences": owned_by("Deployment", "apps/v1", "model"),
        "annotations": {"deployment.kubernetes.io/desired-replicas": str(replicas)},
    }
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta, "spec": {"replicas": replicas}}


def churn_with_defaults(defaults: dict[str, Any]) -> dict[str, Any]:
    return namespace("churn", annotations={"scheduling.hopsworks.ai/defaults": json.dumps(defaults)})


@dataclass
class Write:
    id: str
    write: Callable[[ClusterState], None]
    seen: str  # what the next decision says, and the one before did not


WRITES = [
    Write("Namespace: the project's default class", lambda s: s.apply(churn_with_defaults({"priorityClass": "batch"})),
          '"value":"batch"'),
    Write("PriorityClass: the default class's value", lambda s: s.apply(priority_class("normal", 12345)), "12345"),
    Write("PriorityClass deleted", lambda s: s.delete(priority_class("normal", 10000)),
          "default priority class normal does not exist"),
    Write("PriorityClasses listed again without it", lambda s: s.replace_all("PriorityClass", []),
          "default priority class normal does not exist"),
    Write("settings ConfigMap: the cluster's default class",
          lambda s: s.apply(settings_configmap(
              scheduler={**PLAN_SCHEDULER, "defaults": {"priorityClass": "batch", "topology": "zone"}},
              kueue_installed=True)),
          '"value":"batch"'),
    Write("settings ConfigMap deleted: Kueue off", lambda s: s.delete(settings_configmap()), '"patch":[]'),
    Write("LocalQueue: another ClusterQueue", lambda s: s.apply(local_queue("churn", "default", "elsewhere")),
          "ClusterQueue elsewhere of LocalQueue default does not exist"),
    Write("LocalQueue deleted", lambda s: s.delete(local_queue("churn", "default")), "has no Kueue LocalQueue"),
    Write("LocalQueues listed again without it", lambda s: s.replace_all("LocalQueue", []),
          "has no Kueue LocalQueue"),
    Write("ClusterQueue: another flavor", lambda s: s.apply(cluster_queue(flavors=("plain",))),
          "ResourceFlavor plain does not exist"),
    Write("ClusterQueue deleted", lambda s: s.delete(cluster_queue()), "ClusterQueue cq of LocalQueue default"),
    Write("ResourceFlavor: no Topology", lambda s: s.apply(resource_flavor(topology_name=None)),
          "ResourceFlavor default names no Topology"),
    Write("ResourceFlavors listed again without it", lambda s: s.replace_all("ResourceFlavor", []),
          "ResourceFlavor default does not exist"),
    Write("Topology: hosts only", lambda s: s.apply(topology(levels=["kubernetes.io/hostname"])),
          "default topology zone (topology.kubernetes.io/zone) is not a level"),
    Write("Topology deleted", lambda s: s.delete(topology()),
          "Topology default of ResourceFlavor default does not exist"),
]  # fmt: skip


def said(decision: Decision) -> str:
    """The decision as one text (what the tables look for in it)."""
    fields = dataclasses.asdict(decision)
    return json.dumps(fields, separators=(",", ":"), default=str)


@pytest.mark.parametrize("case", WRITES, ids=[c.id for c in WRITES])
def test_a_write_of_what_a_plan_holds_is_seen_by_the_next_review(case: Write) -> None:
    state = kueue_cluster()
    review = pod_review("churn")["request"]
    before = mutate_pod(review, state.snapshot())
    assert "churn" in state.memo.plans  # the review made the namespace's plan
    generation = state.memo.generation

    case.write(state)

    # Emptied by the write itself: a plan that outlived it would serve the old objects.
    assert state.memo.plans == {} and state.memo.generation > generation
    after = mutate_pod(review, state.snapshot())
    assert case.seen in said(after) and case.seen not in said(before), said(after)
    assert after == mutate_pod(review, without_memo(state.snapshot()))


def test_pods_and_replica_sets_keep_the_plans_and_are_still_read() -> None:
    state = kueue_cluster()
    state.apply(replica_set("model-5d8f", 3))
    review = pod_review("churn", annotations={TOPOLOGY: "host"}, owners=owned_by("ReplicaSet", "apps/v1", "model-5d8f"))
    assert mutate_pod(review["request"], state.snapshot()).audit["pod-group"] == "model-5d8f-n3/3"
    plans, generation = dict(state.memo.plans), state.memo.generation

    state.apply(replica_set("model-5d8f", 4))
    state.apply({**pod_review("churn")["request"]["object"], "kind": "Pod"})

    assert state.memo.plans == plans and state.memo.generation == generation
    # The group's count is the ReplicaSet cache's, read for every pod: never part of a plan.
    assert mutate_pod(review["request"], state.snapshot()).audit["pod-group"] == "model-5d8f-n4/4"


def test_what_pods_choose_does_not_grow_the_memo() -> None:
    state = kueue_cluster()
    snapshot = state.snapshot()
    for i in range(200):
        chosen = {"labels": {QUEUE: f"made-up-{i}"}, "annotations": {TOPOLOGY: f"unit-{i}"}}
        assert not mutate_pod(pod_review("churn", **chosen)["request"], snapshot).allowed
        assert not mutate_pod(pod_review(f"nowhere-{i}")["request"], snapshot).patch  # not a namespace here
    for unit in ("host", "zone", "region", None):
        for queue in ("default", None):
            labels = {QUEUE: queue} if queue else {}
            annotations = {TOPOLOGY: unit} if unit else {}
            mutate_pod(pod_review("churn", labels=labels, annotations=annotations)["request"], snapshot)
    assert set(state.memo.plans) == {"churn"}
    plan: Any = state.memo.plans["churn"]
    # One resolution per (queue: default or none chosen) x (unit: a unit of the settings or none).
    assert len(plan.kueue) <= 2 * 4
    assert all(queue in (None, "default") for queue, _, _ in plan.kueue)


def test_a_plan_is_made_again_for_a_namespace_record_written_around_the_store() -> None:
    # A snapshot's dicts changed without the store (a test, a bug) must not be served an old plan.
    state = kueue_cluster()
    review = pod_review("churn")["request"]
    assert mutate_pod(review, state.snapshot()).audit["priority-class"] == "normal"
    state.namespaces["churn"] = dataclasses.replace(
        state.namespaces["churn"], annotations={"scheduling.hopsworks.ai/defaults": '{"priorityClass": "batch"}'}
    )
    assert mutate_pod(review, state.snapshot()).audit["priority-class"] == "batch"


@pytest.mark.parametrize("name", ["churn", "fraud"])
def test_the_plans_spec_affinity_is_what_the_rule_makes_for_a_pod_without_affinity(name: str) -> None:
    state = cluster_state(namespaces=test_scheduling.NAMESPACES)
    target = pod_target(pod_review(name)["request"], state.snapshot())
    assert target is not None and "affinity" not in target.spec
    plan = namespace_plan(target.namespace, state.snapshot())
    patch = PodPatch(target.pod)
    assert _inject_node_affinity(target, plan.affinity_groups, plan.anti_affinity_groups, plan.max_terms, patch) is None
    assert plan.spec_affinity is not None
    assert patch.operations() == [{"op": "add", "path": "/spec/affinity", "value": orjson.loads(plan.spec_affinity)}]


# -- the same decisions with and without the memo, over the scheduling tables ---------------------


def same_with_and_without_memo(review: dict[str, Any], snapshot: ClusterSnapshot) -> Decision:
    made = mutate_pod(review, snapshot)  # makes the plan
    kept = mutate_pod(review, snapshot)  # served from it
    plain = mutate_pod(review, without_memo(snapshot))
    assert made == kept == plain
    return made


@pytest.mark.parametrize("case", test_scheduling.CASES, ids=[c.id for c in test_scheduling.CASES])
def test_scheduling_rules_decide_the_same_with_the_memo(case: test_scheduling.Case) -> None:
    for settings in (case.settings, {**case.settings, "kueue_installed": True}):
        state = cluster_state(
            namespaces=test_scheduling.NAMESPACES,
            extra=[*case.extra, *kueue_setup(), local_queue(case.namespace, "default")],
            **settings,
        )
        same_with_and_without_memo(case.as_review()["request"], state.snapshot())


@pytest.mark.parametrize("case", test_pod_groups.CASES, ids=[c.id for c in test_pod_groups.CASES])
def test_pod_group_rules_decide_the_same_with_the_memo(case: test_pod_groups.Case) -> None:
    state = cluster_state(
        namespaces=[namespace("churn")],
        extra=[
            *kueue_setup(),
            local_queue("churn", "default"),
            test_pod_groups.replica_set("model-5d8f", 3),
            test_pod_groups.replica_set("model-new", 1, desired=3),
            test_pod_groups.replica_set("model-one", 1),
            test_pod_groups.replica_set("bare", 3, deployment=None),
        ],
        kueue_installed=True,
    )
    data = pod_review("churn", labels=case.labels, annotations=case.annotations, owners=case.owners)
    same_with_and_without_memo(data["request"], state.snapshot())
