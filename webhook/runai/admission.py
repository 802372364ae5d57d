"""Binding on a workload's first start (R2, S5), in the mutating phase: `/mutate/pods` against a cluster.

Why here and why the first pod is refused: Run:ai's own mutating webhooks select pods by the
namespace label `runai/queue`, and the apiserver evaluates that selector against its own namespace
cache. A namespace bound while one of its pods is being admitted (even by our mutating webhook,
which runs first) is not selected for that pod, so that pod would be stored outside Run:ai. So an
unbound project's pod binds the project (a counted, bounded call; not on dryRun) and is refused
with a retryable message; controllers and the platform create it again. Pods are admitted, with
`runai/queue`, only once the binding has been in this replica's watch-fed cache for a moment
(`BINDING_SETTLE_S`, see `runai_binding_refusal`), by which time the apiserver's cache has it too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from webhook.admission import is_dry_run
from webhook.core.decision import AdmissionHandler, Decision, Reason
from webhook.core.scheduling import BINDING_SETTLE_S, mutate_pod, request_namespace
from webhook.state.store import ClusterState

log = logging.getLogger(__name__)

# Binds a project namespace to Run:ai (`RunaiIntegration.bind_for_admission`); raises with a
# message for the user when it cannot. The binder puts the bound namespace in the cache itself.
Bind = Callable[[str], Awaitable[object]]


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
        try:
            result = await bind(namespace)
        except Exception as exc:
            log.warning("binding %s to Run:ai on admission failed: %s", namespace, exc)
            return Decision.deny(
                f"project namespace {namespace} is not bound to a Run:ai project yet and cannot be bound now: "
                f"{exc}. The Run:ai control plane is unreachable or refused; its workloads cannot start until "
                "the project is bound. Try again later",
                code=503,
                reason=Reason.RUNAI_UNREACHABLE,
            )
        queue = getattr(result, "project_name", None) or namespace
        return Decision.deny(
            f"project namespace {namespace} has just been bound to Run:ai project {queue}; this pod was refused "
            "so that Run:ai's own admission sees it. Create it again in a moment (controllers retry on their own)",
            code=503,
            reason=Reason.RUNAI_BINDING_SETTLING,
        )

    return handle
