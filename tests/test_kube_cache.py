"""The watch-fed caches (webhook.kube.watch) against the shared real control plane, as the
webhook's ServiceAccount with the chart's RBAC, through the test's fault proxy for the faults:
lists refused with 5xx, watch streams cut or ended, 410 Gone, with the real kubernetes_asyncio
client. Objects the apiserver would not store (a cache must still survive them) are given to the
store directly."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from tests.support.control_plane.fault_proxy import FaultProxy
from tests.support.fixtures import metric, remote_calls
from tests.support.kube_scope import KubeScope, SharedCluster, eventually
from tests.support.kueue_crds import kueue_crds
from webhook.kube.watch import HeldListing, KubeWatcher, Listing, ResourceWatch, WatchTiming
from webhook.settings import SETTINGS_CONFIGMAP
from webhook.snapshot import PodRecord
from webhook.state.store import ClusterState
from webhook.state.watches import cache_watcher, default_watches

# Every kind the caches watch (each one list-then-watch loop, so one open watch each); Kueue's
# only while its CRDs are installed (a test that needs them asks for `kueue`).
KUEUE = {"LocalQueue", "ClusterQueue", "ResourceFlavor", "Topology"}
WATCHED = {"Namespace", "PriorityClass", "ConfigMap", "ReplicaSet", "Pod", "Deployment"} | KUEUE
# The resource of each kind, as the proxy names what it forwards.
RESOURCES = {"Namespace": "namespaces", "PriorityClass": "priorityclasses", "ConfigMap": "configmaps",
             "ReplicaSet": "replicasets", "Pod": "pods", "Deployment": "deployments"}  # fmt: skip
FAST = WatchTiming(
    page_size=2, pod_page_size=2, watch_timeout_s=30, backoff_initial_s=0.02, backoff_max_s=0.1, absent_retry_s=0.2
)
PC = "scheduling.k8s.io/v1"


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {"apiVersion": PC, "kind": "PriorityClass", "metadata": {"name": name}, "value": value}


def settings(ns: str, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": SETTINGS_CONFIGMAP, "namespace": ns},
        "data": data,
    }


def pod(ns: str, name: str, gpus: int = 0) -> dict[str, Any]:
    """A pod no node takes (its nodeSelector matches none), so it stays as the test made it."""
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"hopsworks.ai/workload-type": "notebook"}},
        "spec": {
            "nodeSelector": {"kube-cache-test": "no-such-node"},
            "containers": [{"name": "main", "image": "python", "resources": resources}],
        },
    }


def local_queue(ns: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterQueue": "cq"}}  # fmt: skip


def pod_names(state: ClusterState, namespaces: set[str]) -> set[str]:
    """The cached pods of the test's namespaces (the shared cluster has others')."""
    return {f"{r.namespace}/{r.name}" for ns, pods in state.pods.items() if ns in namespaces for r in pods.values()}


@pytest.fixture(scope="module")
def kueue(shared_control_plane: SharedCluster) -> Iterator[None]:
    """Kueue's CRDs from the first test that asks until the module ends (installing them takes a
    while); the test of a cluster without them runs first and asks for them half way."""
    with kueue_crds(shared_control_plane.cp):
        yield


@pytest.fixture
def state(kube_scope: KubeScope) -> ClusterState:
    return ClusterState(kube_scope.install_ns)


@pytest.fixture
async def api(fault_proxy: FaultProxy, kube_scope: KubeScope) -> AsyncIterator[ApiClient]:
    """The webhook's ServiceAccount, through the test's proxy."""
    async with await fault_proxy.api_client_via(kube_scope.kubeconfig) as client:
        yield client


@pytest.fixture
async def watcher(state: ClusterState, api: ApiClient, kube_scope: KubeScope) -> AsyncIterator[KubeWatcher]:
    w = cache_watcher(state, api, kube_scope.install_ns, timing=FAST)
    yield w
    await w.stop()


def open_watches(proxy: FaultProxy) -> int:
    """Open watches of the kinds the caches watch on every cluster (Kueue's only with its CRDs)."""
    return sum(proxy.open_watches(r) for r in RESOURCES.values())


def lists(proxy: FaultProxy, resource: str | None = None) -> int:
    """Lists that reached the proxy (of `resource`, else of every kind but Kueue's, which are
    listed again and again while their CRDs are absent)."""
    resources = [resource] if resource else RESOURCES.values()
    return sum(len(proxy.calls(verb="list", resource=r)) for r in resources)


async def test_missing_kueue_crd_counts_as_synced_and_is_retried(
    request: pytest.FixtureRequest, kube_scope: KubeScope, state: ClusterState, watcher: KubeWatcher
) -> None:
    # First in the module: the shared cluster has no Kueue until a test asks for its CRDs.
    await watcher.start()
    assert await watcher.wait_synced(10)
    churn = await kube_scope.namespace("churn")
    assert state.synced["LocalQueue"] and churn not in state.local_queues
    # Kueue gets installed later: the queues show up without a restart.
    request.getfixturevalue("kueue")
    await kube_scope.create(local_queue(churn, "default"))
    await eventually(lambda: state.local_queues.get(churn) == frozenset({"default"}), within_s=30)


async def test_initial_sync_fills_the_store_and_sets_readiness(
    kube_scope: KubeScope, fault_proxy: FaultProxy, state: ClusterState, watcher: KubeWatcher, kueue: None
) -> None:
    churn = kube_scope.name("churn")
    await kube_scope.create(namespace(churn, {"hopsworks.ai/project": churn}))
    other = await kube_scope.namespace("other", project=False)
    batch = kube_scope.name("batch")
    await kube_scope.create(priority_class(batch, 10))
    await kube_scope.settings(kueue_installed="true")
    await kube_scope.create(settings(other, run_ai_enable="true"))  # same name, wrong namespace: not ours
    await kube_scope.create(local_queue(churn, "default"))
    for i in range(5):  # more than a page (page_size=2): the list is paginated
        await kube_scope.create(pod(churn, f"p{i}", gpus=1 if i == 0 else 0))
    assert not state.ready()

    await watcher.start()
    assert set(state.synced) == WATCHED
    assert await watcher.wait_synced(10)
    assert state.ready()
    assert {"default", kube_scope.install_ns, churn, other} <= set(state.namespaces)
    assert state.namespaces[churn].is_project
    assert state.priority_classes[batch].value == 10
    assert state.settings.kueue_installed and not state.settings.run_ai_enable
    assert state.local_queues[churn] == frozenset({"default"})
    assert pod_names(state, {churn}) == {f"{churn}/p{i}" for i in range(5)}
    gpus = {r.name: r.gpus for r in state.pods[churn].values()}
    assert gpus["p0"] == 1.0 and gpus["p1"] == 0.0
    pod_lists = fault_proxy.calls(verb="list", resource="pods")
    assert len(pod_lists) >= 3 and {c.query.get("limit") for c in pod_lists} == {"2"}  # paginated
    settings_lists = fault_proxy.calls(verb="list", resource="configmaps", namespace=kube_scope.install_ns)
    assert settings_lists
    assert all(c.query.get("fieldSelector") == f"metadata.name={SETTINGS_CONFIGMAP}" for c in settings_lists)
    assert metric("webhook_cache_objects", kind="Pod") >= 5
    assert metric("webhook_cache_list_seconds", kind="Pod") > 0


async def test_changes_show_up_without_a_restart(
    kube_scope: KubeScope, fault_proxy: FaultProxy, state: ClusterState, watcher: KubeWatcher, kueue: None
) -> None:
    churn = kube_scope.name("churn")
    await kube_scope.create(namespace(churn))
    await watcher.start()
    assert await watcher.wait_synced(10)
    lists_before = lists(fault_proxy)
    events_before = metric("webhook_watch_events_total", kind="Namespace", type="MODIFIED")
    background_before = remote_calls("kubernetes", "background")

    labels = {"hopsworks.ai/project": churn, "hopsworks.ai/department": "risk"}
    await kube_scope.patch("v1", "Namespace", churn, {"metadata": {"labels": labels}})
    await eventually(lambda: state.namespaces[churn].department == "risk")
    urgent = kube_scope.name("urgent")
    await kube_scope.create(priority_class(urgent, 1000))
    await eventually(lambda: urgent in state.priority_classes)
    await kube_scope.settings(run_ai_enable="true", run_ai_project_gpu_quota="2")
    await eventually(lambda: state.settings.run_ai_enable)
    assert state.settings.run_ai_project_gpu_quota == 2
    other = await kube_scope.namespace("other-ns", project=False)
    await kube_scope.create(settings(other, kueue_installed="true"))  # filtered out by the field selector
    await kube_scope.delete("v1", "ConfigMap", SETTINGS_CONFIGMAP, kube_scope.install_ns)
    await eventually(lambda: not state.settings.run_ai_enable)
    assert not state.settings.kueue_installed
    await kube_scope.create(local_queue(churn, "gpu"))
    await eventually(lambda: state.local_queues.get(churn) == frozenset({"gpu"}))
    await kube_scope.delete(PC, "PriorityClass", urgent)
    await eventually(lambda: urgent not in state.priority_classes)

    assert lists(fault_proxy) == lists_before  # all of it through the watches
    assert metric("webhook_watch_events_total", kind="Namespace", type="MODIFIED") >= events_before + 1
    # Starting the watches counted as background calls; nothing since.
    assert remote_calls("kubernetes", "background") == background_before


async def test_pods_come_and_go(kube_scope: KubeScope, state: ClusterState, watcher: KubeWatcher) -> None:
    churn = await kube_scope.namespace("churn")
    await watcher.start()
    assert await watcher.wait_synced(10)
    await kube_scope.create(pod(churn, "nb", gpus=2))
    await eventually(lambda: pod_names(state, {churn}) == {f"{churn}/nb"})
    await kube_scope.patch("v1", "Pod", "nb", {"status": {"phase": "Succeeded"}}, churn, subresource="status")
    await eventually(lambda: next(iter(state.pods[churn].values())).finished)
    await kube_scope.call("DELETE", f"/api/v1/namespaces/{churn}/pods/nb", {"gracePeriodSeconds": 0})
    await eventually(lambda: not pod_names(state, {churn}))


async def test_dropped_watches_resume_without_a_relist(
    kube_scope: KubeScope, fault_proxy: FaultProxy, state: ClusterState, watcher: KubeWatcher
) -> None:
    await watcher.start()
    assert await watcher.wait_synced(10)
    await eventually(lambda: open_watches(fault_proxy) == len(RESOURCES))
    lists_before = lists(fault_proxy)
    errors_before = metric("webhook_watch_restarts_total", kind="Namespace", reason="error")
    before_drop = await kube_scope.namespace("before-drop", project=False)
    await eventually(lambda: before_drop in state.namespaces)
    watches_before = len(fault_proxy.calls(verb="watch", resource="namespaces"))

    assert fault_proxy.cut_watches() >= len(RESOURCES)
    after_drop = await kube_scope.namespace("after-drop", project=False)  # while the watches reconnect
    await kube_scope.create(pod(kube_scope.install_ns, "after-drop"))
    await eventually(
        lambda: (
            after_drop in state.namespaces
            and pod_names(state, {kube_scope.install_ns}) == {f"{kube_scope.install_ns}/after-drop"}
        )
    )
    await eventually(lambda: open_watches(fault_proxy) == len(RESOURCES))
    assert metric("webhook_watch_restarts_total", kind="Namespace", reason="error") == errors_before + 1
    # Resumed from the last resourceVersion seen (not the list's), without a new list.
    assert lists(fault_proxy) == lists_before
    (resumed,) = fault_proxy.calls(verb="watch", resource="namespaces")[watches_before:]
    assert int(resumed.query["resourceVersion"]) >= int(state.namespaces[before_drop].resource_version or 0)

    closed_before = metric("webhook_watch_restarts_total", kind="Namespace", reason="closed")
    fault_proxy.end_watches()  # a clean end, as at timeoutSeconds
    after_close = await kube_scope.namespace("after-close", project=False)
    await eventually(lambda: after_close in state.namespaces)
    assert metric("webhook_watch_restarts_total", kind="Namespace", reason="closed") == closed_before + 1
    assert lists(fault_proxy) == lists_before


def expire_next_watches(proxy: FaultProxy, in_stream: bool = True) -> None:
    """The next watch of each kind is told 410 Gone (what a watch resumed after a long outage
    meets once the apiserver's history has moved past it)."""
    for resource in RESOURCES.values():
        proxy.expire(n=1, verb="watch", resource=resource, in_stream=in_stream)


@pytest.mark.parametrize("in_stream", [True, False], ids=["error-event", "http-410"])
async def test_gone_relists_and_leaves_no_stale_entries(
    kube_scope: KubeScope, fault_proxy: FaultProxy, state: ClusterState, watcher: KubeWatcher, in_stream: bool
) -> None:
    keep, doomed = kube_scope.name("keep"), kube_scope.name("doomed")
    for name in (keep, doomed):
        await kube_scope.create(namespace(name))
        await kube_scope.create(pod(name, "p"))
    await kube_scope.create(priority_class(doomed, 1))
    await watcher.start()
    assert await watcher.wait_synced(10)
    await eventually(lambda: open_watches(fault_proxy) == len(RESOURCES))
    assert doomed in state.namespaces and f"{doomed}/p" in pod_names(state, {doomed})
    gone_before = metric("webhook_watch_restarts_total", kind="Pod", reason="gone")
    pod_lists = lists(fault_proxy, "pods")

    # Take the watches down and keep them down while objects change, then forget the history.
    down = fault_proxy.fail(503, n=None)
    fault_proxy.cut_watches()
    await kube_scope.call("DELETE", f"/api/v1/namespaces/{doomed}/pods/p", {"gracePeriodSeconds": 0})
    await kube_scope.delete("v1", "Namespace", doomed)
    await kube_scope.delete(PC, "PriorityClass", doomed)
    born = await kube_scope.namespace("born-while-down")
    await eventually(lambda: open_watches(fault_proxy) == 0)
    expire_next_watches(fault_proxy, in_stream)
    down.remove()

    await eventually(lambda: doomed not in state.namespaces and born in state.namespaces, within_s=30)
    await eventually(lambda: pod_names(state, {keep, doomed}) == {f"{keep}/p"} and doomed not in state.priority_classes)
    assert metric("webhook_watch_restarts_total", kind="Pod", reason="gone") == gone_before + 1
    assert lists(fault_proxy, "pods") >= pod_lists + 1
    assert state.ready()
    # And the new watches carry on from the fresh list.
    await kube_scope.create(pod(keep, "q"))
    await eventually(lambda: pod_names(state, {keep}) == {f"{keep}/p", f"{keep}/q"})


async def test_a_failing_list_is_retried(
    kube_scope: KubeScope, fault_proxy: FaultProxy, state: ClusterState, watcher: KubeWatcher
) -> None:
    normal = kube_scope.name("normal")
    await kube_scope.create(priority_class(normal, 100))
    failing = fault_proxy.fail(500, n=2, verb="list", resource="priorityclasses")
    errors_before = metric("webhook_watch_restarts_total", kind="PriorityClass", reason="error")
    await watcher.start()
    assert await watcher.wait_synced(10)
    assert normal in state.priority_classes
    # Two first pages refused, then the whole list (in pages of 2) from the start.
    first_pages = [c for c in fault_proxy.calls(verb="list", resource="priorityclasses") if "continue" not in c.query]
    assert failing.hits == 2 and len(first_pages) == 3
    assert metric("webhook_watch_restarts_total", kind="PriorityClass", reason="error") == errors_before + 2


async def test_readiness_waits_for_a_list_that_keeps_failing(
    fault_proxy: FaultProxy, state: ClusterState, watcher: KubeWatcher
) -> None:
    failing = fault_proxy.fail(503, n=None, verb="list", resource="pods")
    await watcher.start()
    await eventually(lambda: state.synced.get("Namespace") and state.synced.get("PriorityClass"))
    await eventually(lambda: failing.hits >= 2)
    assert not state.synced.get("Pod")
    assert not state.ready()
    failing.remove()
    assert await watcher.wait_synced(10)
    assert state.ready()


async def test_stop_closes_every_watch(
    kube_scope: KubeScope, fault_proxy: FaultProxy, state: ClusterState, watcher: KubeWatcher
) -> None:
    await watcher.start()
    assert await watcher.wait_synced(10)
    await eventually(lambda: open_watches(fault_proxy) == len(RESOURCES))
    await watcher.stop()
    await eventually(lambda: open_watches(fault_proxy) == 0)
    after_stop = await kube_scope.namespace("after-stop", project=False)
    await asyncio.sleep(0.3)  # a watch still running would deliver it well within this
    assert after_stop not in state.namespaces


async def test_one_more_resource_is_one_line(kube_scope: KubeScope, api: ApiClient) -> None:
    from functools import partial

    from kubernetes_asyncio.client import CoreV1Api

    seen: dict[str, dict[str, Any]] = {}

    class Recorder:
        synced: dict[str, bool] = {}

        def apply(self, obj: Any) -> None:
            seen[obj["metadata"]["name"]] = dict(obj)

        def delete(self, obj: Any) -> None:
            seen.pop(obj["metadata"]["name"], None)

        def replace_all(self, kind: str, objects: Sequence[Mapping[str, Any]]) -> None:
            seen.clear()
            for obj in objects:
                self.apply(obj)

        def listing(self, kind: str) -> Listing:
            return HeldListing(self, kind)

    ns = await kube_scope.namespace("owned", project=False)
    # The webhook's ServiceAccount reads ConfigMaps only in its install namespace: the admin here.
    core = CoreV1Api(kube_scope.api)
    extra = ResourceWatch(
        "ConfigMap",
        partial(core.list_namespaced_config_map, ns),
        name="ConfigMap/owned",
        label_selector="app=x",
    )
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"namespace": ns, "labels": {"app": "x"}},
    }
    await kube_scope.create({**cm, "metadata": {**cm["metadata"], "name": "a"}})
    await kube_scope.create({**cm, "metadata": {"name": "b", "namespace": ns}})
    async with KubeWatcher(Recorder(), [extra]) as w:
        assert await w.wait_synced(10)
        assert set(seen) == {"a"} and seen["a"]["kind"] == "ConfigMap"
        await kube_scope.create({**cm, "metadata": {**cm["metadata"], "name": "c"}})
        await eventually(lambda: set(seen) == {"a", "c"})
    assert [w.name for w in default_watches(api, kube_scope.install_ns, pods=False, kueue=False)] == [
        "Namespace",
        "PriorityClass",
        "ConfigMap",
        "Deployment",  # Run:ai's admission, in namespace runai
    ]


