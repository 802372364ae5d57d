"""Warn before enforce on the real control plane: with `gpu_quota_enforcement: warn` an over-quota
notebook is stored, kubectl prints the would-be refusal as a warning and the metric counts it;
switched to `enforce`, the next one is refused."""

from __future__ import annotations

import asyncio
import time

import pytest
import yaml

from tests.e2e.conftest import Cluster
from tests.e2e.test_kubectl import pod, quota_known_project

pytestmark = pytest.mark.slow


# The 503 a pod of a project bound moments ago gets while the binding settles on every replica:
# retryable, and the ReplicaSet controller or the platform tries again, as the loops below do.
SETTLING = "RunaiBindingSettling"


def gpu_notebook(name: str, namespace: str, gpus: int) -> str:
    notebook = pod(name, namespace)
    notebook["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return yaml.safe_dump(notebook)


async def test_warn_admits_and_counts_then_enforce_refuses(cluster: Cluster) -> None:
    local = cluster.needs_local("reads the replicas' metrics and needs the Run:ai stand-ins")
    project, _ = await quota_known_project(cluster, "warn")  # 2 deserved GPUs per new project

    try:
        await cluster.settings(gpu_quota_enforcement="warn")
        # Each replica reads the settings from its watch: until both have, the Service may send the
        # request to one that still refuses it. kubectl again, as a controller would.
        deadline = time.monotonic() + 20
        while True:
            warned = await cluster.kubectl("apply", "-f", "-", stdin=gpu_notebook("nb-warn", project, 3))
            if warned.rc == 0:
                break
            assert ("GpuQuotaExceeded" in warned.stderr or SETTLING in warned.stderr) and time.monotonic() < deadline, (
                str(warned)
            )
            await asyncio.sleep(0.3)
        assert (
            "Warning: admitted because gpu_quota_enforcement is warn; with enforce this is refused: " in warned.stderr
        )
        assert f"project {project} has 2 of 2 deserved GPUs left; this notebook asks for 3" in warned.stderr
        assert (await cluster.get("pod", "nb-warn", project))["metadata"]["labels"]["runai/queue"] == project
        counted = local.metric("webhook_would_refuse_total", rule="gpu-quota", project=project)
        assert sum(counted) == 1, counted

        await cluster.settings(gpu_quota_enforcement="enforce")
        # nb-warn holds 3 of the 2 deserved GPUs now: even one more is over the quota.
        deadline = time.monotonic() + 20
        while True:
            refused = await cluster.kubectl("apply", "-f", "-", stdin=gpu_notebook("nb-next", project, 1))
            if refused.rc != 0 and SETTLING not in refused.stderr:
                break
            assert time.monotonic() < deadline, "still admitted with enforce on"
            if refused.rc == 0:  # a replica still in warn
                await cluster.ok("delete", "pod", "nb-next", "-n", project, "--wait=false")
            await asyncio.sleep(0.3)
        assert refused.stderr.startswith("Error from server (GpuQuotaExceeded)"), str(refused)
        assert f"project {project} has 0 of 2 deserved GPUs left; this notebook asks for 1" in refused.stderr
    finally:
        await cluster.settings(gpu_quota_enforcement="enforce")
