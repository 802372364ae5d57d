"""The watch-fed caches (webhook.kube.watch) against the API emulator, over HTTP with the real client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from tests.support.fixtures import Obj, metric, remote_calls
from tests.support.kube_emulator import KubeEmulator, eventually
from webhook.kube.watch import KubeWatcher, ResourceWatch, WatchTiming
from webhook.settings import SETTINGS_CONFIGMAP
from webhook.state.store import ClusterState
from webhook.state.watches import cache_watcher, default_watches

INSTALL_NS = "hopsworks"
# Every kind the caches watch (each one list-then-watch loop, so one open watch each).
WATCHED = {
    "Namespace", "PriorityClass", "ConfigMap", "LocalQueue", "ClusterQueue", "ResourceFlavor", "Topology",
    "ReplicaSet", "Pod", "Deployment",
}  # fmt: skip
FAST = WatchTiming(page_size=2, watch_timeout_s=30, backoff_initial_s=0.02, backoff_max_s=0.1, absent_retry_s=0.2)


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value}


def settings(ns: str = INSTALL_NS, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": SETTINGS_CONFIGMAP, "namespace": ns},
        "data": data,
    }


def pod(ns: str, name: str, gpus: int = 0, phase: str = "Running") -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"hopsworks.ai/workload-type": "notebook"}},
        "spec": {"containers": [{"name": "main", "image": "python", "resources": resources}]},
        "status": {"phase": phase},
    }


def local_queue(ns: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": name, "namespace": ns}}


def pod_names(state: ClusterState) -> set[str]:
    return {f"{r.namespace}/{r.name}" for pods in state.pods.values() for r in pods.values()}


@pytest.fixture
def kube_objects() -> list[Obj]:
    return [namespace(INSTALL_NS)]


@pytest.fixture
def state() -> ClusterState:
    return ClusterState(INSTALL_NS)


@pytest.fixture
async def watcher(state: ClusterState, api: ApiClient) -> AsyncIterator[KubeWatcher]:
    w = cache_watcher(state, api, INSTALL_NS, timing=FAST)
    yield w
    await w.stop()


def list_calls(kube: KubeEmulator, path: str) -> int:
    return len(kube.calls("GET", path, watch=False))


async def test_initial_sync_fills_the_store_and_sets_readiness(
    kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher
) -> None:
    kube.put_object(namespace("churn", {"hopsworks.ai/project": "churn"}))
    kube.put_object(namespace("other"))
    kube.put_object(priority_class("batch", 10))
    kube.put_object(settings(kueue_installed="true"))
    kube.put_object(settings("other", run_ai_enable="true"))  # same name, wrong namespace: not ours
    kube.put_object(local_queue("churn", "default"))
    for i in range(5):  # more than a page (page_size=2): the list is paginated
        kube.put_object(pod("churn", f"p{i}", gpus=1 if i == 0 else 0))
    assert not state.ready()

    await watcher.start()
    assert set(state.synced) == WATCHED
    assert await watcher.wait_synced(5)
    assert state.ready()
    assert set(state.namespaces) == {"default", INSTALL_NS, "churn", "other"}
    assert state.namespaces["churn"].is_project
    assert state.priority_classes["batch"].value == 10
    assert state.settings.kueue_installed and not state.settings.run_ai_enable
    assert state.local_queues == {"churn": frozenset({"default"})}
    assert pod_names(state) == {f"churn/p{i}" for i in range(5)}
    gpus = {r.name: r.gpus for r in state.pods["churn"].values()}
    assert gpus["p0"] == 1.0 and gpus["p1"] == 0.0
    assert list_calls(kube, "/api/v1/pods") == 3  # 5 pods in pages of 2
    settings_lists = [r for r in kube.calls("GET", f"/api/v1/namespaces/{INSTALL_NS}/configmaps")]
    assert all(r.query.get("fieldSelector") == f"metadata.name={SETTINGS_CONFIGMAP}" for r in settings_lists)
    assert metric("webhook_cache_objects", kind="Pod") == 5


async def test_changes_show_up_without_a_restart(kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher) -> None:
    kube.put_object(namespace("churn"))
    await watcher.start()
    assert await watcher.wait_synced(5)
    lists_before = len(kube.calls("GET", watch=False))
    events_before = metric("webhook_watch_events_total", kind="Namespace", type="MODIFIED")
    background_before = remote_calls("kubernetes", "background")

    kube.put_object(namespace("churn", {"hopsworks.ai/project": "churn", "hopsworks.ai/department": "risk"}))
    await eventually(lambda: state.namespaces["churn"].department == "risk")
    kube.put_object(priority_class("urgent", 1000))
    await eventually(lambda: "urgent" in state.priority_classes)
    namespace_events = metric("webhook_watch_events_total", kind="Namespace", type="ADDED")
    kube.put_object(settings(run_ai_enable="true", run_ai_project_gpu_quota="2"))
    await eventually(lambda: state.settings.run_ai_enable)
    assert state.settings.run_ai_project_gpu_quota == 2
    kube.put_object(namespace("other-ns"))
    kube.put_object(settings("other-ns", kueue_installed="true"))  # filtered out by the field selector
    kube.delete_object("ConfigMap", SETTINGS_CONFIGMAP, INSTALL_NS)
    await eventually(lambda: not state.settings.run_ai_enable)
    assert not state.settings.kueue_installed
    kube.put_object(local_queue("churn", "gpu"))
    await eventually(lambda: state.local_queues.get("churn") == frozenset({"gpu"}))
    kube.delete_object("PriorityClass", "urgent")
    await eventually(lambda: "urgent" not in state.priority_classes)

    assert len(kube.calls("GET", watch=False)) == lists_before  # all of it through the watches
    assert metric("webhook_watch_events_total", kind="Namespace", type="MODIFIED") == events_before + 1
    assert metric("webhook_watch_events_total", kind="Namespace", type="ADDED") == namespace_events + 1
    # Starting the watches counted as background calls; nothing since.
    assert remote_calls("kubernetes", "background") == background_before


async def test_pods_come_and_go(kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher) -> None:
    kube.put_object(namespace("churn"))
    await watcher.start()
    assert await watcher.wait_synced(5)
    kube.put_object(pod("churn", "nb", gpus=2, phase="Pending"))
    await eventually(lambda: pod_names(state) == {"churn/nb"})
    kube.put_object(pod("churn", "nb", gpus=2, phase="Succeeded"))
    await eventually(lambda: next(iter(state.pods["churn"].values())).finished)
    kube.delete_object("Pod", "nb", "churn")
    await eventually(lambda: not state.pods)


async def test_dropped_watches_resume_without_a_relist(
    kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher
) -> None:
    await watcher.start()
    assert await watcher.wait_synced(5)
    await eventually(lambda: kube.open_watches == len(WATCHED))
    lists_before = len(kube.calls("GET", watch=False))
    errors_before = metric("webhook_watch_restarts_total", kind="Namespace", reason="error")
    added_before = metric("webhook_watch_events_total", kind="Namespace", type="ADDED")
    kube.put_object(namespace("before-drop"))
    await eventually(lambda: "before-drop" in state.namespaces)

    assert kube.drop_watches() == len(WATCHED)
    kube.put_object(namespace("after-drop"))  # while the watches reconnect: must not be missed
    kube.put_object(pod(INSTALL_NS, "after-drop"))
    await eventually(lambda: "after-drop" in state.namespaces and pod_names(state) == {f"{INSTALL_NS}/after-drop"})
    await eventually(lambda: kube.open_watches == len(WATCHED))
    assert metric("webhook_watch_restarts_total", kind="Namespace", reason="error") == errors_before + 1
    assert len(kube.calls("GET", watch=False)) == lists_before  # resumed from the last resourceVersion
    # ... the last one seen, not the list's: "before-drop" is not replayed.
    assert metric("webhook_watch_events_total", kind="Namespace", type="ADDED") == added_before + 2

    closed_before = metric("webhook_watch_restarts_total", kind="Namespace", reason="closed")
    kube.close_watches()  # a clean end, as at timeoutSeconds
    kube.put_object(namespace("after-close"))
    await eventually(lambda: "after-close" in state.namespaces)
    assert metric("webhook_watch_restarts_total", kind="Namespace", reason="closed") == closed_before + 1
    assert len(kube.calls("GET", watch=False)) == lists_before


@pytest.mark.parametrize("gone_in_stream", [True, False], ids=["error-event", "http-410"])
async def test_gone_relists_and_leaves_no_stale_entries(
    kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher, gone_in_stream: bool
) -> None:
    kube.gone_in_stream = gone_in_stream
    for name in ("keep", "doomed"):
        kube.put_object(namespace(name))
        kube.put_object(pod(name, "p"))
    kube.put_object(priority_class("doomed", 1))
    await watcher.start()
    assert await watcher.wait_synced(5)
    await eventually(lambda: kube.open_watches == len(WATCHED))
    assert "doomed" in state.namespaces and "doomed/p" in pod_names(state)
    gone_before = metric("webhook_watch_restarts_total", kind="Pod", reason="gone")
    pod_lists = list_calls(kube, "/api/v1/pods")

    # Take the watches down and keep them down while objects change, then forget the history.
    kube.fail_next(10_000, status=503)
    kube.drop_watches()
    kube.delete_object("Pod", "p", "doomed")
    kube.delete_object("Namespace", "doomed")
    kube.delete_object("PriorityClass", "doomed")
    kube.put_object(namespace("born-while-down"))
    await eventually(lambda: kube.open_watches == 0)
    kube.compact()
    kube.clear_faults()

    await eventually(lambda: "doomed" not in state.namespaces and "born-while-down" in state.namespaces)
    await eventually(lambda: pod_names(state) == {"keep/p"} and "doomed" not in state.priority_classes)
    assert metric("webhook_watch_restarts_total", kind="Pod", reason="gone") == gone_before + 1
    assert list_calls(kube, "/api/v1/pods") == pod_lists + 1
    assert state.ready()
    # And the new watches carry on from the fresh list.
    kube.put_object(pod("keep", "q"))
    await eventually(lambda: pod_names(state) == {"keep/p", "keep/q"})


async def test_a_failing_list_is_retried(kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher) -> None:
    kube.put_object(priority_class("normal", 100))
    kube.fail_next(2, status=500, path_prefix="/apis/scheduling.k8s.io/v1/priorityclasses")
    errors_before = metric("webhook_watch_restarts_total", kind="PriorityClass", reason="error")
    await watcher.start()
    assert await watcher.wait_synced(5)
    assert "normal" in state.priority_classes
    assert list_calls(kube, "/apis/scheduling.k8s.io/v1/priorityclasses") == 3
    assert metric("webhook_watch_restarts_total", kind="PriorityClass", reason="error") == errors_before + 2


async def test_readiness_waits_for_a_list_that_keeps_failing(
    kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher
) -> None:
    kube.fail_next(10_000, status=503, path_prefix="/api/v1/pods")
    await watcher.start()
    await eventually(lambda: state.synced.get("Namespace") and state.synced.get("PriorityClass"))
    assert not await watcher.wait_synced(0.3)
    assert not state.ready()
    kube.clear_faults()
    assert await watcher.wait_synced(5)
    assert state.ready()


async def test_missing_kueue_crd_counts_as_synced_and_is_retried(
    kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher
) -> None:
    lq_type = kube._resolve("LocalQueue")
    kube.remove_resource("LocalQueue")
    await watcher.start()
    assert await watcher.wait_synced(5)
    assert state.synced["LocalQueue"] and state.local_queues == {}
    # Kueue gets installed later: the queues show up without a restart.
    kube.add_resource(lq_type)
    kube.put_object(namespace("churn"))
    kube.put_object(local_queue("churn", "default"))
    await eventually(lambda: state.local_queues.get("churn") == frozenset({"default"}))


async def test_stop_closes_every_watch(kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher) -> None:
    await watcher.start()
    assert await watcher.wait_synced(5)
    await eventually(lambda: kube.open_watches == len(WATCHED))
    await watcher.stop()
    await eventually(lambda: kube.open_watches == 0)
    kube.put_object(namespace("after-stop"))
    await asyncio.sleep(0.3)  # a watch still running would deliver it well within this
    assert "after-stop" not in state.namespaces


async def test_one_more_resource_is_one_line(kube: KubeEmulator, api: ApiClient) -> None:
    from functools import partial

    from kubernetes_asyncio.client import CoreV1Api

    seen: dict[str, dict[str, Any]] = {}

    class Recorder:
        synced: dict[str, bool] = {}

        def apply(self, obj: Any) -> None:
            seen[obj["metadata"]["name"]] = dict(obj)

        def delete(self, obj: Any) -> None:
            seen.pop(obj["metadata"]["name"], None)

        def replace_all(self, kind: str, objects: list[Any]) -> None:
            seen.clear()
            for obj in objects:
                self.apply(obj)

    core = CoreV1Api(api)
    extra = ResourceWatch(
        "ConfigMap",
        partial(core.list_namespaced_config_map, INSTALL_NS),
        name="ConfigMap/owned",
        label_selector="app=x",
    )
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": INSTALL_NS, "labels": {"app": "x"}}}
    kube.put_object({**cm, "metadata": {**cm["metadata"], "name": "a"}})
    kube.put_object({**cm, "metadata": {"name": "b", "namespace": INSTALL_NS}})
    async with KubeWatcher(Recorder(), [extra]) as w:
        assert await w.wait_synced(5)
        assert set(seen) == {"a"} and seen["a"]["kind"] == "ConfigMap"
        kube.put_object({**cm, "metadata": {**cm["metadata"], "name": "c"}})
        await eventually(lambda: set(seen) == {"a", "c"})
    assert [w.name for w in default_watches(api, INSTALL_NS, pods=False, kueue=False)] == [
        "Namespace",
        "PriorityClass",
        "ConfigMap",
        "Deployment",  # Run:ai's admission, in namespace runai
    ]


def poison_objects() -> list[dict[str, Any]]:
    """One object per cached kind that the store cannot take as it is (issue 10.1); an apiserver
    would not store most of them, but a cache must survive whatever a list or watch hands it."""
    gpu_poison = pod("churn", "gpu-poison")
    gpu_poison["metadata"]["annotations"] = {"gpu-fraction": "1e999999999"}  # decimal.Overflow before the fix
    nan_poison = pod("churn", "nan-poison")
    nan_poison["metadata"]["annotations"] = {"gpu-fraction": "0", "gpu-fraction-num-devices": "1e999999"}
    bad_labels = pod("churn", "bad-labels")
    bad_labels["metadata"]["labels"] = "not-a-map"
    bad_namespace = namespace("bad-ns")
    bad_namespace["metadata"]["labels"] = "not-a-map"
    return [
        gpu_poison,
        nan_poison,
        bad_labels,
        bad_namespace,
        {**priority_class("bad-pc", 0), "value": "urgent"},
        settings(scheduler="maxNodeSelectorTerms: " + "9" * 5_000),  # ValueError before the fix
    ]


def skipped(kind: str) -> float:
    return metric("webhook_cache_objects_skipped_total", kind=kind)


async def test_no_single_object_stops_a_cache_from_syncing(
    kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher
) -> None:
    # Issue 10.1: a poison object in the first list, in a re-list after 410 Gone, and in a watch
    # event. Each is skipped (or, for a pod's GPU request, counted as the most a pod may ask for),
    # the others are all there, and readiness tells the truth.
    from webhook.core.kinds import UNREADABLE_POD_GPUS

    kube.put_object(namespace("churn", {"hopsworks.ai/project": "churn"}))
    kube.put_object(priority_class("normal", 100))
    kube.put_object(local_queue("churn", "default"))
    for i in range(3):
        kube.put_object(pod("churn", f"good-{i}", gpus=1))
    for obj in poison_objects():
        kube.put_object(obj)
    before = {k: skipped(k) for k in ("Pod", "Namespace", "PriorityClass")}

    await watcher.start()
    assert await watcher.wait_synced(5), state.synced
    assert state.ready()
    assert {"churn", "default", INSTALL_NS} <= set(state.namespaces) and "bad-ns" not in state.namespaces
    assert set(state.priority_classes) == {"normal"}
    assert state.local_queues == {"churn": frozenset({"default"})}
    gpus = {r.name: r.gpus for r in state.pods["churn"].values()}
    assert gpus == {
        "good-0": 1.0,
        "good-1": 1.0,
        "good-2": 1.0,
        "gpu-poison": UNREADABLE_POD_GPUS,
        "nan-poison": UNREADABLE_POD_GPUS,
    }
    assert "scheduler:" in (state.snapshot().settings_error or "")  # refused, defaults serve (issue 10.6)
    assert {k: skipped(k) - before[k] for k in before} == {"Pod": 1, "Namespace": 1, "PriorityClass": 1}

    # A re-list after 410 Gone meets the same objects and still completes, with no stale entries.
    await eventually(lambda: kube.open_watches == len(WATCHED))
    kube.fail_next(10_000, status=503)
    kube.drop_watches()
    kube.delete_object("Pod", "good-2", "churn")
    await eventually(lambda: kube.open_watches == 0)
    kube.compact()
    kube.clear_faults()
    await eventually(lambda: "churn/good-2" not in pod_names(state))
    assert await watcher.wait_synced(5) and state.ready()
    assert pod_names(state) == {f"churn/{n}" for n in ("good-0", "good-1", "gpu-poison", "nan-poison")}
    assert skipped("Pod") - before["Pod"] == 2

    # And as watch events: skipped, and the events after them still arrive.
    await eventually(lambda: kube.open_watches == len(WATCHED))
    late = pod("churn", "late-poison")
    late["metadata"]["labels"] = "not-a-map"
    kube.put_object(late)
    kube.put_object(pod("churn", "after", gpus=2))
    await eventually(lambda: "churn/after" in pod_names(state))
    assert skipped("Pod") - before["Pod"] == 3
    assert state.ready()


async def test_a_relist_that_fails_part_way_is_not_reported_synced(kube: KubeEmulator, api: ApiClient) -> None:
    # Issue 10.1: after 410 Gone, /readyz said ready while the pod cache held only part of the list.
    class Breaks(ClusterState):
        broken = False

        def replace_all(self, kind: str, objects: list[Any]) -> None:
            if self.broken and kind == "Pod":
                raise RuntimeError("a store bug half way through")
            super().replace_all(kind, objects)

    state = Breaks(INSTALL_NS)
    kube.put_object(pod(INSTALL_NS, "p"))
    watch = ResourceWatch("Pod", partial_list_pods(api), timing=FAST)
    task = asyncio.create_task(watch.run(state))
    try:
        await eventually(lambda: state.synced.get("Pod") is True)
        state.broken = True
        await eventually(lambda: kube.open_watches == 1)
        kube.fail_next(10_000, status=503)
        kube.drop_watches()
        await eventually(lambda: kube.open_watches == 0)
        kube.put_object(pod(INSTALL_NS, "q"))  # history moves on, then is forgotten: 410 Gone
        kube.compact()
        kube.clear_faults()
        await eventually(lambda: state.synced.get("Pod") is False)
        state.broken = False
        await eventually(lambda: state.synced.get("Pod") is True)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def partial_list_pods(api: ApiClient) -> Any:
    from kubernetes_asyncio.client import CoreV1Api

    return CoreV1Api(api).list_pod_for_all_namespaces


# -- Kueue's objects behind a queue, and the ReplicaSets pod groups are named after ---------------------


def replica_set(ns: str, name: str, *, deployment: str | None, desired: str | None, replicas: int) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{name}"}
    if deployment is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment, "uid": "uid-d", "controller": True}
        ]
    if desired is not None:
        meta["annotations"] = {"deployment.kubernetes.io/desired-replicas": desired, "other": "x" * 1000}
    template = {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "i" * 5000}]}}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": meta,
        "spec": {"replicas": replicas, "template": template},
    }


async def test_kueue_objects_and_replica_sets_are_cached_and_follow_changes(
    kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher
) -> None:
    from tests.support.cluster import cluster_queue, resource_flavor, topology
    from tests.support.cluster import local_queue as queue_of

    kube.put_object(namespace("churn"))
    kube.put_object(topology())
    kube.put_object(resource_flavor())
    kube.put_object(cluster_queue(cohort="research", usage={"default": {"cpu": "6"}}, pending=3))
    kube.put_object(queue_of("churn", "default", pendingWorkloads=1))
    kube.put_object(replica_set("churn", "web-5d8f", deployment="web", desired="3", replicas=1))
    kube.put_object(replica_set("churn", "bare", deployment=None, desired=None, replicas=2))
    await watcher.start()
    assert await watcher.wait_synced(5)
    snap = state.snapshot()
    assert snap.topologies["default"].levels == (
        "topology.kubernetes.io/region", "topology.kubernetes.io/zone", "kubernetes.io/hostname"
    )  # fmt: skip
    assert snap.resource_flavors["default"].topology == "default"
    cq = snap.cluster_queues["cq"]
    assert (cq.cohort, cq.pending, cq.active, cq.flavor_names) == ("research", 3, True, ("default",))
    assert cq.flavors[0].nominal == {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "8"}
    assert cq.flavors[0].usage == {"cpu": "6"}
    local = snap.local_queue_info["churn"]["default"]
    assert (local.cluster_queue, local.pending) == ("cq", 1)
    # The Deployment's count, not the ReplicaSet's (1 while a rollout scales it up); a bare one's own.
    web, bare = snap.replica_sets["churn"]["web-5d8f"], snap.replica_sets["churn"]["bare"]
    assert (web.replicas, web.deployment) == (3, "web") and web.uid
    assert (bare.replicas, bare.deployment) == (2, None)

    kube.put_object(cluster_queue(cohort="research", usage={"default": {"cpu": "9"}}, pending=0))
    await eventually(lambda: state.snapshot().cluster_queues["cq"].flavors[0].usage == {"cpu": "9"})
    kube.put_object(replica_set("churn", "web-5d8f", deployment="web", desired="5", replicas=3))
    await eventually(lambda: state.snapshot().replica_sets["churn"]["web-5d8f"].replicas == 5)
    kube.delete_object("Topology", "default")
    await eventually(lambda: "default" not in state.snapshot().topologies)
    kube.delete_object("ReplicaSet", "bare", "churn")
    await eventually(lambda: "bare" not in state.snapshot().replica_sets["churn"])


async def test_a_kueue_serving_only_v1beta1_is_read_at_v1beta1(
    kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher
) -> None:
    # Kueue before v0.15 serves no v1beta2: the caches fall back to v1beta1, whose ClusterQueue
    # names its cohort `spec.cohort`.
    from tests.support.kube_emulator_types import ResourceType

    kube.remove_resource("ClusterQueue")
    kube.add_resource(
        ResourceType("kueue.x-k8s.io", "v1beta1", "clusterqueues", "ClusterQueue", False, status_subresource=True,
                     custom=True)
    )  # fmt: skip
    kube.put_object(
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "old"},
         "spec": {"cohort": "legacy", "resourceGroups": []}}
    )  # fmt: skip
    await watcher.start()
    assert await watcher.wait_synced(5)
    assert state.snapshot().cluster_queues["old"].cohort == "legacy"
    v1beta2 = kube.calls("GET", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues")
    assert v1beta2, "v1beta2 is asked first"


async def test_kueue_objects_of_odd_shapes_are_kept_with_what_can_be_read(
    kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher
) -> None:
    kube.put_object(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": "odd"},
            "spec": {"resourceGroups": "nope", "cohortName": 7},
            "status": {"pendingWorkloads": "many"},
        }
    )
    kube.put_object(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Topology",
            "metadata": {"name": "t"},
            "spec": {"levels": [{"nodeLabel": 3}, "x", {"nodeLabel": "kubernetes.io/hostname"}]},
        }
    )
    kube.put_object({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "f"},
                     "spec": {"topologyName": {"not": "a name"}}})  # fmt: skip
    await watcher.start()
    assert await watcher.wait_synced(5) and state.ready()
    snap = state.snapshot()
    assert (snap.cluster_queues["odd"].flavors, snap.cluster_queues["odd"].cohort) == ((), None)
    assert snap.cluster_queues["odd"].pending == 0
    assert snap.topologies["t"].levels == ("kubernetes.io/hostname",)
    assert snap.resource_flavors["f"].topology is None