def gpu_poisons(ns: str) -> list[dict[str, Any]]:
    """Pods the apiserver stores but whose GPU request cannot be read as a number."""
    gpu_poison = pod(ns, "gpu-poison")
    gpu_poison["metadata"]["annotations"] = {"gpu-fraction": "1e999999999"}  # decimal.Overflow once
    nan_poison = pod(ns, "nan-poison")
    nan_poison["metadata"]["annotations"] = {"gpu-fraction": "0", "gpu-fraction-num-devices": "1e999999"}
    return [gpu_poison, nan_poison]


def unreadable(names: set[str]) -> Any:
    """What the proxy makes of the objects named: shapes the apiserver would refuse to store (labels
    that are no map, a PriorityClass value that is no number), as a list or a watch hands them out."""

    def edit(obj: dict[str, Any]) -> dict[str, Any]:
        if obj.get("metadata", {}).get("name") in names:
            if obj.get("kind") == "PriorityClass" or "value" in obj:
                obj["value"] = "urgent"
            else:
                obj["metadata"]["labels"] = "not-a-map"
        return obj

    return edit


def skipped(kind: str) -> float:
    return metric("webhook_cache_objects_skipped_total", kind=kind)


async def test_no_single_object_stops_a_cache_from_syncing(
    kube_scope: KubeScope, fault_proxy: FaultProxy, state: ClusterState, watcher: KubeWatcher, kueue: None
) -> None:
    # A poison object in the first list, in a re-list after 410 Gone, and in a watch event. Each is
    # skipped (or, for a pod's GPU request, counted as the most a pod may ask for), the others are
    # all there, and readiness tells the truth.
    from webhook.core.kinds import UNREADABLE_POD_GPUS

    churn = kube_scope.name("churn")
    await kube_scope.create(namespace(churn, {"hopsworks.ai/project": churn}))
    normal, bad_pc, bad_ns = kube_scope.name("normal"), kube_scope.name("bad-pc"), kube_scope.name("bad-ns")
    await kube_scope.create(priority_class(normal, 100))
    await kube_scope.create(priority_class(bad_pc, 0))
    await kube_scope.create(namespace(bad_ns))
    await kube_scope.create(local_queue(churn, "default"))
    for i in range(3):
        await kube_scope.create(pod(churn, f"good-{i}", gpus=1))
    for obj in [*gpu_poisons(churn), pod(churn, "bad-labels")]:
        await kube_scope.create(obj)
    await kube_scope.settings(scheduler="maxNodeSelectorTerms: " + "9" * 5_000)  # a ValueError once
    fault_proxy.rewrite(unreadable({"bad-labels", "late-poison", bad_ns, bad_pc}))
    before = {k: skipped(k) for k in ("Pod", "Namespace", "PriorityClass")}

    await watcher.start()
    assert await watcher.wait_synced(10), state.synced
    assert state.ready()
    assert {churn, "default", kube_scope.install_ns} <= set(state.namespaces) and bad_ns not in state.namespaces
    assert normal in state.priority_classes and bad_pc not in state.priority_classes
    assert state.local_queues[churn] == frozenset({"default"})
    gpus = {r.name: r.gpus for r in state.pods[churn].values()}
    assert gpus == {
        "good-0": 1.0,
        "good-1": 1.0,
        "good-2": 1.0,
        "gpu-poison": UNREADABLE_POD_GPUS,
        "nan-poison": UNREADABLE_POD_GPUS,
    }
    assert "scheduler:" in (state.snapshot().settings_error or "")  # refused, defaults serve
    assert {k: skipped(k) - before[k] for k in before} == {"Pod": 1, "Namespace": 1, "PriorityClass": 1}

    # A re-list after 410 Gone meets the same objects and still completes, with no stale entries.
    await eventually(lambda: open_watches(fault_proxy) == len(RESOURCES))
    down = fault_proxy.fail(503, n=None)
    fault_proxy.cut_watches()
    await kube_scope.call("DELETE", f"/api/v1/namespaces/{churn}/pods/good-2", {"gracePeriodSeconds": 0})
    await eventually(lambda: open_watches(fault_proxy) == 0)
    expire_next_watches(fault_proxy)
    down.remove()
    await eventually(lambda: f"{churn}/good-2" not in pod_names(state, {churn}))
    assert await watcher.wait_synced(10) and state.ready()
    assert pod_names(state, {churn}) == {f"{churn}/{n}" for n in ("good-0", "good-1", "gpu-poison", "nan-poison")}
    assert skipped("Pod") - before["Pod"] == 2

    # And as watch events: skipped, and the events after them still arrive.
    await eventually(lambda: open_watches(fault_proxy) == len(RESOURCES))
    await kube_scope.create(pod(churn, "late-poison"))
    await kube_scope.create(pod(churn, "after", gpus=2))
    await eventually(lambda: f"{churn}/after" in pod_names(state, {churn}))
    # At least once: the scheduler's note that no node fits it is one more event of the same pod.
    assert skipped("Pod") - before["Pod"] >= 3
    assert state.ready()


