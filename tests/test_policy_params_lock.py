"""Who may write the compiled policies' parameters, on the real apiserver with the chart's RBAC and
policies (`kube_scope`): the server's ServiceAccount writes them by server-side apply with RBAC that
names them; a project's own user, allowed every ConfigMap verb in the namespace, may not create,
change or delete them, and keeps every other ConfigMap of the namespace; deleting the namespace
still empties it."""

from __future__ import annotations

import json
import ssl
from typing import Any

import aiohttp
import pytest

from tests.support.kube_scope import KubeScope, eventually, resource_path
from webhook.core.admission_policies import PARAMS_NAME, params_config_map

pytestmark = pytest.mark.slow

FIELD_MANAGER = "scheduling-webhook"


async def _as(scope: KubeScope, token: str, method: str, path: str, body: Any = None,
              content_type: str = "application/json") -> tuple[int, dict[str, Any]]:  # fmt: skip
    """One request with a bearer token: (status, the answer's JSON)."""
    context = ssl.create_default_context(cafile=str(scope.cp.pki.ca_file))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": content_type, "Accept": "application/json"}
    data = None if body is None else json.dumps(body)
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, scope.cp.url + path, data=data, headers=headers, ssl=context) as answer,
    ):
        return answer.status, await answer.json(content_type=None)


def _apply_path(ns: str) -> str:
    return resource_path("v1", "ConfigMap", ns, PARAMS_NAME) + f"?fieldManager={FIELD_MANAGER}&force=true"


async def _server_token(scope: KubeScope) -> str:
    return await scope.token("scheduling-webhook", scope.install_ns)


async def test_only_the_server_writes_the_policy_parameters(kube_scope: KubeScope) -> None:
    scope = kube_scope
    ns = await scope.namespace("vision")
    other = await scope.namespace("speech")
    user, token = await scope.user_token("member", ns)
    for where in (ns, other):
        await scope.allow(user, "*", "configmaps", where)
    server = await _server_token(scope)
    params = params_config_map(ns, {"compiled": "true", "priorityClassName": "normal"})

    async def locked() -> bool:
        """The apiserver loads a new policy from its informer: until then the user's create passes."""
        attempt = params_config_map(other, {"compiled": "false"})
        status, _ = await _as(scope, token, "POST", resource_path("v1", "ConfigMap", other), attempt)
        if status == 201:
            await scope.delete("v1", "ConfigMap", PARAMS_NAME, other)
        return status == 403

    await eventually(locked, within_s=30, interval_s=0.2, message="the parameters' policy never took effect")

    # The server: created by an apply (RBAC names the ConfigMap for `create` too), then changed.
    # An earlier test's policy, for its own install namespace, may be enforced a moment after its
    # deletion (the apiserver's informer): until then it refuses this server too.
    async def applied() -> bool:
        status, answer = await _as(scope, server, "PATCH", _apply_path(ns), params, "application/apply-patch+yaml")
        assert status in (200, 201) or "denied request" in answer.get("message", ""), answer.get("message")
        return status in (200, 201)

    await eventually(applied, within_s=30, interval_s=0.2, message="the server's apply was never allowed")
    changed = params_config_map(ns, {"compiled": "true", "priorityClassName": "batch"})
    status, answer = await _as(scope, server, "PATCH", _apply_path(ns), changed, "application/apply-patch+yaml")
    assert status == 200 and answer["data"]["priorityClassName"] == "batch", answer

    # The project's user: every write refused, with a message that says why.
    path = resource_path("v1", "ConfigMap", ns, PARAMS_NAME)
    attempts = [
        ("PATCH", path, {"data": {"priorityClassName": "urgent"}}, "application/merge-patch+json"),
        ("PUT", path, {**changed, "data": {"compiled": "false"}}, "application/json"),
        ("DELETE", path, None, "application/json"),
        ("POST", resource_path("v1", "ConfigMap", other), params_config_map(other, {"compiled": "false"}),
         "application/json"),
        ("PATCH", _apply_path(other), params_config_map(other, {"compiled": "false"}), "application/apply-patch+yaml"),
    ]  # fmt: skip
    for method, where, body, content_type in attempts:
        status, answer = await _as(scope, token, method, where, body, content_type)
        assert status == 403, (method, where, answer)
        assert "only scheduling-webhook writes its admission policy parameters" in answer["message"], answer
        assert user in answer["message"], answer
    stored = await scope.get("v1", "ConfigMap", PARAMS_NAME, ns)
    assert stored is not None and stored["data"] == {"compiled": "true", "priorityClassName": "batch"}
    assert await scope.get("v1", "ConfigMap", PARAMS_NAME, other) is None

    # Every other ConfigMap of the namespace is still the user's.
    mine = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mine", "namespace": ns}, "data": {"a": "1"}}
    status, answer = await _as(scope, token, "POST", resource_path("v1", "ConfigMap", ns), mine)
    assert status == 201, answer
    status, answer = await _as(scope, token, "DELETE", resource_path("v1", "ConfigMap", ns, "mine"))
    assert status == 200, answer

    # The server reads them back across namespaces by name, and deletes what it wrote.
    status, answer = await _as(scope, server, "GET", f"/api/v1/configmaps?fieldSelector=metadata.name%3D{PARAMS_NAME}")
    assert status == 200, answer
    assert (ns, PARAMS_NAME) in {(i["metadata"]["namespace"], i["metadata"]["name"]) for i in answer["items"]}
    status, answer = await _as(
        scope, server, "PATCH", _apply_path(other), params_config_map(other, {}), "application/apply-patch+yaml"
    )
    assert status == 201, answer
    status, answer = await _as(scope, server, "DELETE", resource_path("v1", "ConfigMap", other, PARAMS_NAME))
    assert status == 200, answer

    # Nor may the server write any other ConfigMap outside its namespace.
    status, answer = await _as(scope, server, "POST", resource_path("v1", "ConfigMap", ns), {**mine})
    assert status == 403, answer

    # A namespace being deleted is emptied of them by the namespace controller.
    await scope.delete("v1", "Namespace", ns)

    async def gone() -> bool:
        return await scope.get("v1", "Namespace", ns) is None

    await eventually(gone, within_s=60, interval_s=0.2, message=f"namespace {ns} with its parameters never went")
