"""The GPU API end to end: real HTTPS, bearer tokens checked by TokenReview/SubjectAccessReview on the
real apiserver (a KubeScope of the shared control plane; the callers are ServiceAccounts whose
tokens the apiserver issued, their rights real RBAC), Run:ai numbers from the spec-checked stand-in
through the real RunaiClient, and the Python client. The server's own calls to the apiserver go
through a fault proxy, which counts them and injects the faults a test names."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient

from tests.support.apps import cache_app
from tests.support.cluster import cluster_state, namespace
from tests.support.control_plane.fault_proxy import FaultProxy
from tests.support.fixtures import remote_calls
from tests.support.https import LOOPBACK, LOOPBACK6, HttpsServer, StartHttpsServer, ipv6_loopback, wait_until
from tests.support.kube_scope import KubeScope, eventually
from tests.support.runai_standin import RunaiStandin
from webhook.client import (
    Forbidden,
    GpuApiError,
    GpuAvailability,
    GpuClient,
    NotFound,
    RunaiAdminView,
    Unauthorized,
    Unavailable,
    get_gpu_availability,
)
from webhook.http.admin_api import ADMIN_API_ACTION, ADMIN_API_CHECK, admin_routes, authorize_with
from webhook.http.auth import KubeAuthorizer
from webhook.http.gpu_api import DirectoryAdapter, RunaiDirectoryView, gpu_api_routes
from webhook.http.review_budget import ReviewBudget
from webhook.kube.api import KubeApi
from webhook.runai import ClientOptions, RunaiClient, RunaiError, SecretFile
from webhook.runai.models import Department, NodePool, NodePoolMetrics, Project
from webhook.state.store import ClusterState

FAST = ClientOptions(timeout_s=1.0, connect_timeout_s=0.5, retries=1, backoff_s=0.02, backoff_max_s=0.05, deadline_s=3)
METRICS = "/api/v1/clusters/*/nodepools/*/metrics"
# A bound on waiting for the apiserver's RBAC and token caches to catch up with a change.
CAUGHT_UP_WITHIN_S = 15.0


class Clock:
    """Time the caches read; tests move it instead of sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class StandinDirectory:
    """A directory over the real RunaiClient, as RunaiDirectory will be: `refresh()` caches clusters,
    departments, projects and node pools; `node_pool_metrics` is the one live call."""

    def __init__(self, client: RunaiClient) -> None:
        self.client = client
        self.cluster_id: str | None = None
        self.reachable = False
        self._projects: list[Project] | None = None
        self._departments: list[Department] | None = None
        self._node_pools: list[NodePool] | None = None

    async def refresh(self) -> None:
        try:
            cluster = await self.client.get_cluster()
            self._departments = await self.client.list_departments(cluster_id=cluster.uuid)
            self._projects = await self.client.list_projects(cluster_id=cluster.uuid)
            self._node_pools = await self.client.list_node_pools(cluster.uuid)
            self.cluster_id, self.reachable = cluster.uuid, True
        except RunaiError:
            self.reachable = False

    def projects(self) -> Sequence[Project] | None:
        return self._projects

    def departments(self) -> Sequence[Department] | None:
        return self._departments

    def node_pools(self) -> Sequence[NodePool] | None:
        return self._node_pools

    async def node_pool_metrics(self, node_pool: str) -> NodePoolMetrics:
        assert self.cluster_id is not None
        return await self.client.node_pool_metrics(self.cluster_id, node_pool, call_path="request")


def _protocol_check(directory: StandinDirectory) -> RunaiDirectoryView:
    return directory  # a type checker proves the stand-in directory satisfies the Protocol


class UnreachableMover:
    """The admin routes' mover, for tests that never get past authentication."""

    async def move_project(
        self, namespace: str, department: str | None, *, requested_by: str = "", dry_run: bool = False
    ) -> Any:
        raise AssertionError("an unauthenticated request reached the mover")

    async def delete_department(self, name: str, *, requested_by: str = "", dry_run: bool = False) -> Any:
        raise AssertionError("an unauthenticated request reached the mover")


@dataclass
class Caller:
    """A caller of the API: a ServiceAccount's username and a token the apiserver issued for it."""

    name: str  # the ServiceAccount's name in its namespace
    namespace: str
    token: str

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"


