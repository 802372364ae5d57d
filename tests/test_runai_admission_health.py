"""Run:ai's own admission Deployments, watched (issue 19): the watch against the API emulator, the
metric, the admin view's warning and the console's; the install's read-only Role in namespace runai."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from tests.support import chart
from tests.support.cluster import cluster_state, settings_configmap
from tests.support.fixtures import metric
from tests.support.https import make_cert_files
from tests.support.kube_emulator import KubeEmulator, eventually
from webhook.core.admin_view import admin_view
from webhook.core.gpu_view import GpuCode
from webhook.core.runai_health import runai_admission_down
from webhook.kube.watch import KubeWatcher, WatchTiming
from webhook.metrics import REGISTRY
from webhook.state.store import ClusterState
from webhook.state.watches import cache_watcher

FAST = WatchTiming(page_size=50, watch_timeout_s=30, backoff_initial_s=0.02, backoff_max_s=0.1, absent_retry_s=0.2)


def deployment(name: str, replicas: int = 1, available: int | None = None, ns: str = "runai") -> dict[str, Any]:
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
def kube_objects() -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hopsworks"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "runai"}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}},
        settings_configmap(run_ai_enable=True),
    ]


@pytest.fixture
def state() -> ClusterState:
    return ClusterState("hopsworks")


@pytest.fixture
async def watcher(state: ClusterState, api: ApiClient) -> AsyncIterator[KubeWatcher]:
    w = cache_watcher(state, api, "hopsworks", timing=FAST)
    yield w
    await w.stop()


def codes(state: ClusterState) -> list[str]:
    return [w.code for w in admin_view(state.snapshot(), None).warnings]


async def test_scaling_one_to_zero_shows_in_the_metric_the_admin_view_and_back(
    kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher
) -> None:
    kube.put_object(deployment("runai-admission-controller"))
    kube.put_object(deployment("admission", replicas=2))
    kube.put_object(deployment("admission", ns="other"))  # same name elsewhere: not Run:ai's
    kube.put_object(deployment("runai-scheduler"))  # Run:ai's, but not its admission
    await watcher.start()
    assert await watcher.wait_synced(5)
    assert runai_admission_down(state.snapshot()) == []
    assert metric("webhook_runai_admission_available", deployment="admission") == 1
    assert GpuCode.ADMISSION_DOWN not in codes(state)

    kube.put_object(deployment("admission", replicas=0))  # scaled to 0
    await eventually(lambda: runai_admission_down(state.snapshot()) == ["admission"])
    assert metric("webhook_runai_admission_available", deployment="admission") == 0
    assert metric("webhook_runai_admission_available", deployment="runai-admission-controller") == 1
    view = admin_view(state.snapshot(), None)
    (warning,) = [w for w in view.warnings if w.code == GpuCode.ADMISSION_DOWN]
    assert "admission has 0 of 0 replicas available" in warning.message
    assert "no pod can be created in a namespace bound to Run:ai" in warning.message

    kube.put_object(deployment("admission", replicas=2))
    await eventually(lambda: runai_admission_down(state.snapshot()) == [])
    assert metric("webhook_runai_admission_available", deployment="admission") == 1

    kube.delete_object("Deployment", "runai-admission-controller", namespace="runai")
    await eventually(lambda: runai_admission_down(state.snapshot()) == ["runai-admission-controller"])
    assert metric("webhook_runai_admission_available", deployment="runai-admission-controller") == 0
    assert "runai-admission-controller not found" in admin_view(state.snapshot(), None).warnings[-1].message


async def test_without_read_access_in_runai_the_caches_still_become_ready(
    kube: KubeEmulator, state: ClusterState, watcher: KubeWatcher
) -> None:
    kube.fail_next(100, status=403, path_prefix="/apis/apps/v1/namespaces/runai/deployments")
    await watcher.start()
    assert await watcher.wait_synced(5)  # /readyz, and so every pod webhook, does not wait on it
    assert state.ready()
    assert runai_admission_down(state.snapshot()) == ["runai-admission-controller", "admission"]


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
