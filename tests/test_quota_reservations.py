"""R2/R3 at pod creation across replicas: GPU reservations in the Kubernetes API.

Every replica here is what one webhook process holds (a ClusterState, a reservation store with its
watch, its own API client), all against the real apiserver (a KubeScope of the shared control
plane, as the webhook's ServiceAccount with the chart's RBAC): resourceVersions are real, a stale
write gets 409, the watch feeds every replica's cache. The pod caches are left empty on purpose:
admitted pods "not yet seen" are exactly what the reservations are for. Faults come from a fault
proxy in front of the apiserver, on the path of the requests an admission makes.
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
from tests.support.control_plane.fault_proxy import FaultProxy
from tests.support.fixtures import remote_calls
from tests.support.https import StartHttpsServer
from tests.support.kube_scope import SERVICE_ACCOUNT, KubeScope, eventually
from tests.support.reviews import admitted_labels, owned_by, pod_review
from tests.support.scope_clients import webhook_client_config
from webhook.core.decision import AdmissionHandler, Decision, Reason
from webhook.core.quota import validate_pod
from webhook.http.pod_webhook import mutate_pods_handler, validate_pods_handler
from webhook.kube.api import KubeApi
from webhook.kube.watch import WatchTiming
from webhook.quota import GpuReservations, configmap_name
from webhook.quota.reservations import NAMESPACE_ANNOTATION, RESERVATIONS_LABEL, WATCH_NAME
from webhook.snapshot import RunaiProjectInfo
from webhook.state.store import ClusterState

NOTEBOOK = {"jupyter": "true"}
FAST = WatchTiming(watch_timeout_s=30, backoff_initial_s=0.02, backoff_max_s=0.1)
SYNCED_WITHIN_S = 15.0  # a bound on a watch's first list on a loaded machine


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


@dataclass
class Projects:
    """The test's part of the cluster: its install namespace (where the reservation ConfigMaps
    live) and two project namespaces, `vision` bound to Run:ai and `nlp` not bound yet."""

    scope: KubeScope
    vision: str
    nlp: str

    @property
    def install_ns(self) -> str:
        return self.scope.install_ns

    def objects(self) -> list[dict[str, Any]]:
        """The two project namespaces as the replicas' caches hold them."""
        bound = {"runai/queue": self.vision, "hopsworks.ai/runai-project-id": "7"}
        return [namespace(self.vision, labels=bound), namespace(self.nlp)]

    def notebook(
        self, uid: str, gpus: float | None = 1, ns: str | None = None, dry_run: bool = False, **kw: Any
    ) -> dict[str, Any]:
        """A real pod CREATE review for a GPU notebook (in `vision` unless `ns`), with the uid the
        apiserver gives the pod and the project's runai/queue and preemptibility labels (as the
        mutating webhook set them: a pod with a Job owner is a job)."""
        ns = ns or self.vision
        kind = "job" if kw.get("owners") else "notebook"
        labels = {**kw.pop("labels", NOTEBOOK), "runai/queue": ns, **admitted_labels(kind)}
        data = pod_review(ns, labels=labels, gpus=gpus, dry_run=dry_run, uid=f"req-{uid}", **kw)
        meta = data["request"]["object"]["metadata"]
        meta.update(uid=uid, name=f"nb-{uid}")
        return dict(data["request"])

    async def configmap(self, ns: str | None = None) -> dict[str, Any] | None:
        """The reservation ConfigMap of project `ns` (`vision` by default) as the apiserver has it."""
        return await self.scope.get("v1", "ConfigMap", configmap_name(ns or self.vision), self.install_ns)

    async def stored(self, ns: str | None = None) -> dict[str, dict[str, Any]]:
        cm = await self.configmap(ns)
        return {k: json.loads(v) for k, v in ((cm or {}).get("data") or {}).items()}

    async def reservation_configmaps(self) -> list[str]:
        """The names of the reservation ConfigMaps the apiserver holds: none until a write."""
        listed = await self.scope.list("v1", "ConfigMap", self.install_ns, label_selector=RESERVATIONS_LABEL)
        return [cm["metadata"]["name"] for cm in listed]

    async def through_proxy(self, proxy: FaultProxy) -> Configuration:
        """The webhook's ServiceAccount, reaching the apiserver through `proxy`."""
        return proxy.client_config(await self.scope.token(SERVICE_ACCOUNT, self.install_ns))