async def test_a_relist_that_fails_part_way_is_not_reported_synced(
    kube_scope: KubeScope, fault_proxy: FaultProxy, api: ApiClient
) -> None:
    # After 410 Gone, /readyz once said ready while the pod cache held only part of the list.
    class Breaks(ClusterState):
        broken = False

        def replace_pods(self, records: Iterable[PodRecord]) -> None:
            if self.broken:
                raise RuntimeError("a store bug half way through")
            super().replace_pods(records)

    state = Breaks(kube_scope.install_ns)
    await kube_scope.create(pod(kube_scope.install_ns, "p"))
    watch = ResourceWatch("Pod", partial_list_pods(api), timing=FAST)
    task = asyncio.create_task(watch.run(state))
    try:
        await eventually(lambda: state.synced.get("Pod") is True, within_s=10)
        state.broken = True
        await eventually(lambda: fault_proxy.open_watches("pods") == 1)
        down = fault_proxy.fail(503, n=None)
        fault_proxy.cut_watches()
        await eventually(lambda: open_watches(fault_proxy) == 0)
        await kube_scope.create(pod(kube_scope.install_ns, "q"))
        fault_proxy.expire(n=1, verb="watch", resource="pods")
        down.remove()
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

KUEUE_API = "kueue.x-k8s.io/v1beta2"


