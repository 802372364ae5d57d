"""Every admission handler, built once, in one place (as Kueue's `webhooks.Setup` registers all of
its webhooks): `admission_handlers` returns the path → handler table the app serves.

Without cluster parts (`serve --state DIR`, tests) the handlers decide from the caches alone; with
them (against an apiserver) `/mutate/pods` binds an unbound project on its first pod,
`/validate/pods` may look up a project and reserve GPUs, and `/validate/settings` knows the Run:ai
department names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.decision import AdmissionHandler, Decision, Reason
from webhook.core.guard import validate_settings_request
from webhook.core.guard_config import GuardConfig
from webhook.core.owners import mutate_owner
from webhook.core.quota import validate_pod
from webhook.core.scheduling import mutate_pod
from webhook.core.workloads import validate_workload
from webhook.quota.handlers import Lookup, validate_pods_handler
from webhook.quota.reservations import GpuReservations
from webhook.runai.admission import Bind, mutate_pods_handler
from webhook.state.store import ClusterState


@dataclass(frozen=True, slots=True)
class ClusterParts:
    """What the handlers use against an apiserver with the Run:ai integration running."""

    reservations: GpuReservations
    bind: Bind
    lookup: Lookup
    runai_departments: Callable[[], Collection[str] | None]


def admission_handlers(
    state: ClusterState, guard: GuardConfig, cluster: ClusterParts | None = None
) -> dict[str, AdmissionHandler]:
    """The admission endpoints and their handlers. `/validate/workloads` is cache-only either way: a
    scale without a template passes with a warning and its pods are checked one by one."""
    if cluster is None:
        return {
            "/mutate/pods": mutate_handler(state),
            "/mutate/workloads": owners_handler(state),
            "/validate/pods": cached_pods_handler(state),
            "/validate/workloads": cached_workloads_handler(state),
            "/validate/settings": settings_handler(state, guard),
        }
    return {
        # Binding on a first start happens in the mutating phase, so Run:ai's webhooks see the pod.
        "/mutate/pods": mutate_pods_handler(state, cluster.bind),
        "/mutate/workloads": owners_handler(state),
        "/validate/pods": validate_pods_handler(state, cluster.reservations, lookup=cluster.lookup),
        "/validate/workloads": cached_workloads_handler(state),
        "/validate/settings": settings_handler(state, guard, cluster.runai_departments),
    }


def mutate_handler(state: ClusterState) -> AdmissionHandler:
    async def handle(request: Mapping[str, Any]) -> Decision:
        return mutate_pod(request, state.snapshot())

    return handle


def owners_handler(state: ClusterState) -> AdmissionHandler:
    """With Kueue on, the queue and topology on the owners Kueue reads them from (`core.owners`)."""

    async def handle(request: Mapping[str, Any]) -> Decision:
        return mutate_owner(request, state.snapshot())

    return handle


def cached_pods_handler(state: ClusterState) -> AdmissionHandler:
    """Quota and binding state without a Run:ai connection (`serve --state`)."""

    async def handle(request: Mapping[str, Any]) -> Decision:
        decision = validate_pod(request, state.snapshot(), time.time())
        if decision.reason == Reason.RUNAI_PROJECT_NOT_KNOWN_HERE:
            # `serve --state` has no Run:ai connection at all: say that, rather than "retry".
            return Decision.allow(warnings=["GPU quota not checked: this server runs without a Run:ai connection"])
        return decision

    return handle


def cached_workloads_handler(state: ClusterState) -> AdmissionHandler:
    """Replicas × GPUs of pod owners at `kubectl apply` time, from the caches only."""

    async def handle(request: Mapping[str, Any]) -> Decision:
        return validate_workload(request, state.snapshot(), time.time())

    return handle


def settings_handler(
    state: ClusterState, config: GuardConfig, runai_departments: Callable[[], Collection[str] | None] = lambda: None
) -> AdmissionHandler:
    async def handle(request: Mapping[str, Any]) -> Decision:
        return validate_settings_request(request, state.snapshot(), config, runai_departments())

    return handle
