"""R2/R3 as pure decisions: is the pod's project bound, and does its GPU request fit the quota.

`validate_pod(request, snapshot, now)` never calls out. What it cannot decide alone it says with a
reason the shell acts on: `RunaiProjectNotBound` (bind now, or refuse if Run:ai is unreachable).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.decision import Decision
from webhook.core.kinds import pod_gpu_request
from webhook.core.scheduling import pod_target
from webhook.settings import QUOTA_CHECKED_KINDS
from webhook.snapshot import ClusterSnapshot

NOT_BOUND = "RunaiProjectNotBound"
OVER_QUOTA = "GpuQuotaExceeded"
MOVING = "ProjectMoving"
EPSILON = 1e-9  # fractions add up in floating point


def request_key(request: Mapping[str, Any]) -> str:
    """How a reservation names the pod: its uid when the apiserver set one, else the request uid."""
    meta = (request.get("object") or {}).get("metadata") or {}
    return str(meta.get("uid") or request.get("uid") or "")


def gpus_in_use(snapshot: ClusterSnapshot, namespace: str, now: float, exclude: str = "") -> float:
    """GPUs held by the namespace's running or waiting non-preemptible pods, plus live reservations
    for pods the cache does not show yet."""
    pods = snapshot.pods.get(namespace, {})
    used = sum(p.gpus for uid, p in pods.items() if uid != exclude and not p.finished and p.kind in QUOTA_CHECKED_KINDS)
    reservations = snapshot.gpu_reservations.get(namespace, {})
    pending = sum(
        r.gpus for key, r in reservations.items() if key != exclude and key not in pods and r.expires_at > now
    )
    return used + pending


def format_gpus(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value % 1 else str(int(value))


def validate_pod(request: Mapping[str, Any], snapshot: ClusterSnapshot, now: float = 0.0) -> Decision:
    target = pod_target(request, snapshot)
    settings = snapshot.settings
    if target is None or not settings.run_ai_enable:
        return Decision.allow()
    ns = target.namespace
    if ns.moving:
        # Between the delete and the create of a move, no Run:ai project governs the namespace.
        return Decision.deny(
            f"project {ns.name} is moving to another department; its workloads start once the move is done",
            code=409,
            reason=MOVING,
        )
    if ns.runai_queue is None:
        return Decision.deny(
            f"project namespace {ns.name} is not bound to a Run:ai project yet; its workloads start once it is",
            code=403,
            reason=NOT_BOUND,
        )
    if target.kind not in QUOTA_CHECKED_KINDS:
        return Decision.allow()  # jobs are preemptible: Run:ai runs them on idle GPUs over quota
    try:
        gpus = pod_gpu_request(target.pod)
    except ValueError as exc:
        return Decision.deny(f"GPU request: {exc}", code=400, reason="Invalid")
    if gpus <= 0:
        return Decision.allow()
    return check_quota(
        snapshot,
        ns.name,
        gpus,
        now,
        exclude=request_key(request),
        asks=f"this {target.kind} asks for {format_gpus(gpus)}. Stop another GPU {target.kind} or ask an "
        "administrator for more Run:ai quota",
    )


def check_quota(
    snapshot: ClusterSnapshot, namespace: str, gpus: float, now: float, *, asks: str, exclude: str = ""
) -> Decision:
    """R3 for a bound project: allow `gpus` more GPUs when the project has that many of its
    deserved GPUs left. A refusal says "N of M deserved GPUs left; " and then `asks` (what the
    request asks for and what the user can do)."""
    if snapshot.runai_projects is None or namespace not in snapshot.runai_projects:
        # Bound but the Run:ai view is missing: Run:ai enforces the quota when it schedules.
        return Decision.allow(warnings=["GPU quota not checked: Run:ai control plane unreachable"])
    deserved = snapshot.runai_projects[namespace].deserved_gpus
    left = deserved - gpus_in_use(snapshot, namespace, now, exclude=exclude)
    if gpus > left + EPSILON:
        return Decision.deny(
            f"project {namespace} has {format_gpus(max(left, 0.0))} of {format_gpus(deserved)} deserved GPUs left; "
            + asks,
            code=403,
            reason=OVER_QUOTA,
        )
    return Decision.allow(audit={"gpus": format_gpus(gpus), "gpus-left": format_gpus(left - gpus)})
