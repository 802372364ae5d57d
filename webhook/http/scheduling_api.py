"""`GET /api/v1/projects/{namespace}/scheduling[?kind=notebook]`: what a project's workloads may choose.

With any of the query parameters `affinity` and `antiAffinity` (`key=value,...`), `priorityClass`,
`queue` and `topology`, the answer also says what a workload making those choices gets (`workload`:
each value with the level it came from, and the refusals admission would give).

The answer is `webhook.core.offer_view.SchedulingOfferView`: affinity and anti-affinity labels,
priority classes with their values, with Kueue the queues and topology units, the default of each
and the level it came from, and whether GPUs may be asked for. Admission decides with the same
`scheduling_offer`, so what this shows is what admission admits. Authorized as the GPU view is
(a project member); reading has no side effects and makes no call to Run:ai.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from webhook.core.choices import WorkloadChoices
from webhook.core.offer import scheduling_offer
from webhook.core.offer_view import SchedulingOfferView, offer_view
from webhook.core.scheduling import parse_label_list
from webhook.http.auth import Authorizer
from webhook.http.gpu_api import GpuViews, authorized, error_response, private_json

SCHEDULING_PATH = "/api/v1/projects/{namespace}/scheduling"


# A priority class, queue or topology unit name is a Kubernetes object name at most.
MAX_NAME_CHARS = 253


class NotAProject(LookupError):
    pass


def choices_from_query(query: Mapping[str, str]) -> WorkloadChoices | None:
    """The workload's choices given as query parameters; None when none is given. Raises
    ValueError naming the bad parameter."""
    if not any(key in query for key in ("affinity", "antiAffinity", "priorityClass", "queue", "topology")):
        return None

    def labels(key: str) -> tuple[str, ...] | None:
        if key not in query:
            return None
        try:
            return tuple(parse_label_list(query[key]))
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None

    def name(key: str) -> str | None:
        value = query.get(key) or None
        if value is not None and len(value) > MAX_NAME_CHARS:
            raise ValueError(f"{key}: {len(value)} characters, more than the limit of {MAX_NAME_CHARS}")
        return value

    return WorkloadChoices(
        affinity=labels("affinity"),
        anti_affinity=labels("antiAffinity"),
        priority_class=name("priorityClass"),
        queue=name("queue"),
        topology=name("topology"),
    )


async def project_offer(
    views: GpuViews, namespace: str, kind: str | None = None, choices: WorkloadChoices | None = None
) -> SchedulingOfferView:
    """The offer of one project namespace (raises NotAProject, or ValueError for an unknown kind)."""
    gpus = await views.project(namespace, with_metrics=False)  # deserved GPUs need no live call
    snapshot = views.state.snapshot()
    ns = snapshot.namespaces.get(namespace)
    if gpus is None or ns is None:
        raise NotAProject(f"{namespace} is not a project namespace")
    return offer_view(scheduling_offer(ns, snapshot), snapshot, gpus, kind, choices)


def scheduling_routes(views: GpuViews, authorizer: Authorizer) -> list[web.RouteDef]:
    async def scheduling(request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        kind = request.query.get("kind") or None
        try:
            choices = choices_from_query(request.query)
            offer = await project_offer(views, namespace, kind, choices)
        except NotAProject as exc:
            return error_response(404, "NotFound", str(exc))
        except ValueError as exc:
            return error_response(400, "BadRequest", str(exc))
        return private_json(offer.model_dump(mode="json"))

    return [web.get(SCHEDULING_PATH, authorized(authorizer, scheduling), allow_head=False)]
