"""`serve` with no state folder: the real Runtime reads the cluster from the Kubernetes API.

The apiserver is the stateful emulator reached through a kubeconfig; the test plays the apiserver's
webhook client over HTTPS (CA + service name, keep-alive).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import namespace, priority_class, settings_configmap
from tests.support.kube_emulator import KubeEmulator
from tests.support.reviews import apply_patch, assert_valid_pod, pod_review
from tests.support.runtime import TOKEN, apiserver_session, base_url, start_runtime
from webhook.app import StartupError
from webhook.metrics import REGISTRY


def request_path_calls() -> float:
    return REGISTRY.get_sample_value("webhook_remote_calls_total", {"target": "kubernetes", "path": "request"}) or 0.0


@pytest.fixture
async def emulator() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator(token=TOKEN) as emu:
        for obj in (
            namespace("hopsworks", project=False),
            namespace("churn"),
            namespace("bound", labels={"runai/queue": "bound"}),
            priority_class("low", 1000, "Never"),
            priority_class("normal", 10000),
            priority_class("high", 100000),
            settings_configmap(),
        ):
            emu.create_object(obj)
        yield emu


async def test_serve_reads_the_cluster_from_the_api_and_follows_settings(
    tmp_path: Path, emulator: KubeEmulator
) -> None:
    runtime, options, certs = await start_runtime(tmp_path, emulator)
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

            calls_before = request_path_calls()
            data, patch = await mutate("churn")
            patched = apply_patch(data["request"]["object"], patch)
            assert patched["spec"]["priorityClassName"] == "normal"
            assert_valid_pod(patched)

            # A settings change in the API reaches the next request through the watch.
            emulator.put_object(settings_configmap(run_ai_enable=True))
            label_op = {"op": "add", "path": "/metadata/labels/runai~1queue", "value": "bound"}

            latest: list[list[dict[str, Any]]] = [[]]

            async def poll() -> None:
                for _ in range(200):
                    latest[0] = (await mutate("bound"))[1]
                    if label_op in latest[0]:
                        return
                    await asyncio.sleep(0.02)

            await poll()
            assert label_op in latest[0]
            # The request path made no call to the API (other tests in this process may have).
            assert request_path_calls() == calls_before
    finally:
        await runtime.shutdown()


async def test_serve_refuses_to_start_with_kueue_and_runai_both_on(tmp_path: Path, emulator: KubeEmulator) -> None:
    emulator.put_object(settings_configmap(run_ai_enable=True, kueue_installed=True))
    with pytest.raises(StartupError, match="cannot both be true"):
        runtime, _, _ = await start_runtime(tmp_path, emulator)
        await runtime.shutdown()
