"""The offline review and the served folder mode answer every shipped request alike.

Offline is `scheduling-webhook review FILE --state examples/cluster -o json` (the command's own
function, in-process); served is the app `serve --state` builds, asked as the apiserver asks it:
`/mutate/pods`, then `/validate/pods` with the patched pod. Decision, status, patch, warnings and
audit annotations must be the same; only a Pod file's generated uid differs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient

from tests.support.apps import cache_app
from tests.support.reviews import apply_patch
from webhook.review import request_for, review_command
from webhook.state.folder import load_into
from webhook.state.store import ClusterState

ROOT = Path(__file__).resolve().parents[1]
REQUESTS = ROOT / "examples" / "requests"
CLUSTER = ROOT / "examples" / "cluster"
SHIPPED = sorted(p.name for p in REQUESTS.iterdir() if p.suffix in (".json", ".yaml"))

ClientFactory = Callable[..., Awaitable[TestClient[Any, Any]]]


def offline(file: Path) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    args = argparse.Namespace(file=str(file), state=str(CLUSTER), namespace="hopsworks", output="json")
    code = review_command(args, out)
    return code, json.loads(out.getvalue())


async def served(client: TestClient[Any, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The answer the apiserver assembles: the mutation's, then the validation's of the patched pod."""

    async def ask(path: str, req: dict[str, Any]) -> dict[str, Any]:
        resp = await client.post(
            path, json={"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}
        )
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = (await resp.json())["response"]
        return answer

    mutated = await ask("/mutate/pods", request)
    if not mutated["allowed"]:
        return mutated
    patch = json.loads(base64.b64decode(mutated["patch"])) if "patch" in mutated else []
    pod = apply_patch(request["object"], patch)
    validated = await ask("/validate/pods", {**request, "object": pod})
    warnings = mutated.get("warnings", []) + validated.get("warnings", [])
    if not validated["allowed"]:
        return {**validated, **({"warnings": warnings} if warnings else {})}
    answer = {**mutated, "object": pod}
    if patch:
        answer["patch"] = patch
    if warnings:
        answer["warnings"] = warnings
    audit = {**mutated.get("auditAnnotations", {}), **validated.get("auditAnnotations", {})}
    if audit:
        answer["auditAnnotations"] = audit
    return answer


@pytest.fixture
async def client(aiohttp_client: ClientFactory) -> TestClient[Any, Any]:
    state = ClusterState("hopsworks")
    load_into(state, CLUSTER)
    return await aiohttp_client(cache_app(state))


@pytest.mark.parametrize("name", SHIPPED)
async def test_offline_and_served_answer_alike(client: TestClient[Any, Any], name: str) -> None:
    file = REQUESTS / name
    code, here = await asyncio.to_thread(offline, file)  # the command runs its own event loop
    request = request_for(yaml.safe_load(file.read_text()))
    there = await served(client, request)
    here.pop("uid"), there.pop("uid")
    assert here == there
    assert code == (0 if there["allowed"] else 1)


def test_every_shipped_request_is_compared() -> None:
    assert "gpu-notebook.json" in SHIPPED and "notebook-pod.yaml" in SHIPPED