@dataclass
class Env:
    scope: KubeScope
    proxy: FaultProxy  # the servers' way to the apiserver
    runai: RunaiStandin
    state: ClusterState
    directory: StandinDirectory
    clock: Clock
    start: StartHttpsServer
    churn: str  # a bound project; alice reads it
    fraud: str  # a project not bound yet; bob reads it
    ops_group: str  # the platform admins' group; ops is in it
    callers: dict[str, Caller] = field(default_factory=dict)
    api_clients: list[ApiClient] = field(default_factory=list)
    authorizer: KubeAuthorizer | None = None

    def token(self, who: str) -> str:
        return self.callers[who].token

    def user(self, who: str) -> str:
        return self.callers[who].user

    def reviews(self, resource: str = "tokenreviews") -> int:
        """The servers' TokenReviews (or SubjectAccessReviews) that reached the apiserver's proxy."""
        return len(self.proxy.calls(verb="create", resource=resource))

    async def server(
        self,
        directory: RunaiDirectoryView | None = None,
        auth: Mapping[str, Any] | None = None,
        host: str = LOOPBACK,
        **kwargs: Any,
    ) -> HttpsServer:
        """A GPU API server over `directory` (default: the refreshed stand-in directory), with the
        admin API's routes behind the same kind of authorizer, listening on `host`; `auth`:
        KubeAuthorizer options."""
        api_client = await self.proxy.api_client_via(self.scope.kubeconfig)  # the webhook's ServiceAccount
        self.api_clients.append(api_client)
        kube = KubeApi(api_client, self.scope.install_ns)
        authorizer = KubeAuthorizer(kube, admin_groups=[self.ops_group], clock=self.clock, **(auth or {}))
        self.authorizer = authorizer
        routes = gpu_api_routes(self.state, directory or self.directory, authorizer, clock=self.clock, **kwargs)
        admin_auth = KubeAuthorizer(kube, admin_check=ADMIN_API_CHECK, admin_action=ADMIN_API_ACTION, **(auth or {}))
        routes += admin_routes(UnreachableMover(), authorize_with(admin_auth))
        return await self.start(cache_app(self.state, routes=routes), host=host)

    async def caller(self, who: str, namespace: str | None = None, seconds: int | None = None) -> Caller:
        """A new ServiceAccount (in `namespace`, else the install namespace) and a token of it
        (valid `seconds` when given)."""
        user, token = await self.scope.user_token(who, namespace)
        _, _, where, name = user.split(":")
        if seconds is not None:
            token = await self.scope.token(name, where, seconds)
        self.callers[who] = caller = Caller(name, where, token)
        return caller

    async def grant(self, who: str, namespace: str) -> None:
        """What a member of the project in `namespace` may do (get pods there), once RBAC says so."""
        await self.scope.allow(self.user(who), "get", "pods", namespace)
        await self.authorized(who, {"verb": "get", "resource": "pods", "namespace": namespace})

    async def cluster_admin(self, who: str) -> None:
        user, token = await self.scope.admin_token(who)
        _, _, where, name = user.split(":")
        self.callers[who] = Caller(name, where, token)
        await self.authorized(who, {"verb": "list", "resource": "namespaces"})

    async def authorized(self, who: str, attributes: Mapping[str, str]) -> None:
        """Until the apiserver's authorizer, whose caches follow RBAC objects a moment late, allows it."""
        caller = self.callers[who]
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{caller.namespace}", "system:authenticated"]
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": caller.user, "groups": groups, "resourceAttributes": dict(attributes)}}  # fmt: skip

        async def allowed() -> bool:
            answer = await self.scope.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
            return bool(answer["status"].get("allowed"))

        await eventually(allowed, within_s=CAUGHT_UP_WITHIN_S, interval_s=0.05, message=f"RBAC never allowed {review}")

    async def revoke(self, who: str) -> None:
        """Deletes the caller's ServiceAccount: its tokens stop working, once the apiserver sees it."""
        caller = self.callers[who]
        await self.scope.delete("v1", "ServiceAccount", caller.name, caller.namespace)
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": caller.token}}

        async def refused() -> bool:
            answer = await self.scope.call("POST", "/apis/authentication.k8s.io/v1/tokenreviews", review)
            return not answer["status"].get("authenticated")

        await eventually(refused, within_s=CAUGHT_UP_WITHIN_S, interval_s=0.05, message=f"{who}'s token still valid")


