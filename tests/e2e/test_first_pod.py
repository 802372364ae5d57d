"""S5 through the real apiserver: with Run:ai on, no pod of a project is stored unless its namespace
was bound before the pod's mutating phase and the pod carries `runai/queue`.

The real ReplicaSet controller creates the pods and retries the first, refused one; a watch opened
before `kubectl apply` sees every pod the apiserver stores in the namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from tests.e2e.conftest import Cluster, Obj
from tests.e2e.test_kubectl import IMAGE, MUTATE, turn_runai_on
from tests.support.runai_webhook import RUNAI_SCHEDULER
from webhook.core.scheduling import BINDING_SETTLE_S

pytestmark = pytest.mark.slow


@contextlib.asynccontextmanager
async def stored_pods(cluster: Cluster, namespace: str) -> AsyncIterator[list[Obj]]:
    """Every pod the apiserver stores in `namespace` while the block runs, as stored (a watch)."""
    proc = await asyncio.create_subprocess_exec(
        cluster.kubectl_bin, "--kubeconfig", str(cluster.kubeconfig), "get", "pods", "-n", namespace, "--watch",
        "--output-watch-events", "-o", "json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"HOME": str(cluster.home)},
    )  # fmt: skip
    seen: list[Obj] = []

    async def read() -> None:
        assert proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        while chunk := await proc.stdout.read(65536):
            buffer += chunk.decode()
            while buffer.strip():
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    break
                buffer = buffer.lstrip()[end:]
                if event.get("type") == "ADDED":
                    seen.append(event["object"])

    reader = asyncio.create_task(read())
    await asyncio.sleep(1.0)  # the watch is open before anything is created
    try:
        yield seen
    finally:
        await asyncio.sleep(1.0)
        proc.terminate()
        await proc.wait()
        await reader


def deployment(name: str, namespace: str, workload_type: str = "notebook") -> Obj:
    labels = {"app": name, "hopsworks.ai/workload-type": workload_type}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "main", "image": IMAGE}]}}},
    }  # fmt: skip


async def test_the_first_pod_of_an_unbound_project_is_stored_only_through_runai(cluster: Cluster) -> None:
    await turn_runai_on(cluster)
    local = cluster.needs_local("needs the Run:ai stand-ins")
    project = await cluster.project("first")
    async with stored_pods(cluster, project) as seen:
        await cluster.apply(deployment("nb", project))
        pods = await cluster.eventually(lambda: cluster.list("pods", project, "-l", "app=nb"), "the pod stored", 60)
    (stored,) = pods
    assert stored["metadata"]["labels"]["runai/queue"] == project
    assert stored["spec"]["schedulerName"] == RUNAI_SCHEDULER, "Run:ai's webhook did not see the pod"
    # Every pod ever stored there went through both webhooks: none without the queue.
    assert seen, "the watch saw nothing"
    for obj in seen:
        assert obj["metadata"]["labels"].get("runai/queue") == project, obj["metadata"]
        assert obj["spec"]["schedulerName"] == RUNAI_SCHEDULER, obj["metadata"]["name"]
    assert (await cluster.get("namespace", project))["metadata"]["labels"]["runai/queue"] == project
    assert [p["name"] for p in local.runai.projects.values()].count(project) == 1
    # The controller's refused attempts are in its events: the first pod was held back, not lost.
    events = await cluster.list("events", project, "--field-selector", "reason=FailedCreate")
    messages = " ".join(e["message"] for e in events)
    if events:  # bound by the leader's pass a moment before the first pod: nothing to refuse
        assert f'admission webhook "{MUTATE}" denied the request' in messages, messages
        assert f"project namespace {project}" in messages, messages


async def test_a_dry_run_in_an_unbound_project_binds_nothing(cluster: Cluster) -> None:
    await turn_runai_on(cluster)
    local = cluster.needs_local("needs the Run:ai stand-ins")
    local.hold_leadership_elsewhere()  # no reconcile pass: only admission could bind
    try:
        project = await cluster.project("dry")
        stderr = await cluster.refused("run", "nb", "-n", project, f"--image={IMAGE}", "--dry-run=server")
        assert f'admission webhook "{MUTATE}" denied the request' in stderr, stderr
        assert "not bound to a Run:ai project yet" in stderr, stderr
        assert "runai/queue" not in (await cluster.get("namespace", project))["metadata"].get("labels", {})
        assert [p for p in local.runai.projects.values() if p["name"] == project] == []
        assert await cluster.list("pods", project) == []
    finally:
        local.release_leadership()


async def test_a_pod_of_a_bound_project_passes_both_webhooks_at_once(cluster: Cluster) -> None:
    await turn_runai_on(cluster)
    local = cluster.needs_local("needs the Run:ai stand-ins")
    project = await cluster.project("bound")

    async def bound() -> bool:
        return "runai/queue" in (await cluster.get("namespace", project))["metadata"].get("labels", {})

    await cluster.eventually(bound, f"{project} bound by the leader's pass")
    await asyncio.sleep(BINDING_SETTLE_S + 1)  # settled in both replicas' caches and the apiserver's
    await cluster.ok("run", "nb", "-n", project, f"--image={IMAGE}", "--labels=hopsworks.ai/workload-type=notebook")
    stored = await cluster.get("pod", "nb", project)
    assert stored["metadata"]["labels"]["runai/queue"] == project
    assert stored["spec"]["schedulerName"] == RUNAI_SCHEDULER
    seen = local.runai_admission.pods_seen(project)
    assert [p["metadata"]["labels"].get("runai/queue") for p in seen] == [project], seen