def runai_view(state: ClusterState, **deserved: float) -> None:
    state.snapshot().runai_projects = {
        ns: RunaiProjectInfo(id=str(i), name=ns, namespace=ns, deserved_gpus=gpus)
        for i, (ns, gpus) in enumerate(deserved.items())
    }


@pytest.fixture
async def kube(kube_scope: KubeScope) -> Projects:
    projects = Projects(kube_scope, kube_scope.name("vision"), kube_scope.name("nlp"))
    for obj in projects.objects():
        await kube_scope.create(obj)
    return projects


@pytest.fixture
async def replicas(kube: Projects) -> AsyncIterator[Callable[..., Any]]:
    """Factory: `await replicas(n, deserved=3, clock=..., api_config=..., watch=True)` -> started
    replicas. `api_config`: the way of the admission's own requests to the apiserver (the watch
    always reads the apiserver directly). `watch=False` plays a cache that lags behind the API
    server for the whole test."""
    own = await webhook_client_config(kube.scope)
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
                api = await stack.enter_async_context(ApiClient(api_config or own))
                watch_api = await stack.enter_async_context(ApiClient(own))
                state = cluster_state(namespaces=kube.objects(), run_ai_enable=True, **(settings or {}))
                runai_view(state, **{kube.vision: deserved, kube.nlp: deserved})
                kube_api = KubeApi(api, kube.install_ns)
                store = GpuReservations(state, kube_api, jitter_s=0.005)
                if watch:
                    await store.start(watch_api, FAST)
                    stack.push_async_callback(store.stop)
                    await eventually(
                        lambda s=state: s.synced.get(WATCH_NAME),
                        within_s=SYNCED_WITHIN_S,
                        message="reservation watch synced",
                    )
                binder = FakeBinder(kube_api, state)
                replica_clock = clock or Clock()
                state.clock = replica_clock
                handler = validate_pods_handler(state, store, clock=replica_clock)
                mutate = mutate_pods_handler(state, binder, clock=replica_clock)
                out.append(Replica(state, store, binder, handler, kube_api, mutate, replica_clock))
            return out

        yield make


async def test_a_reservation_within_quota_writes_one_entry_counted_on_the_request_path(
    kube: Projects, replicas: Callable[..., Any]
) -> None:
    (a,) = await replicas(1, deserved=3)
    before = remote_calls("kubernetes", "request")
    decision = await a.handler(kube.notebook("uid-1", gpus=2))
    assert decision.allowed, decision.message
    assert decision.audit["gpus-left"] == "1"
    assert remote_calls("kubernetes", "request") - before == 1  # one create, no GET first (nothing cached yet)
    cm = await kube.configmap()
    assert cm is not None
    assert cm["metadata"]["labels"][RESERVATIONS_LABEL] == "true"
    assert cm["metadata"]["annotations"][NAMESPACE_ANNOTATION] == kube.vision
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
    refused = await a.handler(kube.notebook("uid-2", gpus=2))
    assert not refused.allowed and refused.reason == Reason.GPU_QUOTA_EXCEEDED
    assert "1 of 3 deserved GPUs left" in refused.message
    assert set(await kube.stored()) == {"uid-1"}


