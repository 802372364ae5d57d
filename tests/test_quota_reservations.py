"""R2/R3 at pod creation across replicas: GPU reservations in the Kubernetes API.

Every replica here is what one webhook process holds (a ClusterState, a reservation store with its
watch, its own API client), all against one stateful API emulator reached over HTTP by the real
client: resourceVersions are real, a stale write gets 409, the watch feeds every replica's cache.
The pod caches are left empty on purpose: admitted pods "not yet seen" are exactly what the
reservations are for.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from tests.support.apps import cache_app
from tests.support.cluster import cluster_state, namespace
from tests.support.fixtures import Obj, remote_calls
from tests.support.https import StartHttpsServer
from tests.support.kube_emulator import KubeEmulator, eventually
from tests.support.reviews import admitted_labels, owned_by, pod_review
from webhook.core.decision import AdmissionHandler, Decision, Reason
from webhook.core.quota import validate_pod
from webhook.http.pod_webhook import mutate_pods_handler, validate_pods_handler
from webhook.kube.api import KubeApi
from webhook.kube.watch import WatchTiming
from webhook.quota import GpuReservations, configmap_name
from webhook.quota.reservations import NAMESPACE_ANNOTATION, RESERVATIONS_LABEL, WATCH_NAME
from webhook.snapshot import RunaiProjectInfo
from webhook.state.store import ClusterState

INSTALL_NS = "hopsworks"
BOUND = namespace("vision", labels={"runai/queue": "vision", "hopsworks.ai/runai-project-id": "7"})
UNBOUND = namespace("nlp")
NOTEBOOK = {"jupyter": "true"}
FAST = WatchTiming(watch_timeout_s=30, backoff_initial_s=0.02, backoff_max_s=0.1)
CM_PATH = f"/api/v1/namespaces/{INSTALL_NS}/configmaps"


class RunaiUnreachable(Exception):
    pass


@dataclass
class FakeBinder:
    """Plays the Run:ai binding as `Binder.ensure_bound` does: labels the namespace through the real
    API, puts it in the replica's cache and returns a result object; or raises as an unreachable
    Run:ai does."""

    kube: KubeApi
    cache: ClusterState
    reachable: bool = True
    calls: list[str] = field(default_factory=list)

    async def __call__(self, ns: str) -> object:
        self.calls.append(ns)
        if not self.reachable:
            raise RunaiUnreachable("Run:ai control plane at http://127.0.0.1:9 did not answer within 3s")
        obj = await self.kube.patch_namespace(ns, {"metadata": {"labels": {"runai/queue": ns}}}, call_path="request")
        self.cache.apply({**obj, "kind": "Namespace"})
        return ("created", ns)


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Replica:
    state: ClusterState
    store: GpuReservations
    binder: FakeBinder
    handler: AdmissionHandler  # /validate/pods
    kube_api: KubeApi
    mutate: AdmissionHandler  # /mutate/pods, which binds an unbound project
    clock: Clock


def notebook(uid: str, gpus: float | None = 1, ns: str = "vision", dry_run: bool = False, **kw: Any) -> dict[str, Any]:
    """A real pod CREATE review for a GPU notebook, with the uid the apiserver gives the pod and the
    project's runai/queue and preemptibility labels (as the mutating webhook set them: a pod with
    a Job owner is a job)."""
    kind = "job" if kw.get("owners") else "notebook"
    labels = {**kw.pop("labels", NOTEBOOK), "runai/queue": ns, **admitted_labels(kind)}
    data = pod_review(ns, labels=labels, gpus=gpus, dry_run=dry_run, uid=f"req-{uid}", **kw)
    meta = data["request"]["object"]["metadata"]
    meta.update(uid=uid, name=f"nb-{uid}")
    return data["request"]


def runai_view(state: ClusterState, **deserved: float) -> None:
    state.snapshot().runai_projects = {
        ns: RunaiProjectInfo(id=str(i), name=ns, namespace=ns, deserved_gpus=gpus)
        for i, (ns, gpus) in enumerate(deserved.items())
    }


@pytest.fixture
def kube_objects() -> list[Obj]:
    return [namespace(INSTALL_NS, project=False), BOUND, UNBOUND]


@pytest.fixture
async def replicas(kube: KubeEmulator) -> AsyncIterator[Callable[..., Any]]:
    """Factory: `await replicas(n, deserved=3, clock=..., api_config=..., watch=True)` -> started
    replicas. `watch=False` plays a cache that lags behind the API server for the whole test."""
    async with AsyncExitStack() as stack:

        async def make(
            n: int = 1,
            *,
            deserved: float = 3,
            clock: Clock | None = None,
            api_config: Configuration | None = None,
            watch: bool = True,
            settings: dict[str, Any] | None = None,
        ) -> list[Replica]:
            out = []
            for _ in range(n):
                api = await stack.enter_async_context(ApiClient(api_config or kube.client_config()))
                watch_api = await stack.enter_async_context(ApiClient(kube.client_config()))
                state = cluster_state(namespaces=[BOUND, UNBOUND], run_ai_enable=True, **(settings or {}))
                runai_view(state, vision=deserved, nlp=deserved)
                kube_api = KubeApi(api, INSTALL_NS)
                store = GpuReservations(state, kube_api, jitter_s=0.005)
                if watch:
                    await store.start(watch_api, FAST)
                    stack.push_async_callback(store.stop)
                    await eventually(lambda s=state: s.synced.get(WATCH_NAME), message="reservation watch synced")
                binder = FakeBinder(kube_api, state)
                replica_clock = clock or Clock()
                state.clock = replica_clock
                handler = validate_pods_handler(state, store, clock=replica_clock)
                mutate = mutate_pods_handler(state, binder, clock=replica_clock)
                out.append(Replica(state, store, binder, handler, kube_api, mutate, replica_clock))
            return out

        yield make


def stored(kube: KubeEmulator, ns: str = "vision") -> dict[str, dict[str, Any]]:
    cm = kube.get_object("ConfigMap", configmap_name(ns), INSTALL_NS)
    return {k: json.loads(v) for k, v in ((cm or {}).get("data") or {}).items()}


def writes(kube: KubeEmulator) -> int:
    return len(kube.calls("POST", CM_PATH)) + len(kube.calls("PUT", CM_PATH))


async def test_a_reservation_within_quota_writes_one_entry_counted_on_the_request_path(
    kube: KubeEmulator, replicas: Callable[..., Any]
) -> None:
    (a,) = await replicas(1, deserved=3)
    before = remote_calls("kubernetes", "request")
    decision = await a.handler(notebook("uid-1", gpus=2))
    assert decision.allowed, decision.message
    assert decision.audit["gpus-left"] == "1"
    assert remote_calls("kubernetes", "request") - before == 1  # one create, no GET first (nothing cached yet)
    cm = kube.get_object("ConfigMap", configmap_name("vision"), INSTALL_NS)
    assert cm is not None
    assert cm["metadata"]["labels"][RESERVATIONS_LABEL] == "true"
    assert cm["metadata"]["annotations"][NAMESPACE_ANNOTATION] == "vision"
    entry = json.loads(cm["data"]["uid-1"])
    # It counts for gpu_reservation_confirm_s (10 s by default) unless the pod shows up; its key is kept 120 s.
    assert entry == {
        "gpus": 2.0,
        "expires_at": 1_000_000.0 + 10,
        "kept_until": 1_000_000.0 + 120,
        "pod": "nb-uid-1",
        "kind": "notebook",
    }
    # The next one is decided against the reservation: 1 left, asks for 2.
    refused = await a.handler(notebook("uid-2", gpus=2))
    assert not refused.allowed and refused.reason == Reason.GPU_QUOTA_EXCEEDED
    assert "1 of 3 deserved GPUs left" in refused.message
    assert set(stored(kube)) == {"uid-1"}


async def test_the_other_replicas_cache_sees_the_reservation_through_the_watch(
    kube: KubeEmulator, replicas: Callable[..., Any]
) -> None:
    a, b = await replicas(2, deserved=1)
    assert (await a.handler(notebook("uid-1"))).allowed
    await eventually(lambda: "uid-1" in b.store.reservations("vision"), message="replica b sees the reservation")
    reservation = b.state.snapshot().gpu_reservations["vision"]["uid-1"]
    assert reservation.gpus == 1 and reservation.expires_at == 1_000_000.0 + 10
    # b refuses from its cache alone (dryRun never writes), and so does a real request on b.
    assert not validate_pod(notebook("uid-2"), b.state.snapshot(), 1_000_000.0).allowed
    assert "0 of 1 deserved GPUs left" in (await b.handler(notebook("uid-2"))).message


async def test_two_replicas_whose_caches_lag_behind_racing_for_the_last_gpus_admit_exactly_the_quota(
    kube: KubeEmulator, replicas: Callable[..., Any]
) -> None:
    """Replicas whose reservation watch shows nothing (a lag the real apiserver cannot be made to
    have): the ConfigMap's resourceVersion alone keeps them to the quota. The race with the watch
    running is tests/e2e/test_two_replicas.py's, through the real apiserver."""
    a, b = await replicas(2, deserved=3, watch=False)
    kube.latency = 0.003  # a real round trip widens the window between read and write
    requests = [((a, b)[i % 2], notebook(f"uid-{i}")) for i in range(12)]
    decisions: list[Decision] = await asyncio.gather(*(r.handler(req) for r, req in requests))
    admitted = [d for d in decisions if d.allowed]
    refused = [d for d in decisions if not d.allowed]
    assert len(admitted) == 3, [d.message for d in refused]
    assert len(refused) == 9
    assert all(d.reason == Reason.GPU_QUOTA_EXCEEDED and "0 of 3 deserved GPUs left" in d.message for d in refused), (
        refused
    )
    assert len(stored(kube)) == 3
    assert writes(kube) > 3  # the replicas did collide: some writes were refused with 409


