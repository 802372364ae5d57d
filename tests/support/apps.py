"""The app as `serve --state` builds it (cache-only admission handlers), for tests that serve a
`ClusterState` of their own; `handlers` replaces some of those handlers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from webhook.core.decision import AdmissionHandler
from webhook.core.guard_config import GuardConfig
from webhook.http.app import create_app
from webhook.http.handlers import admission_handlers
from webhook.state.store import ClusterState


def cache_app(
    state: ClusterState, handlers: Mapping[str, AdmissionHandler] | None = None, **kwargs: Any
) -> web.Application:
    chosen = admission_handlers(state, GuardConfig(install_namespace=state.install_namespace))
    chosen.update(handlers or {})
    return create_app(state, chosen, **kwargs)
