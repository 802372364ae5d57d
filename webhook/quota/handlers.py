"""The admission handler of R2/R3 against a cluster: `/validate/pods` (bind on first start, quota,
reservation). `/validate/workloads` needs no I/O and lives with the other cache-only handlers in
`webhook.app`.

The decisions are the pure ones in `webhook.core`; this module only adds the two counted calls the
request path may make: binding an unbound project, looking up the Run:ai project of one bound
since the last directory refresh, and writing a GPU reservation.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from webhook.admission import is_dry_run
from webhook.app import AdmissionHandler
from webhook.core.decision import Decision
from webhook.core.scheduling import request_namespace
from webhook.core.validation import NOT_BOUND, NOT_KNOWN_HERE, validate_pod
from webhook.quota.reservations import GpuReservations, reservation_need
from webhook.state.store import ClusterState

log = logging.getLogger(__name__)

# Binds a project namespace to Run:ai on the request path; raises with a clear message when it
# cannot (Run:ai unreachable). When it returns the namespace object (a dict), the handler puts it
# in the cache; anything else (e.g. `Binder.ensure_bound`'s result) means the binder did that.
Bind = Callable[[str], Awaitable[object]]
# Fetches and publishes the Run:ai project of a bound namespace this replica has no record of;
# raises with a message when it cannot (e.g. `RunaiIntegration.lookup_for_admission`).
Lookup = Callable[[str], Awaitable[object]]
RUNAI_UNREACHABLE = "RunaiUnreachable"


def validate_pods_handler(
    state: ClusterState,
    reservations: GpuReservations,
    bind: Bind,
    clock: Callable[[], float] = time.time,
    lookup: Lookup | None = None,
) -> AdmissionHandler:
    """The pure decision; an unbound project is bound first (not on dryRun) and decided again; an
    admitted GPU pod of a checked kind then reserves its GPUs, which may still refuse it when
    another replica took them in the meantime."""

    async def handle(request: Mapping[str, Any]) -> Decision:
        now = clock()
        decision = validate_pod(request, state.snapshot(), now)
        warnings: list[str] = []
        if decision.reason == NOT_BOUND:
            namespace = request_namespace(request)
            if is_dry_run(request):
                return Decision.deny(
                    f"project namespace {namespace} is not bound to a Run:ai project yet; a real (not dry-run) "
                    "request binds it first and is then checked against its GPU quota",
                    code=403,
                    reason=NOT_BOUND,
                )
            try:
                await bind(namespace)  # the binder puts the bound namespace in the cache itself
            except Exception as exc:
                log.warning("binding %s to Run:ai on admission failed: %s", namespace, exc)
                return Decision.deny(
                    f"project namespace {namespace} is not bound to a Run:ai project yet and cannot be bound now: "
                    f"{exc}. The Run:ai control plane is unreachable or refused; its workloads cannot start until "
                    "the project is bound. Try again later",
                    code=503,
                    reason=RUNAI_UNREACHABLE,
                )
            decision = validate_pod(request, state.snapshot(), now)
            if decision.reason == NOT_BOUND:
                return Decision.deny(
                    f"project namespace {namespace} was bound to Run:ai but the binding is not visible yet; "
                    "try again in a moment",
                    code=503,
                    reason=NOT_BOUND,
                )
            info = state.snapshot().namespaces.get(namespace)
            queue = info.runai_queue if info is not None else None
            warnings.append(f"project namespace {namespace} was bound to Run:ai project {queue} on this start")
        if decision.reason == NOT_KNOWN_HERE and lookup is not None:
            # Bound since this replica's last directory refresh (often by another replica): never
            # admit unchecked; fetch that one project, or refuse with a message to retry.
            namespace = request_namespace(request)
            try:
                await lookup(namespace)
            except Exception as exc:
                log.info("looking up the Run:ai project of %s on admission failed: %s", namespace, exc)
                return Decision.deny(
                    f"the GPU quota of project {namespace} cannot be checked now: this replica has no record yet "
                    f"of its Run:ai project, bound moments ago, and looking it up failed ({exc}). Try again in a "
                    "few seconds",
                    code=503,
                    reason=NOT_KNOWN_HERE,
                )
            decision = validate_pod(request, state.snapshot(), now)
        # dryRun has no side effects (sideEffects: NoneOnDryRun): the cache's answer only.
        if decision.allowed and not is_dry_run(request):
            need = reservation_need(request, state.snapshot())
            if need is not None:
                decision = await reservations.reserve(request, state.snapshot(), now, need)
        if warnings:
            decision = dataclasses.replace(decision, warnings=(*warnings, *decision.warnings))
        return decision

    return handle
