"""The pod cache's per-namespace held-GPUs index (`snapshot.HeldGpus`) against the full sum.

Admission reads a project's held GPUs from the index instead of summing its pods; these tests hold
the two together after every kind of write the pod cache takes, and show that quota decisions made
from the index are the ones the full sum gives.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.cluster import namespace, priority_class, settings_configmap
from webhook.core.quota import check_quota, gpus_in_use, pods_holding
from webhook.snapshot import ClusterSnapshot, GpuReservation, RunaiProjectInfo, holds_gpus
from webhook.state.store import ClusterState

NOW = 1_000_000.0
PREEMPTIBILITY = "kai.scheduler/preemptibility"
NAMESPACES = ("vision", "nlp", "audio")


def gpu_pod(
    name: str,
    gpus: str | None = "1",
    *,
    ns: str = "vision",
    uid: str | None = None,
    phase: str = "Running",
    preemptible: bool = False,
    fraction: str | None = None,
    priority: str | None = None,
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": gpus} if gpus is not None else {}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "uid": uid or f"uid-{name}",
        "labels": {PREEMPTIBILITY: "preemptible" if preemptible else "non-preemptible"},
    }
    if fraction is not None:
        meta["annotations"] = {"gpu-fraction": fraction}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i", "resources": {"limits": limits}}]}
    if priority is not None:
        meta["labels"] = {}  # preemptibility then comes from the priority class
        spec["priorityClassName"] = priority
    return {"kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


def full_sum(state: ClusterState, ns: str, exclude: str = "") -> float:
    """What quota summed before the index: every held record of the namespace, correctly rounded."""
    pods = state.pods.get(ns, {})
    return math.fsum(p.gpus for uid, p in pods.items() if uid != exclude and holds_gpus(p))


def assert_index_matches(state: ClusterState) -> None:
    snapshot = state.snapshot()
    for ns in {*NAMESPACES, *state.pods}:
        assert pods_holding(snapshot, ns) == full_sum(state, ns), ns
        for uid in state.pods.get(ns, {}):
            assert pods_holding(snapshot, ns, exclude=uid) == full_sum(state, ns, exclude=uid), (ns, uid)
    # Nothing is left behind for a namespace whose held pods are all gone.
    assert {ns for ns in NAMESPACES if state.held_gpus.get(ns)} == {ns for ns in NAMESPACES if full_sum(state, ns)}


def without_index(snapshot: ClusterSnapshot) -> ClusterSnapshot:
    return dataclasses.replace(snapshot, held_gpus_index=None)


def new_state() -> ClusterState:
    state = ClusterState()
    state.apply(settings_configmap(run_ai_enable=True))
    for ns in NAMESPACES:
        state.apply(namespace(ns, labels={"runai/queue": ns}))
    return state


Event = tuple[str, dict[str, Any]]


def apply(obj: dict[str, Any]) -> Event:
    return ("apply", obj)


def delete(obj: dict[str, Any]) -> Event:
    return ("delete", obj)


def resync(*objs: dict[str, Any]) -> Event:
    return ("resync", {"items": list(objs)})


def run(state: ClusterState, event: Event) -> None:
    what, obj = event
    if what == "apply":
        state.apply(obj)
    elif what == "delete":
        state.delete(obj)
    else:
        state.replace_all("Pod", obj["items"])


@dataclass
class Case:
    id: str
    events: list[Event]
    held: dict[str, float]  # what the index says at the end, namespace by namespace


CASES = [
    Case("adds", [apply(gpu_pod("a", "1")), apply(gpu_pod("b", "2")), apply(gpu_pod("c", "1", ns="nlp"))],
         {"vision": 3, "nlp": 1}),
    Case("a pod without GPUs holds none", [apply(gpu_pod("a", None))], {"vision": 0}),
    Case("pending pods hold, finished ones do not",
         [apply(gpu_pod("a", "1", phase="Pending")), apply(gpu_pod("b", "4", phase="Succeeded"))], {"vision": 1}),
    Case("preemptible pods do not hold", [apply(gpu_pod("a", "2", preemptible=True))], {"vision": 0}),
    Case("an update replaces the pod's GPUs", [apply(gpu_pod("a", "1")), apply(gpu_pod("a", "3"))], {"vision": 3}),
    Case("an update to finished frees them", [apply(gpu_pod("a", "2")), apply(gpu_pod("a", "2", phase="Failed"))],
         {"vision": 0}),
    Case("an update to preemptible frees them",
         [apply(gpu_pod("a", "2")), apply(gpu_pod("a", "2", preemptible=True))], {"vision": 0}),
    Case("a delete frees them", [apply(gpu_pod("a", "2")), apply(gpu_pod("b", "1")), delete(gpu_pod("a", "2"))],
         {"vision": 1}),
    Case("a delete of a pod never seen changes nothing", [apply(gpu_pod("a", "1")), delete(gpu_pod("x", "5"))],
         {"vision": 1}),
    Case("a delete of a finished pod changes nothing",
         [apply(gpu_pod("a", "2", phase="Succeeded")), apply(gpu_pod("b", "1")),
          delete(gpu_pod("a", "2", phase="Succeeded"))], {"vision": 1}),
    Case("fractions add and leave without a remainder",
         [apply(gpu_pod(n, None, fraction=f)) for n, f in (("a", "0.1"), ("b", "0.2"), ("c", "0.7"))]
         + [delete(gpu_pod("a", None, fraction="0.1")), delete(gpu_pod("b", None, fraction="0.2"))]
         + [delete(gpu_pod("c", None, fraction="0.7"))], {"vision": 0}),
    Case("the same uid seen in another namespace counts where the cache holds it",
         [apply(gpu_pod("a", "1")), apply(gpu_pod("a", "2", ns="nlp"))], {"vision": 1, "nlp": 2}),
    Case("a deleted namespace takes its pods' GPUs along",
         [apply(gpu_pod("a", "1")), apply(gpu_pod("b", "1", ns="nlp")), delete(namespace("vision"))],
         {"vision": 0, "nlp": 1}),
    Case("a namespace bound to another project keeps its pods' GPUs",
         [apply(gpu_pod("a", "2")), apply(namespace("vision", labels={"runai/queue": "vision-2"}))], {"vision": 2}),
    Case("a resync keeps only what the new list shows",
         [apply(gpu_pod("a", "1")), apply(gpu_pod("b", "2")), apply(gpu_pod("c", "1", ns="nlp")),
          resync(gpu_pod("b", "3"), gpu_pod("d", "1", ns="audio"))], {"vision": 3, "nlp": 0, "audio": 1}),
    Case("a priority class that makes pods preemptible frees their GPUs",
         [apply(priority_class("low", 10)), apply(gpu_pod("a", "2", priority="low")), apply(gpu_pod("b", "1"))],
         {"vision": 1}),
    Case("a priority class raised above 100 makes them hold",
         [apply(priority_class("low", 10)), apply(gpu_pod("a", "2", priority="low")),
          apply(priority_class("low", 1000))], {"vision": 2}),
    Case("a priority class deleted: Run:ai's default, not preemptible",
         [apply(priority_class("low", 10)), apply(gpu_pod("a", "2", priority="low")),
          delete(priority_class("low", 10))], {"vision": 2}),
    Case("settings reading another preemptibility label reclassify the pods",
         [apply(gpu_pod("a", "2", preemptible=True)),
          apply(settings_configmap(run_ai_enable=True, scheduler={"runai": {"preemptibilityLabel": "example.com/p"}}))],
         {"vision": 2}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_index_equals_the_full_sum_after_each_event(case: Case) -> None:
    state = new_state()
    for event in case.events:
        run(state, event)
        assert_index_matches(state)
    assert {ns: state.held_gpus.get(ns) for ns in case.held} == pytest.approx(case.held)


def test_a_snapshot_without_the_index_sums_the_pods() -> None:
    state = new_state()
    for name, gpus in (("a", "1"), ("b", "0.5")):
        state.apply(gpu_pod(name, gpus))
    bare = without_index(state.snapshot())
    assert pods_holding(bare, "vision") == pods_holding(state.snapshot(), "vision") == 1.5
    assert pods_holding(bare, "vision", exclude="uid-b") == pods_holding(state.snapshot(), "vision", "uid-b") == 1.0


# -- random event sequences -----------------------------------------------------------------------

GPU_VALUES = st.sampled_from(["0", "1", "2", "3", "500m", "250m", "0.1", "0.3", "7", "1024", "1e0"])
POD = st.builds(
    gpu_pod,
    name=st.sampled_from(["a", "b", "c", "d"]),
    gpus=st.one_of(st.none(), GPU_VALUES),
    ns=st.sampled_from(NAMESPACES),
    # The same name in another namespace is another pod, unless the uid says otherwise (a move).
    uid=st.one_of(st.none(), st.sampled_from(["shared-1", "shared-2"])),
    phase=st.sampled_from(["Pending", "Running", "Running", "Succeeded", "Failed"]),
    preemptible=st.booleans(),
    fraction=st.one_of(st.none(), st.sampled_from(["0.1", "0.25", "0.7"])),
)
EVENT = st.one_of(
    st.tuples(st.just("apply"), POD),
    st.tuples(st.just("delete"), POD),
    st.tuples(st.just("resync"), st.lists(POD, max_size=5).map(lambda pods: {"items": pods})),
    st.tuples(st.just("apply"), st.sampled_from(NAMESPACES).map(lambda ns: namespace(ns))),
    st.tuples(st.just("delete"), st.sampled_from(NAMESPACES).map(lambda ns: namespace(ns))),
    st.tuples(st.just("apply"), st.sampled_from([10, 1000]).map(lambda value: priority_class("low", value))),
)


def quota_decisions(snapshot: ClusterSnapshot, ns: str) -> list[tuple[bool, str, dict[str, str]]]:
    """check_quota's answers for a range of requests, with and without a pod of the cache left out."""
    answers = []
    for gpus in (0.1, 0.5, 1.0, 2.0, 4.0):
        for exclude in ("", "uid-a", "shared-1", "new"):
            d = check_quota(snapshot, ns, gpus, NOW, asks="asks", exclude=exclude)
            answers.append((d.allowed, d.message, dict(d.audit)))
    return answers


@settings(max_examples=150, deadline=None)
@given(st.lists(EVENT, max_size=25))
def test_random_event_sequences_keep_the_index_and_the_decisions(events: list[Event]) -> None:
    state = new_state()
    state.apply(priority_class("low", 10))
    snapshot = state.snapshot()
    snapshot.runai_projects = {
        ns: RunaiProjectInfo(id=str(i), name=ns, namespace=ns, deserved_gpus=4.0) for i, ns in enumerate(NAMESPACES)
    }
    snapshot.gpu_reservations = {"nlp": {"new": GpuReservation("new", "nlp", 1.0, NOW + 60)}}
    for event in events:
        run(state, event)
        assert_index_matches(state)
        for ns in NAMESPACES:
            if ns in state.namespaces:
                assert quota_decisions(snapshot, ns) == quota_decisions(without_index(snapshot), ns)
                assert gpus_in_use(snapshot, ns, NOW) == gpus_in_use(without_index(snapshot), ns, NOW)
