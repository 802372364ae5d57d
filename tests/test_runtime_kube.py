"""`serve` with no state folder: the real Runtime reads the cluster from the Kubernetes API.

The apiserver is the shared real control plane, read through a kubeconfig as the webhook's
ServiceAccount (tests/support/kube_scope.py); the test plays the apiserver's webhook client over
HTTPS (CA + service name, keep-alive).
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import settings_configmap
from tests.support.control_plane.fault_proxy import FaultProxy
from tests.support.fixtures import remote_calls
from tests.support.kube_scope import KubeScope, eventually
from tests.support.reviews import apply_patch, assert_valid_pod, pod_review
from tests.support.runtime import apiserver_session, base_url, start_runtime
from webhook.settings import SETTINGS_CONFIGMAP


async def test_serve_reads_the_cluster_from_the_api_and_follows_settings(tmp_path: Path, kube_scope: KubeScope) -> None:
    churn = await kube_scope.namespace("churn")
    bound = await kube_scope.namespace("bound", labels={"runai/queue": "bound"})
    await kube_scope.settings()
    runtime, options, certs = await start_runtime(tmp_path, kube_scope)
    base = base_url(options)
    try:
        async with apiserver_session(certs) as session:
            async with session.get(f"{base}/readyz") as resp:
                assert resp.status == 200, await resp.text()

            async def mutate(ns: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
                data = pod_review(ns)
                async with session.post(f"{base}/mutate/pods", json=data) as resp:
                    answer = await resp.json()
                response = answer["response"]
                patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
                return data, patch

            calls_before = remote_calls("kubernetes", "request")
            data, patch = await mutate(churn)
            patched = apply_patch(data["request"]["object"], patch)
            assert patched["spec"]["priorityClassName"] == "normal"
            assert_valid_pod(patched)

            # A settings change in the API reaches the next request through the watch.
            await kube_scope.settings(run_ai_enable=True)
            label_op = {"op": "add", "path": "/metadata/labels/runai~1queue", "value": "bound"}

            latest: list[list[dict[str, Any]]] = [[]]

            async def poll() -> None:
                for _ in range(200):
                    latest[0] = (await mutate(bound))[1]
                    if label_op in latest[0]:
                        return
                    await asyncio.sleep(0.02)

            await poll()
            assert label_op in latest[0]
            # The request path made no call to the API (other tests in this process may have).
            assert remote_calls("kubernetes", "request") == calls_before
    finally:
        await runtime.shutdown()


def stored_settings(case: str, install_ns: str) -> dict[str, Any]:
    if case == "kueue-and-runai":
        return settings_configmap(install_ns, run_ai_enable=True, kueue_installed=True)
    stored = settings_configmap(install_ns, run_ai_enable=True)
    stored["data"]["scheduler"] = {
        "5000-digit-number": "maxNodeSelectorTerms: " + "9" * 5_000,
        "deep-yaml": "available: " + "[" * 100_000,
    }[case]
    return stored


@pytest.mark.parametrize("case", ["kueue-and-runai", "5000-digit-number", "deep-yaml"])
async def test_stored_settings_that_cannot_be_used_never_stop_the_server(
    tmp_path: Path, kube_scope: KubeScope, case: str
) -> None:
    # Stored settings that cannot be used (a Kueue + Run:ai conflict, a 5,000-digit number, deep
    # YAML) leave the server ready on the defaults with the problem reported, and the settings
    # webhook, which fails closed, lets through the edit that repairs them.
    stored = await kube_scope.put(stored_settings(case, kube_scope.install_ns))
    runtime, options, certs = await start_runtime(tmp_path, kube_scope)
    base = base_url(options)
    try:
        assert runtime.state.ready()
        assert not runtime.state.settings.run_ai_enable and not runtime.state.settings.kueue_installed  # defaults
        async with apiserver_session(certs) as session:
            async with session.get(f"{base}/readyz") as resp:
                assert resp.status == 200
                problems = (await resp.json())["problems"]
            assert len(problems) == 1 and "settings ConfigMap refused" in problems[0]
            async with session.get(f"{base}/metrics") as resp:
                assert "webhook_settings_rejected 1.0" in await resp.text()

            fixed = settings_configmap(kube_scope.install_ns, run_ai_enable=True)  # what the admin writes to repair it
            edit = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": "fix-settings",
                    "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
                    "operation": "UPDATE",
                    "name": SETTINGS_CONFIGMAP,
                    "namespace": kube_scope.install_ns,
                    "userInfo": {"username": "platform-admin"},  # not an installer
                    "object": fixed,
                    "oldObject": stored,
                },
            }
            async with session.post(f"{base}/validate/settings", json=edit) as resp:
                response = (await resp.json())["response"]
            assert response["allowed"], response
        await kube_scope.put(fixed)
        await eventually(lambda: runtime.state.settings.run_ai_enable)
        assert runtime.state.snapshot().settings_error is None
    finally:
        await runtime.shutdown()


async def test_serve_listens_before_a_slow_first_list_and_is_ready_after_it(
    tmp_path: Path, kube_scope: KubeScope, fault_proxy: FaultProxy
) -> None:
    # The server listens at once, before its caches have listed, and /readyz says what it waits for
    # until the lists are done: a slow first list must not keep the probes unanswered.
    await kube_scope.settings()
    slow = fault_proxy.hang(verb="list", resource="pods")  # until released below
    kubeconfig = fault_proxy.via(kube_scope.kubeconfig)
    runtime, options, certs = await start_runtime(tmp_path, kube_scope, wait_ready_s=None, kubeconfig=kubeconfig)
    base = base_url(options)
    try:
        async with apiserver_session(certs) as session:
            async with session.get(f"{base}/healthz") as resp:
                assert resp.status == 200
            async with session.get(f"{base}/readyz") as resp:
                assert resp.status == 503
                # Other caches may still be listing too ("caches: GpuReservation, Pod"); the pods are held.
                waiting = (await resp.json())["waiting_for"]
                pending = {kind for w in waiting if w.startswith("caches:") for kind in w[7:].replace(",", " ").split()}
                assert "Pod" in pending, waiting
            slow.release()  # the list completes

            async def ready() -> bool:
                async with session.get(f"{base}/readyz") as resp:
                    return resp.status == 200

            for _ in range(400):
                if await ready():
                    break
                await asyncio.sleep(0.025)
            assert await ready()
    finally:
        await runtime.shutdown()
