"""The Kubernetes API emulator's semantics, through the real kubernetes_asyncio client over HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from tests.support.kube_emulator import KubeEmulator, eventually
from tests.support.kube_emulator_store import strategic_merge_patch

KUEUE = ("kueue.x-k8s.io", "v1beta2")


def status_of(exc: ApiException) -> dict[str, Any]:
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["code"] == exc.status
    return body


async def make_namespace(api: ApiClient, name: str, labels: dict[str, str] | None = None) -> Any:
    return await client.CoreV1Api(api).create_namespace({"metadata": {"name": name, "labels": labels or {}}})


async def read_events(kube: KubeEmulator, path: str, **query: str) -> list[dict[str, Any]]:
    """A raw watch over HTTP until the server ends it (the tests pass timeoutSeconds)."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(kube.url + path, params={"watch": "true", **query}) as response,
    ):
        assert response.status == 200
        return [json.loads(line) async for line in response.content if line.strip()]


async def test_create_get_and_not_found(kube: KubeEmulator, api: ApiClient) -> None:
    core = client.CoreV1Api(api)
    ns = await make_namespace(api, "team-a")
    assert ns.status.phase == "Active" and ns.metadata.uid and ns.metadata.creation_timestamp
    pod = await core.create_namespaced_pod(
        "team-a", {"metadata": {"generateName": "nb-"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    )
    assert pod.metadata.name.startswith("nb-") and len(pod.metadata.name) == len("nb-") + 5
    assert int(pod.metadata.resource_version) > int(ns.metadata.resource_version)
    assert (await core.read_namespaced_pod(pod.metadata.name, "team-a")).metadata.uid == pod.metadata.uid

    with pytest.raises(ApiException) as err:
        await core.read_namespaced_pod("missing", "team-a")
    assert err.value.status == 404 and status_of(err.value)["reason"] == "NotFound"
    # Content of a namespace that does not exist is refused, as by the NamespaceLifecycle plugin.
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_config_map("nowhere", {"metadata": {"name": "x"}})
    assert err.value.status == 404
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_config_map("team-a", {"metadata": {"name": "Bad_Name"}})
    assert err.value.status == 422


async def test_create_existing_is_409_already_exists(api: ApiClient) -> None:
    await make_namespace(api, "dup")
    with pytest.raises(ApiException) as err:
        await make_namespace(api, "dup")
    assert err.value.status == 409 and status_of(err.value)["reason"] == "AlreadyExists"


async def test_list_with_label_and_field_selectors(kube: KubeEmulator, api: ApiClient) -> None:
    core = client.CoreV1Api(api)
    await make_namespace(api, "a")
    await make_namespace(api, "b")
    specs = {
        ("a", "p1"): {"app": "nb", "tier": "gpu"},
        ("a", "p2"): {"app": "job"},
        ("b", "p3"): {"app": "nb", "tier": "cpu"},
        ("b", "p4"): {},
    }
    for (ns, name), labels in specs.items():
        await core.create_namespaced_pod(ns, {"metadata": {"name": name, "labels": labels}, "spec": {"containers": []}})

    async def names(**kwargs: str) -> list[str]:
        result = await core.list_pod_for_all_namespaces(**kwargs)
        assert result.metadata.resource_version == str(kube.resource_version)
        return sorted(p.metadata.name for p in result.items)

    assert await names(label_selector="app=nb") == ["p1", "p3"]
    assert await names(label_selector="app==nb,tier!=cpu") == ["p1"]
    assert await names(label_selector="app!=nb") == ["p2", "p4"]  # != also matches pods without the key
    assert await names(label_selector="app in (nb, job)") == ["p1", "p2", "p3"]
    assert await names(label_selector="tier notin (gpu)") == ["p2", "p3", "p4"]
    assert await names(label_selector="tier") == ["p1", "p3"]
    assert await names(label_selector="!app") == ["p4"]
    assert await names(field_selector="metadata.name=p2") == ["p2"]
    assert await names(field_selector="metadata.namespace=b,metadata.name!=p3") == ["p4"]
    in_a = await core.list_namespaced_pod("a", label_selector="app=nb")
    assert [p.metadata.name for p in in_a.items] == ["p1"]
    with pytest.raises(ApiException) as err:
        await core.list_pod_for_all_namespaces(label_selector="app in nb")
    assert err.value.status == 400

    # Items of a built-in list come without kind/apiVersion, as from a real apiserver.
    async with aiohttp.ClientSession() as session, session.get(kube.url + "/api/v1/pods") as response:
        body = await response.json()
    assert body["kind"] == "PodList" and "kind" not in body["items"][0]


async def test_paginated_list_is_a_consistent_snapshot(kube: KubeEmulator, api: ApiClient) -> None:
    core = client.CoreV1Api(api)
    await make_namespace(api, "pg")
    for i in range(5):
        await core.create_namespaced_config_map("pg", {"metadata": {"name": f"cm{i}"}})
    first = await core.list_namespaced_config_map("pg", limit=2)
    assert [c.metadata.name for c in first.items] == ["cm0", "cm1"] and first.metadata._continue
    await core.create_namespaced_config_map("pg", {"metadata": {"name": "cm9"}})  # after the snapshot
    seen = [c.metadata.name for c in first.items]
    token = first.metadata._continue
    while token:
        page = await core.list_namespaced_config_map("pg", limit=2, _continue=token)
        assert page.metadata.resource_version == first.metadata.resource_version
        seen += [c.metadata.name for c in page.items]
        token = page.metadata._continue
    assert seen == [f"cm{i}" for i in range(5)]


async def test_stale_update_is_409_conflict(kube: KubeEmulator, api: ApiClient) -> None:
    core = client.CoreV1Api(api)
    await make_namespace(api, "cc")
    created = await core.create_namespaced_config_map("cc", {"metadata": {"name": "cfg"}, "data": {"k": "1"}})
    stale = {"name": "cfg", "resourceVersion": created.metadata.resource_version}
    body = {"metadata": {"name": "cfg", "resourceVersion": created.metadata.resource_version}, "data": {"k": "2"}}
    updated = await core.replace_namespaced_config_map("cfg", "cc", body)
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
    assert updated.metadata.uid == created.metadata.uid
    with pytest.raises(ApiException) as err:
        await core.replace_namespaced_config_map("cfg", "cc", {"metadata": stale, "data": {"k": "3"}})
    assert err.value.status == 409 and status_of(err.value)["reason"] == "Conflict"
    assert (await core.read_namespaced_config_map("cfg", "cc")).data == {"k": "2"}
    # A write that changes nothing keeps the resourceVersion.
    same = await core.replace_namespaced_config_map(
        "cfg",
        "cc",
        {"metadata": {"name": "cfg", "resourceVersion": updated.metadata.resource_version}, "data": {"k": "2"}},
    )
    assert same.metadata.resource_version == updated.metadata.resource_version


async def test_merge_strategic_and_json_patch(kube: KubeEmulator, api: ApiClient) -> None:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    await make_namespace(api, "pp", {"keep": "1", "drop": "1"})
    # kubernetes_asyncio sends a dict body as strategic-merge-patch (applied as a merge patch here).
    ns = await core.patch_namespace("pp", {"metadata": {"labels": {"drop": None, "new": "x"}}})
    assert ns.metadata.labels == {"keep": "1", "new": "x", "kubernetes.io/metadata.name": "pp"}
    ops = [{"op": "add", "path": "/metadata/annotations", "value": {}},
           {"op": "add", "path": "/metadata/annotations/scheduling.hopsworks.ai~1defaults", "value": "{}"}]  # fmt: skip
    ns = await core.patch_namespace("pp", ops)
    assert ns.metadata.annotations == {"scheduling.hopsworks.ai/defaults": "{}"}
    with pytest.raises(ApiException) as err:
        await core.patch_namespace("pp", [{"op": "test", "path": "/metadata/labels/keep", "value": "2"}])
    assert err.value.status == 422
    # A patch that carries a resourceVersion is checked like an update.
    with pytest.raises(ApiException) as err:
        await core.patch_namespace("pp", {"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}})
    assert err.value.status == 409

    lq = {"apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": "q"}, "spec": {"clusterQueue": "a"}}
    await custom.create_namespaced_custom_object(*KUEUE, "pp", "localqueues", lq)
    change = {"spec": {"clusterQueue": "b"}}
    # kubernetes_asyncio sends a dict to CustomObjectsApi as a JSON patch unless told otherwise;
    # a real apiserver refuses that too.
    with pytest.raises(ApiException) as err:
        await custom.patch_namespaced_custom_object(*KUEUE, "pp", "localqueues", "q", change)
    assert err.value.status == 400
    patched = await custom.patch_namespaced_custom_object(
        *KUEUE, "pp", "localqueues", "q", change, _content_type="application/merge-patch+json"
    )
    assert kube.calls("PATCH")[-1].body == {"spec": {"clusterQueue": "b"}}
    assert patched["spec"] == {"clusterQueue": "b"} and patched["metadata"]["generation"] == 2


async def test_finalizers_keep_the_object_until_removed(kube: KubeEmulator, api: ApiClient) -> None:
    core = client.CoreV1Api(api)
    await make_namespace(api, "ff")
    await core.create_namespaced_config_map("ff", {"metadata": {"name": "held", "finalizers": ["example.com/hold"]}})
    await core.delete_namespaced_config_map("held", "ff")
    held = await core.read_namespaced_config_map("held", "ff")
    assert held.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as err:  # no new finalizers on an object being deleted
        await core.patch_namespaced_config_map("held", "ff", {"metadata": {"finalizers": ["a", "b"]}})
    assert err.value.status == 422
    await core.patch_namespaced_config_map("held", "ff", {"metadata": {"finalizers": None}})
    assert kube.get_object("ConfigMap", "held", "ff") is None
    with pytest.raises(ApiException) as err:
        await core.delete_namespaced_config_map("held", "ff")
    assert err.value.status == 404


async def test_deleting_a_namespace_terminates_it_and_its_content(kube: KubeEmulator, api: ApiClient) -> None:
    core = client.CoreV1Api(api)
    await make_namespace(api, "proj")
    await core.create_namespaced_config_map("proj", {"metadata": {"name": "plain"}})
    pod = {"metadata": {"name": "p", "finalizers": ["example.com/hold"]}, "spec": {"containers": []}}
    await core.create_namespaced_pod("proj", pod)
    await core.delete_namespace("proj")  # answers the Namespace (the client reads it as a V1Status)
    ns = await core.read_namespace("proj")
    assert ns.status.phase == "Terminating" and ns.metadata.deletion_timestamp is not None
    assert kube.get_object("ConfigMap", "plain", "proj") is None
    assert kube.get_object("Pod", "p", "proj")["metadata"]["deletionTimestamp"]
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_config_map("proj", {"metadata": {"name": "late"}})
    assert err.value.status == 403
    await core.patch_namespaced_pod("p", "proj", {"metadata": {"finalizers": None}})
    assert kube.get_object("Pod", "p", "proj") is None
    assert kube.get_object("Namespace", "proj") is None


async def test_watch_replays_history_after_a_resource_version(kube: KubeEmulator, api: ApiClient) -> None:
    core = client.CoreV1Api(api)
    await make_namespace(api, "w")
    start = kube.resource_version
    await core.create_namespaced_config_map("w", {"metadata": {"name": "one"}})
    await core.patch_namespaced_config_map("one", "w", {"data": {"a": "b"}})
    await core.create_namespaced_pod("w", {"metadata": {"name": "other-kind"}, "spec": {"containers": []}})
    await core.delete_namespaced_config_map("one", "w")
    events = await read_events(
        kube,
        "/api/v1/namespaces/w/configmaps",
        resourceVersion=str(start),
        timeoutSeconds="1",
        allowWatchBookmarks="true",
    )
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[-1] == kube.resource_version
    assert events[1]["object"]["data"] == {"a": "b"} and events[0]["object"]["kind"] == "ConfigMap"
    # Without a resourceVersion a watch starts with the current state as ADDED events.
    await core.create_namespaced_config_map("w", {"metadata": {"name": "two"}})
    events = await read_events(kube, "/api/v1/namespaces/w/configmaps", timeoutSeconds="1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "two")]


async def test_selective_watch_sees_objects_leave_and_enter(kube: KubeEmulator, api: ApiClient) -> None:
    await make_namespace(api, "sel", {"team": "x"})
    start = kube.resource_version
    core = client.CoreV1Api(api)
    await core.patch_namespace("sel", {"metadata": {"labels": {"team": "y"}}})
    await core.patch_namespace("sel", {"metadata": {"labels": {"team": "x"}}})
    events = await read_events(
        kube, "/api/v1/namespaces", resourceVersion=str(start - 1), labelSelector="team=x", timeoutSeconds="1"
    )
    assert [e["type"] for e in events] == ["ADDED", "DELETED", "ADDED"]


async def test_live_watch_and_drop(kube: KubeEmulator, api: ApiClient) -> None:
    core = client.CoreV1Api(api)
    response = await core.list_namespace(
        watch=True, resource_version=str(kube.resource_version), _preload_content=False
    )
    try:
        await eventually(lambda: kube.open_watches == 1)
        await make_namespace(api, "live")
        event = json.loads(await asyncio.wait_for(response.content.readline(), 5))
        assert event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "live"
        assert kube.drop_watches() == 1
        with pytest.raises(aiohttp.ClientPayloadError):  # an abrupt end, not a clean one
            await asyncio.wait_for(response.content.read(), 5)
    finally:
        response.close()
    await eventually(lambda: kube.open_watches == 0)


async def test_gone_after_compact(kube: KubeEmulator, api: ApiClient) -> None:
    core = client.CoreV1Api(api)
    await make_namespace(api, "g1")
    old = kube.resource_version
    await make_namespace(api, "g2")
    # Before compaction an exact list at an old version shows the past.
    past = await core.list_namespace(resource_version=str(old), resource_version_match="Exact")
    assert [n.metadata.name for n in past.items] == ["default", "g1"]
    kube.compact()
    events = await read_events(kube, "/api/v1/namespaces", resourceVersion=str(old), timeoutSeconds="5")
    assert len(events) == 1 and events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410 and events[0]["object"]["reason"] == "Expired"
    with pytest.raises(ApiException) as err:
        await core.list_namespace(resource_version=str(old), resource_version_match="Exact")
    assert err.value.status == 410
    kube.gone_in_stream = False  # the apiserver without a watch cache answers with HTTP 410
    with pytest.raises(ApiException) as err:
        await core.list_namespace(watch=True, resource_version=str(old))
    assert err.value.status == 410
    # The current version is still watchable after compaction.
    events = await read_events(
        kube, "/api/v1/namespaces", resourceVersion=str(kube.resource_version), timeoutSeconds="1"
    )
    assert events == []


async def test_bounded_history_expires_old_versions() -> None:
    async with KubeEmulator(history_limit=3) as kube:
        kube.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "h"}})
        old = kube.resource_version
        for i in range(4):
            kube.put_object(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "h", "labels": {"i": str(i)}}}
            )
        events = await read_events(kube, "/api/v1/namespaces", resourceVersion=str(old), timeoutSeconds="1")
        assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410