async def test_the_other_replicas_cache_sees_the_reservation_through_the_watch(
    kube: Projects, replicas: Callable[..., Any]
) -> None:
    a, b = await replicas(2, deserved=1)
    assert (await a.handler(kube.notebook("uid-1"))).allowed
    await eventually(lambda: "uid-1" in b.store.reservations(kube.vision), message="replica b sees the reservation")
    reservation = b.state.snapshot().gpu_reservations[kube.vision]["uid-1"]
    assert reservation.gpus == 1 and reservation.expires_at == 1_000_000.0 + 10
    # b refuses from its cache alone (dryRun never writes), and so does a real request on b.
    assert not validate_pod(kube.notebook("uid-2"), b.state.snapshot(), 1_000_000.0).allowed
    assert "0 of 1 deserved GPUs left" in (await b.handler(kube.notebook("uid-2"))).message


async def test_two_replicas_whose_caches_lag_behind_racing_for_the_last_gpus_admit_exactly_the_quota(
    kube: Projects, replicas: Callable[..., Any]
) -> None:
    """Replicas whose reservation watch shows nothing (a lag the real apiserver cannot be made to
    have): the ConfigMap's resourceVersion alone keeps them to the quota. The race with the watch
    running is tests/e2e/test_two_replicas.py's, through the real apiserver."""
    async with FaultProxy(kube.scope.cp) as proxy:  # no fault: it counts the writes
        a, b = await replicas(2, deserved=3, watch=False, api_config=await kube.through_proxy(proxy))
        requests = [((a, b)[i % 2], kube.notebook(f"uid-{i}")) for i in range(12)]
        decisions: list[Decision] = await asyncio.gather(*(r.handler(req) for r, req in requests))
        writes = proxy.calls(resource="configmaps", verb="create") + proxy.calls(resource="configmaps", verb="update")
    admitted = [d for d in decisions if d.allowed]
    refused = [d for d in decisions if not d.allowed]
    assert len(admitted) == 3, [d.message for d in refused]
    assert len(refused) == 9
    assert all(d.reason == Reason.GPU_QUOTA_EXCEEDED and "0 of 3 deserved GPUs left" in d.message for d in refused), (
        refused
    )
    assert len(await kube.stored()) == 3
    assert len(writes) > 3  # the replicas did collide: some writes were refused with 409


async def test_expired_reservations_are_pruned_on_the_next_write(kube: Projects, replicas: Callable[..., Any]) -> None:
    clock = Clock()
    (a,) = await replicas(1, deserved=2, clock=clock)
    assert (await a.handler(kube.notebook("uid-1"))).allowed
    assert (await a.handler(kube.notebook("uid-2"))).allowed
    assert not (await a.handler(kube.notebook("uid-3"))).allowed
    clock.now += 121  # the pods never showed up: their reservations lapse
    decision = await a.handler(kube.notebook("uid-4"))
    assert decision.allowed, decision.message
    assert set(await kube.stored()) == {"uid-4"}


async def test_a_reservation_whose_pod_never_shows_stops_counting_after_the_confirm_window(
    kube: Projects, replicas: Callable[..., Any]
) -> None:
    """A review the apiserver never turned into a pod (sent by another process, or refused by a
    later webhook) holds the project's GPUs for gpu_reservation_confirm_s, not for the entry's 120 s."""
    clock = Clock()
    (a,) = await replicas(1, deserved=4, clock=clock, settings={"gpu_reservation_confirm_s": 3})
    assert (await a.handler(kube.notebook("forged-1", gpus=4))).allowed
    assert (await kube.stored())["forged-1"]["expires_at"] == clock.now + 3
    clock.now += 2.5
    refused = await a.handler(kube.notebook("uid-2"))
    assert not refused.allowed and "0 of 4 deserved GPUs left" in refused.message
    clock.now += 0.5  # the pod watch never showed forged-1
    decision = await a.handler(kube.notebook("uid-3"))
    assert decision.allowed, decision.message
    assert decision.audit["gpus-left"] == "3"


