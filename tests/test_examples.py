"""The requests shipped in examples/requests/, answered by the app against examples/cluster.

In-process through pytest-aiohttp's `aiohttp_client` (plain HTTP on loopback): these are route and
handler tests, so the transport adds nothing here; tests/test_server.py, test_tls.py and
test_lifecycle.py keep real HTTPS with certificate and hostname checks. None of this needs ../shared,
so a clone on its own runs it: the README's examples keep working there too.
"""

from __future__ import annotations

import base64
import copy
import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient

from tests.support.apps import cache_app
from tests.support.reviews import apply_patch, assert_valid_pod
from webhook.state.folder import load_into
from webhook.state.store import ClusterState

ROOT = Path(__file__).resolve().parents[1]
REQUESTS = ROOT / "examples" / "requests"
CLUSTER = ROOT / "examples" / "cluster"

ClientFactory = Callable[..., Awaitable[TestClient[Any, Any]]]


def example(name: str) -> dict[str, Any]:
    return json.loads((REQUESTS / name).read_text())


def example_state(folder: Path = CLUSTER) -> ClusterState:
    """A cluster folder as `make run` reads it."""
    state = ClusterState("hopsworks")
    load_into(state, folder)
    return state


def with_settings(tmp_path: Path, **flat: str) -> Path:
    """A copy of examples/cluster with flat settings changed, as a user editing 20-settings.yaml would."""
    folder = tmp_path / "cluster"
    shutil.copytree(CLUSTER, folder)
    settings = folder / "20-settings.yaml"
    doc = yaml.safe_load(settings.read_text())
    doc["data"].update(flat)
    settings.write_text(yaml.safe_dump(doc))
    return folder


async def ask(client: TestClient[Any, Any], path: str, review: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(path, json=review)
    assert resp.status == 200, await resp.text()  # a refusal too: the decision is in the body
    answer = await resp.json()
    assert answer["response"]["uid"] == review["request"]["uid"]
    return answer["response"]


def patched(review: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    pod = apply_patch(review["request"]["object"], json.loads(base64.b64decode(response["patch"])))
    assert_valid_pod(pod)
    return pod


@pytest.fixture
async def client(aiohttp_client: ClientFactory) -> TestClient[Any, Any]:
    return await aiohttp_client(cache_app(example_state()))


def test_every_shipped_request_is_a_json_admission_review() -> None:
    names = sorted(p.name for p in REQUESTS.glob("*.json"))
    assert names == [
        "gpu-notebook-patched.json",
        "gpu-notebook.json",
        "kueue-pod.json",
        "notebook-zone.json",
        "refused-priority.json",
    ]
    for name in names:
        review = example(name)
        assert review["kind"] == "AdmissionReview" and review["request"]["operation"] == "CREATE", name


async def test_readme_example_is_patched_with_zone_priority_and_anti_affinity(client: TestClient[Any, Any]) -> None:
    review = example("notebook-zone.json")
    response = await ask(client, "/mutate/pods", review)
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    assert response["auditAnnotations"] == {
        "affinity": "topology.kubernetes.io/zone=eu-1a",
        "anti-affinity": "maintenance=true",
        "priority-class": "hopsworks-normal",
        "runai-queue": "churn",
        "runai-preemptibility": "non-preemptible",  # examples/cluster has Run:ai on and churn bound
    }
    pod = patched(review, response)
    assert pod["spec"]["priorityClassName"] == "hopsworks-normal" and pod["spec"]["priority"] == 10000


async def test_a_refusal_is_http_200_with_allowed_false_and_a_code(client: TestClient[Any, Any]) -> None:
    response = await ask(client, "/mutate/pods", example("refused-priority.json"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403 and response["status"]["reason"] == "Forbidden"
    assert "allowed: hopsworks-low, hopsworks-normal" in response["status"]["message"]


async def test_gpu_notebook_gets_the_project_defaults_and_passes_validation(client: TestClient[Any, Any]) -> None:
    review = example("gpu-notebook.json")
    mutated = await ask(client, "/mutate/pods", review)
    assert mutated["auditAnnotations"]["priority-class"] == "hopsworks-high"  # fraud-detection's own default
    assert mutated["auditAnnotations"]["affinity"] == "nvidia.com/gpu.product=A100"
    pod = patched(review, mutated)
    # What the apiserver sends the validating webhook is the patched pod: shipped, for the README's
    # readers to send, and kept the mutation's exact result here.
    second = example("gpu-notebook-patched.json")
    assert second["request"]["object"] == pod
    assert {k: v for k, v in second["request"].items() if k not in ("uid", "object")} == {
        k: v for k, v in review["request"].items() if k not in ("uid", "object")
    }
    validated = await ask(client, "/validate/pods", second)
    # Folder mode has no Run:ai control plane to check the quota against: allowed, and it says so.
    assert validated["allowed"] is True
    assert any("GPU quota not checked" in w for w in validated["warnings"]), validated


async def test_kueue_pod_gets_the_runai_queue_while_runai_is_on(client: TestClient[Any, Any]) -> None:
    review = example("kueue-pod.json")
    response = await ask(client, "/mutate/pods", review)
    assert response["allowed"] is True and response["auditAnnotations"]["runai-queue"] == "churn"
    pod = patched(review, response)
    assert "kueue.x-k8s.io/podset-required-topology" not in pod["metadata"].get("annotations", {})


async def test_kueue_pod_gets_its_queue_and_topology_with_kueue_on(
    aiohttp_client: ClientFactory, tmp_path: Path
) -> None:
    kueue_on = with_settings(tmp_path, kueue_installed="true", run_ai_enable="false")
    client = await aiohttp_client(cache_app(example_state(kueue_on)))
    review = example("kueue-pod.json")
    response = await ask(client, "/mutate/pods", copy.deepcopy(review))
    assert response["allowed"] is True and not response.get("warnings")
    pod = patched(review, response)
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] == "topology.kubernetes.io/zone"


async def test_bad_bodies_get_4xx_with_a_reason(client: TestClient[Any, Any]) -> None:
    wrong_type = await client.post("/mutate/pods", data=b"{}", headers={"Content-Type": "text/plain"})
    assert wrong_type.status == 415 and "Content-Type" in (await wrong_type.json())["error"]
    not_a_review = await client.post("/mutate/pods", json={"kind": "Pod"})
    assert not_a_review.status == 400 and (await not_a_review.json())["error"]


async def test_probes_and_metrics_answer(client: TestClient[Any, Any]) -> None:
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    metrics = await client.get("/metrics")
    assert metrics.status == 200 and "webhook_admission_requests_total" in await metrics.text()