def condition(type: str, status: str) -> dict[str, str]:
    return {"type": type, "status": status, "reason": "Test", "message": "set by the test",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip


def deployment(ns: str, name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "i"}]}}},
    }  # fmt: skip


def bare_replica_set(ns: str, name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "i"}]}}},
    }  # fmt: skip


async def test_replica_sets_are_cached_with_their_deployments_count_and_follow_changes(
    kube_scope: KubeScope, state: ClusterState, watcher: KubeWatcher
) -> None:
    churn = await kube_scope.namespace("churn")
    await kube_scope.create(deployment(churn, "web", 3))
    await kube_scope.create(bare_replica_set(churn, "bare", 2))
    await watcher.start()
    assert await watcher.wait_synced(10)

    def web() -> Any:
        return next((r for r in state.snapshot().replica_sets.get(churn, {}).values() if r.deployment == "web"), None)

    # The Deployment's count (its controller's desired-replicas annotation), not the ReplicaSet's own.
    first = await eventually(web, within_s=30)
    assert first.replicas == 3 and first.uid
    bare = state.snapshot().replica_sets[churn]["bare"]
    assert (bare.replicas, bare.deployment) == (2, None)

    await kube_scope.patch("apps/v1", "Deployment", "web", {"spec": {"replicas": 5}}, churn)
    await eventually(lambda: (w := web()) is not None and w.replicas == 5, within_s=30)
    await kube_scope.delete("apps/v1", "ReplicaSet", "bare", churn)
    await eventually(lambda: "bare" not in state.snapshot().replica_sets.get(churn, {}))


