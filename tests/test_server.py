"""The admission endpoints over real HTTPS, as the apiserver calls them (CA + service name, keep-alive)."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from yarl import URL

from tests.support.apps import cache_app
from tests.support.cluster import cluster_state, namespace, settings_configmap
from tests.support.https import StartHttpsServer
from tests.support.reviews import apply_patch, assert_valid_pod, fixture_names, pod_review, review
from webhook.core.decision import Decision
from webhook.http.app import MAX_BODY_BYTES
from webhook.metrics import (
    ADMISSION_INTERNAL_ERRORS_HELP,
    ADMISSION_LATENCY_BUCKETS,
    ADMISSION_LATENCY_HELP,
    ADMISSION_OUTCOMES,
    ADMISSION_REQUESTS_HELP,
    REGISTRY,
    admission_counts,
)

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


def exposition(text: str, endpoint: str) -> tuple[list[str], set[tuple[str, str]]]:
    """The admission families' HELP and TYPE lines, and the series (name, labels) of `endpoint`."""
    comments = [line for line in text.splitlines() if line.startswith("# ") and " webhook_admission_" in line]
    series = {
        (name, labels)
        for name, labels in re.findall(r"^(webhook_admission_\w+)\{([^}]*)\} ", text, re.M)
        if f'endpoint="{endpoint}"' in labels
    }
    return comments, series


def prometheus_client_exposition(endpoint: str, latencies: list[float], outcomes: list[str]) -> str:
    """What prometheus_client's Counter and Histogram exported for these answers (the metrics were
    those, and labels bound once per endpoint), in a registry of their own."""
    registry = CollectorRegistry()
    requests = Counter(
        "webhook_admission_requests_total", ADMISSION_REQUESTS_HELP, ["endpoint", "outcome"], registry=registry
    )
    latency = Histogram(
        "webhook_admission_duration_seconds", ADMISSION_LATENCY_HELP, ["endpoint"],
        buckets=ADMISSION_LATENCY_BUCKETS, registry=registry,
    )  # fmt: skip
    errors = Counter(
        "webhook_admission_internal_errors_total", ADMISSION_INTERNAL_ERRORS_HELP, ["endpoint"], registry=registry
    )
    for outcome in ADMISSION_OUTCOMES:
        requests.labels(endpoint, outcome)
    errors.labels(endpoint)
    for outcome in outcomes:
        requests.labels(endpoint, outcome).inc()
    for seconds in latencies:
        latency.labels(endpoint).observe(seconds)
    return generate_latest(registry).decode()


async def test_the_admission_series_are_the_ones_counter_and_histogram_exported(https_server: StartHttpsServer) -> None:
    # The counts are plain integers behind a collector of our own (webhook.metrics.AdmissionCounts):
    # dashboards and alerts must see the same families, help, types and labels.
    srv = await https_server(make_app())
    await post(srv, "/mutate/pods", pod_review("churn"))
    await post(srv, "/mutate/pods", b"{", content_type="text/plain")
    async with srv.session.get(srv.url("/metrics")) as resp:
        text = await resp.text()
    reference = prometheus_client_exposition("mutate_pods", [0.001], ["patched", "bad_request"])
    assert exposition(text, "mutate_pods") == exposition(reference, "mutate_pods")
    for endpoint in ("mutate_workloads", "validate_pods", "validate_workloads", "validate_settings"):
        assert exposition(text, endpoint)[1] == exposition(reference.replace("mutate_pods", endpoint), endpoint)[1]


def test_admission_counts_are_what_counter_and_histogram_counted() -> None:
    latencies = [0.0001, 0.0005, 0.0007, 0.003, 0.25, 0.9, 1.0, 7.5, 0.0]  # bounds included: `le`
    outcomes = ["allowed", "patched", "patched", "denied", "bad_request", "bad_request", "bad_request"]
    counts = admission_counts("test_counts")
    for seconds in latencies:
        counts.observe(seconds)
    for outcome in outcomes:
        setattr(counts, outcome, getattr(counts, outcome) + 1)

    def samples(text: str) -> dict[str, float]:
        found = re.findall(r'^(webhook_admission_\w+\{[^}]*endpoint="test_counts"[^}]*\}) (\S+)$', text, re.M)
        return {series: float(value) for series, value in found if "_created" not in series}

    ours = samples(generate_latest(REGISTRY).decode())
    theirs = samples(prometheus_client_exposition("test_counts", latencies, outcomes))
    assert ours.keys() == theirs.keys()
    assert ours == pytest.approx(theirs)


CONTENT_TYPES = [  # as aiohttp parses the header: type and subtype, case-blind, parameters aside
    ("application/json", 200),
    ("application/json; charset=utf-8", 200),
    ("APPLICATION/JSON", 200),
    ("application/jsonx", 415),
    ("text/plain", 415),
    ("application/json, text/html", 415),
]


@pytest.mark.parametrize(("content_type", "status"), CONTENT_TYPES)
async def test_the_content_types_a_review_is_taken_in(
    https_server: StartHttpsServer, content_type: str, status: int
) -> None:
    srv = await https_server(make_app())
    got, answer = await post(srv, "/mutate/pods", pod_review("churn"), content_type=content_type)
    assert got == status, answer
    assert status == 200 or "application/json" in answer["error"]


ROUTED = [  # the admission paths go to their route without the router; the rest as the router answers
    ("POST", "/mutate/pods", 200),
    ("POST", "/mutate/pods?timeout=10s", 200),  # the apiserver's own query
    ("POST", "/validate/pods?timeout=10s&x=1", 200),
    ("POST", "/mutate/pods/", 404),
    ("POST", "/mutate/pods%2F", 404),
    ("POST", "//mutate/pods", 404),
    ("POST", "/MUTATE/pods", 404),
    ("GET", "/mutate/pods", 405),
    ("PUT", "/validate/pods?timeout=10s", 405),
    ("POST", "/healthz", 405),
    ("GET", "/healthz", 200),
    ("GET", "/nothing", 404),
    ("GET", "/no%0Athing", 404),  # a newline in the decoded path: still the JSON 404
    ("POST", "/mutate/pods%0A", 404),
]


@pytest.mark.parametrize(("method", "path", "status"), ROUTED)
async def test_what_each_path_and_method_is_answered(
    https_server: StartHttpsServer, method: str, path: str, status: int
) -> None:
    srv = await https_server(make_app())
    body = json.dumps(pod_review("churn")).encode()
    headers = {"Content-Type": "application/json"}
    async with srv.session.request(method, URL(srv.url(path), encoded=True), data=body, headers=headers) as resp:
        assert resp.status == status, await resp.text()
        assert resp.content_type == "application/json"
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        answer = await resp.json()
    if status == 200 and path.startswith("/mutate"):
        assert answer["response"]["allowed"] is True and "patch" in answer["response"]
    if status == 405:
        assert method in answer["error"] and resp.headers["Allow"]


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


async def test_metrics_carry_the_standard_process_and_python_series(https_server: StartHttpsServer) -> None:
    srv = await https_server(make_app())
    async with srv.session.get(srv.url("/metrics")) as resp:
        text = await resp.text()
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds",
                 "python_gc_objects_collected_total", "python_gc_collections_total", "python_info"):  # fmt: skip
        assert re.search(rf"^{name}[{{ ]", text, re.M), name