async def test_lease_create_and_update_race() -> None:
    async with KubeEmulator() as kube, kube.api_client() as api_a, kube.api_client() as api_b:
        await make_namespace(api_a, "hopsworks")
        a, b = client.CoordinationV1Api(api_a), client.CoordinationV1Api(api_b)

        def lease(holder: str) -> dict[str, Any]:
            return {"metadata": {"name": "leader"}, "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}}

        results = await asyncio.gather(
            a.create_namespaced_lease("hopsworks", lease("a")),
            b.create_namespaced_lease("hopsworks", lease("b")),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, ApiException)]
        assert len(errors) == 1 and errors[0].status == 409
        current = await a.read_namespaced_lease("leader", "hopsworks")
        rv = current.metadata.resource_version

        async def take(api: client.CoordinationV1Api, holder: str) -> Any:
            body = {**lease(holder), "metadata": {"name": "leader", "resourceVersion": rv}}
            return await api.replace_namespaced_lease("leader", "hopsworks", body)

        results = await asyncio.gather(take(a, "a2"), take(b, "b2"), return_exceptions=True)
        won = [r for r in results if not isinstance(r, BaseException)]
        lost = [r for r in results if isinstance(r, ApiException)]
        assert len(won) == 1 and len(lost) == 1 and lost[0].status == 409
        stored = kube.get_object("Lease", "leader", "hopsworks")
        assert stored["spec"]["holderIdentity"] == won[0].spec.holder_identity