async def test_sending_the_same_review_again_renews_nothing(kube: Projects, replicas: Callable[..., Any]) -> None:
    clock = Clock()
    (a,) = await replicas(1, deserved=2, clock=clock, settings={"gpu_reservation_confirm_s": 5})
    forged = kube.notebook("forged-1", gpus=2)
    assert (await a.handler(forged)).allowed
    written = (await kube.stored())["forged-1"]
    version = (await kube.configmap() or {})["metadata"]["resourceVersion"]
    for step in (2, 2, 2, 2):  # again and again, before and after the count lapsed
        clock.now += step
        assert (await a.handler(forged)).allowed  # its own entry is never counted against it
        assert (await kube.stored())["forged-1"] == written
    assert (await kube.configmap() or {})["metadata"]["resourceVersion"] == version
    # 8 s after the first review, the project's 2 GPUs are free for its real pods.
    decision = await a.handler(kube.notebook("uid-2", gpus=2))
    assert decision.allowed, decision.message


async def test_dry_run_writes_nothing(kube: Projects, replicas: Callable[..., Any]) -> None:
    (a,) = await replicas(1, deserved=1)
    assert (await a.handler(kube.notebook("uid-1", dry_run=True))).allowed
    assert await kube.reservation_configmaps() == []
    assert (await a.handler(kube.notebook("uid-2"))).allowed
    version = (await kube.configmap() or {})["metadata"]["resourceVersion"]
    refused = await a.handler(kube.notebook("uid-3", dry_run=True))  # the cache already holds uid-2
    assert not refused.allowed and "0 of 1" in refused.message
    assert (await kube.configmap() or {})["metadata"]["resourceVersion"] == version
    assert set(await kube.stored()) == {"uid-2"}


async def test_kubernetes_api_failing_refuses_clearly_and_recovers(
    kube: Projects, replicas: Callable[..., Any]
) -> None:
    async with FaultProxy(kube.scope.cp) as proxy:
        (a,) = await replicas(1, deserved=2, api_config=await kube.through_proxy(proxy))
        created = proxy.fail(500, n=50, verb="create", resource="configmaps", namespace=kube.install_ns)
        read = proxy.fail(500, n=50, verb="get", resource="configmaps", namespace=kube.install_ns)
        decision = await a.handler(kube.notebook("uid-1"))
        assert not decision.allowed
        assert decision.code == 503 and decision.reason == Reason.GPU_QUOTA_UNPROVEN
        assert "cannot be checked right now" in decision.message and "Try again" in decision.message
        assert created.hits + read.hits >= 1
        proxy.clear()
        assert (await a.handler(kube.notebook("uid-1"))).allowed


async def test_kubernetes_api_unreachable_refuses_clearly(kube: Projects, replicas: Callable[..., Any]) -> None:
    (a,) = await replicas(1, deserved=2, api_config=Configuration(host="http://127.0.0.1:9"))
    decision = await a.handler(kube.notebook("uid-1"))
    assert not decision.allowed and decision.reason == Reason.GPU_QUOTA_UNPROVEN
    assert f"GPU quota of project {kube.vision} cannot be checked" in decision.message


async def test_conflicts_past_the_retry_bound_fail_closed(kube: Projects, replicas: Callable[..., Any]) -> None:
    async with FaultProxy(kube.scope.cp) as proxy:
        (a,) = await replicas(1, deserved=2, api_config=await kube.through_proxy(proxy))
        assert (await a.handler(kube.notebook("uid-1"))).allowed  # the ConfigMap exists: later writes are PUTs
        conflicts = proxy.fail(409, n=100, verb="update", resource="configmaps", namespace=kube.install_ns)
        decision = await a.handler(kube.notebook("uid-2"))
    assert not decision.allowed and decision.reason == Reason.GPU_QUOTA_UNPROVEN
    assert "kept conflicting after 10 attempts" in decision.message
    assert conflicts.hits == 10


