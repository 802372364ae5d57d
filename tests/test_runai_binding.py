"""Run:ai binding (R1, R2, R4 and the seed's "Operational dependency"), end to end on real parts.

Each replica is what `serve` runs: watch-fed caches from the real apiserver (a KubeScope of the
shared control plane, read as the webhook's ServiceAccount with the chart's RBAC), and the Run:ai
integration (directory, Lease, binder, reconciler) talking to the Run:ai stand-in over HTTP; every
Run:ai request and answer is checked against runai-openapi.json. The namespaces are the test's own
(their names carry the scope's id), the install namespace too. Test names quote the seed sentence
they prove.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from tests.support.cluster import namespace
from tests.support.control_plane.fault_proxy import FaultProxy
from tests.support.fixtures import remote_calls
from tests.support.kube_scope import SERVICE_ACCOUNT, KubeScope, eventually
from tests.support.runai_standin import RunaiStandin
from tests.support.scope_clients import namespace_events, webhook_client_config
from webhook.core.quota import validate_pod
from webhook.kube.api import KubeApi
from webhook.kube.leader import LeaseTiming
from webhook.kube.watch import KubeWatcher, WatchTiming
from webhook.runai.binding import (
    BINDING_ANNOTATION,
    FINALIZER,
    BindingError,
    BindingUnavailable,
    RunaiDisabled,
)
from webhook.runai.client import ClientOptions
from webhook.runai.integration import IntegrationOptions, RunaiIntegration, client_factory
from webhook.runai.left import LEFT_CONFIGMAP, dump
from webhook.snapshot import LeftProject
from webhook.state.store import ClusterState
from webhook.state.watches import cache_watcher

SECRET = "binding-test-secret"
QUEUE = "runai/queue"
PROJECT_ID = "hopsworks.ai/runai-project-id"
FAST_CLIENT = ClientOptions(
    timeout_s=1.0, connect_timeout_s=0.3, retries=1, backoff_s=0.02, backoff_max_s=0.05, deadline_s=2.0
)
FAST_WATCH = WatchTiming(watch_timeout_s=30, backoff_initial_s=0.02, backoff_max_s=0.1)
LEASE = LeaseTiming(lease_duration_s=1.0, renew_deadline_s=0.5, retry_period_s=0.1, request_timeout_s=1.0)
# A bound on each wait for the cluster to show a change: the namespace controller, the watches and
# the reconciler all take their turn on a loaded machine (15 s was too short at load 15-20 in a full
# run). A passing wait returns as soon as it holds.
AT_LEAST_S = 60.0


# ---- harness -------------------------------------------------------------------------------------


@pytest.fixture
def kube(kube_scope: KubeScope) -> KubeScope:
    return kube_scope


@pytest.fixture
async def runai() -> AsyncIterator[RunaiStandin]:
    async with RunaiStandin(client_secret=SECRET) as standin:
        yield standin
        assert not standin.violations, "\n\n".join(str(v) for v in standin.violations)


@pytest.fixture
def secret_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "runai-secret"
    directory.mkdir()
    (directory / "clientSecret").write_text(SECRET + "\n")
    return directory


async def until(condition: Callable[[], Any], *, within: float = 5.0, what: str = "condition") -> None:
    """Bounded polling of a condition (sync, or a coroutine's answer) on the cluster or a replica."""
    bound_s = max(within, AT_LEAST_S)
    await eventually(condition, within_s=bound_s, interval_s=0.05, message=f"no {what} after {bound_s:.0f} s")


async def put_settings(kube: KubeScope, runai: RunaiStandin, **overrides: Any) -> None:
    flat: dict[str, Any] = {
        "run_ai_enable": True,
        "run_ai_url": runai.url,
        "run_ai_client_id": runai.client_id,
        "run_ai_client_secret_name": "runai-hopsworks",
        "run_ai_client_secret_key": "clientSecret",
        "run_ai_reconcile_interval_s": 30,
        **overrides,
    }
    await kube.settings(**flat)


class Replica:
    """One `serve` process: its own API client, caches fed by watches, and the Run:ai integration."""

    def __init__(self, config: Configuration, install_ns: str, secret_dir: Path, identity: str, **options: Any) -> None:
        self.config = config
        self.install_ns = install_ns
        self.identity = identity
        self.secret_dir = secret_dir
        self.options = IntegrationOptions(
            install_namespace=install_ns,
            identity=identity,
            lease=LEASE,
            refresh_interval_s=options.pop("refresh_interval_s", 0.2),
            claim_ttl_s=options.pop("claim_ttl_s", 5.0),
            backoff_initial_s=0.05,
            backoff_max_s=0.3,
            settings_check_s=0.2,
            client_close_grace_s=options.pop("client_close_grace_s", 0.1),
            **options,
        )
        self.api: ApiClient | None = None
        self.state = ClusterState(install_ns)
        self.integration: RunaiIntegration | None = None
        self.watcher: KubeWatcher | None = None

    async def start(self) -> Replica:
        self.api = ApiClient(self.config)
        self.watcher = cache_watcher(self.state, self.api, self.install_ns, pods=False, kueue=False, timing=FAST_WATCH)
        await self.watcher.start()
        assert await self.watcher.wait_synced(AT_LEAST_S)
        factory = client_factory(self.secret_dir, FAST_CLIENT)
        self.integration = await RunaiIntegration.start(
            self.state, self.api, KubeApi(self.api, self.install_ns), factory, self.options
        )
        return self

    @property
    def runai(self) -> RunaiIntegration:
        assert self.integration is not None
        return self.integration

    async def stop(self, release: bool = True) -> None:
        if self.integration is not None:
            await self.integration.stop(release_lease=release)
            self.integration = None
        if self.watcher is not None:
            await self.watcher.stop()
            self.watcher = None
        if self.api is not None:
            await self.api.close()
            self.api = None


@pytest.fixture
async def replicas(kube: KubeScope, secret_dir: Path) -> AsyncIterator[Callable[..., Awaitable[Replica]]]:
    """Factory: `await replicas(identity, config=..., **IntegrationOptions)`; `config`: another way
    to the apiserver (e.g. through a fault proxy) than the webhook's ServiceAccount's own."""
    made: list[Replica] = []
    own = await webhook_client_config(kube)

    async def make(identity: str = "replica-a", config: Configuration | None = None, **options: Any) -> Replica:
        replica = await Replica(config or own, kube.install_ns, secret_dir, identity, **options).start()
        made.append(replica)
        return replica

    yield make
    for replica in made:
        await replica.stop()


async def ns_labels(kube: KubeScope, name: str) -> dict[str, str]:
    obj = await kube.get("v1", "Namespace", name)
    return dict((obj or {}).get("metadata", {}).get("labels") or {})


async def ns_meta(kube: KubeScope, name: str) -> dict[str, Any]:
    obj = await kube.get("v1", "Namespace", name)
    assert obj is not None, f"namespace {name} is gone"
    return dict(obj["metadata"])


async def bound(kube: KubeScope, *names: str) -> bool:
    """Whether every one of `names` carries its Run:ai queue label."""
    for name in names:
        if QUEUE not in await ns_labels(kube, name):
            return False
    return True


async def gone(kube: KubeScope, name: str) -> bool:
    return await kube.get("v1", "Namespace", name) is None


def creates(runai: RunaiStandin, status: int | None = 201) -> list[Any]:
    return [r for r in runai.calls("POST", "/api/v1/org-unit/projects") if status is None or r.status == status]


async def events(kube: KubeScope, reason: str, name: str) -> list[dict[str, Any]]:
    return await namespace_events(kube, name, reason)


async def until_events(kube: KubeScope, reason: str, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    async def seen() -> bool:
        found[:] = await events(kube, reason, name)
        return bool(found)

    await until(seen, within=5, what=f"{reason} event")
    return found


def projects_named(runai: RunaiStandin, name: str) -> list[dict[str, Any]]:
    return [p for p in runai.projects.values() if p["name"] == name]


def gpu_notebook(ns: str, gpus: int = 1) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        # runai/queue as the mutating webhook sets it for a bound project (S5)
        "metadata": {
            "name": "nb",
            "namespace": ns,
            "uid": "u1",
            "labels": {"hopsworks.ai/workload-type": "notebook", "runai/queue": ns},
        },
        "spec": {"containers": [{"name": "main", "image": "x", "resources": resources}]},
    }
    return {
        "uid": "req-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": ns,
        "operation": "CREATE",
        "object": pod,
        "userInfo": {"username": "alice"},
    }


async def hold_lease_elsewhere(kube: KubeScope) -> None:
    """Another process holds the Lease for an hour: replicas never reconcile, only admission binds."""
    await kube.create(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "scheduling-webhook-leader", "namespace": kube.install_ns},
            "spec": {"holderIdentity": "elsewhere", "leaseDurationSeconds": 3600, "leaseTransitions": 0},
        }
    )


