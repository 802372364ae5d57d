"""The admission handler of R3 against a cluster: `/validate/pods` (quota, reservation).
`webhook.http.handlers` builds it with the other admission handlers.

The decisions are the pure ones in `webhook.core`; this module only adds the counted calls the
request path may make here: looking up the Run:ai project of one bound since the last directory
refresh, and writing a GPU reservation. Binding an unbound project happens in the mutating phase
(`webhook.runai.admission`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from webhook.admission import is_dry_run
from webhook.core.decision import AdmissionHandler, Decision, Reason
from webhook.core.quota import validate_pod
from webhook.core.scheduling import request_namespace
from webhook.quota.reservations import GpuReservations, reservation_need
from webhook.state.store import ClusterState

log = logging.getLogger(__name__)

# Fetches and publishes the Run:ai project of a bound namespace this replica has no record of;
# raises with a message when it cannot (e.g. `RunaiIntegration.lookup_for_admission`).
Lookup = Callable[[str], Awaitable[object]]


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
        warnings: list[str] = []
        if decision.reason == Reason.RUNAI_PROJECT_NOT_KNOWN_HERE and lookup is not None:
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
                    reason=Reason.RUNAI_PROJECT_NOT_KNOWN_HERE,
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
