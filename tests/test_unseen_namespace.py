"""A project namespace whose first pod arrives before this replica's watch shows the namespace
(issue 21, item 5): never admitted unmutated, on either pod webhook, on either replica.

Two real Runtimes against one Kubernetes API emulator whose namespace watch is held back (the
apiserver has the namespace; the replicas' watches lag), and the spec-checked Run:ai stand-in,
driven over HTTPS as the apiserver does.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import (
    kueue_setup,
    local_queue,
    namespace,
    priority_class,
    runai_admission_objects,
    runai_settings_configmap,
    settings_configmap,
)
from tests.support.https import wait_until
from tests.support.kube_emulator import KubeEmulator
from tests.support.reviews import pod_review
from tests.support.runai_standin import RunaiStandin
from tests.support.runtime import TOKEN, ServedRuntime, apiserver_session, start_runtime
from webhook.snapshot import RUNAI_PROJECT_ID_LABEL, RUNAI_QUEUE_LABEL

SECRET = "unseen-namespace-secret"
INSTALL_NS = "hopsworks"
CONCURRENT = 8  # reviews sent at once to each replica for the one new namespace


@dataclass
class Replica(ServedRuntime):
    def knows(self, name: str) -> bool:
        return name in self.runtime.state.namespaces


@dataclass
class Env:
    emu: KubeEmulator
    runai: RunaiStandin
    replicas: list[Replica]

    def namespace_reads(self, name: str) -> int:
        return len([r for r in self.emu.calls("GET", f"/api/v1/namespaces/{name}") if r.path.endswith(name)])


async def _replicas(emu: KubeEmulator, tmp_path: Path, count: int = 2) -> list[Replica]:
    secret_dir = tmp_path / "runai-secret"
    secret_dir.mkdir(exist_ok=True)
    (secret_dir / "clientSecret").write_text(SECRET)
    out = []
    for name in ("a", "b")[:count]:
        home = tmp_path / name
        home.mkdir()
        runtime, options, certs = await start_runtime(home, emu, runai_secret_dir=secret_dir)
        out.append(Replica(runtime, options, apiserver_session(certs)))
    return out


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with KubeEmulator(token=TOKEN) as emu, RunaiStandin(client_secret=SECRET) as runai:
        for obj in (namespace(INSTALL_NS, project=False), priority_class("normal", 10000), *runai_admission_objects()):
            emu.create_object(obj)
        emu.allow("webhook", "*", "*")
        emu.put_object(settings_configmap(INSTALL_NS))
        replicas = await _replicas(emu, tmp_path)
        try:
            yield Env(emu, runai, replicas)
        finally:
            emu.release_watch_events("Namespace")
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
    env.emu.hold_watch_events("Namespace")
    env.emu.create_object(namespace("fresh"))
    assert not any(r.knows("fresh") for r in env.replicas)  # the watches are held back

    for index, replica in enumerate(env.replicas):
        answers = await asyncio.gather(
            *(replica.review("/mutate/pods", pod_review("fresh", uid=f"m-{index}-{i}")) for i in range(CONCURRENT))
        )
        for answer in answers:
            assert answer["allowed"], answer
            # The project's scheduling: its default priority class and node affinity, not "no patch".
            assert {"/spec/priorityClassName", "/spec/affinity"} <= _paths(answer), answer
            assert answer["auditAnnotations"]["priority-class"] == "normal"
        assert replica.knows("fresh")
    # One read per replica, shared by its concurrent reviews.
    assert env.namespace_reads("fresh") == len(env.replicas)


async def test_a_namespace_that_cannot_be_read_refuses_its_pods_with_a_retryable_503(env: Env) -> None:
    env.emu.hold_watch_events("Namespace")
    env.emu.create_object(namespace("unread"))
    for replica in env.replicas:
        for path in ("/mutate/pods", "/validate/pods"):
            env.emu.fail_next(1, 500, path_prefix="/api/v1/namespaces/unread", method="GET")
            answer = await replica.review(path, pod_review("unread", uid=f"{path}-{id(replica)}"))
            assert not answer["allowed"], (path, answer)
            assert answer["status"]["code"] == 503 and answer["status"]["reason"] == "NamespaceNotKnownHere", answer
            assert "unread" in answer["status"]["message"] and "Try again" in answer["status"]["message"]
            assert not replica.knows("unread")


async def test_with_runai_on_an_unseen_bound_namespace_is_decided_by_both_webhooks_on_both_replicas(
    env: Env,
) -> None:
    projects = {name: env.runai.add_project(name, namespace=name, gpu_quota=1) for name in ("gpus", "quota")}
    env.emu.put_object(
        runai_settings_configmap(env.runai, INSTALL_NS, run_ai_directory_refresh_s=600, run_ai_reconcile_interval_s=300)
    )
    await wait_until(
        lambda: all(r.runtime.state.settings.run_ai_enable for r in env.replicas), within=10, what="Run:ai on"
    )
    env.emu.hold_watch_events("Namespace")
    for name, project in projects.items():
        env.emu.create_object(namespace(name, labels={RUNAI_QUEUE_LABEL: name, RUNAI_PROJECT_ID_LABEL: project["id"]}))

    notebook = {"jupyter": "true"}
    for index, replica in enumerate(env.replicas):
        first = await replica.review("/mutate/pods", pod_review("gpus", labels=notebook, uid=f"first-{index}"))
        # Known now, and bound: held back only while the binding settles, never admitted without its queue.
        assert first["allowed"] or first["status"]["reason"] == "RunaiBindingSettling", first
        await asyncio.sleep(1.1)
        mutated = await replica.review("/mutate/pods", pod_review("gpus", labels=notebook, uid=f"again-{index}"))
        assert mutated["allowed"], mutated
        assert mutated["auditAnnotations"]["runai-queue"] == "gpus", mutated

        # /validate/pods first: the quota of the project it reads is checked, not skipped.
        labelled = {**notebook, RUNAI_QUEUE_LABEL: "quota"}
        over = await replica.review("/validate/pods", pod_review("quota", labels=labelled, gpus=2, uid=f"over-{index}"))
        assert not over["allowed"] and over["status"]["reason"] == "GpuQuotaExceeded", over
        assert replica.knows("quota")
    assert not any(r.runtime.state.namespaces["gpus"].moving for r in env.replicas)


async def test_with_kueue_on_a_job_of_an_unseen_namespace_still_gets_its_queue(env: Env) -> None:
    # A Job passed as no project's would run outside Kueue's quota: its namespace is read too.
    env.emu.put_object(settings_configmap(INSTALL_NS, kueue_installed=True))
    for obj in kueue_setup():
        env.emu.create_object(obj)
    await wait_until(lambda: all(r.runtime.state.settings.kueue_installed for r in env.replicas), within=10,
                     what="Kueue on")  # fmt: skip
    env.emu.hold_watch_events("Namespace")
    env.emu.create_object(namespace("batch"))
    env.emu.create_object(local_queue("batch", "default"))
    await wait_until(lambda: all("batch" in r.runtime.state.local_queue_info for r in env.replicas), within=10,
                     what="the LocalQueue cached")  # fmt: skip
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "batch"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "x"}]}}},
    }
    request = {"uid": "job-1", "kind": {"group": "batch", "version": "v1", "kind": "Job"},
               "resource": {"group": "batch", "version": "v1", "resource": "jobs"}, "namespace": "batch",
               "name": "train", "operation": "CREATE", "object": job}  # fmt: skip
    for replica in env.replicas:
        assert not replica.knows("batch")
        answer = await replica.review(
            "/mutate/workloads", {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        )
        assert answer["allowed"], answer
        assert "/metadata/labels" in _paths(answer) or "/metadata/labels/kueue.x-k8s.io~1queue-name" in _paths(answer)
        assert answer["auditAnnotations"]["queue"] == "default"
        assert replica.knows("batch")
