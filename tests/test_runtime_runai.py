"""The whole product against an apiserver with Run:ai on: the real Runtime, the shared real control
plane (read as the webhook's ServiceAccount) and the spec-checked Run:ai stand-in, driven over HTTPS
as the apiserver and a data scientist would."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import runai_settings_configmap
from tests.support.https import wait_until
from tests.support.kube_scope import KubeScope, eventually
from tests.support.reviews import admitted_labels, apply_patch, assert_valid_pod, owned_by, pod_review
from tests.support.runai_standin import RunaiStandin
from tests.support.runtime import apiserver_session, base_url, binding_settled, start_runtime

SECRET = "standin-client-secret"


@pytest.fixture
async def runai(kube_scope: KubeScope) -> AsyncIterator[RunaiStandin]:
    async with RunaiStandin(client_secret=SECRET) as runai:
        runai.add_department("vision-dept")
        settings = runai_settings_configmap(
            runai,
            kube_scope.install_ns,
            run_ai_project_gpu_quota=1,
            run_ai_reconcile_interval_s=1,
        )
        await kube_scope.put(settings)
        yield runai
        assert runai.violations == [], runai.violations


async def bound_labels(scope: KubeScope, name: str) -> dict[str, str] | None:
    """The namespace's labels once it is bound to a Run:ai queue; None before."""
    got = await scope.get("v1", "Namespace", name)
    labels = dict((got or {}).get("metadata", {}).get("labels") or {})
    return labels if "runai/queue" in labels else None


async def test_project_lifecycle_with_runai(tmp_path: Path, kube_scope: KubeScope, runai: RunaiStandin) -> None:
    secret_dir = tmp_path / "runai-secret"
    secret_dir.mkdir()
    (secret_dir / "clientSecret").write_text(SECRET)
    runtime, options, certs = await start_runtime(tmp_path, kube_scope, runai_secret_dir=secret_dir)
    base = base_url(options)
    try:
        async with apiserver_session(certs) as session:

            async def admit(path: str, review: dict[str, Any]) -> dict[str, Any]:
                async with session.post(f"{base}{path}", json=review) as resp:
                    assert resp.status == 200, await resp.text()
                    return (await resp.json())["response"]

            # A new project namespace in a department Run:ai knows: the leader binds it.
            vision = await kube_scope.namespace("vision", labels={"hopsworks.ai/department": "vision-dept"})
            alice, alice_token = await kube_scope.user_token("alice")
            await kube_scope.allow(alice, "get", "pods", vision)
            labels = await eventually(
                lambda: bound_labels(kube_scope, vision), within_s=15, message="vision bound by the reconciler"
            )
            project = runai.project(vision)
            assert project is not None
            assert project["requestedNamespace"] == vision
            assert project["parentId"] == runai.department("vision-dept")["id"]
            assert labels["runai/queue"] == vision
            assert labels["hopsworks.ai/runai-project-id"] == project["id"]
            await wait_until(lambda: runtime.state.namespaces[vision].runai_queue == vision, what="cache sees it")
            await wait_until(
                lambda: vision in (runtime.state.snapshot().runai_projects or {}), within=20, what="quota known"
            )
            await binding_settled(runtime, vision)  # its pods are admitted once the binding settled

            # A GPU notebook: mutation puts it in the Run:ai queue, validation admits it within quota.
            first = pod_review(vision, labels={"jupyter": "true"}, gpus=1, uid="nb-1")
            mutated = await admit("/mutate/pods", first)
            patched = apply_patch(first["request"]["object"], json.loads(base64.b64decode(mutated["patch"])))
            assert patched["metadata"]["labels"]["runai/queue"] == vision
            assert_valid_pod(patched)
            first["request"]["object"] = patched
            assert (await admit("/validate/pods", first))["allowed"] is True

            # The second one finds the GPU taken, by the reservation, before the pod cache shows it.
            second = pod_review(vision, labels={"jupyter": "true", "runai/queue": vision}, gpus=1, uid="nb-2")
            refused = await admit("/validate/pods", second)
            assert refused["allowed"] is False
            assert "0 of 1 deserved GPUs left" in refused["status"]["message"]
            # Jobs (pods of a batch Job) are never checked.
            job = pod_review(
                vision,
                labels={"job-name": "train", "runai/queue": vision, **admitted_labels("job")},
                gpus=4,
                uid="job-1",
                owners=owned_by("Job"),
            )
            assert (await admit("/validate/pods", job))["allowed"] is True

            # The GPU view, as a project member sees it; no token is 401.
            async with session.get(
                f"{base}/api/v1/projects/{vision}/gpu", headers={"Authorization": f"Bearer {alice_token}"}
            ) as resp:
                assert resp.status == 200, await resp.text()
                view = await resp.json()
            assert view["project"]["name"] == vision and view["project"]["quota"] == 1
            async with session.get(f"{base}/api/v1/projects/{vision}/gpu") as resp:
                assert resp.status == 401

            # Deleting the project namespace deletes the Run:ai project this system created, and the
            # namespace goes once the server has taken its finalizer off.
            await kube_scope.delete("v1", "Namespace", vision)
            await wait_until(lambda: runai.project(vision) is None, within=15, what="Run:ai project deleted")

            async def gone() -> bool:
                return await kube_scope.get("v1", "Namespace", vision) is None

            await eventually(gone, within_s=60, interval_s=0.2, message="namespace gone")
    finally:
        await runtime.shutdown()


async def test_with_several_runai_clusters_only_the_named_one_is_used(
    tmp_path: Path, kube_scope: KubeScope, runai: RunaiStandin
) -> None:
    east = runai.add_cluster("gpu-east")
    runai.add_node_pool("default", total_gpus=8, is_default=True, cluster_id=east)
    runai.add_department("default", cluster_id=east)
    secret_dir = tmp_path / "runai-secret"
    secret_dir.mkdir()
    (secret_dir / "clientSecret").write_text(SECRET)
    runtime, options, certs = await start_runtime(tmp_path, kube_scope, runai_secret_dir=secret_dir)
    try:
        async with apiserver_session(certs) as session:
            vision = await kube_scope.namespace("vision")
            # Two clusters and no name: nothing is bound, and the refusal (of the pod whose mutating
            # phase tries to bind its project) names the clusters.
            review = pod_review(vision, labels={"jupyter": "true"}, gpus=1, uid="nb-1")
            async with session.post(f"{base_url(options)}/mutate/pods", json=review) as resp:
                refused = (await resp.json())["response"]
            assert refused["allowed"] is False
            assert "gpu-east, hopsworks" in refused["status"]["message"], refused["status"]["message"]
            assert runai.projects == {}

            # The operator names this cluster; the change is followed without a restart.
            await kube_scope.patch(
                "v1", "ConfigMap", "hopsworks-cluster-settings", {"data": {"run_ai_cluster_name": "gpu-east"}},
                kube_scope.install_ns,
            )  # fmt: skip
            labels = await eventually(
                lambda: bound_labels(kube_scope, vision), within_s=15, message="vision bound in gpu-east"
            )
            project = runai.project(vision, cluster_id=east)
            assert project is not None
            assert project["parentId"] == runai.department("default", cluster_id=east)["id"]
            assert runai.project(vision) is None  # nothing in the other cluster
            assert labels["hopsworks.ai/runai-project-id"] == project["id"]
    finally:
        await runtime.shutdown()