async def test_kueue_objects_are_cached_and_follow_changes(
    kube_scope: KubeScope, state: ClusterState, watcher: KubeWatcher, kueue: None
) -> None:
    from tests.support.cluster import cluster_queue, resource_flavor, topology
    from tests.support.cluster import local_queue as queue_of

    churn = await kube_scope.namespace("churn")
    await kube_scope.create(topology())
    flavor = resource_flavor()
    flavor["spec"]["nodeLabels"] = {"type": "kwok"}  # Kueue requires some with a topology
    await kube_scope.create(flavor)
    cq = cluster_queue(cohort="research")
    del cq["status"]
    await kube_scope.create(cq)
    usage = [{"name": "default", "resources": [{"name": "cpu", "total": "6"}]}]
    cq_status = {"pendingWorkloads": 3, "flavorsUsage": usage, "conditions": [condition("Active", "True")]}
    await kube_scope.patch(KUEUE_API, "ClusterQueue", "cq", {"status": cq_status}, subresource="status")
    await kube_scope.create(queue_of(churn, "default"))
    await kube_scope.patch(KUEUE_API, "LocalQueue", "default", {"status": {"pendingWorkloads": 1}}, churn,
                           subresource="status")  # fmt: skip
    await watcher.start()
    assert await watcher.wait_synced(10)
    snap = state.snapshot()
    assert snap.topologies["default"].levels == (
        "topology.kubernetes.io/region", "topology.kubernetes.io/zone", "kubernetes.io/hostname"
    )  # fmt: skip
    assert snap.resource_flavors["default"].topology == "default"
    queue = snap.cluster_queues["cq"]
    assert (queue.cohort, queue.pending, queue.active, queue.flavor_names) == ("research", 3, True, ("default",))
    assert queue.flavors[0].nominal == {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "8"}
    assert queue.flavors[0].usage == {"cpu": "6"}
    local = snap.local_queue_info[churn]["default"]
    assert (local.cluster_queue, local.pending) == ("cq", 1)

    cq_status["flavorsUsage"] = [{"name": "default", "resources": [{"name": "cpu", "total": "9"}]}]
    await kube_scope.patch(KUEUE_API, "ClusterQueue", "cq", {"status": cq_status}, subresource="status")
    await eventually(lambda: state.snapshot().cluster_queues["cq"].flavors[0].usage == {"cpu": "9"})
    await kube_scope.delete(KUEUE_API, "Topology", "default")
    await eventually(lambda: "default" not in state.snapshot().topologies)


