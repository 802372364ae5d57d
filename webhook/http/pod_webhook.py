"""The pod webhook: `/mutate/pods` and `/validate/pods`, from the caches alone (`serve --state`)
or against a cluster.

Both decide with the pure functions of `webhook.core` (`mutate_pod`, `validate_pod`); this module
adds only the counted calls the request path may make for a pod, each bounded, each refused with a
retryable 503 when it fails (`webhook.http.remote`).

`/mutate/pods` binds an unbound project on its first pod (R2, S5), and refuses that pod. Run:ai's
own mutating webhooks select pods by the namespace label `runai/queue`, and the apiserver evaluates
that selector against its own namespace cache. A namespace bound while one of its pods is being
admitted (even by our mutating webhook, which runs first) is not selected for that pod, so that pod
would be stored outside Run:ai. So an unbound project's pod binds the project (not on dryRun) and
is refused with a retryable message; controllers and the platform create it again. Pods are
admitted, with `runai/queue`, only once the binding has been in this replica's watch-fed cache for a
moment (`BINDING_SETTLE_S`, see `runai_binding_refusal`), by which time the apiserver's cache has
it too.

`/validate/pods` (R3) looks up the Run:ai project of a namespace bound since this replica's last
directory refresh, then writes the GPU reservation of an admitted GPU pod
(`webhook.quota.reservations`).

`webhook.http.handlers` builds both with the other admission handlers, and puts each behind the
read of a namespace the watch has not delivered yet.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from webhook.admission import is_dry_run
from webhook.core.decision import AdmissionHandler, Decision, Reason
from webhook.core.quota import validate_pod
from webhook.core.scheduling import BINDING_SETTLE_S, mutate_pod, request_namespace
from webhook.http.remote import call_or_refuse
from webhook.quota.reservations import GpuReservations, reservation_need
from webhook.state.store import ClusterState

# Binds a project namespace to Run:ai (`RunaiIntegration.bind_for_admission`); raises with a
# message for the user when it cannot. The binder puts the bound namespace in the cache itself.
Bind = Callable[[str], Awaitable[object]]

# Fetches and publishes the Run:ai project of a bound namespace this replica has no record of;
# raises with a message when it cannot (e.g. `RunaiIntegration.lookup_for_admission`).
Lookup = Callable[[str], Awaitable[object]]


def mutate_pods_handler(
    state: ClusterState,
    bind: Bind,
    settle_s: float = BINDING_SETTLE_S,
    clock: Callable[[], float] = time.time,
) -> AdmissionHandler:
    async def handle(request: Mapping[str, Any]) -> Decision:
        decision = mutate_pod(request, state.snapshot(), clock(), settle_s)
        if decision.reason != Reason.RUNAI_PROJECT_NOT_BOUND:
            return decision
        namespace = request_namespace(request)
        if is_dry_run(request):
            # sideEffects: NoneOnDryRun: a dry run never binds.
            return Decision.deny(
                f"project namespace {namespace} is not bound to a Run:ai project yet; a real (not dry-run) "
                "pod creation binds it, and pods are admitted once the binding is in place",
                code=403,
                reason=Reason.RUNAI_PROJECT_NOT_BOUND,
            )
        result = await call_or_refuse(
            bind(namespace),
            f"binding {namespace} to Run:ai",
            lambda exc: (
                f"project namespace {namespace} is not bound to a Run:ai project yet and cannot be bound now: "
                f"{exc}. The Run:ai control plane is unreachable or refused; its workloads cannot start until "
                "the project is bound. Try again later"
            ),
            Reason.RUNAI_UNREACHABLE,
            level=logging.WARNING,
        )
        if isinstance(result, Decision):
            return result
        queue = getattr(result, "project_name", None) or namespace
        return Decision.deny(
            f"project namespace {namespace} has just been bound to Run:ai project {queue}; this pod was refused "
            "so that Run:ai's own admission sees it. Create it again in a moment (controllers retry on their own)",
            code=503,
            reason=Reason.RUNAI_BINDING_SETTLING,
        )

    return handle


def validate_pods_handler(
    state: ClusterState,
    reservations: GpuReservations,
    clock: Callable[[], float] = time.time,
    lookup: Lookup | None = None,
) -> AdmissionHandler:
    """The pure decision (binding happens earlier, in `/mutate/pods`; an unbound project is refused
    here); a project bound since this replica's last Run:ai refresh is looked up and decided again;
    an admitted GPU pod of a checked kind then reserves its GPUs, which may still refuse it when
    another replica took them in the meantime."""

    async def handle(request: Mapping[str, Any]) -> Decision:
        now = clock()
        decision = validate_pod(request, state.snapshot(), now)
        if decision.reason == Reason.RUNAI_PROJECT_NOT_KNOWN_HERE and lookup is not None:
            # Bound since this replica's last directory refresh (often by another replica): never
            # admit unchecked; fetch that one project, or refuse with a message to retry.
            namespace = request_namespace(request)
            looked_up = await call_or_refuse(
                lookup(namespace),
                f"looking up the Run:ai project of {namespace}",
                lambda exc: (
                    f"the GPU quota of project {namespace} cannot be checked now: this replica has no record yet "
                    f"of its Run:ai project, bound moments ago, and looking it up failed ({exc}). Try again in a "
                    "few seconds"
                ),
                Reason.RUNAI_PROJECT_NOT_KNOWN_HERE,
            )
            if isinstance(looked_up, Decision):
                return looked_up
            decision = validate_pod(request, state.snapshot(), now)
        # dryRun has no side effects (sideEffects: NoneOnDryRun): the cache's answer only.
        if decision.allowed and not is_dry_run(request):
            need = reservation_need(request, state.snapshot())
            if need is not None:
                decision = await reservations.reserve(request, state.snapshot(), now, need)
        return decision

    return handle


def cached_mutate_pods_handler(state: ClusterState) -> AdmissionHandler:
    """Without a Run:ai connection (`serve --state`): the pure decision, nothing is bound."""

    async def handle(request: Mapping[str, Any]) -> Decision:
        return mutate_pod(request, state.snapshot())

    return handle


def cached_validate_pods_handler(state: ClusterState) -> AdmissionHandler:
    """Quota and binding state without a Run:ai connection (`serve --state`)."""

    async def handle(request: Mapping[str, Any]) -> Decision:
        decision = validate_pod(request, state.snapshot(), time.time())
        if decision.reason == Reason.RUNAI_PROJECT_NOT_KNOWN_HERE:
            # `serve --state` has no Run:ai connection at all: say that, rather than "retry".
            return Decision.allow(warnings=["GPU quota not checked: this server runs without a Run:ai connection"])
        return decision

    return handle