async def test_fault_injection_latency_and_request_log(kube: KubeEmulator, api: ApiClient) -> None:
    core = client.CoreV1Api(api)
    kube.fail_next(2, status=503, path_prefix="/api/v1/namespaces")
    await core.list_pod_for_all_namespaces()  # another path is not affected
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            await core.list_namespace()
        assert err.value.status == 503
    await core.list_namespace()
    assert len(kube.calls("GET", "/api/v1/namespaces")) == 3
    kube.latency = 0.2
    started = time.monotonic()
    await core.list_namespace()
    assert time.monotonic() - started >= 0.2
    kube.latency = 0.0
    await make_namespace(api, "logged")
    assert kube.calls("POST")[-1].body == {"metadata": {"name": "logged", "labels": {}}}


async def test_bearer_token_token_review_and_access_review() -> None:
    async with KubeEmulator(token="admin-token") as kube:
        kube.add_user("alice-token", "alice", groups=["team-a"])
        kube.allow("alice", "get", "pods", namespace="team-a")
        kube.allow("group:admins", "*", "*")
        async with kube.api_client(token="wrong") as api:
            with pytest.raises(ApiException) as err:
                await client.CoreV1Api(api).list_namespace()
            assert err.value.status == 401
        async with kube.api_client() as api:
            authn = client.AuthenticationV1Api(api)
            review = await authn.create_token_review({"spec": {"token": "alice-token"}})
            assert review.status.authenticated and review.status.user.username == "alice"
            assert review.status.user.groups == ["team-a"]
            review = await authn.create_token_review({"spec": {"token": "nope"}})
            assert not review.status.authenticated

            authz = client.AuthorizationV1Api(api)

            async def allowed(user: str, verb: str, namespace: str, groups: list[str] | None = None) -> bool:
                spec = {"user": user, "groups": groups or [],
                        "resourceAttributes": {"verb": verb, "resource": "pods", "namespace": namespace}}  # fmt: skip
                return (await authz.create_subject_access_review({"spec": spec})).status.allowed

            assert await allowed("alice", "get", "team-a")
            assert not await allowed("alice", "get", "team-b")
            assert not await allowed("alice", "delete", "team-a")
            assert await allowed("bob", "delete", "team-b", groups=["admins"])