async def test_unbound_project_is_bound_in_the_mutating_phase_its_first_pod_refused_then_reserved(
    kube: Projects, replicas: Callable[..., Any]
) -> None:
    (a,) = await replicas(1, deserved=1)
    first = await a.mutate(kube.notebook("uid-1", ns=kube.nlp))
    # Bound, but this pod's mutating phase started before: Run:ai's webhooks would not see it.
    assert not first.allowed and first.reason == Reason.RUNAI_BINDING_SETTLING and first.code == 503, first.message
    assert "has just been bound to Run:ai project nlp" in first.message and "Create it again" in first.message
    assert a.binder.calls == [kube.nlp]
    assert (await kube.scope.get("v1", "Namespace", kube.nlp) or {})["metadata"]["labels"]["runai/queue"] == kube.nlp
    # Retried at once: still held back until the binding has settled.
    assert (await a.mutate(kube.notebook("uid-1", ns=kube.nlp))).reason == Reason.RUNAI_BINDING_SETTLING
    a.clock.now += 1.5
    again = await a.mutate(kube.notebook("uid-1", ns=kube.nlp))
    assert again.allowed and again.audit.get("runai-queue") == kube.nlp, again.message
    decision = await a.handler(kube.notebook("uid-1", ns=kube.nlp))
    assert decision.allowed, decision.message
    assert set(await kube.stored(kube.nlp)) == {"uid-1"}
    # Bound now: the next one is decided on quota, no second bind.
    assert not (await a.handler(kube.notebook("uid-2", ns=kube.nlp))).allowed
    assert (await a.mutate(kube.notebook("uid-2", ns=kube.nlp))).allowed
    assert a.binder.calls == [kube.nlp]


async def test_validation_refuses_pods_of_unbound_projects_and_pods_without_the_queue(
    kube: Projects, replicas: Callable[..., Any]
) -> None:
    (a,) = await replicas(1, deserved=1)
    unbound = await a.handler(kube.notebook("uid-1", ns=kube.nlp))
    assert not unbound.allowed and unbound.reason == Reason.RUNAI_PROJECT_NOT_BOUND
    other = kube.notebook("uid-2")
    other["object"]["metadata"]["labels"]["runai/queue"] = kube.nlp  # another project's queue
    assert (await a.handler(other)).reason == Reason.RUNAI_QUEUE_MISSING
    request = kube.notebook("uid-3")
    del request["object"]["metadata"]["labels"]["runai/queue"]
    missing = await a.handler(request)
    assert not missing.allowed and missing.reason == Reason.RUNAI_QUEUE_MISSING
    assert a.binder.calls == [] and await kube.reservation_configmaps() == []


async def test_unbound_project_with_runai_unreachable_is_refused(kube: Projects, replicas: Callable[..., Any]) -> None:
    (a,) = await replicas(1)
    a.binder.reachable = False
    decision = await a.mutate(kube.notebook("uid-1", ns=kube.nlp))
    assert not decision.allowed and decision.reason == Reason.RUNAI_UNREACHABLE and decision.code == 503
    assert "not bound to a Run:ai project yet" in decision.message
    assert "Run:ai control plane at http://127.0.0.1:9 did not answer" in decision.message
    assert "unreachable" in decision.message and "Try again later" in decision.message
    assert await kube.reservation_configmaps() == []
    # Jobs too: nothing starts outside Run:ai's governance (R2).
    job = await a.mutate(kube.notebook("uid-2", ns=kube.nlp, labels={"job-name": "train"}))
    assert not job.allowed and job.reason == Reason.RUNAI_UNREACHABLE


async def test_dry_run_on_an_unbound_project_does_not_bind(kube: Projects, replicas: Callable[..., Any]) -> None:
    (a,) = await replicas(1)
    decision = await a.mutate(kube.notebook("uid-1", ns=kube.nlp, dry_run=True))
    assert not decision.allowed and decision.reason == Reason.RUNAI_PROJECT_NOT_BOUND
    assert "a real (not dry-run) pod creation binds it" in decision.message
    assert a.binder.calls == [] and await kube.reservation_configmaps() == []