@pytest.fixture
async def env(https_server: StartHttpsServer, tmp_path: Path, kube_scope: KubeScope) -> AsyncIterator[Env]:
    secret = tmp_path / "runai-secret"
    secret.mkdir()
    (secret / "clientSecret").write_text("standin-client-secret")
    churn, fraud = kube_scope.name("churn"), kube_scope.name("fraud")
    namespaces = [
        namespace(churn, labels={"runai/queue": churn, "hopsworks.ai/runai-project-id": "placeholder"}),
        namespace(fraud, labels={"hopsworks.ai/department": "research"}),  # not bound yet
        namespace("kube-public", project=False),
    ]
    for ns in namespaces[:2]:
        await kube_scope.create(ns)
    ops_ns = await kube_scope.namespace("ops", project=False)  # every ServiceAccount there is a platform admin
    async with FaultProxy(kube_scope.cp) as proxy, RunaiStandin() as runai:
        runai.add_department("research", gpu_quota=2)
        runai.add_project(churn, namespace=churn, gpu_quota=4)
        runai.set_project_usage(churn, allocated=3, allocated_non_preemptible=1, requested=3)
        runai.set_node_pool_gpus("default", total=8)  # allocation: the projects' sum, 3

        state = cluster_state(namespaces=namespaces, run_ai_enable=True)
        for kind in ("Namespace", "PriorityClass", "ConfigMap", "LocalQueue", "Pod"):
            state.synced[kind] = True
        async with RunaiClient(runai.url, runai.client_id, SecretFile(secret, "clientSecret"), options=FAST) as client:
            directory = StandinDirectory(client)
            await directory.refresh()
            assert directory.reachable
            env = Env(kube_scope, proxy, runai, state, directory, Clock(), https_server, churn, fraud,
                      f"system:serviceaccounts:{ops_ns}")  # fmt: skip
            await env.caller("alice")  # member of churn
            await env.grant("alice", churn)
            await env.caller("bob")  # member of fraud
            await env.grant("bob", fraud)
            await env.cluster_admin("root")
            await env.caller("ops", ops_ns)  # platform admin by group only
            try:
                yield env
            finally:
                for api_client in env.api_clients:
                    await api_client.close()
        assert not runai.violations, "\n\n".join(str(v) for v in runai.violations)


