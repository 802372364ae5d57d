"""A project namespace and a GPU Deployment in one `kubectl apply`, on the real control plane: the
quota the product will give the project (`run_ai_project_gpu_quota`) is known before the binding
lands, so an over-quota Deployment is refused at apply time, as it is once the project is bound,
rather than stored to have its ReplicaSet retry a refused pod for as long as it exists."""

from __future__ import annotations

import uuid

import pytest
import yaml

from tests.e2e.conftest import Cluster
from tests.e2e.test_kubectl import gpu_deployment, turn_runai_on

pytestmark = pytest.mark.slow


async def test_a_deployment_applied_with_its_new_project_is_judged_at_apply(cluster: Cluster) -> None:
    await turn_runai_on(cluster)  # run_ai_project_gpu_quota: 2
    name = f"fresh-{uuid.uuid4().hex[:6]}"
    cluster.namespaces.append(name)  # deleted after the test
    project = {"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": name, "labels": {"hopsworks.ai/project": name}}}  # fmt: skip
    stderr = await cluster.refused(
        "apply", "-f", "-", stdin=yaml.safe_dump_all([project, gpu_deployment("m", name, 3)])
    )
    assert "Error from server (GpuQuotaExceeded)" in stderr, stderr
    assert 'admission webhook "validate-workloads.scheduling.hopsworks.ai" denied the request' in stderr, stderr
    assert f"project {name} has 2 of 2 deserved GPUs left; Deployment m (deployment) asks for 3" in stderr, stderr
    assert (await cluster.get("namespace", name))["metadata"]["name"] == name  # the namespace itself is stored
    # Within the quota, the same apply stores the Deployment.
    await cluster.apply(project, gpu_deployment("m", name, 2))