async def test_a_kueue_serving_only_v1beta1_is_read_at_v1beta1(
    kube_scope: KubeScope, fault_proxy: FaultProxy, state: ClusterState, watcher: KubeWatcher, kueue: None
) -> None:
    # Kueue before v0.15 serves no v1beta2 (here the proxy answers 404 for it, as such an apiserver
    # does): the caches fall back to v1beta1, whose ClusterQueue names its cohort `spec.cohort`.
    # v0.17's CRDs store v1beta2, whose schema has no `cohort`: the proxy hands it out as an older
    # Kueue's v1beta1 has it.
    fault_proxy.fail(404, n=None, path="/apis/kueue.x-k8s.io/v1beta2")

    def older_kueue(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] == "old":
            obj["spec"]["cohort"] = "legacy"
        return obj

    fault_proxy.rewrite(older_kueue, path="/apis/kueue.x-k8s.io/v1beta1/clusterqueues")
    await kube_scope.create(
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "old"},
         "spec": {"resourceGroups": []}}
    )  # fmt: skip
    await watcher.start()
    assert await watcher.wait_synced(10)
    assert state.snapshot().cluster_queues["old"].cohort == "legacy"
    assert fault_proxy.calls(path="/apis/kueue.x-k8s.io/v1beta2/clusterqueues"), "v1beta2 is asked first"
    assert fault_proxy.calls(verb="watch", path="/apis/kueue.x-k8s.io/v1beta1/clusterqueues")


