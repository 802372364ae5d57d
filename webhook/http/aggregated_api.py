"""The GPU, scheduling and admin APIs as an aggregated API of the Kubernetes apiserver.

An APIService (`v1.scheduling.hopsworks.ai`) makes the apiserver serve these paths itself:

    GET    /apis/scheduling.hopsworks.ai/v1/namespaces/{namespace}/projectviews/gpu
    GET    /apis/scheduling.hopsworks.ai/v1/namespaces/{namespace}/projectviews/scheduling[?kind=]
    GET    /apis/scheduling.hopsworks.ai/v1/adminviews/runai
    POST   /apis/scheduling.hopsworks.ai/v1/namespaces/{namespace}/projectmoves[?dryRun=All]
           {"department": "<name>" | null}
    DELETE /apis/scheduling.hopsworks.ai/v1/departments/{name}[?dryRun=All]

A user calls them with their own kubeconfig (kubectl, `kubectl hopsworks`): the apiserver
authenticates them, authorizes the request with RBAC on these resources (`get projectviews` in the
namespace, `get adminviews`, `create projectmoves`, `delete departments`; the chart's ClusterRoles
grant them), and only then proxies it here with its front-proxy client certificate and the user in
the X-Remote-* headers. That check is the authorization: this listener requires a client
certificate of the requestheader CA, with one of the allowed names, both as the apiserver publishes
them in kube-system/extension-apiserver-authentication, and trusts the headers of no one else. The
user's name is what an admin action records as its author.

The answers are the objects the `/api/v1` routes answer (`GpuAvailability`, `SchedulingOfferView`,
`RunaiAdminView`, the move and delete results), and so are the errors (`{"error", "code"}`), so that
a client reads either route alike.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from aiohttp import web
from multidict import CIMultiDictProxy

from webhook.http.admin_api import Mover, delete_answer, move_answer
from webhook.http.auth import Principal
from webhook.http.gpu_api import NO_RUNAI_DATA, GpuViews, error_response, private_json
from webhook.http.scheduling_api import NotAProject, choices_from_query, project_offer

log = logging.getLogger(__name__)

GROUP = "scheduling.hopsworks.ai"
VERSION = "v1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
PREFIX = f"/apis/{GROUP}/{VERSION}"
# Where the apiserver publishes how it proxies to aggregated APIs (readable with the bootstrap Role
# kube-system/extension-apiserver-authentication-reader).
AUTHENTICATION_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")

# One resource per thing a role grants: RBAC checks the resource (and name) of the path.
RESOURCES: tuple[dict[str, Any], ...] = (
    {"name": "projectviews", "singularName": "projectview", "namespaced": True, "kind": "ProjectView",
     "verbs": ["get"]},
    {"name": "adminviews", "singularName": "adminview", "namespaced": False, "kind": "AdminView", "verbs": ["get"]},
    {"name": "projectmoves", "singularName": "projectmove", "namespaced": True, "kind": "ProjectMove",
     "verbs": ["create"]},
    {"name": "departments", "singularName": "department", "namespaced": False, "kind": "Department",
     "verbs": ["delete"]},
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RequestHeaderConfig:
    """How the apiserver names the user it proxies for, from the ConfigMap it publishes."""

    client_ca: str  # PEM: the CA of the front-proxy client certificate
    allowed_names: tuple[str, ...] = ()  # empty: any certificate of that CA
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)


class NoRequestHeaderConfig(ValueError):
    """The apiserver publishes no requestheader CA: it has no aggregation layer configured."""


def requestheader_config(data: Mapping[str, str]) -> RequestHeaderConfig:
    """`RequestHeaderConfig` of the ConfigMap's data; raises NoRequestHeaderConfig without a CA."""
    ca = (data.get("requestheader-client-ca-file") or "").strip()
    if not ca:
        raise NoRequestHeaderConfig(
            f"{'/'.join(AUTHENTICATION_CONFIGMAP)} has no requestheader-client-ca-file: the apiserver runs without "
            "--requestheader-client-ca-file, so it cannot reach an aggregated API"
        )

    def names(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        raw = data.get(key)
        if raw is None:
            return default
        try:
            values = json.loads(raw)
        except ValueError:
            raise ValueError(f"{key}: not a JSON list of strings") from None
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"{key}: not a JSON list of strings")
        return tuple(values)

    return RequestHeaderConfig(
        client_ca=ca + "\n",
        allowed_names=names("requestheader-allowed-names", ()),
        username_headers=names("requestheader-username-headers", ()),
        group_headers=names("requestheader-group-headers", ()),
        extra_prefixes=names("requestheader-extra-headers-prefix", ()),
    )


