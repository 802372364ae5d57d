"""What Run:ai's admission would make of a pod, decided before the platform counts it.

Called by the mutating phase (which runs before Run:ai's webhooks, so ours is the refusal a user
sees) and again by the validating phase.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.decision import Decision, Reason
from webhook.core.gpu_sharing import SHARING_ANNOTATIONS, gpu_sharing_error
from webhook.core.preemptibility import POD_GROUPER_ANNOTATIONS, escapes_pod_grouper, unreviewed_owner

# Every annotation either check below reads, each module naming its own: a pod with none of them
# (nearly every pod) passes both, so it is let through without walking its containers.
_READ_ANNOTATIONS = frozenset((*SHARING_ANNOTATIONS, *POD_GROUPER_ANNOTATIONS))


def project_not_bound(namespace: str) -> Decision:
    """Run:ai on and the namespace has no `runai/queue` label yet: its pods wait for the binding.
    Both pod phases refuse with it, the mutating one (S5) after the shell's attempt to bind, the
    validating one (R2) for a pod that reached it anyway, so a user reads the same words."""
    return Decision.deny(
        f"project namespace {namespace} is not bound to a Run:ai project yet; its workloads start once it is",
        code=403,
        reason=Reason.RUNAI_PROJECT_NOT_BOUND,
    )


def runai_pod_refusal(pod: Mapping[str, Any]) -> Decision | None:
    """A pod Run:ai's admission would refuse (its GPU-sharing grammar), or one that would escape
    the preemptibility the webhook gives it: refused with the reason, before anything counts it."""
    meta = pod.get("metadata")
    if (type(meta) is dict or isinstance(meta, Mapping)) and meta.get("ownerReferences"):
        owner = unreviewed_owner(meta)
        if owner is not None:
            return Decision.deny(
                f"this pod: {owner}; in a project bound to Run:ai the platform decides which pods Run:ai may preempt",
                code=403,
                reason=Reason.FORBIDDEN,
            )
    if type(meta) is dict:
        annotations = meta.get("annotations")
        if annotations is None or (type(annotations) is dict and annotations.keys().isdisjoint(_READ_ANNOTATIONS)):
            return None
    reason = gpu_sharing_error(pod)
    if reason is not None:
        return Decision.deny(f"GPU request: {reason}", code=400, reason=Reason.INVALID)
    meta = pod.get("metadata") or {}
    escape = escapes_pod_grouper(meta) if isinstance(meta, Mapping) else None
    if escape is not None:
        return Decision.deny(
            f"{escape}; in a project bound to Run:ai the platform decides which pods Run:ai may preempt: "
            "remove the annotation",
            code=403,
            reason=Reason.FORBIDDEN,
        )
    return None
