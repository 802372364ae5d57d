"""The admission handlers of R2/R3: `/validate/pods` (bind on first start, quota, reservation) and
`/validate/workloads` (replicas × GPUs at `kubectl apply`).

The decisions are the pure ones in `webhook.core`; this module only adds the two counted calls the
request path may make: binding an unbound project, and writing a GPU reservation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, AppsV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from webhook.admission import is_dry_run
from webhook.app import AdmissionHandler
from webhook.core.decision import Decision
from webhook.core.scheduling import request_namespace
from webhook.core.validation import NOT_BOUND, validate_pod
from webhook.core.workloads import scale_up, validate_workload
from webhook.metrics import REMOTE_CALLS
from webhook.quota.reservations import GpuReservations, reservation_need
from webhook.snapshot import ClusterSnapshot
from webhook.state.store import ClusterState

log = logging.getLogger(__name__)

# Binds a project namespace to Run:ai on the request path; raises with a clear message when it
# cannot (Run:ai unreachable). When it returns the namespace object (a dict), the handler puts it
# in the cache; anything else (e.g. `Binder.ensure_bound`'s result) means the binder did that.
Bind = Callable[[str], Awaitable[object]]
# (resource plural, namespace, name) -> the object, or None when it cannot be read.
ReadWorkload = Callable[[str, str, str], Awaitable[Mapping[str, Any] | None]]
RUNAI_UNREACHABLE = "RunaiUnreachable"


def validate_pods_handler(
    state: ClusterState,
    reservations: GpuReservations,
    bind: Bind,
    clock: Callable[[], float] = time.time,
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
                bound = await bind(namespace)
            except Exception as exc:
                log.warning("binding %s to Run:ai on admission failed: %s", namespace, exc)
                return Decision.deny(
                    f"project namespace {namespace} is not bound to a Run:ai project yet and cannot be bound now: "
                    f"{exc}. The Run:ai control plane is unreachable or refused; its workloads cannot start until "
                    "the project is bound. Try again later",
                    code=503,
                    reason=RUNAI_UNREACHABLE,
                )
            if isinstance(bound, Mapping):
                # Decide again on the bound namespace now, not when the watch brings the label.
                state.apply({**bound, "kind": "Namespace"})
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
        # dryRun has no side effects (sideEffects: NoneOnDryRun): the cache's answer only.
        if decision.allowed and not is_dry_run(request):
            need = reservation_need(request, state.snapshot())
            if need is not None:
                decision = await reservations.reserve(request, state.snapshot(), now, need)
        if warnings:
            decision = dataclasses.replace(decision, warnings=(*warnings, *decision.warnings))
        return decision

    return handle


def validate_workloads_handler(
    state: ClusterState,
    read_workload: ReadWorkload | None = None,
    clock: Callable[[], float] = time.time,
) -> AdmissionHandler:
    """Pure except for the scale subresource, whose Scale has no pod template: with `read_workload`
    the owner is read (one counted GET); without it, or when the read fails, the scale is allowed
    with a warning (the pods are still checked when they start)."""

    async def handle(request: Mapping[str, Any]) -> Decision:
        parent = None
        snapshot = state.snapshot()
        if read_workload is not None and scale_up(request) and _quota_checked(snapshot, request_namespace(request)):
            resource = str((request.get("resource") or {}).get("resource", ""))
            parent = await read_workload(resource, request_namespace(request), str(request.get("name") or ""))
        return validate_workload(request, snapshot, clock(), parent)

    return handle


def _quota_checked(snapshot: ClusterSnapshot, namespace: str) -> bool:
    """Run:ai on, a bound project, its Run:ai view present: only then is a read worth its cost."""
    info = snapshot.namespaces.get(namespace)
    return (
        snapshot.settings.run_ai_enable
        and info is not None
        and info.is_project
        and info.runai_queue is not None
        and snapshot.runai_projects is not None
        and namespace in snapshot.runai_projects
    )


def kube_workload_reader(api_client: ApiClient, timeout_s: float = 2.0) -> ReadWorkload:
    """Reads a Deployment, StatefulSet or ReplicaSet as raw JSON (counted, path="request")."""
    apps = AppsV1Api(api_client)
    readers = {
        "deployments": apps.read_namespaced_deployment,
        "statefulsets": apps.read_namespaced_stateful_set,
        "replicasets": apps.read_namespaced_replica_set,
    }

    async def read(resource: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        reader = readers.get(resource)
        if reader is None or not namespace or not name:
            return None
        REMOTE_CALLS.labels(target="kubernetes", path="request").inc()
        try:
            async with asyncio.timeout(timeout_s):
                response = await reader(name, namespace, _preload_content=False)
                async with response:
                    if response.status != 200:
                        return None
                    return json.loads(await response.read())
        except (ApiException, aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            log.warning("reading %s %s/%s for a scale check failed: %s", resource, namespace, name, exc)
            return None

    return read