async def test_expired_reservations_are_pruned_on_the_next_write(
    kube: KubeEmulator, replicas: Callable[..., Any]
) -> None:
    clock = Clock()
    (a,) = await replicas(1, deserved=2, clock=clock)
    assert (await a.handler(notebook("uid-1"))).allowed
    assert (await a.handler(notebook("uid-2"))).allowed
    assert not (await a.handler(notebook("uid-3"))).allowed
    clock.now += 121  # the pods never showed up: their reservations lapse
    decision = await a.handler(notebook("uid-4"))
    assert decision.allowed, decision.message
    assert set(stored(kube)) == {"uid-4"}


async def test_a_reservation_whose_pod_never_shows_stops_counting_after_the_confirm_window(
    kube: KubeEmulator, replicas: Callable[..., Any]
) -> None:
    """A review the apiserver never turned into a pod (sent by another process, or refused by a
    later webhook) holds the project's GPUs for gpu_reservation_confirm_s, not for the entry's 120 s."""
    clock = Clock()
    (a,) = await replicas(1, deserved=4, clock=clock, settings={"gpu_reservation_confirm_s": 3})
    assert (await a.handler(notebook("forged-1", gpus=4))).allowed
    assert stored(kube)["forged-1"]["expires_at"] == clock.now + 3
    clock.now += 2.5
    refused = await a.handler(notebook("uid-2"))
    assert not refused.allowed and "0 of 4 deserved GPUs left" in refused.message
    clock.now += 0.5  # the pod watch never showed forged-1
    decision = await a.handler(notebook("uid-3"))
    assert decision.allowed, decision.message
    assert decision.audit["gpus-left"] == "3"


