"""The fault proxy does what each fault says, against the real apiserver behind it."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from tests.support.control_plane.cluster import ControlPlane
from tests.support.control_plane.fault_proxy import FaultProxy, events, request_info
from tests.support.kube_scope import KubeScope, SharedCluster, eventually


@pytest.fixture
def cp(shared_control_plane: SharedCluster) -> ControlPlane:
    return shared_control_plane.cp


@pytest.fixture
def proxy(fault_proxy: FaultProxy) -> FaultProxy:
    return fault_proxy


@pytest.fixture
async def ns(kube_scope: KubeScope) -> str:
    """A namespace of the test's, once the controllers have put their ConfigMap in it (so that
    what a watch of it shows is the test's doing)."""
    name = await kube_scope.namespace("fp", project=False)
    await eventually(lambda: kube_scope.get("v1", "ConfigMap", "kube-root-ca.crt", name), within_s=30)
    return name


class Client:
    """Plain HTTPS to the proxy, so that each test sees the wire: status, body, stream."""

    def __init__(self, proxy: FaultProxy, token: str | None) -> None:
        ctx = ssl.create_default_context(cafile=str(proxy.cp.pki.ca_file))
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx))
        self.url = proxy.url
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.session.request(method, self.url + path, json=body, headers=self.headers) as resp:
            return resp.status, await resp.json()

    def watch(self, path: str) -> Any:
        return self.session.get(self.url + path, headers=self.headers)


@pytest.fixture
async def admin(proxy: FaultProxy) -> AsyncIterator[Client]:
    client = Client(proxy, proxy.admin_token)
    yield client
    await client.session.close()


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}


async def test_a_named_5xx_answers_n_times_then_the_apiserver_does(proxy: FaultProxy, admin: Client, ns: str) -> None:
    proxy.fail(503, n=2, verb="list", resource="configmaps", namespace=ns)
    path = f"/api/v1/namespaces/{ns}/configmaps"
    first, second = await admin.call("GET", path), await admin.call("GET", path)
    assert [first[0], second[0]] == [503, 503]
    assert first[1]["kind"] == "Status" and first[1]["reason"] == "ServiceUnavailable"
    # Another verb on the same resource is not matched, and after n the apiserver answers.
    assert (await admin.call("POST", path, configmap("a")))[0] == 201
    status, body = await admin.call("GET", path)
    assert status == 200 and "a" in [i["metadata"]["name"] for i in body["items"]]
    assert [c.verb for c in proxy.calls(resource="configmaps", namespace=ns)] == ["list", "list", "create", "list"]