async def test_kueue_objects_of_odd_shapes_are_kept_with_what_can_be_read(
    kube_scope: KubeScope, fault_proxy: FaultProxy, state: ClusterState, watcher: KubeWatcher, kueue: None
) -> None:
    # Shapes Kueue's CRD schemas refuse: the proxy hands them out in place of valid objects.
    odd: dict[str, dict[str, Any]] = {
        "ClusterQueue": {"spec": {"resourceGroups": "nope", "cohortName": 7}, "status": {"pendingWorkloads": "many"}},
        "Topology": {"spec": {"levels": [{"nodeLabel": 3}, "x", {"nodeLabel": "kubernetes.io/hostname"}]}},
        "ResourceFlavor": {"spec": {"topologyName": {"not": "a name"}}},
    }

    def oddly(obj: dict[str, Any]) -> dict[str, Any]:
        return {**obj, **odd.get(obj.get("kind", ""), {})} if obj["metadata"]["name"] in ("odd", "t", "f") else obj

    fault_proxy.rewrite(oddly, path="/apis/kueue.x-k8s.io/")
    await kube_scope.create({"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": "odd"},
                             "spec": {"resourceGroups": []}})  # fmt: skip
    await kube_scope.create({"apiVersion": KUEUE_API, "kind": "Topology", "metadata": {"name": "t"},
                             "spec": {"levels": [{"nodeLabel": "kubernetes.io/hostname"}]}})  # fmt: skip
    await kube_scope.create({"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": "f"}, "spec": {}})
    await watcher.start()
    assert await watcher.wait_synced(10) and state.ready()
    snap = state.snapshot()
    assert (snap.cluster_queues["odd"].flavors, snap.cluster_queues["odd"].cohort) == ((), None)
    assert snap.cluster_queues["odd"].pending == 0
    assert snap.topologies["t"].levels == ("kubernetes.io/hostname",)
    assert snap.resource_flavors["f"].topology is None
