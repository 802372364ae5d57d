"""Run:ai's own admission Deployments, watched: scaled to 0 on the real cluster, the metric and the
admin view say so on both replicas; back up, they clear."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import Cluster, Obj
from tests.e2e.test_kubectl import IMAGE, turn_runai_on

pytestmark = pytest.mark.slow
RUNAI_NS = "runai"
DEPLOYMENTS = ("runai-admission-controller", "admission")


def deployment(name: str) -> Obj:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": RUNAI_NS},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "main", "image": IMAGE}]}}},
    }  # fmt: skip


async def admin_view(cluster: Cluster, token: str) -> Any:
    """GET /api/v1/admin/runai as an admin: the real TokenReview and SubjectAccessReview behind it."""
    local = cluster.needs_local("calls the replicas on the Service's address")
    ctx = ssl.create_default_context(cafile=str(local.dir / "ca.crt"))
    ctx.check_hostname = False  # the certificate names the Service, not its address
    async with aiohttp.ClientSession() as session:
        url = f"https://{local.service_ip}:443/api/v1/admin/runai"
        async with session.get(url, ssl=ctx, headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()


def codes(view: Any) -> list[str]:
    return [w["code"] for w in view.get("warnings") or []]


async def test_runai_admission_scaled_to_zero_shows_in_the_metric_and_the_admin_view(cluster: Cluster) -> None:
    local = cluster.needs_local("reads the replicas' metrics")
    await turn_runai_on(cluster)
    await cluster.apply(*(deployment(name) for name in DEPLOYMENTS))
    # An admin of the platform: a ServiceAccount bound to cluster-admin, with a TokenRequest token.
    admins = await cluster.plain_namespace("admins")
    await cluster.ok("create", "serviceaccount", "platform-admin", "-n", admins)
    await cluster.ok("create", "clusterrolebinding", f"{admins}-admin", "--clusterrole=cluster-admin",
                     f"--serviceaccount={admins}:platform-admin")  # fmt: skip
    token = (await cluster.ok("create", "token", "platform-admin", "-n", admins)).strip()

    def available(name: str) -> list[float]:
        return local.metric("webhook_runai_admission_available", deployment=name)

    try:
        for name in DEPLOYMENTS:  # kwok runs their pods: available on both replicas
            await cluster.eventually(lambda n=name: available(n) == [1.0, 1.0], f"{name} available", 60)
        assert "RUN_AI_ADMISSION_DOWN" not in codes(await admin_view(cluster, token))

        await cluster.ok("scale", "deployment", "admission", "-n", RUNAI_NS, "--replicas=0")
        await cluster.eventually(lambda: available("admission") == [0.0, 0.0], "admission unavailable", 60)
        assert available("runai-admission-controller") == [1.0, 1.0]
        view = await cluster.eventually(lambda: _down_view(cluster, token), "the admin view's warning", 30)
        warning = next(w for w in view["warnings"] if w["code"] == "RUN_AI_ADMISSION_DOWN")
        # Scaled to 0 is down whatever the pods still terminating: "N of 0 replicas available".
        assert re.search(r"admission has \d+ of 0 replicas available", warning["message"]), json.dumps(warning)

        await cluster.ok("scale", "deployment", "admission", "-n", RUNAI_NS, "--replicas=1")
        await cluster.eventually(lambda: available("admission") == [1.0, 1.0], "admission available again", 60)
        assert "RUN_AI_ADMISSION_DOWN" not in codes(await admin_view(cluster, token))
    finally:
        await cluster.kubectl("delete", "deployment", *DEPLOYMENTS, "-n", RUNAI_NS, "--ignore-not-found")
        await cluster.kubectl("delete", "clusterrolebinding", f"{admins}-admin", "--ignore-not-found")


async def _down_view(cluster: Cluster, token: str) -> Any:
    view = await admin_view(cluster, token)
    return view if "RUN_AI_ADMISSION_DOWN" in codes(view) else None


async def test_fractional_gpu_requests_reach_runai_and_a_bad_one_is_refused_with_our_reason(cluster: Cluster) -> None:
    """KAI's admission cannot be built here (the module proxy refuses it: hack/peers/kai/README.md);
    what reaches Run:ai's webhook is checked against the same grammar (core/gpu_sharing.py)."""
    local = cluster.needs_local("needs the Run:ai stand-ins")
    await turn_runai_on(cluster)
    project = await cluster.project("frac")

    async def bound() -> bool:
        return "runai/queue" in (await cluster.get("namespace", project))["metadata"].get("labels", {})

    await cluster.eventually(bound, f"{project} bound")
    await asyncio.sleep(2)  # the binding settled everywhere
    good = ["run", "nb", "-n", project, f"--image={IMAGE}", "--labels=hopsworks.ai/workload-type=notebook",
            "--annotations=gpu-fraction=0.5"]  # fmt: skip
    result = await cluster.kubectl(*good)
    while result.rc != 0 and "again" in result.stderr:  # a retryable refusal while the directory refreshes
        await asyncio.sleep(0.5)
        result = await cluster.kubectl(*good)
    assert result.rc == 0, str(result)
    stored = await cluster.get("pod", "nb", project)
    assert stored["metadata"]["annotations"]["gpu-fraction"] == "0.5"
    assert stored["metadata"]["labels"]["kai.scheduler/preemptibility"] == "non-preemptible"
    assert [p["metadata"]["name"] for p in local.runai_admission.pods_seen(project)] == ["nb"]
    # A fraction of 1 is whole GPUs, which KAI refuses: ours refuses it first, with the reason.
    whole = ["--labels=hopsworks.ai/workload-type=notebook", "--annotations=gpu-fraction=1"]
    stderr = await cluster.refused("run", "nb2", "-n", project, f"--image={IMAGE}", *whole)
    assert "gpu-fraction" in stderr and "denied the request" in stderr, stderr
    assert [p["metadata"]["name"] for p in local.runai_admission.pods_seen(project)] == ["nb"]
