"""Warn before enforce: a refusal of a family the settings put in `warn` becomes an admission that
carries the refusal as an admission warning (kubectl prints it) and an audit annotation, as
Kyverno's `Audit` and Gatekeeper's `warn` do, so an operator sees what would be refused in a
cluster already running before anything is.

Each family has one settings key, in one table. A rule that can carry on past its refusal (the pod
mutation still builds the patch it would build, the owner check still checks the quota) asks
`warns` and collects the would-be refusals; GPU quota, the last check of a validation, is named by
its refusal's reason and turned by the shell (`warned_family`, `as_warning`). Refusals outside the
families (a bad object, an unbound project, another project's queue, what bounds the work a hostile
pod causes) and the settings guard (G1, G2) are enforced in every mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from webhook.core.decision import Decision, Reason
from webhook.settings import ClusterSettings

GPU_QUOTA = "gpu-quota"
PRIORITY_CLASS = "priority-class"
AFFINITY = "affinity"
QUEUE_TOPOLOGY = "queue-topology"
PREEMPTIBILITY = "preemptibility"

# Family (the metric's `rule` label) -> the settings key that puts it in warn.
FAMILIES: Mapping[str, str] = {
    GPU_QUOTA: "gpu_quota_enforcement",
    PRIORITY_CLASS: "priority_class_enforcement",
    AFFINITY: "affinity_enforcement",
    QUEUE_TOPOLOGY: "queue_topology_enforcement",
    PREEMPTIBILITY: "preemptibility_enforcement",
}
# The families the pod mutation judges (S1, S4): its webhook may be called twice for one pod (the
# apiserver calls it again when a later webhook changed the pod), so the pod's validation, called
# once, counts them.
MUTATION_FAMILIES = (PRIORITY_CLASS, AFFINITY, QUEUE_TOPOLOGY)
# Refusals the shell turns into warnings after the decision, by reason: each is the last check of
# its decision, so nothing is left to carry on with.
BY_REASON: Mapping[Reason, str] = {Reason.GPU_QUOTA_EXCEEDED: GPU_QUOTA}
WOULD_REFUSE_AUDIT = "would-refuse"  # the audit annotation's key (the apiserver prefixes the webhook's name)
# The pod annotation naming the families the mutation admitted in warn mode. The pod's validation
# counts them, and the chart calls validate-pods only for a pod that carries a label or annotation
# of ours (or a GPU): a pod that chose a class only by `spec.priorityClassName` carries none.
WOULD_REFUSE_ANNOTATION = "scheduling.hopsworks.ai/would-refuse"

# A would-be refusal: (family, the refusal's message).
WouldRefuse = tuple[str, str]


def warns(settings: ClusterSettings, family: str) -> bool:
    """Whether the settings put `family` in warn mode."""
    return bool(getattr(settings, FAMILIES[family]) == "warn")


def warned_family(decision: Decision, settings: ClusterSettings) -> str | None:
    """The family of a refusal the settings put in warn mode; None for anything to return as is."""
    if decision.allowed or decision.reason is None:
        return None
    family = BY_REASON.get(decision.reason)
    if family is None or not warns(settings, family):
        return None
    return family


def warning_text(family: str, message: str, admitted: bool = True) -> str:
    """What kubectl prints for a would-be refusal: of a request admitted, or of one refused for
    another reason (so that fixing that does not come as a surprise)."""
    if admitted:
        return f"admitted because {FAMILIES[family]} is warn; with enforce this is refused: {message}"
    return f"{FAMILIES[family]} is warn, so this alone does not refuse the request; with enforce it does: {message}"


def with_would_refuse(decision: Decision, would_refuse: Sequence[WouldRefuse], count: bool = True) -> Decision:
    """`decision` with its would-be refusals: one warning each, the audit annotation naming each
    family with its message, and (`count`) the families, which the shell counts once the review is
    admitted. A refusal carries them too: fixing what it enforces must not hide them, and the shell
    may still admit it (`as_warning`)."""
    if not would_refuse:
        return decision
    said = "; ".join(f"{family}: {message}" for family, message in would_refuse)
    earlier = decision.audit.get(WOULD_REFUSE_AUDIT)
    return replace(
        decision,
        warnings=(*decision.warnings, *(warning_text(f, m, decision.allowed) for f, m in would_refuse)),
        audit={**decision.audit, WOULD_REFUSE_AUDIT: f"{earlier}; {said}" if earlier else said},
        would_refuse=(*decision.would_refuse, *(family for family, _ in would_refuse if count)),
    )


def as_warning(decision: Decision, family: str) -> Decision:
    """The refusal, admitted: its message as a warning and an audit annotation, with what it
    carried already (warnings, would-be refusals)."""
    allowed = Decision(True, warnings=decision.warnings, audit=decision.audit, would_refuse=decision.would_refuse)
    return with_would_refuse(allowed, [(family, decision.message)])