async def test_discovery(kube: KubeEmulator, api: ApiClient) -> None:
    assert (await client.CoreApi(api).get_api_versions()).versions == ["v1"]
    groups = {g.name for g in (await client.ApisApi(api).get_api_versions()).groups}
    assert {"apps", "coordination.k8s.io", "scheduling.k8s.io", "kueue.x-k8s.io"} <= groups
    resources = {r.name for r in (await client.CoreV1Api(api).get_api_resources()).resources}
    assert {"namespaces", "pods", "pods/status", "configmaps", "secrets", "events"} <= resources
    leases = await client.CoordinationV1Api(api).get_api_resources()
    assert [r.name for r in leases.resources] == ["leases"]


async def test_python_access_goes_through_the_same_path(kube: KubeEmulator, api: ApiClient) -> None:
    start = kube.resource_version
    kube.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "py"}})
    kube.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "py", "labels": {"a": "b"}}})
    kube.put_object({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "py"},
                     "status": {"phase": "Running"}})  # fmt: skip
    assert kube.get_object("Pod", "p", "py")["status"]["phase"] == "Running"
    assert kube.get_object("Namespace", "py")["metadata"]["labels"] == {"a": "b", "kubernetes.io/metadata.name": "py"}
    events = await read_events(kube, "/api/v1/namespaces", resourceVersion=str(start), timeoutSeconds="1")
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED"]
    kube.delete_object("pods", "p", "py")
    assert kube.objects("Pod") == []