async def test_latency_holds_a_request_back_before_it_reaches_the_apiserver(
    proxy: FaultProxy, admin: Client, cp: ControlPlane, ns: str
) -> None:
    proxy.delay(2.0, verb="create", resource="configmaps")
    create = asyncio.create_task(admin.call("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap("late")))
    await asyncio.sleep(0.2)
    assert cp.kubectl("get", "configmap", "late", "-n", ns, check=False).returncode != 0
    assert (await create)[0] == 201
    assert cp.get_json("configmap", "late", "-n", ns)["data"] == {"k": "v"}


async def test_a_hung_list_answers_once_released(proxy: FaultProxy, admin: Client, ns: str) -> None:
    hang = proxy.hang(verb="list", resource="configmaps", namespace=ns)
    listing = asyncio.create_task(admin.call("GET", f"/api/v1/namespaces/{ns}/configmaps"))
    for _ in range(100):
        if hang.waiting:
            break
        await asyncio.sleep(0.05)
    assert hang.waiting == 1 and not listing.done()
    # Other requests go on meanwhile.
    assert (await admin.call("GET", f"/api/v1/namespaces/{ns}"))[0] == 200
    hang.release()
    status, body = await listing
    assert status == 200 and body["kind"] == "ConfigMapList"


@pytest.mark.parametrize("in_stream", [True, False], ids=["error-event", "http-410"])
async def test_an_expired_watch_is_told_410_as_the_apiserver_says_it(
    proxy: FaultProxy, admin: Client, ns: str, in_stream: bool
) -> None:
    _, listed = await admin.call("GET", f"/api/v1/namespaces/{ns}/configmaps")
    path = f"/api/v1/namespaces/{ns}/configmaps?watch=true&resourceVersion={listed['metadata']['resourceVersion']}"
    proxy.expire(verb="watch", resource="configmaps", in_stream=in_stream)
    async with admin.watch(path) as resp:
        body = await resp.read()
    if in_stream:
        (event,) = events(body)
        assert resp.status == 200 and event["type"] == "ERROR", body
        status_object = event["object"]
    else:
        assert resp.status == 410
        status_object = json.loads(body)
    assert (status_object["code"], status_object["reason"]) == (410, "Expired")
    # Only the next one: a watch from the same version now streams from the apiserver.
    async with admin.watch(path + "&timeoutSeconds=1") as resp:
        assert resp.status == 200 and events(await resp.read()) == []


async def test_a_real_compaction_expires_a_continue_token(proxy: FaultProxy, admin: Client, ns: str) -> None:
    for name in ("a", "b", "c"):
        await admin.call("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap(name))
    status, page = await admin.call("GET", f"/api/v1/namespaces/{ns}/configmaps?limit=1")
    token = page["metadata"]["continue"]
    await admin.call("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap("d"))
    revision = await proxy.compact(seen_by=(f"/api/v1/namespaces/{ns}/configmaps",))
    assert revision > int(page["metadata"]["resourceVersion"])
    status, body = await admin.call("GET", f"/api/v1/namespaces/{ns}/configmaps?limit=1&continue={token}")
    assert status == 410 and body["reason"] == "Expired", body
    # A list from now on is whole again.
    status, body = await admin.call("GET", f"/api/v1/namespaces/{ns}/configmaps")
    assert status == 200 and {"a", "b", "c", "d"} <= {i["metadata"]["name"] for i in body["items"]}


async def test_a_rewrite_hands_out_what_the_apiserver_would_not_store(
    proxy: FaultProxy, admin: Client, ns: str
) -> None:
    def unreadable(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] == "odd":
            obj["metadata"]["labels"] = "not-a-map"
        return obj

    proxy.rewrite(unreadable, resource="configmaps", namespace=ns)
    status, created = await admin.call("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap("odd"))
    assert status == 201 and created["metadata"]["labels"] == "not-a-map"  # a create's answer too
    _, listed = await admin.call("GET", f"/api/v1/namespaces/{ns}/configmaps")
    odd = next(i for i in listed["items"] if i["metadata"]["name"] == "odd")
    assert odd["metadata"]["labels"] == "not-a-map"
    async with admin.watch(f"/api/v1/namespaces/{ns}/configmaps?watch=true&timeoutSeconds=1") as resp:
        watched = {e["object"]["metadata"]["name"]: e["object"] for e in events(await resp.read())}
    assert watched["odd"]["metadata"]["labels"] == "not-a-map"
    assert watched["kube-root-ca.crt"]["metadata"].get("labels") != "not-a-map"


async def _watch_until_open(proxy: FaultProxy, admin: Client, ns: str) -> Any:
    resp = await admin.watch(f"/api/v1/namespaces/{ns}/configmaps?watch=true").__aenter__()
    for _ in range(100):
        if proxy.open_watches("configmaps"):
            break
        await asyncio.sleep(0.05)
    return resp


async def test_a_cut_watch_breaks_the_stream_mid_watch(proxy: FaultProxy, admin: Client, ns: str) -> None:
    resp = await _watch_until_open(proxy, admin, ns)
    assert json.loads(await resp.content.readline())["object"]["metadata"]["name"] == "kube-root-ca.crt"
    assert proxy.cut_watches("configmaps") == 1
    with pytest.raises(aiohttp.ClientPayloadError):
        await resp.read()
    resp.release()
    assert proxy.open_watches() == 0


async def test_an_ended_watch_ends_cleanly(proxy: FaultProxy, admin: Client, ns: str) -> None:
    resp = await _watch_until_open(proxy, admin, ns)
    # The object's ADDED first: a stream ended before the apiserver sent it would carry nothing.
    first = await asyncio.wait_for(resp.content.readline(), 10)
    assert proxy.end_watches() == 1
    assert [e["type"] for e in events(first + await resp.read())] == ["ADDED"]
    resp.release()


async def test_a_held_watch_lags_while_reads_see_the_object(proxy: FaultProxy, admin: Client, ns: str) -> None:
    resp = await _watch_until_open(proxy, admin, ns)
    await resp.content.readline()  # kube-root-ca.crt
    proxy.hold_watches("configmaps")
    await admin.call("POST", f"/api/v1/namespaces/{ns}/configmaps", configmap("held"))
    assert (await admin.call("GET", f"/api/v1/namespaces/{ns}/configmaps/held"))[0] == 200
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(next_line := asyncio.ensure_future(resp.content.readline())), 1.0)
    proxy.release_watches("configmaps")
    event = json.loads(await next_line)
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "held")
    resp.close()


async def test_the_callers_credentials_reach_the_apiserver(proxy: FaultProxy, kube_scope: KubeScope, ns: str) -> None:
    user, token = await kube_scope.user_token("nobody")
    anonymous, nobody = Client(proxy, None), Client(proxy, token)
    try:
        status, body = await nobody.call("GET", f"/api/v1/namespaces/{ns}/configmaps")
        assert status == 403 and user in body["message"]
        await kube_scope.allow(user, "list", "configmaps", ns)
        status, body = await nobody.call("GET", f"/api/v1/namespaces/{ns}/configmaps")
        assert status == 200, body
        status, body = await anonymous.call("GET", f"/api/v1/namespaces/{ns}/configmaps")
        assert status in (401, 403) and "system:masters" not in json.dumps(body)
        if status == 403:
            assert "system:anonymous" in body["message"]
    finally:
        await anonymous.session.close()
        await nobody.session.close()


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/pods", {}, ("list", "", "pods", "", "")),
        ("GET", "/api/v1/pods", {"watch": "true"}, ("watch", "", "pods", "", "")),
        ("GET", "/api/v1/pods", {"watch": "True"}, ("watch", "", "pods", "", "")),
        ("GET", "/api/v1/pods", {"watch": "false"}, ("list", "", "pods", "", "")),
        ("GET", "/api/v1/namespaces/a/pods/p", {}, ("get", "", "pods", "a", "p")),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/a/leases/l", {},
         ("update", "coordination.k8s.io", "leases", "a", "l")),
        ("GET", "/api/v1/namespaces/a", {}, ("get", "", "namespaces", "a", "a")),
        ("GET", "/api/v1/namespaces/a/configmaps", {"fieldSelector": "metadata.name=s"},
         ("list", "", "configmaps", "a", "s")),
        ("PUT", "/api/v1/namespaces/a/status", {}, ("update", "", "namespaces", "a", "a")),
        ("DELETE", "/api/v1/namespaces/a/configmaps", {}, ("deletecollection", "", "configmaps", "a", "")),
        ("PATCH", "/apis/apps/v1/namespaces/a/deployments/d/scale", {}, ("patch", "apps", "deployments", "a", "d")),
    ],
)  # fmt: skip
def test_requests_are_read_as_the_apiserver_reads_them(
    method: str, path: str, query: dict[str, str], expected: tuple[str, ...]
) -> None:
    call = request_info(method, path, query)
    assert (call.verb, call.group, call.resource, call.namespace, call.name) == expected


async def test_a_kubeconfig_through_the_proxy_is_the_same_user(
    proxy: FaultProxy, kube_scope: KubeScope, tmp_path: Path
) -> None:
    """The webhook's ServiceAccount through the proxy: the chart's RBAC lets it list namespaces."""
    loaded = Configuration()
    await config.load_kube_config(str(proxy.via(kube_scope.kubeconfig)), client_configuration=loaded)
    async with ApiClient(loaded) as api:
        names = [n.metadata.name for n in (await CoreV1Api(api).list_namespace()).items]
        assert kube_scope.install_ns in names
        with pytest.raises(ApiException) as denied:
            await CoreV1Api(api).list_namespaced_secret("kube-system")
    assert denied.value.status == 403
    assert [c.verb for c in proxy.calls(resource="namespaces")] == ["list"]
