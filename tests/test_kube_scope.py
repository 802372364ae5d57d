"""The shared real cluster's promises to a test (tests/support/kube_scope.py): the webhook's
ServiceAccount has the chart's RBAC and no more, names are the test's own, and what a test made is
gone after it, its namespaces no longer projects while they terminate."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from tests.support.kube_scope import PROJECT_LABEL, KubeScope, SharedCluster, admin_api_client


async def as_webhook(scope: KubeScope) -> ApiClient:
    configuration = Configuration()
    await config.load_kube_config(config_file=str(scope.kubeconfig), client_configuration=configuration)
    return ApiClient(configuration)


async def test_the_runtime_kubeconfig_has_the_charts_rbac_and_no_more(kube_scope: KubeScope) -> None:
    project = await kube_scope.namespace("rbac")
    async with await as_webhook(kube_scope) as api:
        core = CoreV1Api(api)
        listed = await core.list_namespace()
        assert project in {n.metadata.name for n in listed.items}
        await core.list_namespaced_config_map(kube_scope.install_ns)
        with pytest.raises(ApiException) as denied:
            await core.list_namespaced_secret(kube_scope.install_ns)  # the chart grants no secrets
        assert denied.value.status == 403
        with pytest.raises(ApiException) as elsewhere:
            await core.list_namespaced_config_map("default")  # ConfigMaps only in its own namespace
        assert elsewhere.value.status == 403


async def test_names_carry_the_scope_and_the_settings_land_in_the_install_namespace(kube_scope: KubeScope) -> None:
    assert kube_scope.name("churn") == kube_scope.name("churn") != f"churn-{uuid.uuid4().hex[:6]}"
    assert kube_scope.id in kube_scope.install_ns
    await kube_scope.settings(run_ai_enable=True)
    stored = await kube_scope.get("v1", "ConfigMap", "hopsworks-cluster-settings", kube_scope.install_ns)
    assert stored is not None and stored["data"]["run_ai_enable"] == "true"
    await kube_scope.settings(run_ai_enable=False)  # a second write replaces the first
    stored = await kube_scope.get("v1", "ConfigMap", "hopsworks-cluster-settings", kube_scope.install_ns)
    assert stored is not None and stored["data"]["run_ai_enable"] == "false"


async def test_what_a_scope_made_goes_and_its_namespaces_stop_being_projects(
    shared_control_plane: SharedCluster, tmp_path: Path
) -> None:
    api = await admin_api_client(shared_control_plane.cp)
    try:
        scope = KubeScope(shared_control_plane.cp, api, uuid.uuid4().hex[:6], tmp_path)
        await scope._install(shared_control_plane.rbac)
        project = await scope.namespace("gone")
        await scope.patch(
            "v1", "Namespace", project, {"metadata": {"finalizers": ["scheduling.hopsworks.ai/runai-project"]}}
        )
        role = next(
            r
            for r in await scope.list("rbac.authorization.k8s.io/v1", "ClusterRole")
            if scope.id in r["metadata"]["name"]
        )
        await scope._cleanup()
        left = await scope.get("v1", "Namespace", project)
        assert left is None or (
            PROJECT_LABEL not in left["metadata"]["labels"] and not left["metadata"].get("finalizers")
        )
        assert await scope.get("rbac.authorization.k8s.io/v1", "ClusterRole", role["metadata"]["name"]) is None
    finally:
        await api.close()