async def test_status_subresource_is_separate(kube: KubeEmulator, api: ApiClient) -> None:
    core = client.CoreV1Api(api)
    await make_namespace(api, "st")
    await core.create_namespaced_pod("st", {"metadata": {"name": "p"}, "spec": {"containers": []}})
    pod = await core.patch_namespaced_pod("p", "st", {"status": {"phase": "Running"}})
    assert pod.status.phase == "Pending"  # the main resource ignores status
    pod = await core.patch_namespaced_pod_status("p", "st", {"status": {"phase": "Running"}})
    assert pod.status.phase == "Running"


@pytest.mark.parametrize(
    ("current", "patch", "expected"),
    [
        # keyed lists merge by key: kubectl apply's patch of one webhook keeps the others
        ({"webhooks": [{"name": "a", "t": 1}, {"name": "b", "t": 1}]},
         {"$setElementOrder/webhooks": [{"name": "a"}, {"name": "b"}], "webhooks": [{"name": "b", "t": 2}]},
         {"webhooks": [{"name": "a", "t": 1}, {"name": "b", "t": 2}]}),
        ({"containers": [{"name": "c", "env": [{"name": "X", "value": "1"}]}]},
         {"containers": [{"name": "c", "env": [{"name": "Y", "value": "2"}]}]},
         {"containers": [{"name": "c", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]}]}),
        ({"containers": [{"name": "a"}, {"name": "b"}]}, {"containers": [{"name": "a", "$patch": "delete"}]},
         {"containers": [{"name": "b"}]}),
        ({"ports": [{"containerPort": 80, "protocol": "TCP"}]}, {"ports": [{"containerPort": 81}]},
         {"ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 81}]}),
        # lists without a merge key are replaced; null deletes; maps merge
        ({"args": ["a", "b"], "m": {"x": 1, "y": 2}}, {"args": ["c"], "m": {"x": None, "z": 3}},
         {"args": ["c"], "m": {"y": 2, "z": 3}}),
        ({"m": {"x": 1, "y": 2}}, {"m": {"$patch": "replace", "z": 3}}, {"m": {"z": 3}}),
        ({"finalizers": ["a", "b"]}, {"$deleteFromPrimitiveList/finalizers": ["a"]}, {"finalizers": ["b"]}),
        ({"finalizers": ["a"]}, {"finalizers": ["b"]}, {"finalizers": ["a", "b"]}),
        ({"s": {"a": 1, "b": 2}}, {"s": {"$retainKeys": ["b", "c"], "c": 3}}, {"s": {"b": 2, "c": 3}}),
    ],
)  # fmt: skip
def test_strategic_merge_patch(current: dict[str, Any], patch: dict[str, Any], expected: dict[str, Any]) -> None:
    assert strategic_merge_patch(current, patch) == expected


async def test_held_watch_events_arrive_in_order_once_released(kube: KubeEmulator, api: ApiClient) -> None:
    kube.hold_watch_events("Namespace")
    events = asyncio.create_task(read_events(kube, "/api/v1/namespaces", resourceVersion="1", timeoutSeconds="2"))
    await make_namespace(api, "held-1")
    await make_namespace(api, "held-2")
    await asyncio.sleep(0.3)
    # The object is there for a read; only the watch lags.
    assert (await client.CoreV1Api(api).read_namespace("held-1")).metadata.name == "held-1"
    assert not events.done()
    kube.release_watch_events("Namespace")
    names = [e["object"]["metadata"]["name"] for e in await events if e["type"] == "ADDED"]
    assert names[-2:] == ["held-1", "held-2"]
