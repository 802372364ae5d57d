"""A project namespace whose first pod arrives before this replica's watch shows the namespace:
never admitted unmutated, on either pod webhook, on either replica.

Two real Runtimes against the shared real control plane, each through the test's fault proxy,
which holds the namespace watches back (the apiserver has the namespace; the replicas' watches
lag), Kueue's CRDs for the Job's case, and the spec-checked Run:ai stand-in, driven over HTTPS as the apiserver does.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import kueue_setup, local_queue, runai_settings_configmap, settings_configmap
from tests.support.control_plane.fault_proxy import FaultProxy
from tests.support.https import wait_until
from tests.support.kube_scope import KubeScope, SharedCluster
from tests.support.kueue_crds import kueue_crds
from tests.support.reviews import pod_review
from tests.support.runai_standin import RunaiStandin
from tests.support.runtime import ServedRuntime, apiserver_session, binding_settled, start_runtime
from webhook.snapshot import RUNAI_PROJECT_ID_LABEL, RUNAI_QUEUE_LABEL

SECRET = "unseen-namespace-secret"
CONCURRENT = 8  # reviews sent at once to each replica for the one new namespace


@dataclass
class Replica(ServedRuntime):
    def knows(self, name: str) -> bool:
        return name in self.runtime.state.namespaces


@dataclass
class Env:
    scope: KubeScope
    proxy: FaultProxy
    runai: RunaiStandin
    replicas: list[Replica]

    def namespace_reads(self, name: str) -> int:
        return len(self.proxy.calls(verb="get", resource="namespaces", name=name))


async def _replicas(scope: KubeScope, proxy: FaultProxy, tmp_path: Path, count: int = 2) -> list[Replica]:
    secret_dir = tmp_path / "runai-secret"
    secret_dir.mkdir(exist_ok=True)
    (secret_dir / "clientSecret").write_text(SECRET)
    out = []
    for name in ("a", "b")[:count]:
        home = tmp_path / name
        home.mkdir()
        runtime, options, certs = await start_runtime(
            home, scope, kubeconfig=proxy.via(scope.kubeconfig), runai_secret_dir=secret_dir
        )
        out.append(Replica(runtime, options, apiserver_session(certs)))
    return out


@pytest.fixture
async def env(tmp_path: Path, kube_scope: KubeScope, fault_proxy: FaultProxy) -> AsyncIterator[Env]:
    async with RunaiStandin(client_secret=SECRET) as runai:
        await kube_scope.put(settings_configmap(kube_scope.install_ns))
        replicas = await _replicas(kube_scope, fault_proxy, tmp_path)
        try:
            for replica in replicas:
                await wait_until(replica.runtime.state.ready, within=30, what="caches listed")
            yield Env(kube_scope, fault_proxy, runai, replicas)
        finally:
            fault_proxy.release_watches("namespaces")
            for replica in replicas:
                await replica.session.close()
                await replica.runtime.shutdown()
        assert runai.violations == [], runai.violations


def _patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    raw = response.get("patch")
    return json.loads(base64.b64decode(raw)) if raw else []


def _paths(response: dict[str, Any]) -> set[str]:
    return {op["path"] for op in _patch(response)}


async def test_first_pods_of_an_unseen_namespace_get_the_scheduling_on_both_replicas(env: Env) -> None:
    env.proxy.hold_watches("namespaces")
    fresh = await env.scope.namespace("fresh")
    assert not any(r.knows(fresh) for r in env.replicas)  # the watches are held back

    for index, replica in enumerate(env.replicas):
        answers = await asyncio.gather(
            *(replica.review("/mutate/pods", pod_review(fresh, uid=f"m-{index}-{i}")) for i in range(CONCURRENT))
        )
        for answer in answers:
            assert answer["allowed"], answer
            # The project's scheduling: its default priority class and node affinity, not "no patch".
            assert {"/spec/priorityClassName", "/spec/affinity"} <= _paths(answer), answer
            assert answer["auditAnnotations"]["priority-class"] == "normal"
        assert replica.knows(fresh)
    # One read per replica, shared by its concurrent reviews.
    assert env.namespace_reads(fresh) == len(env.replicas)


async def test_a_namespace_that_cannot_be_read_refuses_its_pods_with_a_retryable_503(env: Env) -> None:
    env.proxy.hold_watches("namespaces")
    unread = await env.scope.namespace("unread")
    for replica in env.replicas:
        for path in ("/mutate/pods", "/validate/pods"):
            failed = env.proxy.fail(500, n=1, verb="get", resource="namespaces", name=unread)
            answer = await replica.review(path, pod_review(unread, uid=f"{path}-{id(replica)}"))
            assert failed.hits == 1
            assert not answer["allowed"], (path, answer)
            assert answer["status"]["code"] == 503 and answer["status"]["reason"] == "NamespaceNotKnownHere", answer
            assert unread in answer["status"]["message"] and "Try again" in answer["status"]["message"]
            assert not replica.knows(unread)


async def test_with_runai_on_an_unseen_bound_namespace_is_decided_by_both_webhooks_on_both_replicas(
    env: Env,
) -> None:
    gpus, quota = env.scope.name("gpus"), env.scope.name("quota")
    projects = {name: env.runai.add_project(name, namespace=name, gpu_quota=1) for name in (gpus, quota)}
    await env.scope.put(
        runai_settings_configmap(env.runai, env.scope.install_ns, run_ai_directory_refresh_s=600,
                                 run_ai_reconcile_interval_s=300)
    )  # fmt: skip
    await wait_until(
        lambda: all(r.runtime.state.settings.run_ai_enable for r in env.replicas), within=10, what="Run:ai on"
    )
    env.proxy.hold_watches("namespaces")
    for name, project in projects.items():
        await env.scope.namespace(
            name.removesuffix(f"-{env.scope.id}"),
            labels={RUNAI_QUEUE_LABEL: name, RUNAI_PROJECT_ID_LABEL: project["id"]},
        )

    notebook = {"jupyter": "true"}
    for index, replica in enumerate(env.replicas):
        first = await replica.review("/mutate/pods", pod_review(gpus, labels=notebook, uid=f"first-{index}"))
        # Known now, and bound: held back only while the binding settles, never admitted without its queue.
        assert first["allowed"] or first["status"]["reason"] == "RunaiBindingSettling", first
        await binding_settled(replica.runtime, gpus)
        mutated = await replica.review("/mutate/pods", pod_review(gpus, labels=notebook, uid=f"again-{index}"))
        assert mutated["allowed"], mutated
        assert mutated["auditAnnotations"]["runai-queue"] == gpus, mutated

        # /validate/pods first: the quota of the project it reads is checked, not skipped.
        labelled = {**notebook, RUNAI_QUEUE_LABEL: quota}
        over = await replica.review("/validate/pods", pod_review(quota, labels=labelled, gpus=2, uid=f"over-{index}"))
        assert not over["allowed"] and over["status"]["reason"] == "GpuQuotaExceeded", over
        assert replica.knows(quota)
    assert not any(r.runtime.state.namespaces[gpus].moving for r in env.replicas)


@pytest.fixture
def kueue(shared_control_plane: SharedCluster) -> Iterator[None]:
    """Kueue's CRDs, installed before the replicas start (they look for Kueue once a minute)."""
    with kueue_crds(shared_control_plane.cp):
        yield


