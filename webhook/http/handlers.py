"""Every admission handler, built once, in one place (as Kueue's `webhooks.Setup` registers all of
its webhooks): `admission_handlers` returns the path → handler table the app serves.

Without cluster parts (`serve --state DIR`, tests) the handlers decide from the caches alone; with
them (against an apiserver) `/mutate/pods` binds an unbound project on its first pod,
`/validate/pods` may look up a project and reserve GPUs, and `/validate/settings` knows the Run:ai
department names. Both pod webhooks and `/validate/workloads` first read a namespace that the watch
has not delivered yet (`webhook.state.namespace_reader`), or refuse with a retryable 503: never pass
a pod or a Deployment as if it were no project's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from webhook.admission import is_dry_run
from webhook.core.decision import AdmissionHandler, Decision, Reason
from webhook.core.enforcement import MUTATION_FAMILIES, as_warning, warned_family, warns
from webhook.core.guard import validate_settings_request
from webhook.core.guard_config import GuardConfig
from webhook.core.owners import mutate_owner, unseen_owner_namespace
from webhook.core.pod_updates import validate_pod_update
from webhook.core.scheduling import mutate_pod, request_namespace, unseen_namespace
from webhook.core.workloads import unseen_workload_namespace, validate_workload
from webhook.http.pod_webhook import (
    Bind,
    Lookup,
    cached_mutate_pods_handler,
    cached_validate_pods_handler,
    mutate_pods_handler,
    validate_pods_handler,
)
from webhook.http.remote import call_or_refuse
from webhook.logformat import REVIEW_UID
from webhook.metrics import WOULD_REFUSE_RECENT
from webhook.quota.reservations import GpuReservations
from webhook.snapshot import ClusterSnapshot
from webhook.state.store import ClusterState

log = logging.getLogger(__name__)

# Puts a namespace the watch has not delivered yet into the cache (`NamespaceReader.read`); raises
# with a message when it cannot.
ReadNamespace = Callable[[str], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class ClusterParts:
    """What the handlers use against an apiserver with the Run:ai integration running."""

    reservations: GpuReservations
    bind: Bind
    lookup: Lookup
    runai_departments: Callable[[], Collection[str] | None]
    read_namespace: ReadNamespace


def admission_handlers(
    state: ClusterState, guard: GuardConfig, cluster: ClusterParts | None = None, clock: Callable[[], float] = time.time
) -> dict[str, AdmissionHandler]:
    """The admission endpoints and their handlers. `/validate/workloads` decides from the caches
    either way: a scale without a template passes with a warning and its pods are checked one by one.
    The validating webhooks, called once per request, turn and count what warn mode admits."""
    handlers = _handlers(state, guard, cluster)
    handlers["/validate/pods"] = warn_mode(state, handlers["/validate/pods"], clock, pods=True)
    handlers["/validate/workloads"] = warn_mode(state, handlers["/validate/workloads"], clock)
    return {path: logging_review_uid(handler) for path, handler in handlers.items()}


def warn_mode(
    state: ClusterState, handler: AdmissionHandler, clock: Callable[[], float] = time.time, pods: bool = False
) -> AdmissionHandler:
    """`handler`, with warn mode (`core.enforcement`) carried out: a refusal the settings put in
    warn by its reason (GPU quota) admitted as a warning and an audit annotation, and each family
    of an admitted request's would-be refusals counted per project (`metrics.WOULD_REFUSE`).

    `pods`: the pod mutation's families are counted here too, judged again on the pod as it will
    be stored. The apiserver calls a validating webhook once per request, but the mutating one
    again when a later webhook changed the pod, and a pod refused after its mutation was never
    admitted. kubectl and the audit log have those from the mutating webhook already."""

    async def handle(request: Mapping[str, Any]) -> Decision:
        decision = await handler(request)
        if decision.allowed and not pods and not decision.would_refuse:
            return decision  # the common case, with nothing more to read
        snapshot = state.snapshot()
        if not decision.allowed:
            family = warned_family(decision, snapshot.settings)
            if family is None:
                return decision
            decision = as_warning(decision, family)
        judged_again = pods and any(warns(snapshot.settings, family) for family in MUTATION_FAMILIES)
        if judged_again and (families := mutate_pod(request, snapshot).would_refuse):
            decision = replace(decision, would_refuse=(*families, *decision.would_refuse))
        # Counted when it would have kept something out of the cluster: not a dry run.
        if decision.would_refuse and not is_dry_run(request):
            project, now = request_namespace(request), clock()
            for family in dict.fromkeys(decision.would_refuse):
                WOULD_REFUSE_RECENT.record(family, project, now)
        return decision

    return handle


def logging_review_uid(handler: AdmissionHandler) -> AdmissionHandler:
    """`handler`, with the review's uid on every log line written while it decides (`logformat`)."""

    async def handle(request: Mapping[str, Any]) -> Decision:
        token = REVIEW_UID.set(request.get("uid"))
        try:
            return await handler(request)
        finally:
            REVIEW_UID.reset(token)

    return handle