def proxied_user(headers: CIMultiDictProxy[str], config: RequestHeaderConfig) -> Principal | None:
    """The user the apiserver proxies for, read as the apiserver's own requestheader authenticator
    reads it: the first non-empty username header, every value of the group headers, and the extra
    headers with their key unescaped and lower-cased. None without a username."""
    username = next((v for h in config.username_headers for v in headers.getall(h, []) if v), "")
    if not username:
        return None
    groups = tuple(g for h in config.group_headers for g in headers.getall(h, []) if g)
    extra: dict[str, tuple[str, ...]] = {}
    for key in headers:
        for prefix in config.extra_prefixes:
            if prefix and key.lower().startswith(prefix.lower()):
                name = unquote(key[len(prefix) :]).lower()
                extra[name] = tuple(dict.fromkeys((*extra.get(name, ()), *headers.getall(key))))
    return Principal(username=username, groups=groups, extra=extra)


def _discovery() -> list[web.RouteDef]:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    group = {"name": GROUP, "versions": [version], "preferredVersion": version}

    async def group_list(_: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]})

    async def api_group(_: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroup", "apiVersion": "v1", **group})

    async def resources(_: web.Request) -> web.Response:
        return web.json_response(
            {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION, "resources": list(RESOURCES)}
        )

    return [
        web.get("/apis", group_list, allow_head=False),
        web.get(f"/apis/{GROUP}", api_group, allow_head=False),
        web.get(PREFIX, resources, allow_head=False),
    ]


def aggregated_routes(views: GpuViews, mover: Mover, config: RequestHeaderConfig) -> list[web.RouteDef]:
    """The routes of the aggregated API's listener (`serve --aggregated-port`)."""

    def caller(request: web.Request) -> Principal | web.Response:
        user = proxied_user(request.headers, config)
        if user is None:
            # Only the apiserver gets past the listener, and it always names the user.
            return error_response(401, "Unauthorized", "no user in the request headers of the front proxy")
        return user

    async def project_view(request: web.Request) -> web.Response:
        user = caller(request)
        if isinstance(user, web.Response):
            return user
        namespace, view = request.match_info["namespace"], request.match_info["name"]
        if view == "gpu":
            gpus = await views.project(namespace)
            if gpus is None:
                return error_response(404, "NotFound", f"{namespace} is not a project namespace")
            return private_json(gpus.model_dump(mode="json"))
        if view == "scheduling":
            try:
                offer = await project_offer(
                    views, namespace, request.query.get("kind") or None, choices_from_query(request.query)
                )
            except NotAProject as exc:
                return error_response(404, "NotFound", str(exc))
            except ValueError as exc:
                return error_response(400, "BadRequest", str(exc))
            return private_json(offer.model_dump(mode="json"))
        return error_response(404, "NotFound", f"no project view {view!r}: the views are gpu and scheduling")

    async def admin_view(request: web.Request) -> web.Response:
        user = caller(request)
        if isinstance(user, web.Response):
            return user
        if request.match_info["name"] != "runai":
            return error_response(404, "NotFound", "no such admin view: the one view is runai")
        view = views.admin(await views.load_left())
        if view is None:
            return error_response(503, "RUN_AI_UNREACHABLE", NO_RUNAI_DATA)
        return private_json(view.model_dump(mode="json"))

    async def move(request: web.Request) -> web.Response:
        user = caller(request)
        if isinstance(user, web.Response):
            return user
        return await move_answer(mover, request, request.match_info["namespace"], user.username)

    async def delete_department(request: web.Request) -> web.Response:
        user = caller(request)
        if isinstance(user, web.Response):
            return user
        return await delete_answer(mover, request, request.match_info["name"], user.username)

    return [
        *_discovery(),
        web.get(PREFIX + "/namespaces/{namespace}/projectviews/{name}", project_view, allow_head=False),
        web.get(PREFIX + "/adminviews/{name}", admin_view, allow_head=False),
        web.post(PREFIX + "/namespaces/{namespace}/projectmoves", move),
        web.delete(PREFIX + "/departments/{name}", delete_department),
    ]
