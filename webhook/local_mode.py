"""Folder mode (`serve --state DIR`) serves the GPU API, the scheduling API and the console too,
without sign-in, but only on a loopback address: there is no Kubernetes API to check a token with,
so only the machine's own users may read. Run:ai numbers come from the folder's `RunaiSnapshot`.

A web page elsewhere could still read them through the user's browser by DNS rebinding (its own
name, re-pointed at 127.0.0.1): so these routes answer only a `Host` that is a loopback name
(localhost, or a loopback address), never another name. Admission and the probes are not
guarded: they are what apiserver-shaped clients (the tests, the bench) call by the Service name.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from aiohttp import web

from webhook.console import Console, console_routes
from webhook.http.auth import Forbidden, Principal
from webhook.http.gpu_api import GpuViews
from webhook.http.scheduling_api import scheduling_routes
from webhook.logsafe import log_safe
from webhook.runai.folder_snapshot import RunaiSnapshotDirectory
from webhook.state.store import ClusterState

LOCAL_USER = Principal(username="local")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LoopbackAuthorizer:
    """Everyone may read when the server listens on loopback only; nobody otherwise."""

    def __init__(self, loopback: bool) -> None:
        self.loopback = loopback

    def _check(self) -> Principal:
        if not self.loopback:
            raise Forbidden(
                "without a cluster there is no Kubernetes API to check tokens with: folder mode serves the "
                "GPU API and the console on a loopback address only (--host 127.0.0.1)"
            )
        return LOCAL_USER

    async def authorize_project(self, token: str | None, namespace: str, *, client: str = "") -> Principal:
        return self._check()

    async def authorize_admin(self, token: str | None, *, client: str = "") -> Principal:
        return self._check()

    async def authorize_project_for(self, principal: Principal | None, namespace: str) -> Principal:
        return self._check()

    async def authorize_admin_for(self, principal: Principal | None) -> Principal:
        return self._check()


def folder_mode_routes(state: ClusterState, state_dir: Path, host: str) -> list[web.RouteDef]:
    views = GpuViews(state, RunaiSnapshotDirectory(state_dir))
    authorizer = LoopbackAuthorizer(is_loopback(host))
    routes = [
        *views.routes(authorizer),
        *scheduling_routes(views, authorizer),
        *console_routes(Console(views, authorizer)),
    ]
    return [loopback_host_only(route) for route in routes]


def host_name(header: str | None) -> str:
    """The name of a `Host` header without its port: `[::1]:8443` -> `::1`."""
    if not header:
        return ""
    if header.startswith("["):
        end = header.find("]")
        return header[1:end] if end > 0 else ""
    name, _, _ = header.partition(":")
    return name.lower()


def loopback_host_only(route: web.RouteDef) -> web.RouteDef:
    handler = route.handler

    async def guarded(request: web.Request) -> web.StreamResponse:
        name = host_name(request.headers.get("Host"))
        if not is_loopback(name):
            reason = (
                f"Host {log_safe(name, 100)!r} is not a loopback name: folder mode answers only localhost or a "
                "loopback address (a guard against DNS rebinding)"
            )
            return web.json_response({"error": reason, "code": "NotLoopbackHost"}, status=421)
        return await handler(request)

    return web.RouteDef(route.method, route.path, guarded, route.kwargs)