async def test_bound_project_with_runai_unreachable_is_admitted_unchecked_and_unreserved(
    kube: Projects, replicas: Callable[..., Any]
) -> None:
    (a,) = await replicas(1, deserved=1)
    a.state.snapshot().runai_projects = None  # Run:ai unreachable since start
    a.state.snapshot().runai_reachable = False
    decision = await a.handler(kube.notebook("uid-1", gpus=8))
    assert decision.allowed and any("not checked" in w for w in decision.warnings)
    assert await kube.reservation_configmaps() == []


async def test_jobs_and_cpu_pods_never_write(kube: Projects, replicas: Callable[..., Any]) -> None:
    (a,) = await replicas(1, deserved=0)
    job = owned_by("Job")
    assert (await a.handler(kube.notebook("uid-1", gpus=4, labels={"job-name": "train"}, owners=job))).allowed
    assert (await a.handler(kube.notebook("uid-2", gpus=4, labels={"job-type": "system"}, owners=job))).allowed
    assert (await a.handler(kube.notebook("uid-3", gpus=None))).allowed
    assert await kube.reservation_configmaps() == []


async def test_readiness_waits_for_the_reservation_watch(kube: Projects) -> None:
    state = cluster_state(namespaces=kube.objects()[:1], run_ai_enable=True)
    async with FaultProxy(kube.scope.cp) as proxy, ApiClient(await kube.through_proxy(proxy)) as api:
        store = GpuReservations(state, KubeApi(api, kube.install_ns))
        lists = proxy.fail(500, n=3, verb="list", resource="configmaps", namespace=kube.install_ns)
        await store.start(api, FAST)
        try:
            assert state.synced.get(WATCH_NAME) is False
            await eventually(
                lambda: state.synced.get(WATCH_NAME), within_s=SYNCED_WITHIN_S, message="synced after the faults"
            )
            assert lists.hits == 3
        finally:
            await store.stop()


async def test_end_to_end_over_https(
    kube: Projects, replicas: Callable[..., Any], https_server: StartHttpsServer
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

    answers = await asyncio.gather(*(post(servers[i % 2], kube.notebook(f"uid-{i}")) for i in range(6)))
    assert sum(a["allowed"] for a in answers) == 2
    refused = [a for a in answers if not a["allowed"]]
    assert all(a["status"]["code"] == 403 and "0 of 2 deserved GPUs left" in a["status"]["message"] for a in refused)
    assert len(await kube.stored()) == 2
    for srv in servers:
        async with srv.session.get(srv.url("/readyz")) as resp:
            assert resp.status == 200  # the reservation watch is synced


async def test_the_leader_sweeps_reservations_of_deleted_namespaces_once_they_expire(
    kube: Projects, replicas: Callable[..., Any]
) -> None:
    clock = Clock()
    (a,) = await replicas(1, deserved=2, clock=clock)
    assert (await a.handler(kube.notebook("uid-1"))).allowed
    await eventually(lambda: kube.vision in a.state.snapshot().gpu_reservations, message="cache sees it")
    # The namespace still exists: nothing to sweep.
    assert await a.store.sweep(clock.now + 1000) == []
    a.state.delete({"kind": "Namespace", "metadata": {"name": kube.vision}})
    # Gone, but a reservation is still live: kept (the pod may still be on its way).
    assert await a.store.sweep(clock.now) == []
    assert await kube.stored()
    # Gone and expired: deleted, and the cache forgets it through the watch.
    assert await a.store.sweep(clock.now + 1000) == [kube.vision]
    assert await kube.configmap() is None
    await eventually(lambda: kube.vision not in a.state.snapshot().gpu_reservations, message="cache forgot it")
