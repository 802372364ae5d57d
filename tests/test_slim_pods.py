"""What the pod cache keeps of a pod, listed or watched (`webhook.state.slim_pods`), and the pod
list's way into the store page by page (`ClusterState.listing`): the same records as a pod applied
whole, whichever way it came. No timings here: those are in `python -m bench.cold_start`."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from bench.cold_start import stored_pod
from tests.support.cluster import SCHEDULER, priority_class, settings_configmap
from webhook.kube.watch import ResourceWatch
from webhook.snapshot import PodRecord
from webhook.state.slim_pods import decode_pod_list, slim_pod
from webhook.state.store import ClusterState
from webhook.state.watches import default_watches

Obj = dict[str, Any]
NS = "vision"
JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-job", "controller": True}


def record_fields(record: PodRecord) -> tuple[Any, ...]:
    """Every field of a record, those left out of its equality too."""
    return tuple(getattr(record, f.name) for f in dataclasses.fields(record))


def with_(change: Callable[[Obj], None], gpu: bool = True) -> Obj:
    pod = stored_pod(7, NS, gpu)
    change(pod)
    return pod


def _sidecar(pod: Obj) -> None:
    pod["spec"]["initContainers"] = [
        {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        {"name": "init", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
    ]


def _fraction(pod: Obj) -> None:
    pod["metadata"]["annotations"] = {"gpu-fraction": "0.5", "kubectl.kubernetes.io/last-applied-configuration": "{}"}


def _job(pod: Obj) -> None:
    pod["metadata"]["ownerReferences"] = [JOB_OWNER]
    pod["metadata"]["labels"]["job-type"] = "spark"


def _unreadable(pod: Obj) -> None:
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "lots"}}


def _bare(pod: Obj) -> None:
    for key in ("status", "spec"):
        del pod[key]
    pod["metadata"] = {"name": "bare", "namespace": NS}


def _finished(pod: Obj) -> None:
    pod["status"] = {"phase": "Succeeded"}


def _preemptible(pod: Obj) -> None:
    pod["metadata"]["labels"]["kai.scheduler/preemptibility"] = "preemptible"


def _mig(pod: Obj) -> None:
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-3g.20gb": "2", "cpu": "1"}}


PODS: dict[str, Obj] = {
    "plain notebook, as an apiserver lists it": stored_pod(1, NS, False),
    "GPU notebook": stored_pod(2, NS, True),
    "GPU sidecar beside an init container": with_(_sidecar),
    "fraction annotation and last-applied": with_(_fraction, gpu=False),
    "job pod": with_(_job),
    "unreadable GPU request": with_(_unreadable),
    "no spec, no status": with_(_bare, gpu=False),
    "finished": with_(_finished),
    "preemptible by label": with_(_preemptible),
    "MIG instances": with_(_mig, gpu=False),
}


def new_state() -> ClusterState:
    state = ClusterState("hopsworks")
    state.apply(settings_configmap())
    state.apply(priority_class("normal", 10000))
    return state


def page(pods: list[Obj], **meta: Any) -> bytes:
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": pods}).encode()


@pytest.mark.parametrize("name", PODS)
def test_a_listed_pod_is_slimmed_as_a_watched_one(name: str) -> None:
    pod = PODS[name]
    decoded = decode_pod_list(page([copy.deepcopy(pod)]))
    assert decoded is not None
    assert decoded["items"] == [slim_pod(copy.deepcopy(pod))]


@pytest.mark.parametrize("name", PODS)
def test_a_listed_pod_makes_the_record_the_whole_pod_makes(name: str) -> None:
    whole, listed = new_state(), new_state()
    whole.apply({"kind": "Pod", **copy.deepcopy(PODS[name])})
    decoded = decode_pod_list(page([copy.deepcopy(PODS[name])]))
    assert decoded is not None
    listing = listed.listing("Pod")
    listing.add(decoded["items"])
    listing.finish()
    [expected] = [r for pods in whole.pods.values() for r in pods.values()]
    [got] = [r for pods in listed.pods.values() for r in pods.values()]
    assert record_fields(got) == record_fields(expected)
    assert listed.held_gpus.get(NS) == whole.held_gpus.get(NS)
    assert listed.unreadable_gpu_pods == whole.unreadable_gpu_pods


def test_a_gpu_sidecar_counts_beside_the_app_containers() -> None:
    # Slimming once dropped restartPolicy, so a cached pod's GPU sidecar was counted as an init
    # container that ends before the app starts: 1 GPU held where the pod holds 2.
    state = new_state()
    state.apply(slim_pod({"kind": "Pod", **copy.deepcopy(PODS["GPU sidecar beside an init container"])}))
    [record] = state.pods[NS].values()
    assert record.gpus == 2.0


@dataclass(frozen=True)
class Change:
    what: str
    write: Callable[[ClusterState], None]


def scheduler(**more: Any) -> dict[str, Any]:
    return {**SCHEDULER, **more}


CHANGES = [
    Change("the workload kinds: the pods' label makes them apps", lambda s: s.apply(settings_configmap(
        scheduler=scheduler(workloadKinds={"rules": [{"label": "team-app", "kind": "app"}]})))),
    Change("Run:ai's preemptibility label is another one", lambda s: s.apply(settings_configmap(
        scheduler=scheduler(runai={"preemptibilityLabel": "example.com/preemptible"})))),
    Change("the PriorityClass the pods name is worth less than 100: preemptible",
           lambda s: s.apply(priority_class("normal", 50))),
]  # fmt: skip


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.what)
def test_settings_changed_while_the_list_arrives_hold_for_its_pods(change: Change) -> None:
    pods = [stored_pod(i, NS, True) for i in range(3)]
    for pod in pods:
        del pod["metadata"]["labels"]["hopsworks.ai/workload-type"]
        pod["metadata"]["labels"]["team-app"] = "x"
    pods[0]["metadata"]["labels"]["kai.scheduler/preemptibility"] = "preemptible"
    listed, applied, unchanged = new_state(), new_state(), new_state()
    listing = listed.listing("Pod")
    decoded = decode_pod_list(page(copy.deepcopy(pods)))
    assert decoded is not None
    listing.add(decoded["items"][:2])
    change.write(listed)
    listing.add(decoded["items"][2:])
    listing.finish()
    change.write(applied)
    for pod in pods:
        applied.apply({"kind": "Pod", **pod})
        unchanged.apply({"kind": "Pod", **pod})
    assert listed.snapshot().settings_error is None

    def records(state: ClusterState) -> list[tuple[Any, ...]]:
        return sorted(map(record_fields, state.pods[NS].values()))

    assert records(applied) != records(unchanged)  # the change matters to these pods
    assert records(listed) == records(applied)
    assert listed.held_gpus.get(NS) == applied.held_gpus.get(NS)


def test_a_relist_frees_what_is_gone_and_keeps_the_rest() -> None:
    state = new_state()
    kept, gone = stored_pod(1, NS, True), stored_pod(2, NS, True)
    state.replace_all("Pod", [kept, gone])
    listing = state.listing("Pod")
    listing.add([slim_pod(kept)])
    listing.finish()
    assert [r.uid for r in state.pods[NS].values()] == [kept["metadata"]["uid"]]
    assert set(state.freed_pods[NS]) == {gone["metadata"]["uid"]}
    assert state.held_gpus.get(NS) == 1.0


class Pages:
    """The pod list an apiserver answers, one page per call, as the watch reads responses."""

    status = 200

    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies = bodies
        self.asked: list[dict[str, Any]] = []
        self._body = b""

    async def __call__(self, **kwargs: Any) -> Pages:
        self.asked.append(kwargs)
        token = kwargs.get("_continue")
        self._body = self.bodies[int(token) if token else 0]
        return self

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


def pod_watch(list_fn: Any) -> ResourceWatch:
    async def made() -> ResourceWatch:
        from kubernetes_asyncio.client import ApiClient, Configuration

        async with ApiClient(Configuration()) as api:
            return next(w for w in default_watches(api, "hopsworks") if w.kind == "Pod")

    return dataclasses.replace(asyncio.run(made()), list_fn=list_fn)


PAGINGS: dict[str, list[list[Any]]] = {
    "one page": [[stored_pod(i, NS, i % 2 == 0) for i in range(4)]],
    "three pages": [[stored_pod(i, NS, i % 2 == 0) for i in range(j, j + 2)] for j in (0, 2, 4)],
    "a page with an item that is no object": [[stored_pod(0, NS, True)], [stored_pod(1, NS, True), "junk"]],
    "a page with a container that is no object": [
        [with_(lambda p: p["spec"]["containers"].append(7))],
        [stored_pod(1, NS, False)],
    ],
}


@pytest.mark.parametrize("name", PAGINGS)
def test_the_pod_watch_lists_page_by_page_into_the_records_of_the_whole_pods(name: str) -> None:
    pages = PAGINGS[name]
    bodies = [
        page(items, resourceVersion="42", **({"continue": str(i + 1)} if i + 1 < len(pages) else {}))
        for i, items in enumerate(pages)
    ]
    fetch = Pages(bodies)
    listed, whole = new_state(), new_state()
    asyncio.run(pod_watch(fetch)._list(listed))
    for pod in (p for items in pages for p in items if isinstance(p, dict)):
        whole.apply({"kind": "Pod", **pod})
    assert listed.synced["Pod"]
    assert [a.get("_continue") for a in fetch.asked] == [None, *(str(i) for i in range(1, len(pages)))]
    assert sorted(map(record_fields, listed.pods[NS].values())) == sorted(map(record_fields, whole.pods[NS].values()))
    assert listed.held_gpus.get(NS) == whole.held_gpus.get(NS)