def _handlers(state: ClusterState, guard: GuardConfig, cluster: ClusterParts | None) -> dict[str, AdmissionHandler]:
    if cluster is None:
        return {
            "/mutate/pods": cached_mutate_pods_handler(state),
            "/mutate/workloads": owners_handler(state),
            "/validate/pods": cached_validate_pods_handler(state),
            "/validate/workloads": cached_workloads_handler(state),
            "/validate/settings": settings_handler(state, guard),
            "/validate/pod-updates": pod_updates_handler(state, guard),
        }
    read = cluster.read_namespace
    return {
        # Binding on a first start happens in the mutating phase, so Run:ai's webhooks see the pod.
        "/mutate/pods": reading_unseen_namespaces(state, read, mutate_pods_handler(state, cluster.bind)),
        # A Job let through as no project's would run outside Kueue: its namespace is read too.
        "/mutate/workloads": reading_unseen_namespaces(state, read, owners_handler(state), unseen_owner_namespace),
        "/validate/pods": reading_unseen_namespaces(
            state, read, validate_pods_handler(state, cluster.reservations, lookup=cluster.lookup)
        ),
        # A Deployment applied together with its namespace is judged as that project's.
        "/validate/workloads": reading_unseen_namespaces(
            state, read, cached_workloads_handler(state), unseen_workload_namespace
        ),
        "/validate/settings": settings_handler(state, guard, cluster.runai_departments),
        # Old and new pod are both in the review: no namespace or other cache is read.
        "/validate/pod-updates": pod_updates_handler(state, guard),
    }


def reading_unseen_namespaces(
    state: ClusterState,
    read: ReadNamespace,
    handler: AdmissionHandler,
    unseen: Callable[[Mapping[str, Any], ClusterSnapshot], str | None] = unseen_namespace,
) -> AdmissionHandler:
    """`handler`, after the pod's namespace is in the cache: read it when the watch has not shown
    it yet, or refuse the pod with a retryable 503 when it cannot be read. `unseen` says which
    requests' namespaces count (a pod CREATE's; `core.owners` says it for Jobs and Deployments)."""

    async def handle(request: Mapping[str, Any]) -> Decision:
        namespace = unseen(request, state.snapshot())
        if namespace is not None:
            read_it = await call_or_refuse(
                read(namespace),
                f"reading namespace {namespace}",
                lambda exc: (
                    f"namespace {namespace} is new to this replica and could not be read ({exc}); its pods get the "
                    "platform's scheduling only once it is known here. Try again in a few seconds"
                ),
                Reason.NAMESPACE_NOT_KNOWN_HERE,
            )
            if isinstance(read_it, Decision):
                return read_it
        return await handler(request)

    return handle


def owners_handler(state: ClusterState) -> AdmissionHandler:
    """With Kueue on, the queue and topology on the owners Kueue reads them from (`core.owners`)."""

    async def handle(request: Mapping[str, Any]) -> Decision:
        return mutate_owner(request, state.snapshot())

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


def pod_updates_handler(state: ClusterState, config: GuardConfig) -> AdmissionHandler:
    """A pod's scheduling labels and annotations stay as admitted (`core.pod_updates`)."""

    async def handle(request: Mapping[str, Any]) -> Decision:
        return validate_pod_update(request, state.snapshot().settings, config)

    return handle
