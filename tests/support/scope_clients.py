"""What the modules that run webhook parts in-process need of a KubeScope
(tests/support/kube_scope.py) beside its own helpers: the webhook's ServiceAccount as a client
Configuration (for a test that makes several clients of it), and the Events the code under test
wrote about a namespace."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import config
from kubernetes_asyncio.client import Configuration

from tests.support.kube_scope import KubeScope


async def webhook_client_config(scope: KubeScope) -> Configuration:
    """The webhook's ServiceAccount with the chart's RBAC, as a Runtime of the scope reads it."""
    configuration = Configuration()
    await config.load_kube_config(config_file=str(scope.kubeconfig), client_configuration=configuration)
    return configuration


async def namespace_events(scope: KubeScope, name: str, reason: str | None = None) -> list[dict[str, Any]]:
    """Events about the namespace `name` (kept in `default`, as for any cluster-scoped object),
    of `reason` when given. Namespace names carry the scope's id, so only this test's show."""
    return [
        e
        for e in await scope.list("v1", "Event", "default")
        if e["involvedObject"].get("kind") == "Namespace"
        and e["involvedObject"].get("name") == name
        and (reason is None or e.get("reason") == reason)
    ]
