"""The emulated apiserver admission chain (tests/support/admission_chain.py) behaves as documented:
routing, order, reinvocation, TLS checks, timeouts, failure policies, dry runs, patches, built-in
plugins, and the answers a client sees. Webhooks here are small HTTPS servers whose answers each
test sets; the last tests route the rendered manifests of this project."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, AppsV1Api, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from tests.support.admission_chain import AdmissionChain, Services
from tests.support.cluster import namespace, priority_class, settings_configmap
from tests.support.https import HttpsServer, make_cert_files, start_https_server
from tests.support.kube_emulator import KubeEmulator, Obj
from tests.support.reviews import review
from webhook.manifests import render
from webhook.tls.issuing import make_ca

Answer = Callable[[Obj], Awaitable[Obj] | Obj]  # AdmissionRequest -> AdmissionResponse fields


@dataclass
class Hooks:
    """One HTTPS server for every test webhook: POST /<name> answers with `answers[name]`."""

    answers: dict[str, Answer] = field(default_factory=dict)
    reviews: dict[str, list[Obj]] = field(default_factory=dict)
    delay_s: dict[str, float] = field(default_factory=dict)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{name}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await request.json()
        self.reviews.setdefault(name, []).append(body["request"])
        await asyncio.sleep(self.delay_s.get(name, 0.0))
        answer = self.answers.get(name, allow)(body["request"])
        if asyncio.iscoroutine(answer):
            answer = await answer
        response = {"uid": body["request"]["uid"], **answer}  # type: ignore[dict-item]
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})


def allow(_: Obj) -> Obj:
    return {"allowed": True}


def patching(*operations: Obj) -> Answer:
    def answer(_: Obj) -> Obj:
        patch = base64.b64encode(json.dumps(list(operations)).encode()).decode()
        return {"allowed": True, "patchType": "JSONPatch", "patch": patch}

    return answer


@dataclass
class Env:
    emu: KubeEmulator
    chain: AdmissionChain
    hooks: Hooks
    server: HttpsServer
    ca_bundle: str
    core: CoreV1Api
    apps: AppsV1Api

    def configure(self, kind: str, name: str, *webhooks: Obj) -> None:
        full = []
        for hook in webhooks:
            path = "/" + hook["name"]
            full.append(
                {
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "clientConfig": {
                        "caBundle": self.ca_bundle,
                        "service": {"name": "hooks", "namespace": "test", "path": path, "port": 443},
                    },
                    "rules": [POD_CREATE],
                    **hook,
                }
            )
        group = "admissionregistration.k8s.io/v1"
        self.emu.put_object({"apiVersion": group, "kind": kind, "metadata": {"name": name}, "webhooks": full})

    def called(self, hook: str) -> list[Obj]:
        return self.hooks.reviews.get(hook, [])


POD_CREATE = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
MUTATING = "MutatingWebhookConfiguration"
VALIDATING = "ValidatingWebhookConfiguration"


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with KubeEmulator() as emu:
        emu.create_object(namespace("team-a", labels={"team": "a"}))
        emu.create_object(namespace("other", project=False))
        hooks = Hooks()
        certs = make_cert_files(tmp_path / "hooks-certs", service="hooks", namespace="test")
        server = await start_https_server(hooks.app(), tmp_path, certs=certs)
        services = Services()
        services.add("test", "hooks", server.port)
        chain = AdmissionChain(services).install(emu)
        try:
            async with ApiClient(emu.client_config()) as client:
                ca_bundle = base64.b64encode(certs.ca.cert_pem).decode()
                yield Env(emu, chain, hooks, server, ca_bundle, CoreV1Api(client), AppsV1Api(client))
        finally:
            await chain.close()
            await server.close()


def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}], **spec},
    }


async def refusal(call: Awaitable[Any]) -> tuple[int, Obj]:
    with pytest.raises(ApiException) as caught:
        await call
    return caught.value.status, json.loads(caught.value.body)


# -- routing ----------------------------------------------------------------------------------------
async def test_selectors_route_by_namespace_labels_as_cached_and_object_labels(env: Env) -> None:
    env.chain.namespace_lag_s = 0.3
    env.configure(MUTATING, "m", {
        "name": "web.test",
        "namespaceSelector": {"matchLabels": {"team": "a"}},
        "objectSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]},
    })  # fmt: skip
    env.hooks.answers["web.test"] = patching({"op": "add", "path": "/metadata/labels/seen", "value": "yes"})
    stored = await env.core.create_namespaced_pod("team-a", pod("p1", {"app": "web"}))
    assert stored.metadata.labels["seen"] == "yes"
    await env.core.create_namespaced_pod("team-a", pod("p2", {"app": "db"}))  # objectSelector excludes
    await env.core.create_namespaced_pod("other", pod("p3", {"app": "web"}))  # namespaceSelector excludes
    assert [r["name"] for r in env.called("web.test")] == ["p1"]
    # A label written now reaches the chain's namespace cache only after its lag.
    await env.core.patch_namespace("other", {"metadata": {"labels": {"team": "a"}}})
    await env.core.create_namespaced_pod("other", pod("p4", {"app": "web"}))
    await asyncio.sleep(0.4)
    await env.core.create_namespaced_pod("other", pod("p5", {"app": "web"}))
    assert [r["name"] for r in env.called("web.test")] == ["p1", "p5"]


async def test_mutating_webhooks_run_in_name_order_and_ifneeded_ones_again(env: Env) -> None:
    def trail(name: str) -> Answer:
        def answer(request: Obj) -> Obj:
            before = request["object"]["metadata"].get("annotations", {}).get("trail", "")
            value = f"{before},{name}".strip(",")
            return patching({"op": "add", "path": "/metadata/annotations", "value": {"trail": value}})(request)

        return answer

    env.configure(MUTATING, "b-second", {"name": "second", "reinvocationPolicy": "Never"})
    env.configure(MUTATING, "a-first", {"name": "first", "reinvocationPolicy": "IfNeeded"},
                  {"name": "first-too", "reinvocationPolicy": "Never"})  # fmt: skip
    for name in ("first", "first-too", "second"):
        env.hooks.answers[name] = trail(name)
    stored = await env.core.create_namespaced_pod("team-a", pod("p1"))
    assert stored.metadata.annotations["trail"] == "first,first-too,second,first"
    assert [c.reinvoked for c in env.chain.calls_to("first")] == [False, True]


# -- calls ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
async def test_timeout_seconds_and_failure_policy(env: Env, policy: str) -> None:
    env.configure(VALIDATING, "v", {"name": "slow.test", "timeoutSeconds": 1, "failurePolicy": policy})
    env.hooks.delay_s["slow.test"] = 1.5
    if policy == "Ignore":
        await env.core.create_namespaced_pod("team-a", pod("p1"))
        assert env.chain.calls_to("slow.test")[0].outcome == "ignored-error"
        return
    status, body = await refusal(env.core.create_namespaced_pod("team-a", pod("p1")))
    assert status == 500 and body["reason"] == "InternalError"
    assert body["message"].startswith('Internal error occurred: failed calling webhook "slow.test": failed to call')
    assert "https://hooks.test.svc:443/slow.test?timeout=1s" in body["message"]
    assert "context deadline exceeded" in body["message"]
    assert env.emu.objects("Pod") == []


async def test_the_certificate_is_checked_against_ca_bundle_and_service_name(env: Env, tmp_path: Path) -> None:
    env.ca_bundle = base64.b64encode(make_ca(days=1).cert_pem).decode()  # another CA
    env.configure(VALIDATING, "v", {"name": "untrusted.test"})
    status, body = await refusal(env.core.create_namespaced_pod("team-a", pod("p1")))
    assert status == 500 and "certificate verify failed" in body["message"], body
    # The right CA, but the server's certificate is for another Service name.
    wrong = make_cert_files(tmp_path / "wrong", service="elsewhere", namespace="test", ca=env.server.certs.ca)
    other = await start_https_server(env.hooks.app(), tmp_path / "other", certs=wrong)
    try:
        env.chain.services.add("test", "hooks", other.port)  # type: ignore[attr-defined]
        env.ca_bundle = base64.b64encode(env.server.certs.ca.cert_pem).decode()
        env.configure(VALIDATING, "v", {"name": "misnamed.test"})
        status, body = await refusal(env.core.create_namespaced_pod("team-a", pod("p2")))
        assert status == 500 and "hooks.test.svc" in body["message"], body
        assert "misnamed.test" not in env.hooks.reviews
    finally:
        await other.close()


async def test_dry_run_goes_only_to_webhooks_without_side_effects(env: Env) -> None:
    env.configure(VALIDATING, "v", {"name": "pure.test", "sideEffects": "NoneOnDryRun"})
    await env.core.create_namespaced_pod("team-a", pod("p1"), dry_run="All")
    assert [r["dryRun"] for r in env.called("pure.test")] == [True]
    assert env.called("pure.test")[0]["options"]["dryRun"] == ["All"]
    assert env.emu.objects("Pod") == []
    env.configure(VALIDATING, "w", {"name": "writer.test", "sideEffects": "Some"})
    status, body = await refusal(env.core.create_namespaced_pod("team-a", pod("p2"), dry_run="All"))
    assert status == 400 and body["message"] == 'admission webhook "writer.test" does not support dry run'
    assert "writer.test" not in env.hooks.reviews


async def test_a_patch_that_does_not_apply_is_refused(env: Env) -> None:
    env.configure(MUTATING, "m", {"name": "broken.test", "failurePolicy": "Ignore"})
    env.hooks.answers["broken.test"] = patching({"op": "remove", "path": "/metadata/labels/missing"})
    status, body = await refusal(env.core.create_namespaced_pod("team-a", pod("p1")))
    assert status == 500 and body["message"].startswith("Internal error occurred: "), body  # whatever the policy
    assert env.emu.objects("Pod") == []


@pytest.mark.parametrize(
    ("status", "code", "message"),
    [
        ({"code": 403, "message": "GPU quota exceeded", "reason": "GpuQuotaExceeded"}, 403,
         'admission webhook "judge.test" denied the request: GPU quota exceeded'),
        ({"code": 503, "message": "try again", "reason": "RunaiBindingSettling"}, 503,
         'admission webhook "judge.test" denied the request: try again'),
        ({"code": 200, "message": "no"}, 403, 'admission webhook "judge.test" denied the request: no'),
        (None, 403, 'admission webhook "judge.test" denied the request without explanation'),
    ],
)  # fmt: skip
async def test_refusals_have_the_apiserver_status_and_message(
    env: Env, status: Obj | None, code: int, message: str
) -> None:
    env.configure(VALIDATING, "v", {"name": "judge.test"})
    env.hooks.answers["judge.test"] = lambda _: {"allowed": False, **({"status": status} if status else {})}
    got, body = await refusal(env.core.create_namespaced_pod("team-a", pod("p1")))
    assert (got, body["code"], body["message"]) == (code, code, message)
    assert (body["status"], body["kind"]) == ("Failure", "Status")
    if status and status.get("reason"):
        assert body["reason"] == status["reason"]


async def test_reviews_have_the_apiserver_shape(env: Env) -> None:
    env.configure(MUTATING, "m", {"name": "look.test"})
    env.configure(VALIDATING, "v", {"name": "look-too.test"})
    body = pod("")
    body["metadata"] = {"generateName": "rs-", "labels": {"app": "web"}}
    await env.core.create_namespaced_pod("team-a", body)
    apiserver_fields = set(review("allfields-dryrun-true-with-response.json")["request"])
    [mutating] = env.called("look.test")
    [validating] = env.called("look-too.test")
    assert set(mutating) <= apiserver_fields and set(validating) <= apiserver_fields
    assert mutating["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert mutating["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert mutating["namespace"] == "team-a" and mutating["operation"] == "CREATE"
    # Mutating webhooks see the pod before naming (generateName only), validating ones after.
    assert "name" not in mutating and "uid" not in mutating["object"]["metadata"]
    assert validating["name"].startswith("rs-") and validating["object"]["metadata"]["uid"]
    assert mutating["object"]["spec"]["schedulerName"] == "default-scheduler"  # defaulted first
    assert mutating["userInfo"]["username"] == "kubernetes-admin"


# -- built-in plugins -------------------------------------------------------------------------------
async def test_priority_plugin(env: Env) -> None:
    env.emu.create_object(priority_class("base", 50, global_default=True))
    env.emu.create_object(priority_class("floor", 10, "Never", global_default=True))
    env.emu.create_object(priority_class("urgent", 1000))
    stored = await env.core.create_namespaced_pod("team-a", pod("p1"))
    assert (stored.spec.priority_class_name, stored.spec.priority, stored.spec.preemption_policy) == (
        "floor", 10, "Never",
    )  # fmt: skip
    chosen = await env.core.create_namespaced_pod("team-a", pod("p2", priorityClassName="urgent"))
    assert (chosen.spec.priority, chosen.spec.preemption_policy) == (1000, "PreemptLowerPriority")
    status, body = await refusal(env.core.create_namespaced_pod("team-a", pod("p3", priorityClassName="nope")))
    assert status == 403 and body["message"] == 'pods "p3" is forbidden: no PriorityClass with name nope was found'
    status, body = await refusal(env.core.create_namespaced_pod("team-a", pod("p4", priorityClassName="urgent",
                                                                               priority=5)))  # fmt: skip
    assert status == 403 and "the integer value of priority (5) must not be provided in pod spec" in body["message"]


async def test_namespace_lifecycle(env: Env) -> None:
    env.emu.put_object({**namespace("leaving"), "metadata": {**namespace("leaving")["metadata"],
                                                             "finalizers": ["example.com/hold"]}})  # fmt: skip
    env.emu.delete_object("Namespace", "leaving")
    await asyncio.sleep(0)  # the chain's cache follows on the next turn
    status, body = await refusal(env.core.create_namespaced_pod("leaving", pod("p1")))
    assert status == 403
    assert body["message"] == (
        'pods "p1" is forbidden: unable to create new content in namespace leaving because it is being terminated'
    )
    status, body = await refusal(env.core.delete_namespace("default"))
    assert status == 403 and "may not be deleted" in body["message"]


# -- the rendered manifests -------------------------------------------------------------------------
def rendered_configurations(ca_bundle: str) -> list[Obj]:
    return [o for o in render({"caBundle": ca_bundle}) if o["kind"].endswith("WebhookConfiguration")]


async def route_rendered(env: Env, configurations: list[Obj]) -> dict[str, set[str]]:
    """Which of our webhooks each write reaches, with a recording server as the Service."""
    for obj in configurations:
        for hook in obj["webhooks"]:
            hook["clientConfig"]["service"]["namespace"] = "test"  # our recording server stands in
            hook["clientConfig"]["service"]["name"] = "hooks"
            hook["clientConfig"]["service"]["path"] = "/" + hook["name"]
        env.emu.put_object(obj)
    env.emu.create_object(namespace("hopsworks", project=False))
    env.emu.create_object(namespace("kube-system", project=False))
    env.emu.create_object(namespace("churn"))
    await asyncio.sleep(0)
    reached: dict[str, set[str]] = {}

    async def write(what: str, call: Awaitable[Any]) -> None:
        before = {name: len(reviews) for name, reviews in env.hooks.reviews.items()}
        await call
        reached[what] = {name for name, reviews in env.hooks.reviews.items() if len(reviews) > before.get(name, 0)}

    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
                           "template": {"metadata": {"labels": {"a": "b"}}, "spec": pod("x")["spec"]}}}  # fmt: skip
    await write("project pod", env.core.create_namespaced_pod("churn", pod("p1")))
    await write("kube-system pod", env.core.create_namespaced_pod("kube-system", pod("p2")))
    await write("install-namespace pod", env.core.create_namespaced_pod("hopsworks", pod("p3")))
    await write("project deployment", env.apps.create_namespaced_deployment("churn", deployment))
    await write("kube-system deployment", env.apps.create_namespaced_deployment("kube-system", deployment))
    await write("settings", env.core.create_namespaced_config_map("hopsworks", settings_configmap()))
    other_cm = {"metadata": {"name": "gpu-reservations.churn"}, "data": {}}
    await write("other install ConfigMap", env.core.create_namespaced_config_map("hopsworks", other_cm))
    await write("project namespace", env.core.patch_namespace("churn", {"metadata": {"labels": {"x": "y"}}}))
    await write("other namespace", env.core.patch_namespace("other", {"metadata": {"labels": {"x": "y"}}}))
    return reached


EXPECTED_ROUTES = {
    "project pod": {"mutate-pods.scheduling.hopsworks.ai", "validate-pods.scheduling.hopsworks.ai"},
    "kube-system pod": set(),
    "install-namespace pod": set(),
    "project deployment": {"validate-workloads.scheduling.hopsworks.ai"},
    "kube-system deployment": set(),
    "settings": {"validate-settings.scheduling.hopsworks.ai"},
    "other install ConfigMap": set(),
    "project namespace": {"validate-namespaces.scheduling.hopsworks.ai"},
    "other namespace": set(),
}


async def test_the_rendered_manifests_route_each_webhook_where_it_belongs(env: Env) -> None:
    assert await route_rendered(env, rendered_configurations(env.ca_bundle)) == EXPECTED_ROUTES


async def test_a_manifest_without_the_namespace_selector_is_caught(env: Env) -> None:
    configurations = rendered_configurations(env.ca_bundle)
    for obj in configurations:
        for hook in obj["webhooks"]:
            if hook["name"] == "mutate-pods.scheduling.hopsworks.ai":
                del hook["namespaceSelector"]
    routes = await route_rendered(env, configurations)
    assert routes != EXPECTED_ROUTES
    assert "mutate-pods.scheduling.hopsworks.ai" in routes["kube-system pod"]