# ---- What Hopsworks does: project creation -------------------------------------------------------


async def test_project_creation_creates_a_runai_project_named_after_the_namespace_bound_to_it(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    alpha = kube.name("alpha")
    await put_settings(kube, runai)
    await replicas()
    await kube.create(namespace(alpha))
    await until(lambda: bound(kube, alpha), within=5, what="alpha bound")
    [project] = projects_named(runai, alpha)
    assert project["requestedNamespace"] == alpha
    assert (await ns_labels(kube, alpha))[QUEUE] == alpha
    assert len(creates(runai, None)) == 1


async def test_project_creation_puts_it_in_the_runai_department_of_the_same_name(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    beta = kube.name("beta")
    research = runai.add_department("research")
    await put_settings(kube, runai)
    await replicas()
    await kube.create(namespace(beta, labels={"hopsworks.ai/department": "research"}))
    await until(lambda: bound(kube, beta), within=5, what="beta bound")
    [project] = projects_named(runai, beta)
    assert project["parentId"] == research["id"]


async def test_project_creation_falls_back_to_the_default_department(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    gamma, delta = kube.name("gamma"), kube.name("delta")
    platform = runai.add_department("platform")
    await put_settings(kube, runai, run_ai_default_department="platform")
    await replicas()
    # "marketing" has no Run:ai department of that name: the project goes to run_ai_default_department.
    await kube.create(namespace(gamma, labels={"hopsworks.ai/department": "marketing"}))
    await kube.create(namespace(delta))  # no department label at all
    await until(lambda: bound(kube, gamma, delta), within=5, what="bound")
    assert projects_named(runai, gamma)[0]["parentId"] == platform["id"]
    assert projects_named(runai, delta)[0]["parentId"] == platform["id"]
    assert runai.department("marketing") is None


async def test_project_creation_never_creates_runai_departments(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    epsilon = kube.name("epsilon")
    # The configured default department does not exist in Run:ai: binding fails, nothing is created.
    await put_settings(kube, runai, run_ai_default_department="missing")
    departments_before = set(runai.departments)
    replica = await replicas()
    await kube.create(namespace(epsilon, labels={"hopsworks.ai/department": "nowhere"}))
    await until(lambda: events(kube, "RunaiBindingFailed", epsilon), within=5, what="failure event")
    message = (await events(kube, "RunaiBindingFailed", epsilon))[0]["message"]
    assert "'missing'" in message and "does not exist in Run:ai" in message
    with pytest.raises(BindingError, match="does not exist in Run:ai"):
        await replica.runai.bind_for_admission(epsilon)
    assert set(runai.departments) == departments_before
    assert not creates(runai, None)
    assert not await bound(kube, epsilon)
    assert {r.path for r in runai.calls("POST")} <= {"/api/v1/token"}


async def test_project_creation_adopts_a_runai_project_already_bound_to_the_namespace(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    zeta = kube.name("zeta")
    runai.add_project("legacy-queue", namespace=zeta, gpu_quota=3)
    await put_settings(kube, runai)
    await replicas()
    await kube.create(namespace(zeta))
    await until(lambda: bound(kube, zeta), within=5, what="zeta bound")
    labels = await ns_labels(kube, zeta)
    assert labels[QUEUE] == "legacy-queue"
    assert PROJECT_ID not in labels  # adopted: belongs to whoever bound it
    assert FINALIZER not in ((await ns_meta(kube, zeta)).get("finalizers") or [])
    assert not creates(runai, None)
    await until(lambda: events(kube, "RunaiProjectAdopted", zeta), within=2, what="adoption event")


async def test_project_creation_adopts_a_runai_project_named_after_the_namespace(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    eta = kube.name("eta")
    runai.add_project(eta)  # no requestedNamespace: Run:ai gave it runai-eta
    await put_settings(kube, runai)
    await replicas()
    await kube.create(namespace(eta))
    await until(lambda: bound(kube, eta), within=5, what="eta bound")
    assert (await ns_labels(kube, eta))[QUEUE] == eta and PROJECT_ID not in await ns_labels(kube, eta)
    assert not creates(runai, None)


async def test_project_creation_gives_new_runai_projects_the_configured_deserved_gpus(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    theta = kube.name("theta")
    await put_settings(kube, runai, run_ai_project_gpu_quota=2)
    replica = await replicas()
    await kube.create(namespace(theta))
    await until(lambda: bound(kube, theta), within=5, what="theta bound")
    [project] = projects_named(runai, theta)
    pool = runai.default_node_pool()
    [resource] = project["resources"]
    assert resource["gpu"]["deserved"] == 2
    assert resource["nodePool"]["id"] == pool["id"]  # on the default node pool
    # Published for admission's quota check right away.
    published = replica.state.snapshot().runai_projects
    assert published is not None and published[theta].deserved_gpus == 2


async def test_project_creation_labels_the_namespace_runai_queue_and_runai_project_id(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    iota = kube.name("iota")
    await put_settings(kube, runai)
    await replicas()
    await kube.create(namespace(iota))
    await until(lambda: bound(kube, iota), within=5, what="iota bound")
    [project] = projects_named(runai, iota)
    meta = await ns_meta(kube, iota)
    assert meta["labels"][QUEUE] == iota
    assert meta["labels"][PROJECT_ID] == project["id"]
    assert FINALIZER in meta["finalizers"]  # a deletion is never missed
    assert BINDING_ANNOTATION not in (meta.get("annotations") or {})
    await until(lambda: events(kube, "RunaiProjectCreated", iota), within=2, what="created event")


async def test_existing_projects_bound_by_the_background_pass(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    # Projects that existed before the integration was enabled; the default department is missing
    # at first, so the pass right after enabling cannot bind them.
    await put_settings(kube, runai, run_ai_enable=False, run_ai_default_department="platform")
    names = tuple(kube.name(f"old-{i}") for i in (1, 2, 3))
    for name in names:
        await kube.create(namespace(name))
    replica = await replicas()
    await until(lambda: replica.runai.reconciler.passes >= 1, within=3, what="a pass with Run:ai off")
    assert not runai.requests
    await put_settings(kube, runai, run_ai_default_department="platform", run_ai_reconcile_interval_s=0.3)
    await until(lambda: events(kube, "RunaiBindingFailed", names[2]), within=3, what="first pass failed")
    versions = {n: (await ns_meta(kube, n))["resourceVersion"] for n in names}
    passes = replica.runai.reconciler.passes
    runai.add_department("platform")
    # Nothing about the namespaces changes (no watch event): only the timed pass can bind them.
    await until(lambda: bound(kube, *names), within=3, what="bound by a later pass")
    # The labels are written inside the pass and the pass is counted at its end: wait for the count.
    await until(lambda: replica.runai.reconciler.passes > passes, within=3, what="that pass counted")
    assert all([(await ns_meta(kube, n))["resourceVersion"] != versions[n] for n in names])
    assert len(creates(runai)) == 3


async def test_project_is_bound_on_its_first_workload_start(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    kappa = kube.name("kappa")
    # Another process holds the Lease: this replica never reconciles, only admission binds.
    await hold_lease_elsewhere(kube)
    await put_settings(kube, runai)
    await kube.create(namespace(kappa))
    replica = await replicas()
    await until(lambda: replica.runai.directory.reachable, within=3, what="directory refreshed")
    request = gpu_notebook(kappa)
    first = validate_pod(request, replica.state.snapshot(), time.time())
    assert not first.allowed and first.reason == "RunaiProjectNotBound"
    before = remote_calls("runai", "request")
    result = await replica.runai.bind_for_admission(kappa)
    assert result.outcome == "created" and await bound(kube, kappa)
    assert remote_calls("runai", "request") > before  # counted as request-path calls
    # The cache shows the label at once, so the same admission can now decide.
    assert replica.state.namespaces[kappa].runai_queue == kappa
    after = validate_pod(request, replica.state.snapshot(), time.time())
    assert after.reason == "GpuQuotaExceeded"  # bound now; the quota (0 deserved GPUs) applies
    assert not replica.runai.leader.is_leader


# ---- What Hopsworks does: project deletion -------------------------------------------------------


async def test_deleting_a_project_with_202_accepted_counts_as_deleted(
    kube: KubeScope, secret_dir: Path, replicas: Callable[..., Any]
) -> None:
    nu = kube.name("nu")
    async with RunaiStandin(client_secret=SECRET, delete_status=202, delete_delay_s=0.2) as slow:
        await put_settings(kube, slow)
        await replicas()
        await kube.create(namespace(nu))
        await until(lambda: bound(kube, nu), within=5, what="bound")
        await kube.delete("v1", "Namespace", nu)
        await until(lambda: gone(kube, nu), within=5, what="namespace gone")
        await until(lambda: not projects_named(slow, nu), within=2, what="Run:ai finished deleting")
        assert not slow.violations


async def test_a_refused_finalizer_removal_is_tried_again_without_deleting_in_runai_again(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    refused = kube.name("refused")
    # Every pass a second apart: a delete repeated pass after pass would show in the count.
    await put_settings(kube, runai, run_ai_reconcile_interval_s=1)
    token = await kube.token(SERVICE_ACCOUNT, kube.install_ns)
    async with FaultProxy(kube.cp) as proxy:
        replica = await replicas(config=proxy.client_config(token))
        await kube.create(namespace(refused))
        await until(lambda: bound(kube, refused), within=5, what="bound")
        project_id = (await ns_labels(kube, refused))[PROJECT_ID]
        # The finalizer's removal is refused twice (as an admission policy would), then allowed.
        refusal = proxy.fail(403, n=2, verb="patch", resource="namespaces", name=refused)
        await kube.delete("v1", "Namespace", refused)
        await until(lambda: gone(kube, refused), within=8, what="namespace gone")
        assert refusal.hits == 2
        assert len(runai.calls("DELETE", f"/api/v1/org-unit/projects/{project_id}")) == 1
        await until(lambda: events(kube, "RunaiUnbindFailed", refused), within=5, what="the refusal's Event")
        await until(lambda: events(kube, "RunaiProjectDeleted", refused), within=5, what="the deletion's Event")
        await replica.stop()


# ---- Operational dependency ----------------------------------------------------------------------


async def test_project_creation_succeeds_while_runai_is_down_and_binds_later(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    xi = kube.name("xi")
    await put_settings(kube, runai)
    replica = await replicas()
    await runai.stop_listening()
    await kube.create(namespace(xi))  # as the platform creates it, through the API
    await until(lambda: replica.runai.directory.reachable is False, within=3, what="unreachable noticed")
    assert await kube.get("v1", "Namespace", xi) is not None and not await bound(kube, xi)
    # "A workload in a project that is not bound yet cannot start until Run:ai is reachable."
    with pytest.raises(BindingUnavailable, match="unreachable"):
        await replica.runai.bind_for_admission(xi)
    await runai.resume()
    await until(lambda: bound(kube, xi), within=5, what="bound once Run:ai is back")
    assert len(projects_named(runai, xi)) == 1


async def test_bound_projects_skip_the_quota_check_while_runai_is_unreachable(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    omicron = kube.name("omicron")
    await put_settings(kube, runai, run_ai_project_gpu_quota=1)
    replica = await replicas()
    await kube.create(namespace(omicron))
    await until(lambda: bound(kube, omicron), within=5, what="bound")
    await until(lambda: omicron in (replica.state.snapshot().runai_projects or {}), within=3, what="published")
    over = gpu_notebook(omicron, gpus=2)
    assert not validate_pod(over, replica.state.snapshot(), time.time()).allowed  # 2 > 1 deserved
    await runai.stop_listening()
    assert await replica.runai.directory.refresh_now() is False  # the refresh failed...
    assert replica.state.snapshot().runai_projects is None  # ...and took the stale quota view away
    decision = validate_pod(over, replica.state.snapshot(), time.time())
    assert decision.allowed and any("not checked" in w for w in decision.warnings)
    await runai.resume()
    await replica.runai.directory.refresh_now()
    assert replica.state.snapshot().runai_projects is not None


async def test_flapping_control_plane(kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]) -> None:
    await put_settings(kube, runai, run_ai_reconcile_interval_s=0.3)
    await replicas()
    names = [kube.name(f"flap-{i}") for i in range(6)]

    async def flap() -> None:
        for _ in range(8):
            await runai.stop_listening()
            await asyncio.sleep(0.12)
            await runai.resume()
            await asyncio.sleep(0.12)

    flapper = asyncio.create_task(flap())
    for name in names:
        await kube.create(namespace(name))
        await asyncio.sleep(0.05)
    await flapper
    await until(lambda: bound(kube, *names), within=8, what="all bound after the flapping")
    for name in names:
        [project] = projects_named(runai, name)  # exactly one each: no duplicate from a retried create
        assert (await ns_labels(kube, name))[PROJECT_ID] == project["id"]
    assert len(runai.projects) == len(names)


async def test_token_expiry_mid_pass(kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]) -> None:
    await put_settings(kube, runai, run_ai_enable=False)
    names = [kube.name(f"tok-{i}") for i in (1, 2, 3)]
    for name in names:
        await kube.create(namespace(name))
    expired = []

    def expire_on_second_create(method: str, path: str, body: Any) -> bool:
        if method == "POST" and path == "/api/v1/org-unit/projects":
            expired.append(path)
            if len(expired) == 2:
                runai.expire_tokens()  # this very request now carries an expired token
        return False

    runai.fail_when(expire_on_second_create)
    await replicas()
    await put_settings(kube, runai)
    await until(lambda: bound(kube, *names), within=5, what="all bound")
    assert runai.tokens_issued >= 2
    assert [r.status for r in runai.calls("POST", "/api/v1/org-unit/projects")].count(401) == 1
    assert len(creates(runai)) == 3 and len(runai.projects) == 3


async def test_run_ai_enable_false_makes_no_call(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    rho, pi = kube.name("rho"), kube.name("pi")
    await put_settings(kube, runai, run_ai_enable=False, run_ai_reconcile_interval_s=0.2)
    await kube.create(namespace(pi))
    replica = await replicas()
    await kube.create(namespace(rho))
    await until(lambda: replica.runai.reconciler.passes >= 2, within=3, what="passes with Run:ai off")
    assert await replica.runai.directory.refresh_now() is False
    with pytest.raises(RunaiDisabled):
        await replica.runai.bind_for_admission(pi)
    assert replica.state.snapshot().runai_projects is None
    assert replica.runai.directory.department_names() is None
    assert runai.requests == []
    assert not await bound(kube, pi) and not await bound(kube, rho)


async def test_turning_run_ai_off_stops_calls_and_on_starts_them(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    tau, sigma = kube.name("tau"), kube.name("sigma")
    await put_settings(kube, runai)
    replica = await replicas()
    await kube.create(namespace(sigma))
    await until(lambda: bound(kube, sigma), within=5, what="bound")
    await put_settings(kube, runai, run_ai_enable=False)
    await until(lambda: replica.runai.client() is None, within=3, what="client dropped")
    await until(lambda: replica.state.snapshot().runai_projects is None, within=3, what="view withdrawn")
    count = len(runai.requests)
    await kube.create(namespace(tau))
    await asyncio.sleep(0.5)  # a window in which calls would show (the assertion is on the log)
    assert len(runai.requests) == count and not await bound(kube, tau)
    assert await bound(kube, sigma)  # the namespaces stay bound
    await put_settings(kube, runai)
    await until(lambda: bound(kube, tau), within=5, what="bound once on again")


async def test_runai_url_change_rebuilds_the_client(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    upsilon = kube.name("upsilon")
    await put_settings(kube, runai)
    replica = await replicas()
    old = replica.runai.client()
    async with RunaiStandin(client_secret=SECRET) as moved:
        await put_settings(kube, moved)
        await until(lambda: replica.runai.client() is not old, within=3, what="new client")
        await kube.create(namespace(upsilon))
        await until(lambda: bound(kube, upsilon), within=5, what="bound")
        assert projects_named(moved, upsilon) and not projects_named(runai, upsilon)
        assert not moved.violations


async def left_records(kube: KubeScope) -> dict[str, dict[str, Any]]:
    cm = await kube.get("v1", "ConfigMap", LEFT_CONFIGMAP, kube.install_ns) or {}
    return {k: json.loads(v) for k, v in (cm.get("data") or {}).items()}


async def no_left_records(kube: KubeScope) -> bool:
    return await left_records(kube) == {}


async def test_turned_back_on_deletes_the_project_left_behind_unless_the_namespace_came_back(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    omicron, psi = kube.name("omicron"), kube.name("psi")
    await put_settings(kube, runai)
    replica = await replicas()
    for name in (psi, omicron):
        await kube.create(namespace(name))
    await until(lambda: bound(kube, psi, omicron), within=5, what="bound")
    [psi_project] = projects_named(runai, psi)
    [omicron_project] = projects_named(runai, omicron)
    await put_settings(kube, runai, run_ai_enable=False)
    await asyncio.sleep(0.3)
    await kube.delete("v1", "Namespace", psi)
    await kube.delete("v1", "Namespace", omicron)

    async def both_recorded() -> bool:
        return set(await left_records(kube)) == {psi, omicron}

    await until(both_recorded, within=5, what=f"both recorded (recorded: {await left_records(kube)})")
    await until(lambda: gone(kube, omicron), within=5, what="omicron gone")
    await kube.create(namespace(omicron))  # the name comes back before Run:ai does
    await until(lambda: omicron in replica.state.namespaces, within=3, what="cache sees it")
    await put_settings(kube, runai, run_ai_reconcile_interval_s=0.3)
    await until(lambda: psi_project["id"] not in runai.projects, within=5, what="psi's left project deleted")

    await until(lambda: no_left_records(kube), within=5, what="records dropped")
    # omicron's Run:ai project is bound to a namespace of that name again: adopted, never deleted.
    assert omicron_project["id"] in runai.projects

    async def adopted() -> bool:
        return (await ns_labels(kube, omicron)).get(QUEUE) == omicron

    await until(adopted, within=5, what="adopted")


async def test_a_left_project_is_deleted_only_once_its_namespace_is_gone_not_while_it_terminates(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    # The namespace controller may take its time: a namespace whose Run:ai finalizer came off while
    # Run:ai was off can still be Terminating when Run:ai is turned on again. It has not come back,
    # so its record must wait, not be dropped with the project left in Run:ai.
    rho = kube.name("rho")
    hold = "example.com/hold"
    await put_settings(kube, runai)
    replica = await replicas()
    await kube.create(namespace(rho))
    await until(lambda: bound(kube, rho), within=5, what="bound")
    [project] = projects_named(runai, rho)
    await put_settings(kube, runai, run_ai_enable=False)
    await asyncio.sleep(0.3)
    current = await kube.get("v1", "Namespace", rho)
    assert current is not None
    held = [*(current["metadata"].get("finalizers") or ()), hold]
    await kube.patch("v1", "Namespace", rho, {"metadata": {"finalizers": held}})
    await kube.delete("v1", "Namespace", rho)

    async def terminating_without_ours() -> bool:
        obj = await kube.get("v1", "Namespace", rho)
        return obj is not None and (obj["metadata"].get("finalizers") or []) == [hold]

    await until(terminating_without_ours, within=5, what="our finalizer released")
    assert set(await left_records(kube)) == {rho}

    def cached_as_deleting() -> bool:
        info = replica.state.namespaces.get(rho)
        return info is not None and info.deleting

    await until(cached_as_deleting, within=3, what="cache sees it go")
    passes = replica.runai.reconciler.passes
    await put_settings(kube, runai, run_ai_reconcile_interval_s=0.3)
    await until(lambda: replica.runai.reconciler.passes >= passes + 3, within=5, what="passes with Run:ai on")
    assert project["id"] in runai.projects
    assert set(await left_records(kube)) == {rho}

    await kube.patch("v1", "Namespace", rho, {"metadata": {"finalizers": None}})
    await until(lambda: project["id"] not in runai.projects, within=5, what="left project deleted")

    await until(lambda: no_left_records(kube), within=5, what="record dropped")


async def test_a_left_project_whose_creation_was_unfinished_is_found_by_its_namespace_and_deleted(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    # Recorded with neither a queue nor an id (the binder had written its intent only): the project
    # is the one Run:ai holds for the namespace's name. Namespaces without a queue (every plain one)
    # must not count as that namespace having come back.
    sigma = kube.name("sigma")
    created = runai.add_project(sigma, namespace=sigma)
    record = LeftProject(sigma, runai_project=None, runai_project_id=None, deleted_at="2026-01-01T00:00:00Z")
    await kube.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": LEFT_CONFIGMAP, "namespace": kube.install_ns},
            "data": {sigma: dump(record)},
        }
    )
    await kube.namespace("plain", project=False)
    await put_settings(kube, runai, run_ai_reconcile_interval_s=0.3)
    await replicas()
    await until(lambda: created["id"] not in runai.projects, within=5, what="left project deleted")

    await until(lambda: no_left_records(kube), within=5, what="record dropped")


async def test_project_in_another_department_than_expected_reports_drift(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    omega = kube.name("omega")
    runai.add_department("research")
    runai.add_project(omega, namespace=omega, department="default")  # adopted, in the wrong department
    await put_settings(kube, runai, run_ai_reconcile_interval_s=0.3)
    replica = await replicas()
    await kube.create(namespace(omega, labels={"hopsworks.ai/department": "research"}))
    await until(lambda: events(kube, "RunaiDepartmentDrift", omega), within=5, what="drift event")
    [event] = await events(kube, "RunaiDepartmentDrift", omega)
    assert event["type"] == "Warning"
    assert "department default, expected research" in event["message"]
    passes = replica.runai.reconciler.passes
    await until(lambda: replica.runai.reconciler.passes >= passes + 2, within=3, what="more passes")
    assert len(await events(kube, "RunaiDepartmentDrift", omega)) == 1  # not one per pass
    report = replica.runai.reconciler.last_report
    assert report is not None and report.drift[omega] == ("default", "research")


# ---- crash safety and races ----------------------------------------------------------------------


def intent(by: str, age_s: float) -> str:
    return json.dumps({"state": "creating", "by": by, "at": time.time() - age_s})


@pytest.mark.slow
async def test_leader_failover_mid_bind(kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]) -> None:
    failover = kube.name("failover")
    await put_settings(kube, runai)
    token = await kube.token(SERVICE_ACCOUNT, kube.install_ns)
    async with FaultProxy(kube.cp) as proxy:
        a = await replicas("replica-a", config=proxy.client_config(token))
        await until(lambda: a.runai.leader.is_leader, within=3, what="a leads")
        b = await replicas("replica-b")

        def break_namespace_writes_after_create(method: str, path: str, body: Any) -> bool:
            if method == "POST" and path == "/api/v1/org-unit/projects":
                # The project is being created; every later write of a to the namespace fails, so
                # the leader dies between the Run:ai create and the namespace label.
                proxy.fail(500, n=None, verb="patch", resource="namespaces", name=failover)
            return False

        runai.fail_when(break_namespace_writes_after_create, times=1)
        await kube.create(namespace(failover))
        await until(lambda: creates(runai), within=5, what="a created the Run:ai project")
        await until(
            lambda: len(proxy.calls(verb="patch", resource="namespaces", name=failover)) >= 2,
            within=3,
            what="a's label write failed",
        )
        assert not await bound(kube, failover)
        assert BINDING_ANNOTATION in (await ns_meta(kube, failover))["annotations"]  # a's recorded intent
        await a.stop(release=False)  # killed: no release, no cleanup
    await until(lambda: b.runai.leader.is_leader, within=4, what="b takes over")
    await until(lambda: bound(kube, failover), within=5, what="b finished the binding")
    [project] = projects_named(runai, failover)  # exactly one Run:ai project
    meta = await ns_meta(kube, failover)
    assert meta["labels"][QUEUE] == failover
    assert meta["labels"][PROJECT_ID] == project["id"]  # created by us, not adopted
    assert BINDING_ANNOTATION not in (meta.get("annotations") or {})
    assert len(creates(runai, None)) == 1
    # No orphan: deleting the project deletes the one Run:ai project.
    await kube.delete("v1", "Namespace", failover)
    await until(lambda: gone(kube, failover), within=5, what="gone")
    assert not runai.projects


async def test_recorded_intent_with_an_existing_project_is_finished_as_created_never_adopted(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    resumed = kube.name("resumed")
    # A binder died after creating the project and before labelling: intent + project, no label.
    await put_settings(kube, runai, run_ai_enable=False)
    replica = await replicas()
    created = runai.add_project(resumed, namespace=resumed)
    await kube.create(namespace(resumed, annotations={BINDING_ANNOTATION: intent("dead-replica", 1)}))
    await put_settings(kube, runai)
    await until(lambda: replica.state.settings.run_ai_enable, within=3, what="on")
    result = await replica.runai.binder.ensure_bound(resumed)
    if result.outcome == "already":
        # The reconciler's pass on Run:ai turning on finished the intent first: its Event says how.
        finished = await until_events(kube, "RunaiProjectCreated", resumed)
        assert "finished binding" in finished[0].get("message", ""), finished
    else:
        assert result.outcome == "created" and result.resumed
    assert not await events(kube, "RunaiProjectAdopted", resumed)
    labels = await ns_labels(kube, resumed)
    assert labels[PROJECT_ID] == created["id"] and labels[QUEUE] == resumed
    assert not creates(runai, None)


async def test_stale_intent_without_a_project_is_taken_over_and_created_once(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    stale = kube.name("stale")
    await put_settings(kube, runai, run_ai_enable=False)
    replica = await replicas(claim_ttl_s=1.0)
    await kube.create(namespace(stale, annotations={BINDING_ANNOTATION: intent("dead-replica", 30)}))
    await put_settings(kube, runai)
    await until(lambda: bound(kube, stale), within=5, what="bound")
    assert (await ns_labels(kube, stale))[PROJECT_ID] == projects_named(runai, stale)[0]["id"]
    assert len(creates(runai, None)) == 1
    assert replica.runai.leader.is_leader


async def test_fresh_intent_of_another_binder_makes_admission_wait_not_create(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    busy = kube.name("busy")
    await hold_lease_elsewhere(kube)
    await put_settings(kube, runai)
    await kube.create(namespace(busy, annotations={BINDING_ANNOTATION: intent("other-replica", 0)}))
    replica = await replicas(bind_wait_s={"request": 0.3})
    with pytest.raises(BindingUnavailable, match="being bound to Run:ai by other-replica"):
        await replica.runai.bind_for_admission(busy)
    assert not creates(runai, None)


async def test_two_binders_racing_create_one_runai_project(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    race = kube.name("race")
    # Admission on two replicas at once, with nobody leading (the Lease is held elsewhere).
    await hold_lease_elsewhere(kube)
    await put_settings(kube, runai)
    runai.set_latency(0.2, method="POST", path="/api/v1/org-unit/projects")  # widen the race window
    await kube.create(namespace(race))
    a = await replicas("replica-a")
    b = await replicas("replica-b")
    results = await asyncio.gather(
        a.runai.bind_for_admission(race), b.runai.bind_for_admission(race), return_exceptions=True
    )
    assert all(not isinstance(r, Exception) for r in results), results
    [project] = projects_named(runai, race)
    assert len(creates(runai, None)) == 1
    assert {r.project_name for r in results} == {race}  # type: ignore[union-attr]
    assert (await ns_labels(kube, race))[PROJECT_ID] == project["id"]


async def test_deleting_during_an_unfinished_bind_deletes_what_was_created(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    halfway = kube.name("halfway")
    # The claim put the finalizer there before the create; the binder died before labelling.
    created = runai.add_project(halfway, namespace=halfway)
    obj = namespace(halfway, annotations={BINDING_ANNOTATION: intent("dead-replica", 1)})
    obj["metadata"]["finalizers"] = [FINALIZER]
    await kube.create(obj)
    await kube.delete("v1", "Namespace", halfway)
    await put_settings(kube, runai)
    await replicas()
    await until(lambda: gone(kube, halfway), within=5, what="gone")
    assert created["id"] not in runai.projects


async def test_binding_on_admission_gives_up_in_time_when_runai_hangs(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    omicron = kube.name("omicron")
    # The apiserver allows /validate/pods 10 s; a hanging control plane must get a clear refusal
    # from us well before that, not an apiserver timeout with no reason.
    await put_settings(kube, runai)
    replica = await replicas(request_bind_budget_s=0.5)
    # Run:ai hangs before the namespace exists: else the leader's own pass may bind it first.
    runai.latency = 5.0
    await kube.create(namespace(omicron))
    await until(lambda: omicron in replica.state.namespaces, what="namespace cached")
    with pytest.raises(BindingUnavailable, match=r"did not answer within 0\.5 s"):
        await replica.runai.bind_for_admission(omicron)
    assert not await bound(kube, omicron)  # refused by the budget while Run:ai still had not answered
    runai.latency = 0.0
    await until(lambda: bound(kube, omicron), within=10, what="bound by the leader once Run:ai answers")
    assert len(projects_named(runai, omicron)) == 1


async def test_stop_closes_a_client_retired_by_a_settings_change(
    kube: KubeScope, runai: RunaiStandin, replicas: Callable[..., Any]
) -> None:
    await put_settings(kube, runai)
    replica = await replicas(client_close_grace_s=30.0)
    first = replica.runai.client()
    assert first is not None
    await first.list_clusters()  # opens its HTTP session
    await put_settings(kube, runai, run_ai_cluster_name=runai.clusters[runai.cluster_id]["name"])
    await until(lambda: replica.runai.client() is not first, within=3, what="a new client for the new settings")
    await replica.stop()  # well inside the retired client's 30 s grace
    assert first._session is None  # closed, not left to the garbage collector
