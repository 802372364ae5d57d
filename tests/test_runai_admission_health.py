"""Run:ai's own admission Deployments, watched: the watch against the real apiserver (its
Deployments run by the real controllers on kwok's nodes), the metric, the admin view's warning and
the console's; the install's read-only Role in namespace runai, and what its absence does."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, Configuration

from tests.support import chart
from tests.support.cluster import cluster_state, settings_configmap
from tests.support.fixtures import metric
from tests.support.https import make_cert_files
from tests.support.kube_scope import RUNAI_NAMESPACE, KubeScope, eventually
from webhook.core.admin_view import admin_view
from webhook.core.gpu_view import GpuCode
from webhook.core.runai_health import runai_admission_down
from webhook.kube.watch import KubeWatcher, WatchTiming
from webhook.metrics import REGISTRY
from webhook.state.store import ClusterState
from webhook.state.watches import cache_watcher

FAST = WatchTiming(page_size=50, watch_timeout_s=30, backoff_initial_s=0.02, backoff_max_s=0.1, absent_retry_s=0.2)
RBAC = "rbac.authorization.k8s.io/v1"


def deployment(name: str, replicas: int = 1, available: int | None = None, ns: str = "runai") -> dict[str, Any]:
    """A Deployment as stored with its status (`available` of `replicas` available), for the store;
    the apiserver keeps only the spec of what a test creates and its controllers write the status."""
    ready = replicas if available is None else available
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
        "status": {
            "replicas": replicas,
            "availableReplicas": ready,
            "conditions": [{"type": "Available", "status": "True" if ready > 0 else "False"}],
        },
    }


@pytest.fixture
def state(kube_scope: KubeScope) -> ClusterState:
    return ClusterState(kube_scope.install_ns)


@pytest.fixture
async def watcher(state: ClusterState, kube_scope: KubeScope) -> AsyncIterator[KubeWatcher]:
    """The caches as the webhook's ServiceAccount reads them, with the chart's RBAC."""
    await kube_scope.settings(run_ai_enable=True)
    configuration = Configuration()
    await config.load_kube_config(config_file=str(kube_scope.kubeconfig), client_configuration=configuration)
    async with ApiClient(configuration) as api:
        w = cache_watcher(state, api, kube_scope.install_ns, timing=FAST)
        yield w
        await w.stop()


def codes(state: ClusterState) -> list[str]:
    return [w.code for w in admin_view(state.snapshot(), None).warnings]


async def scale(scope: KubeScope, name: str, replicas: int) -> None:
    await scope.patch("apps/v1", "Deployment", name, {"spec": {"replicas": replicas}}, RUNAI_NAMESPACE)


async def test_scaling_one_to_zero_shows_in_the_metric_the_admin_view_and_back(
    kube_scope: KubeScope, state: ClusterState, watcher: KubeWatcher
) -> None:
    other = await kube_scope.namespace("other", project=False)
    for obj in (
        deployment("runai-admission-controller"),
        deployment("admission", replicas=2),
        deployment("admission", ns=other),  # same name elsewhere: not Run:ai's
        deployment("runai-scheduler"),  # Run:ai's, but not its admission
    ):
        await kube_scope.create({k: v for k, v in obj.items() if k != "status"})
    await watcher.start()
    assert await watcher.wait_synced(10)
    # The deployment controller and kwok make them available.
    await eventually(lambda: runai_admission_down(state.snapshot()) == [], within_s=60)
    assert metric("webhook_runai_admission_available", deployment="admission") == 1
    assert GpuCode.ADMISSION_DOWN not in codes(state)

    await scale(kube_scope, "admission", 0)
    await eventually(lambda: runai_admission_down(state.snapshot()) == ["admission"], within_s=30)
    assert metric("webhook_runai_admission_available", deployment="admission") == 0
    assert metric("webhook_runai_admission_available", deployment="runai-admission-controller") == 1

    def warning() -> str:
        found = [w.message for w in admin_view(state.snapshot(), None).warnings if w.code == GpuCode.ADMISSION_DOWN]
        return found[0] if len(found) == 1 else ""

    # Down as soon as it is scaled to 0; its pods then go, as the controller reports.
    await eventually(lambda: "admission has 0 of 0 replicas available" in warning(), within_s=30, message=warning())
    assert "no pod can be created in a namespace bound to Run:ai" in warning()

    await scale(kube_scope, "admission", 2)
    await eventually(lambda: runai_admission_down(state.snapshot()) == [], within_s=60)
    assert metric("webhook_runai_admission_available", deployment="admission") == 1

    await kube_scope.delete("apps/v1", "Deployment", "runai-admission-controller", RUNAI_NAMESPACE)
    await eventually(lambda: runai_admission_down(state.snapshot()) == ["runai-admission-controller"], within_s=30)
    assert metric("webhook_runai_admission_available", deployment="runai-admission-controller") == 0
    assert "runai-admission-controller not found" in admin_view(state.snapshot(), None).warnings[-1].message


async def test_without_read_access_in_runai_the_caches_still_become_ready(
    kube_scope: KubeScope, state: ClusterState, watcher: KubeWatcher
) -> None:
    # An install whose Role in runai is missing (a cluster admin refused it): the real RBAC denies.
    sa = kube_scope.service_account_user
    for binding in await kube_scope.list(RBAC, "RoleBinding", RUNAI_NAMESPACE):
        subjects = binding.get("subjects") or []
        if any(f"system:serviceaccount:{s.get('namespace')}:{s.get('name')}" == sa for s in subjects):
            await kube_scope.delete(RBAC, "RoleBinding", binding["metadata"]["name"], RUNAI_NAMESPACE)
    await eventually(lambda: denied_deployments(kube_scope), within_s=30, message="RBAC still allows runai")
    await watcher.start()
    assert await watcher.wait_synced(10)  # /readyz, and so every pod webhook, does not wait on it
    assert state.ready()
    assert runai_admission_down(state.snapshot()) == ["runai-admission-controller", "admission"]


async def denied_deployments(scope: KubeScope) -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": scope.service_account_user,
                       "groups": ["system:serviceaccounts", f"system:serviceaccounts:{scope.install_ns}",
                                  "system:authenticated"],
                       "resourceAttributes": {"verb": "list", "group": "apps", "resource": "deployments",
                                              "namespace": RUNAI_NAMESPACE}}}  # fmt: skip
    answer = await scope.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return not answer["status"].get("allowed")


def test_nothing_is_said_with_run_ai_off_or_before_the_watch_listed() -> None:
    st = cluster_state(run_ai_enable=True)
    assert st.snapshot().runai_admission is None and runai_admission_down(st.snapshot()) == []
    st.replace_all("Deployment", [deployment("admission", replicas=0)])
    assert runai_admission_down(st.snapshot()) == ["runai-admission-controller", "admission"]
    st.apply(settings_configmap(run_ai_enable=False))
    assert runai_admission_down(st.snapshot()) == []


def _render(tmp: Path, namespace: str = "hopsworks", **values: Any) -> list[dict[str, Any]]:
    ca = make_cert_files(tmp / "certs").ca.cert_pem
    return chart.render({"certs": {"mode": "secret", "secret": {"caBundle": base64.b64encode(ca).decode()}}, **values},
                        namespace)  # fmt: skip


def test_the_install_reads_runai_deployments_only_with_run_ai_on_and_only_reads(tmp_path: Path) -> None:
    off = _render(tmp_path)
    assert not [o for o in off if o["metadata"].get("namespace") == "runai"]
    on = _render(tmp_path, namespace="platform", variables={"run_ai_enable": True, "run_ai_client_id": "sa"})
    role, bindings = (
        [o for o in on if o["kind"] == k and o["metadata"].get("namespace") == "runai"] for k in ("Role", "RoleBinding")
    )
    assert [r["verbs"] for r in role[0]["rules"]] == [["list", "watch"]]
    assert role[0]["rules"][0]["resources"] == ["deployments"]
    assert bindings[0]["subjects"] == [
        {"kind": "ServiceAccount", "name": "scheduling-webhook", "namespace": "platform"}
    ]
    kinds = [o["kind"] for o in on]
    assert kinds.index("Role") < kinds.index("Deployment")  # helm grants before it runs


def test_the_alert_rules_ship_beside_each_other_and_name_real_metrics(tmp_path: Path) -> None:
    assert not [o for o in _render(tmp_path) if o["kind"] == "PrometheusRule"]
    (rule,) = [
        o
        for o in _render(tmp_path, namespace="platform", metrics={"alertRules": True})
        if o["kind"] == "PrometheusRule"
    ]
    assert rule["metadata"]["namespace"] == "platform"
    alerts = {r["alert"]: r["expr"] for r in rule["spec"]["groups"][0]["rules"]}
    assert set(alerts) == {"SchedulingWebhookCertificateExpiresSoon", "RunaiAdmissionUnavailable"}
    exported = {m.name for m in REGISTRY.collect()}
    assert (
        "webhook_runai_admission_available" in exported
        and "webhook_runai_admission_available" in alerts["RunaiAdmissionUnavailable"]
    )
    assert any(name == "webhook_serving_certificate_expiry_timestamp_seconds" for name in exported)