async def test_with_kueue_on_a_job_of_an_unseen_namespace_still_gets_its_queue(kueue: None, env: Env) -> None:
    # A Job passed as no project's would run outside Kueue's quota: its namespace is read too.
    await env.scope.put(settings_configmap(env.scope.install_ns, kueue_installed=True))
    for obj in kueue_setup():
        obj.pop("status", None)  # a ClusterQueue's status is Kueue's to write
        if obj["kind"] == "ResourceFlavor":
            obj["spec"]["nodeLabels"] = {"type": "kwok"}  # Kueue requires some with a topology
        await env.scope.create(obj)
    await wait_until(lambda: all(r.runtime.state.settings.kueue_installed for r in env.replicas), within=10,
                     what="Kueue on")  # fmt: skip
    env.proxy.hold_watches("namespaces")
    batch = await env.scope.namespace("batch")
    await env.scope.create(local_queue(batch, "default"))
    await wait_until(lambda: all(batch in r.runtime.state.local_queue_info for r in env.replicas), within=30,
                     what="the LocalQueue cached")  # fmt: skip
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": batch},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "x"}]}}},
    }
    request = {"uid": "job-1", "kind": {"group": "batch", "version": "v1", "kind": "Job"},
               "resource": {"group": "batch", "version": "v1", "resource": "jobs"}, "namespace": batch,
               "name": "train", "operation": "CREATE", "object": job}  # fmt: skip
    for replica in env.replicas:
        assert not replica.knows(batch)
        answer = await replica.review(
            "/mutate/workloads",
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request},
        )
        assert answer["allowed"], answer
        paths = _paths(answer)
        assert "/metadata/labels" in paths or "/metadata/labels/kueue.x-k8s.io~1queue-name" in paths
        assert answer["auditAnnotations"]["queue"] == "default"
        assert replica.knows(batch)