async def get(srv: HttpsServer, path: str, token: str | None = None) -> tuple[int, dict[str, Any], Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with srv.session.get(srv.url(path), headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.json()


def metrics_calls(runai: RunaiStandin) -> int:
    return len(runai.calls("GET", METRICS))


# ---- authentication and authorization -------------------------------------------------------------


async def test_a_member_reads_their_project(env: Env) -> None:
    srv = await env.server()
    status, headers, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice"))
    assert status == 200, body
    assert "no-store" in headers["Cache-Control"]
    view = GpuAvailability.model_validate(body)
    assert (view.status, view.warnings) == ("OK", [])
    assert view.project is not None and view.department is not None and view.node_pool_gpus is not None
    assert (view.project.name, view.project.quota, view.project.allocated_non_preemptible) == (env.churn, 4, 1)
    assert (view.department.name, view.department.expected) == ("default", "default")
    assert (view.node_pool, view.node_pool_gpus.total, view.node_pool_gpus.unallocated) == ("default", 8, 5)
    assert view.node_pool_gpus.sampled_at is not None
    assert (view.available_non_preemptible, view.available_preemptible) == (3, 5)
    # The SubjectAccessReview asked what a member of churn can do, and only that: alice may get pods
    # in churn and nothing else, so she reads no other project.
    assert (await get(srv, f"/api/v1/projects/{env.fraud}/gpu", env.token("alice")))[0] == 403


async def test_a_member_of_another_project_is_refused(env: Env) -> None:
    srv = await env.server()
    status, _, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("bob"))
    assert status == 403 and body["code"] == "Forbidden"
    assert env.user("bob") in body["error"]
    assert f"`kubectl auth can-i get pods --namespace={env.churn}`" in body["error"]
    # bob reads his own project; a namespace that does not exist is a 403 too, not a hint that it is missing.
    assert (await get(srv, f"/api/v1/projects/{env.fraud}/gpu", env.token("bob")))[0] == 200
    assert (await get(srv, "/api/v1/projects/nope/gpu", env.token("bob")))[0] == 403


async def test_no_or_invalid_token_is_401(env: Env) -> None:
    srv = await env.server()
    status, headers, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu")
    assert status == 401 and body["code"] == "Unauthenticated" and "Bearer" in body["error"]
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert not env.reviews()  # nothing to review
    status, _, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu", "stolen-token")
    assert status == 401 and "invalid bearer token" in body["error"]
    async with srv.session.get(
        srv.url(f"/api/v1/projects/{env.churn}/gpu"), headers={"Authorization": "Basic YWxpY2U6eA=="}
    ) as resp:
        assert resp.status == 401
    assert (await get(srv, "/api/v1/admin/runai"))[0] == 401


def auth_paths(env: Env) -> tuple[tuple[str, str], ...]:
    return (
        ("GET", f"/api/v1/projects/{env.churn}/gpu"),
        ("GET", "/api/v1/admin/runai"),
        ("POST", f"/api/v1/admin/projects/{env.churn}/move"),
        ("DELETE", "/api/v1/admin/departments/research"),
    )


async def raw_call(srv: HttpsServer, method: str, path: str, authorization: bytes) -> tuple[int, bytes]:
    """One request with an Authorization header of any bytes (aiohttp's client sends only text)."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", srv.port, ssl=srv.client_ssl_context(), server_hostname=srv.hostname
    )
    try:
        head = f"{method} {path} HTTP/1.1\r\nHost: {srv.hostname}\r\nContent-Length: 2\r\n".encode()
        writer.write(head + b"Content-Type: application/json\r\nAuthorization: " + authorization + b"\r\n\r\n{}")
        await writer.drain()
        status_line = await reader.readline()
        body = await reader.read(65536)
        return int(status_line.split()[1]), body
    finally:
        writer.close()


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer tökén".encode(),
        b"Bearer \xff\xfe\x80",
        b"Bearer a b",
        b"Bearer " + b"a" * 20_000,
        b"Bearer \x01\x02",
    ],
    ids=["utf8", "latin1", "space", "oversized", "control"],
)
async def test_a_malformed_bearer_token_is_401_on_every_auth_endpoint(env: Env, authorization: bytes) -> None:
    srv = await env.server()
    for method, path in auth_paths(env):
        status, body = await raw_call(srv, method, path, authorization)
        assert status in (400, 401, 431), (path, status, body)  # 400/431: the header line itself refused
        assert b"Traceback" not in body
    assert not env.reviews(), "a malformed token is never sent for review"


async def test_a_hanging_apiserver_makes_a_bounded_503(env: Env) -> None:
    srv = await env.server(auth={"review_timeout_s": 0.5})
    hanging = env.proxy.hang(n=1, verb="create", resource="tokenreviews")
    status, _, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice"))
    assert (status, body["code"]) == (503, "AuthUnavailable")
    assert hanging.hits == 1 and hanging.waiting == 1  # answered while the apiserver still had not
    hanging.release()
    hanging = env.proxy.hang(n=1, verb="create", resource="subjectaccessreviews")
    assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice")))[0] == 503
    assert hanging.hits == 1 and hanging.waiting == 1
    hanging.release()


async def test_a_503_tells_an_unauthenticated_caller_nothing_of_the_apiserver(env: Env) -> None:
    srv = await env.server()
    for method, path in auth_paths(env):
        env.proxy.fail(500, n=1, verb="create", resource="tokenreviews")
        async with srv.session.request(
            method, srv.url(path), json={}, headers={"Authorization": "Bearer unknown-token"}
        ) as resp:
            text = await resp.text()
            assert resp.status == 503, (path, text)
            assert "injected" not in text and "500" not in text, text


async def test_concurrent_requests_with_one_token_make_one_token_review(env: Env) -> None:
    srv = await env.server()
    first = env.proxy.hang(n=1, verb="create", resource="tokenreviews")  # the rest arrive meanwhile
    asking = [asyncio.ensure_future(get(srv, f"/api/v1/projects/{env.churn}/gpu", "unknown-token")) for _ in range(20)]
    await wait_until(lambda: first.waiting == 1, what="the first review held at the apiserver")
    first.release()  # whoever came later joined it, or finds its refusal cached: no second review
    statuses = await asyncio.gather(*asking)
    assert [s[0] for s in statuses] == [401] * 20
    assert env.reviews() == 1
    assert env.authorizer is not None and len(env.authorizer._token_reviews) == 0  # the table empties


async def test_the_table_of_reviews_in_flight_is_bounded(env: Env) -> None:
    srv = await env.server(auth={"max_in_flight": 4, "reserved_for_known_good": 0})
    held = env.proxy.hang(verb="create", resource="tokenreviews")
    asking = [asyncio.ensure_future(get(srv, f"/api/v1/projects/{env.churn}/gpu", f"token-{i}")) for i in range(10)]
    await wait_until(lambda: held.waiting == 4 and sum(a.done() for a in asking) == 6, what="4 reviews held, 6 refused")
    held.release()
    statuses = sorted(a[0] for a in await asyncio.gather(*asking))
    assert statuses.count(401) == 4 and statuses.count(503) == 6, statuses
    assert env.reviews() == 4


async def test_the_admin_api_refusal_names_the_permission_as_kubectl_auth_can_i(env: Env) -> None:
    # The refusal names the admin API's own action and permission, as `kubectl auth can-i` asks it.
    srv = await env.server()
    async with srv.session.delete(
        srv.url("/api/v1/admin/departments/ml"), headers={"Authorization": f"Bearer {env.token('alice')}"}
    ) as resp:
        assert resp.status == 403
        assert (await resp.json())["error"] == (
            f"user '{env.user('alice')}' may not move projects or delete departments: "
            "`kubectl auth can-i update namespaces --all-namespaces` must say yes for them"
        )


# -- authentication under a flood of new tokens ------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "client"),
    [
        (LOOPBACK, "127.0.0.1"),
        pytest.param(
            LOOPBACK6,
            "::/64",  # ::1's /64: a client with an IPv6 address is its /64
            marks=pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine"),
        ),
    ],
    ids=["ipv4", "ipv6"],
)
async def test_a_flood_of_new_tokens_from_one_client_costs_at_most_its_budget_of_token_reviews(
    env: Env, host: str, client: str
) -> None:
    # Each new token costs a TokenReview: one client gets no more of them than its budget.
    srv = await env.server(host=host)
    env.proxy.delay(0.2, verb="create", resource="tokenreviews")  # the reviews overlap
    answers = await asyncio.gather(*(get(srv, f"/api/v1/projects/{env.churn}/gpu", f"junk-{i}") for i in range(200)))
    statuses = [a[0] for a in answers]
    assert set(statuses) == {401, 429}, statuses
    assert {a[2]["code"] for a in answers if a[0] == 429} == {"TooManyNewTokens"}
    assert env.reviews() == statuses.count(401) <= 20
    assert env.authorizer is not None and env.authorizer._budget.clients() == [client]


async def test_a_token_known_good_is_answered_while_new_tokens_fill_the_table_of_reviews(env: Env) -> None:
    # Room in the table of reviews is kept for tokens known good, whatever junk fills the rest.
    srv = await env.server(auth={"max_in_flight": 8})
    assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice")))[0] == 200
    env.clock.now += 60  # alice's answer has expired; her token is still known good
    held = env.proxy.hang(n=6, verb="create", resource="tokenreviews")  # the junk that gets a review
    junk = [asyncio.ensure_future(get(srv, f"/api/v1/projects/{env.churn}/gpu", f"junk-{i}")) for i in range(8)]
    await wait_until(lambda: held.waiting == 6, what="junk reviews in flight")
    status, _, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice"))
    assert status == 200, body
    held.release()
    assert sorted(a[0] for a in await asyncio.gather(*junk)) == [401] * 6 + [503] * 2


async def test_refusals_of_new_tokens_do_not_push_good_tokens_out_of_the_cache(env: Env) -> None:
    # Refusals and grants are cached apart: refusals never evict a grant.
    srv = await env.server(auth={"max_entries": 4})
    assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice")))[0] == 200
    for i in range(16):  # within the client's budget: each one reviewed, refused and cached
        assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", f"junk-{i}"))[0] == 401
    reviews = env.reviews()
    assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice")))[0] == 200
    assert env.reviews() == reviews  # still cached: no new review


async def spend_the_budget(srv: HttpsServer, env: Env) -> int:
    """The client's whole burst spent on tokens never seen (the fake clock stands still, so
    nothing refills); returns the TokenReviews made so far."""
    for i in range(20):
        assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", f"spent-{i}"))[0] == 401
    return env.reviews()


async def test_a_token_a_later_review_refuses_is_no_longer_known_good_and_pays_its_clients_budget(
    env: Env,
) -> None:
    # A token is known good (its reviews spared its client's budget) only until a review refuses it.
    srv = await env.server()
    assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice")))[0] == 200
    await env.revoke("alice")
    env.clock.now += 60  # the accepted answer has expired
    assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice")))[0] == 401
    env.clock.now += 60  # so has the refusal; the client's budget is full again
    reviews = await spend_the_budget(srv, env)
    status, _, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice"))
    assert (status, body["code"]) == (429, "TooManyNewTokens")
    assert env.reviews() == reviews


async def test_a_token_is_known_good_no_longer_than_its_own_expiry(env: Env) -> None:
    # A token is known good for an hour at most, and never past the expiry its JWT claims.
    carol = await env.caller("carol", seconds=600)  # the shortest a TokenRequest gives
    await env.grant("carol", env.churn)
    srv = await env.server()
    assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", carol.token))[0] == 200
    env.clock.now += 610  # past the token's expiry, well within the hour
    reviews = await spend_the_budget(srv, env)
    status, _, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu", carol.token)
    assert (status, body["code"]) == (429, "TooManyNewTokens")
    assert env.reviews() == reviews


def test_the_review_budget_is_a_bucket_per_client_with_a_bound_on_reviews_in_flight() -> None:
    clock = Clock()
    budget = ReviewBudget(clock, burst=3, per_s=1.0, in_flight=2, max_clients=2)
    assert budget.acquire("a") is None and budget.acquire("a") is None
    assert "2 checks" in (budget.acquire("a") or "")  # two in flight already
    budget.release("a")
    budget.release("a")
    assert budget.acquire("a") is None
    budget.release("a")
    assert "at most 1 a second" in (budget.acquire("a") or "")  # the burst of 3 is spent
    clock.now += 1.0
    assert budget.acquire("a") is None  # one more a second
    budget.release("a")
    assert budget.acquire("b") is None  # another client has a bucket of its own
    assert budget.acquire("c") is None and len(budget) == 2  # the table of clients is bounded


def test_the_review_budget_counts_an_ipv6_client_by_its_64_prefix() -> None:
    # An IPv6 client holds a whole /64 as a rule: a bucket per address would give it a fresh bucket
    # per request, and so as many TokenReviews as it liked.
    budget = ReviewBudget(Clock(), burst=2, per_s=1.0, in_flight=8)
    assert budget.acquire("2001:db8:0:1::1") is None
    assert budget.acquire("2001:db8:0:1:ffff:ffff:ffff:ffff") is None
    assert "at most 1 a second" in (budget.acquire("2001:db8:0:1:1234::9") or "")  # the /64's burst is spent
    assert budget.acquire("2001:db8:0:2::1") is None  # the next /64 is another client
    # IPv4 stays per address, and an IPv4-mapped IPv6 address is that IPv4 address.
    assert budget.acquire("192.0.2.1") is None and budget.acquire("::ffff:192.0.2.1") is None
    assert "at most 1 a second" in (budget.acquire("192.0.2.1") or "")
    assert budget.acquire("192.0.2.2") is None
    # A peer name that is no address (a Unix socket's, or none at all) keeps a bucket of its own.
    assert budget.acquire("") is None and budget.acquire("not-an-address") is None
    assert budget.clients() == [
        "2001:db8:0:1::/64",
        "2001:db8:0:2::/64",
        "192.0.2.1",
        "192.0.2.2",
        "",
        "not-an-address",
    ]
    # Reviews in flight are counted per /64 too, and given back under it.
    budget = ReviewBudget(Clock(), burst=10, per_s=1.0, in_flight=1)
    assert budget.acquire("2001:db8::1") is None
    assert "1 checks" in (budget.acquire("2001:db8::2") or "")
    budget.release("2001:db8::1")
    assert budget.acquire("2001:db8::3") is None


async def test_unknown_and_non_project_namespaces_are_404(env: Env) -> None:
    srv = await env.server()
    for name in ("nope", "kube-public", "Not_A_Name"):
        status, _, body = await get(srv, f"/api/v1/projects/{name}/gpu", env.token("root"))
        assert (status, body["code"]) == (404, "NotFound"), name


async def test_admin_view_needs_an_admin(env: Env) -> None:
    srv = await env.server()
    status, _, body = await get(srv, "/api/v1/admin/runai", env.token("alice"))
    # The permission as `kubectl auth can-i` names it.
    assert status == 403 and body["error"] == (
        f"user '{env.user('alice')}' may not read the Run:ai admin view: "
        "`kubectl auth can-i list namespaces --all-namespaces` "
        f"must say yes for them, or they must be in group {env.ops_group}"
    )
    status, _, body = await get(srv, "/api/v1/admin/runai", env.token("root"))  # by SubjectAccessReview
    assert status == 200, body
    reviews = env.reviews("subjectaccessreviews")
    status, _, body = await get(srv, "/api/v1/admin/runai", env.token("ops"))  # by group: no review needed
    assert status == 200
    assert env.reviews("subjectaccessreviews") == reviews

    view = RunaiAdminView.model_validate(body)
    departments = {d.name: d for d in view.departments}
    assert set(departments) == {"default", "research"}
    assert departments["default"].linked and departments["research"].linked and departments["research"].quota == 2
    projects = {p.namespace: p for p in view.projects}
    assert set(projects) == {env.churn, env.fraud}
    churn, fraud = projects[env.churn], projects[env.fraud]
    assert churn.linked and (churn.quota, churn.allocated) == (4, 3)
    assert not fraud.linked and fraud.warnings[0].code == "RUN_AI_PROJECT_NOT_BOUND"
    assert metrics_calls(env.runai) == 0  # the admin view reads only the directory's cache


async def test_reviews_are_cached_briefly(env: Env) -> None:
    srv = await env.server()
    before = remote_calls("kubernetes", "request")
    for _ in range(5):
        assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice")))[0] == 200
        assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("bob")))[0] == 403
    assert env.reviews() == 2  # alice, bob
    assert env.reviews("subjectaccessreviews") == 2
    after = remote_calls("kubernetes", "request")
    assert after == before + 4  # counted as request-path calls
    # Refusals are kept for less time than grants: a RoleBinding just added works soon.
    await env.grant("bob", env.churn)
    env.clock.now += 6
    assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("bob")))[0] == 200
    assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice")))[0] == 200
    assert env.reviews() == 2 and env.reviews("subjectaccessreviews") == 3
    env.clock.now += 30  # everything expired: reviewed again (a revoked token stops working)
    await env.revoke("alice")
    assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice")))[0] == 401


async def test_kubernetes_api_down_is_503_not_a_refusal(env: Env) -> None:
    srv = await env.server()
    env.proxy.fail(500, n=1, verb="create", resource="tokenreviews")
    status, _, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice"))
    assert (status, body["code"]) == (503, "AuthUnavailable")
    assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice")))[
        0
    ] == 200  # not cached as a refusal


# ---- Run:ai: no side effects, caching, unreachable ----------------------------------------------


async def test_reading_has_no_side_effects(env: Env) -> None:
    srv = await env.server()
    projects_before = dict(env.runai.projects)
    env.runai.requests.clear()
    status, _, body = await get(srv, f"/api/v1/projects/{env.fraud}/gpu", env.token("bob"))
    assert status == 200
    assert body["status"] == "RUN_AI_PROJECT_NOT_BOUND" and body["project"] is None
    assert body["department"]["name"] == "research"  # where binding would put it
    assert (await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("root")))[0] == 200
    assert (await get(srv, "/api/v1/admin/runai", env.token("root")))[0] == 200
    # Run:ai saw reads only (a token request would be the client's credential exchange, not a write).
    assert env.runai.requests and {r.method for r in env.runai.requests if r.path != "/api/v1/token"} == {"GET"}
    assert env.runai.projects.keys() == projects_before.keys()
    # Kubernetes saw reviews only; the namespace is not bound, in the API or in the cache.
    reviews = {("create", "tokenreviews"), ("create", "subjectaccessreviews")}
    assert {(c.verb, c.resource) for c in env.proxy.requests} <= reviews
    fraud = await env.scope.get("v1", "Namespace", env.fraud)
    assert fraud is not None and "runai/queue" not in fraud["metadata"]["labels"]
    assert env.state.namespaces[env.fraud].runai_queue is None


async def test_metrics_are_fetched_once_per_ttl(env: Env) -> None:
    srv = await env.server(metrics_ttl_s=5.0)
    env.runai.set_latency(0.1, path=METRICS)  # concurrent requests overlap one fetch
    answers = await asyncio.gather(
        *(get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice")) for _ in range(8))
    )
    assert {a[0] for a in answers} == {200}
    assert metrics_calls(env.runai) == 1
    for _ in range(5):
        await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice"))
        await get(srv, f"/api/v1/projects/{env.fraud}/gpu", env.token("bob"))  # same node pool, same sample
    assert metrics_calls(env.runai) == 1
    env.runai.set_node_pool_gpus("default", total=8, allocated=8)
    env.clock.now += 5.1
    status, _, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice"))
    assert status == 200 and metrics_calls(env.runai) == 2 and body["available_preemptible"] == 0


async def test_metrics_failure_is_a_warning_and_is_not_retried_per_request(env: Env) -> None:
    srv = await env.server(metrics_ttl_s=5.0)
    env.runai.fail_next(10, 503, path=METRICS)
    status, _, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice"))
    assert status == 200 and body["status"] == "RUN_AI_UNREACHABLE"
    assert "node pool metrics" in body["warnings"][0]["message"]
    assert body["available_preemptible"] is None and body["available_non_preemptible"] == 3
    calls = metrics_calls(env.runai)
    await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice"))
    assert metrics_calls(env.runai) == calls  # the failure is cached for the TTL too


async def test_run_ai_unreachable(env: Env) -> None:
    srv = await env.server()
    await env.runai.stop_listening()
    await env.directory.refresh()
    assert not env.directory.reachable
    before = remote_calls("runai", "request")
    status, _, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice"))
    after = remote_calls("runai", "request")
    assert after == before  # no metrics call tried against a control plane known to be down
    # The UI keeps its GPU section: last known quota, the warning, no live numbers, no call tried.
    assert status == 200 and body["status"] == "RUN_AI_UNREACHABLE"
    assert body["project"]["quota"] == 4 and body["node_pool_gpus"] is None
    status, _, body = await get(srv, "/api/v1/admin/runai", env.token("root"))
    assert status == 200 and body["status"] == "RUN_AI_UNREACHABLE" and body["reachable"] is False

    never = StandinDirectory(env.directory.client)  # never refreshed: nothing true to show admins
    srv2 = await env.server(never)
    status, _, body = await get(srv2, "/api/v1/admin/runai", env.token("root"))
    assert (status, body["code"]) == (503, "RUN_AI_UNREACHABLE")
    status, _, body = await get(srv2, f"/api/v1/projects/{env.churn}/gpu", env.token("alice"))
    assert status == 200 and body["status"] == "RUN_AI_UNREACHABLE" and body["project"] is None
    await env.runai.resume()


async def test_run_ai_off_makes_no_run_ai_call_and_reports_bindings_left(env: Env) -> None:
    env.state.apply(
        {
            "kind": "ConfigMap",
            "metadata": {"name": "hopsworks-cluster-settings", "namespace": "hopsworks"},
            "data": {"run_ai_enable": "false"},
        }
    )
    srv = await env.server()
    env.runai.requests.clear()
    status, _, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice"))
    assert status == 200 and body["status"] == "RUN_AI_BINDING_LEFT" and body["runai_enabled"] is False
    status, _, body = await get(srv, "/api/v1/admin/runai", env.token("root"))
    assert status == 200 and body["status"] == "RUN_AI_DISABLED"
    assert env.runai.requests == []


async def test_directory_adapter_reads_a_directory_that_keeps_its_last_refresh_in_view(env: Env) -> None:
    client = env.directory.client
    cluster = await client.get_cluster()
    timed = SimpleNamespace(
        view=SimpleNamespace(
            departments=await client.list_departments(cluster_id=cluster.uuid),
            projects=await client.list_projects(cluster_id=cluster.uuid),
            default_node_pool=await client.default_node_pool(cluster.uuid),
        ),
        reachable=True,
        cluster_id=cluster.uuid,
    )
    srv = await env.server(DirectoryAdapter(timed, lambda: client))
    status, _, body = await get(srv, f"/api/v1/projects/{env.churn}/gpu", env.token("alice"))
    assert status == 200 and body["status"] == "OK"
    assert (body["node_pool"], body["available_non_preemptible"], body["available_preemptible"]) == ("default", 3, 5)
    timed.view, timed.reachable = None, None  # Run:ai off or never refreshed
    assert (await get(srv, "/api/v1/admin/runai", env.token("root")))[0] == 503


# ---- the Python client -----------------------------------------------------------------------------


async def test_python_client_end_to_end(env: Env) -> None:
    srv = await env.server()
    # The serving certificate names 127.0.0.1 too; the client verifies it against the test CA.
    base = f"https://127.0.0.1:{srv.port}"
    ca = srv.certs.ca_file
    async with GpuClient(base, env.token("alice"), ca) as api:
        gpus = await api.get_gpu_availability(env.churn)
        assert isinstance(gpus, GpuAvailability)
        assert gpus.project is not None and gpus.project.name == env.churn
        assert gpus.department is not None and gpus.department.name == "default"
        assert (gpus.available_non_preemptible, gpus.available_preemptible, gpus.warnings) == (3, 5, [])
        with pytest.raises(Forbidden) as refused:
            await api.get_gpu_availability(env.fraud)
        assert refused.value.status == 403 and f"can-i get pods --namespace={env.fraud}" in refused.value.reason
        with pytest.raises(Forbidden):
            await api.get_runai_admin_view()
    async with GpuClient(base, env.token("root"), ca) as api:
        admin = await api.get_runai_admin_view()
        assert isinstance(admin, RunaiAdminView) and {p.namespace for p in admin.projects} == {env.churn, env.fraud}
        with pytest.raises(NotFound):
            await api.get_gpu_availability("kube-public")
    async with GpuClient(base, "stolen-token", ca) as api:
        with pytest.raises(Unauthorized):
            await api.get_gpu_availability(env.churn)
    async with GpuClient(base, env.token("alice")) as api:  # system trust only: the test CA is not trusted
        with pytest.raises(GpuApiError, match="CERTIFICATE_VERIFY_FAILED") as untrusted:
            await api.get_gpu_availability(env.churn)
        assert not isinstance(untrusted.value, Unavailable)  # a setup error, not "try again later"
    srv2 = await env.server(StandinDirectory(env.directory.client))
    async with GpuClient(f"https://127.0.0.1:{srv2.port}", env.token("root"), srv2.certs.ca_file) as api:
        with pytest.raises(Unavailable) as down:
            await api.get_runai_admin_view()
        assert (down.value.status, down.value.code) == (503, "RUN_AI_UNREACHABLE")

    # The synchronous helper, from plain code and from inside a running event loop (as in Jupyter).
    plain = await asyncio.to_thread(get_gpu_availability, env.churn, base, env.token("alice"), ca)
    assert plain.available_non_preemptible == 3

    def notebook_cell() -> GpuAvailability:
        async def cell() -> GpuAvailability:
            return get_gpu_availability(env.churn, base, env.token("alice"), ca)

        return asyncio.run(cell())

    assert (await asyncio.to_thread(notebook_cell)).project == plain.project


def test_routes_are_plain_route_defs() -> None:
    class Deny:
        async def authorize_project(self, token: str | None, namespace: str, *, client: str = "") -> Any:
            raise AssertionError

        async def authorize_admin(self, token: str | None, *, client: str = "") -> Any:
            raise AssertionError

    routes = gpu_api_routes(ClusterState(), None, Deny())
    assert all(isinstance(r, web.RouteDef) for r in routes)
    assert {(r.method, r.path) for r in routes} == {
        ("GET", "/api/v1/projects/{namespace}/gpu"),
        ("GET", "/api/v1/admin/runai"),
    }