async def test_sending_the_same_review_again_renews_nothing(kube: KubeEmulator, replicas: Callable[..., Any]) -> None:
    clock = Clock()
    (a,) = await replicas(1, deserved=2, clock=clock, settings={"gpu_reservation_confirm_s": 5})
    forged = notebook("forged-1", gpus=2)
    assert (await a.handler(forged)).allowed
    written = stored(kube)["forged-1"]
    version = kube.get_object("ConfigMap", configmap_name("vision"), INSTALL_NS)["metadata"]["resourceVersion"]
    for step in (2, 2, 2, 2):  # again and again, before and after the count lapsed
        clock.now += step
        assert (await a.handler(forged)).allowed  # its own entry is never counted against it
        assert stored(kube)["forged-1"] == written
    assert kube.get_object("ConfigMap", configmap_name("vision"), INSTALL_NS)["metadata"]["resourceVersion"] == version
    # 8 s after the first review, the project's 2 GPUs are free for its real pods.
    decision = await a.handler(notebook("uid-2", gpus=2))
    assert decision.allowed, decision.message


async def test_dry_run_writes_nothing(kube: KubeEmulator, replicas: Callable[..., Any]) -> None:
    (a,) = await replicas(1, deserved=1)
    assert (await a.handler(notebook("uid-1", dry_run=True))).allowed
    assert writes(kube) == 0 and stored(kube) == {}
    assert (await a.handler(notebook("uid-2"))).allowed
    refused = await a.handler(notebook("uid-3", dry_run=True))  # the cache already holds uid-2
    assert not refused.allowed and "0 of 1" in refused.message
    assert writes(kube) == 1


async def test_kubernetes_api_failing_refuses_clearly_and_recovers(
    kube: KubeEmulator, replicas: Callable[..., Any]
) -> None:
    (a,) = await replicas(1, deserved=2)
    kube.fail_next(50, status=500, path_prefix=CM_PATH, method="POST")
    kube.fail_next(50, status=500, path_prefix=CM_PATH, method="GET")
    decision = await a.handler(notebook("uid-1"))
    assert not decision.allowed
    assert decision.code == 503 and decision.reason == Reason.GPU_QUOTA_UNPROVEN
    assert "cannot be checked right now" in decision.message and "Try again" in decision.message
    kube.clear_faults()
    assert (await a.handler(notebook("uid-1"))).allowed


