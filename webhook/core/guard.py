"""`POST /validate/settings`: the settings ConfigMap goes to the settings guard
(`core.settings_guard`), project namespaces to the namespace guard (`core.namespace_guard`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from webhook.core.decision import Decision
from webhook.core.guard_config import GuardConfig, request_kind
from webhook.core.namespace_guard import validate_namespace_change
from webhook.core.settings_guard import validate_settings_change
from webhook.snapshot import ClusterSnapshot


def validate_settings_request(
    request: Mapping[str, Any],
    snapshot: ClusterSnapshot,
    config: GuardConfig,
    runai_departments: Collection[str] | None = None,
) -> Decision:
    """`POST /validate/settings`: the settings ConfigMap and project namespaces."""
    kind = request_kind(request)
    if kind == "ConfigMap":
        return validate_settings_change(request, snapshot, config)
    if kind == "Namespace":
        return validate_namespace_change(request, snapshot, config, runai_departments)
    return Decision.allow()
