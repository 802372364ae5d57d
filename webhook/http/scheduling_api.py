"""`GET /api/v1/projects/{namespace}/scheduling[?kind=notebook]`: what a project's workloads may choose.

The answer is `webhook.core.offer_view.SchedulingOfferView`: affinity and anti-affinity labels,
priority classes with their values, with Kueue the queues and topology units, the default of each
and the level it came from, and whether GPUs may be asked for. Admission decides with the same
`scheduling_offer`, so what this shows is what admission admits. Authorized as the GPU view is
(a project member); reading has no side effects and makes no call to Run:ai.
"""

from __future__ import annotations

from aiohttp import web

from webhook.core.offer import scheduling_offer
from webhook.core.offer_view import SchedulingOfferView, offer_view
from webhook.http.auth import AuthError, Authorizer, bearer_token
from webhook.http.gpu_api import GpuViews, auth_error_response, error_response, private_json

SCHEDULING_PATH = "/api/v1/projects/{namespace}/scheduling"


class NotAProject(LookupError):
    pass


async def project_offer(views: GpuViews, namespace: str, kind: str | None = None) -> SchedulingOfferView:
    """The offer of one project namespace (raises NotAProject, or ValueError for an unknown kind)."""
    gpus = await views.project(namespace, with_metrics=False)  # deserved GPUs need no live call
    snapshot = views.state.snapshot()
    ns = snapshot.namespaces.get(namespace)
    if gpus is None or ns is None:
        raise NotAProject(f"{namespace} is not a project namespace")
    return offer_view(scheduling_offer(ns, snapshot), snapshot, gpus, kind)


def scheduling_routes(views: GpuViews, authorizer: Authorizer) -> list[web.RouteDef]:
    async def scheduling(request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        try:
            await authorizer.authorize_project(bearer_token(request.headers.get("Authorization")), namespace)
        except AuthError as exc:
            return auth_error_response(exc)
        kind = request.query.get("kind") or None
        try:
            offer = await project_offer(views, namespace, kind)
        except NotAProject as exc:
            return error_response(404, "NotFound", str(exc))
        except ValueError as exc:
            return error_response(400, "BadRequest", str(exc))
        return private_json(offer.model_dump(mode="json"))

    return [web.get(SCHEDULING_PATH, scheduling, allow_head=False)]