async def test_kubernetes_api_unreachable_refuses_clearly(kube: KubeEmulator, replicas: Callable[..., Any]) -> None:
    (a,) = await replicas(1, deserved=2, api_config=Configuration(host="http://127.0.0.1:9"))
    decision = await a.handler(notebook("uid-1"))
    assert not decision.allowed and decision.reason == Reason.GPU_QUOTA_UNPROVEN
    assert "GPU quota of project vision cannot be checked" in decision.message


async def test_conflicts_past_the_retry_bound_fail_closed(kube: KubeEmulator, replicas: Callable[..., Any]) -> None:
    (a,) = await replicas(1, deserved=2)
    assert (await a.handler(notebook("uid-1"))).allowed  # the ConfigMap exists: later writes are PUTs
    kube.fail_next(100, status=409, path_prefix=CM_PATH, method="PUT")
    decision = await a.handler(notebook("uid-2"))
    assert not decision.allowed and decision.reason == Reason.GPU_QUOTA_UNPROVEN
    assert "kept conflicting after 10 attempts" in decision.message
    assert len(kube.calls("PUT", CM_PATH)) == 10


async def test_unbound_project_is_bound_in_the_mutating_phase_its_first_pod_refused_then_reserved(
    kube: KubeEmulator, replicas: Callable[..., Any]
) -> None:
    (a,) = await replicas(1, deserved=1)
    first = await a.mutate(notebook("uid-1", ns="nlp"))
    # Bound, but this pod's mutating phase started before: Run:ai's webhooks would not see it.
    assert not first.allowed and first.reason == Reason.RUNAI_BINDING_SETTLING and first.code == 503, first.message
    assert "has just been bound to Run:ai project nlp" in first.message and "Create it again" in first.message
    assert a.binder.calls == ["nlp"]
    assert kube.get_object("Namespace", "nlp")["metadata"]["labels"]["runai/queue"] == "nlp"
    # Retried at once: still held back until the binding has settled.
    assert (await a.mutate(notebook("uid-1", ns="nlp"))).reason == Reason.RUNAI_BINDING_SETTLING
    a.clock.now += 1.5
    again = await a.mutate(notebook("uid-1", ns="nlp"))
    assert again.allowed and again.audit.get("runai-queue") == "nlp", again.message
    decision = await a.handler(notebook("uid-1", ns="nlp"))
    assert decision.allowed, decision.message
    assert set(stored(kube, "nlp")) == {"uid-1"}
    # Bound now: the next one is decided on quota, no second bind.
    assert not (await a.handler(notebook("uid-2", ns="nlp"))).allowed
    assert (await a.mutate(notebook("uid-2", ns="nlp"))).allowed
    assert a.binder.calls == ["nlp"]


async def test_validation_refuses_pods_of_unbound_projects_and_pods_without_the_queue(
    kube: KubeEmulator, replicas: Callable[..., Any]
) -> None:
    (a,) = await replicas(1, deserved=1)
    unbound = await a.handler(notebook("uid-1", ns="nlp"))
    assert not unbound.allowed and unbound.reason == Reason.RUNAI_PROJECT_NOT_BOUND
    other = notebook("uid-2")
    other["object"]["metadata"]["labels"]["runai/queue"] = "nlp"  # another project's queue
    assert (await a.handler(other)).reason == Reason.RUNAI_QUEUE_MISSING
    request = notebook("uid-3")
    del request["object"]["metadata"]["labels"]["runai/queue"]
    missing = await a.handler(request)
    assert not missing.allowed and missing.reason == Reason.RUNAI_QUEUE_MISSING
    assert a.binder.calls == [] and writes(kube) == 0


async def test_unbound_project_with_runai_unreachable_is_refused(
    kube: KubeEmulator, replicas: Callable[..., Any]
) -> None:
    (a,) = await replicas(1)
    a.binder.reachable = False
    decision = await a.mutate(notebook("uid-1", ns="nlp"))
    assert not decision.allowed and decision.reason == Reason.RUNAI_UNREACHABLE and decision.code == 503
    assert "not bound to a Run:ai project yet" in decision.message
    assert "Run:ai control plane at http://127.0.0.1:9 did not answer" in decision.message
    assert "unreachable" in decision.message and "Try again later" in decision.message
    assert writes(kube) == 0
    # Jobs too: nothing starts outside Run:ai's governance (R2).
    job = await a.mutate(notebook("uid-2", ns="nlp", labels={"job-name": "train"}))
    assert not job.allowed and job.reason == Reason.RUNAI_UNREACHABLE


