"""The admission endpoints over real HTTPS, as the apiserver calls them (CA + service name, keep-alive)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import pytest
from aiohttp import web

from tests.support.apps import cache_app
from tests.support.cluster import cluster_state, namespace, settings_configmap
from tests.support.https import StartHttpsServer
from tests.support.reviews import apply_patch, assert_valid_pod, fixture_names, pod_review, review
from webhook.core.decision import Decision
from webhook.http.app import MAX_BODY_BYTES

NAMESPACES = [namespace("churn"), namespace("default"), namespace("customer-1"), namespace("keymaker")]


def make_app(**kwargs: Any) -> web.Application:
    state = cluster_state(namespaces=NAMESPACES)
    for kind in ("Namespace", "PriorityClass", "ConfigMap", "LocalQueue", "Pod"):
        state.synced[kind] = True
    return cache_app(state, **kwargs)


async def post(srv: Any, path: str, body: Any, content_type: str = "application/json") -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with srv.session.post(srv.url(path), data=data, headers={"Content-Type": content_type}) as resp:
        return resp.status, await resp.json()


def patch_of(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    response = answer["response"]
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


@pytest.mark.parametrize("name", fixture_names())
async def test_every_real_fixture_gets_a_sensible_answer(https_server: StartHttpsServer, name: str) -> None:
    srv = await https_server(make_app())
    data = review(name)
    for path in ("/mutate/pods", "/validate/pods", "/validate/settings"):
        status, answer = await post(srv, path, data)
        if name.startswith("allfields"):
            # A round-trip fixture with placeholder enums: refused with the reason, not a 500.
            assert status == 400 and "operation" in answer["error"]
            continue
        assert status == 200, answer
        response = answer["response"]
        assert response["uid"] == data["request"]["uid"]
        assert answer["apiVersion"] == data.get("apiVersion", "admission.k8s.io/v1")
        assert answer["kind"] == "AdmissionReview"
        assert response["allowed"] is True, response
        if (
            data["request"]["operation"] == "CREATE"
            and data["request"]["kind"]["kind"] == "Pod"
            and path == "/mutate/pods"
        ):
            patched = apply_patch(data["request"]["object"], patch_of(answer))
            assert_valid_pod(patched)
        else:
            assert "patch" not in response


async def test_pod_in_a_project_comes_back_patched_over_keep_alive(https_server: StartHttpsServer) -> None:
    srv = await https_server(make_app())
    for i in range(20):
        data = pod_review("churn", uid=f"uid-{i}", annotations={"scheduling.hopsworks.ai/affinity": "disk=ssd"})
        status, answer = await post(srv, "/mutate/pods", data)
        assert status == 200
        assert answer["response"]["uid"] == f"uid-{i}"
        patched = apply_patch(data["request"]["object"], patch_of(answer))
        assert patched["spec"]["priorityClassName"] == "normal"
        assert_valid_pod(patched)
        assert answer["response"]["auditAnnotations"]["affinity"] == "disk=ssd"
    assert srv.connections_accepted == 1


async def test_refusal_carries_status_and_no_patch(https_server: StartHttpsServer) -> None:
    srv = await https_server(make_app())
    status, answer = await post(srv, "/mutate/pods", pod_review("churn", spec={"priorityClassName": "urgent"}))
    assert status == 200
    response = answer["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "allowed: batch, normal" in response["status"]["message"]
    assert "patch" not in response and "patchType" not in response


async def test_v1beta1_is_answered_in_v1beta1(https_server: StartHttpsServer) -> None:
    srv = await https_server(make_app())
    data = pod_review("churn")
    data["apiVersion"] = "admission.k8s.io/v1beta1"
    status, answer = await post(srv, "/mutate/pods", data)
    assert status == 200 and answer["apiVersion"] == "admission.k8s.io/v1beta1"


BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("not json", b"{nope", "not JSON"),
    ("empty", b"", "not JSON"),
    ("an array", b"[]", "JSON object"),
    ("no request", json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), "no request"),
    ("null request", json.dumps({"kind": "AdmissionReview", "request": None}).encode(), "no request"),
    ("wrong kind", json.dumps({"kind": "Pod", "request": {}}).encode(), "kind must be AdmissionReview"),
    ("wrong version", json.dumps({"apiVersion": "admission.k8s.io/v2", "request": {}}).encode(), "not supported"),
    ("no uid", json.dumps({"request": {"kind": {"kind": "Pod"}, "operation": "CREATE"}}).encode(), "request.uid"),
    (
        "object not an object",
        json.dumps({"request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": "pod"}}).encode(),
        "request.object",
    ),
    ("invalid utf-8", b'{"request": "\xff"}', "not JSON"),
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000, "nested"),
]


@pytest.mark.parametrize(("body", "reason"), [(b, r) for _, b, r in BAD_BODIES], ids=[i for i, _, _ in BAD_BODIES])
async def test_malformed_reviews_get_400_with_a_reason_and_the_server_keeps_serving(
    https_server: StartHttpsServer, body: bytes, reason: str
) -> None:
    srv = await https_server(make_app())
    status, answer = await post(srv, "/mutate/pods", body)
    assert status == 400
    assert reason in answer["error"]
    status, _ = await post(srv, "/mutate/pods", pod_review("churn"))
    assert status == 200


async def test_wrong_content_type_is_415(https_server: StartHttpsServer) -> None:
    srv = await https_server(make_app())
    status, answer = await post(srv, "/mutate/pods", pod_review("churn"), content_type="text/plain")
    assert status == 415 and "application/json" in answer["error"]


async def test_body_over_the_limit_is_413(https_server: StartHttpsServer) -> None:
    srv = await https_server(make_app(max_body_bytes=64 * 1024))
    data = pod_review("churn", annotations={"big": "x" * 100_000})
    status, answer = await post(srv, "/mutate/pods", data)
    assert status == 413 and "larger than" in answer["error"]
    status, _ = await post(srv, "/mutate/pods", pod_review("churn"))
    assert status == 200


async def test_the_default_body_limit_is_what_serve_enforces(https_server: StartHttpsServer) -> None:
    srv = await https_server(make_app())  # no max_body_bytes: the limit `serve` runs with
    data = pod_review("churn", annotations={"big": "x" * MAX_BODY_BYTES})
    status, answer = await post(srv, "/mutate/pods", data)
    assert status == 413 and "larger than" in answer["error"]


async def test_a_failing_decision_is_a_refusal_not_a_traceback(https_server: StartHttpsServer) -> None:
    async def broken(_: Mapping[str, Any]) -> Decision:
        raise RuntimeError("bug")

    srv = await https_server(make_app(handlers={"/mutate/pods": broken}))
    status, answer = await post(srv, "/mutate/pods", pod_review("churn"))
    assert status == 200
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 500
    assert "Traceback" not in json.dumps(answer)


async def test_unknown_path_and_method_are_json_errors(https_server: StartHttpsServer) -> None:
    srv = await https_server(make_app())
    async with srv.session.get(srv.url("/mutate/pods")) as resp:
        assert resp.status == 405
        assert "error" in await resp.json()
    async with srv.session.post(srv.url("/mutate/nothing"), json={}) as resp:
        assert resp.status == 404


async def test_readyz_waits_for_the_caches_and_healthz_does_not(https_server: StartHttpsServer) -> None:
    state = cluster_state(namespaces=NAMESPACES)
    state.synced.update({"Namespace": True, "Pod": False})
    srv = await https_server(cache_app(state))
    async with srv.session.get(srv.url("/readyz")) as resp:
        assert resp.status == 503
        assert "Pod" in json.dumps(await resp.json())
    async with srv.session.get(srv.url("/healthz")) as resp:
        assert resp.status == 200
    state.synced["Pod"] = True
    async with srv.session.get(srv.url("/readyz")) as resp:
        assert resp.status == 200


async def test_metrics_count_answers(https_server: StartHttpsServer) -> None:
    srv = await https_server(make_app())
    await post(srv, "/mutate/pods", pod_review("churn"))
    async with srv.session.get(srv.url("/metrics")) as resp:
        text = await resp.text()
    assert 'webhook_admission_requests_total{endpoint="mutate_pods",outcome="patched"}' in text
    assert "webhook_admission_duration_seconds_bucket" in text


async def test_settings_change_applies_to_the_next_request_without_restart(https_server: StartHttpsServer) -> None:
    state = cluster_state(namespaces=[*NAMESPACES, namespace("bound", labels={"runai/queue": "bound"})])
    srv = await https_server(cache_app(state))
    _, before = await post(srv, "/mutate/pods", pod_review("bound"))
    assert "runai/queue" not in json.dumps(patch_of(before))
    state.apply(settings_configmap(run_ai_enable=True))
    _, after = await post(srv, "/mutate/pods", pod_review("bound"))
    assert {"op": "add", "path": "/metadata/labels/runai~1queue", "value": "bound"} in patch_of(after)


async def test_settings_webhook_refuses_kueue_and_runai_both_on(https_server: StartHttpsServer) -> None:
    srv = await https_server(make_app())
    data = review("reqonly-deployment-update-oldobject.json")
    request = data["request"]
    request.update(
        kind={"group": "", "version": "v1", "kind": "ConfigMap"},
        resource={"group": "", "version": "v1", "resource": "configmaps"},
        namespace="hopsworks",
        name="hopsworks-cluster-settings",
        object=settings_configmap(run_ai_enable=True, kueue_installed=True),
        oldObject=settings_configmap(),
    )
    status, answer = await post(srv, "/validate/settings", data)
    assert status == 200
    assert answer["response"]["allowed"] is False
    assert "cannot both be true" in answer["response"]["status"]["message"]