async def test_dry_run_on_an_unbound_project_does_not_bind(kube: KubeEmulator, replicas: Callable[..., Any]) -> None:
    (a,) = await replicas(1)
    decision = await a.mutate(notebook("uid-1", ns="nlp", dry_run=True))
    assert not decision.allowed and decision.reason == Reason.RUNAI_PROJECT_NOT_BOUND
    assert "a real (not dry-run) pod creation binds it" in decision.message
    assert a.binder.calls == [] and writes(kube) == 0


async def test_bound_project_with_runai_unreachable_is_admitted_unchecked_and_unreserved(
    kube: KubeEmulator, replicas: Callable[..., Any]
) -> None:
    (a,) = await replicas(1, deserved=1)
    a.state.snapshot().runai_projects = None  # Run:ai unreachable since start
    a.state.snapshot().runai_reachable = False
    decision = await a.handler(notebook("uid-1", gpus=8))
    assert decision.allowed and any("not checked" in w for w in decision.warnings)
    assert writes(kube) == 0


async def test_jobs_and_cpu_pods_never_write(kube: KubeEmulator, replicas: Callable[..., Any]) -> None:
    (a,) = await replicas(1, deserved=0)
    job = owned_by("Job")
    assert (await a.handler(notebook("uid-1", gpus=4, labels={"job-name": "train"}, owners=job))).allowed
    assert (await a.handler(notebook("uid-2", gpus=4, labels={"job-type": "system"}, owners=job))).allowed
    assert (await a.handler(notebook("uid-3", gpus=None))).allowed
    assert writes(kube) == 0


async def test_readiness_waits_for_the_reservation_watch(kube: KubeEmulator) -> None:
    state = cluster_state(namespaces=[BOUND], run_ai_enable=True)
    async with ApiClient(kube.client_config()) as api:
        store = GpuReservations(state, KubeApi(api, INSTALL_NS))
        kube.fail_next(3, status=500, path_prefix=CM_PATH, method="GET")
        await store.start(api, FAST)
        try:
            assert state.synced.get(WATCH_NAME) is False
            await eventually(lambda: state.synced.get(WATCH_NAME), message="synced after the faults")
        finally:
            await store.stop()


async def test_end_to_end_over_https(
    kube: KubeEmulator, replicas: Callable[..., Any], https_server: StartHttpsServer
) -> None:
    a, b = await replicas(2, deserved=2)
    servers = []
    for r in (a, b):
        for kind in ("Namespace", "PriorityClass", "ConfigMap", "LocalQueue", "Pod"):
            r.state.synced[kind] = True
        servers.append(await https_server(cache_app(r.state, handlers={"/validate/pods": r.handler})))

    async def post(srv: Any, request: dict[str, Any]) -> dict[str, Any]:
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        async with srv.session.post(srv.url("/validate/pods"), json=review) as resp:
            assert resp.status == 200
            return (await resp.json())["response"]

    answers = await asyncio.gather(*(post(servers[i % 2], notebook(f"uid-{i}")) for i in range(6)))
    assert sum(a["allowed"] for a in answers) == 2
    refused = [a for a in answers if not a["allowed"]]
    assert all(a["status"]["code"] == 403 and "0 of 2 deserved GPUs left" in a["status"]["message"] for a in refused)
    assert len(stored(kube)) == 2
    for srv in servers:
        async with srv.session.get(srv.url("/readyz")) as resp:
            assert resp.status == 200  # the reservation watch is synced


async def test_the_leader_sweeps_reservations_of_deleted_namespaces_once_they_expire(
    kube: KubeEmulator, replicas: Callable[..., Any]
) -> None:
    clock = Clock()
    (a,) = await replicas(1, deserved=2, clock=clock)
    assert (await a.handler(notebook("uid-1"))).allowed
    await eventually(lambda: "vision" in a.state.snapshot().gpu_reservations, message="cache sees it")
    # The namespace still exists: nothing to sweep.
    assert await a.store.sweep(clock.now + 1000) == []
    a.state.delete({"kind": "Namespace", "metadata": {"name": "vision"}})
    # Gone, but a reservation is still live: kept (the pod may still be on its way).
    assert await a.store.sweep(clock.now) == []
    assert stored(kube)
    # Gone and expired: deleted, and the cache forgets it through the watch.
    assert await a.store.sweep(clock.now + 1000) == ["vision"]
    assert kube.get_object("ConfigMap", configmap_name("vision"), INSTALL_NS) is None
    await eventually(lambda: "vision" not in a.state.snapshot().gpu_reservations, message="cache forgot it")
