"""Warn before enforce: a refusal of a family the settings put in `warn` becomes an admission that
carries the refusal as an admission warning (kubectl prints it) and an audit annotation, as
Kyverno's `Audit` and Gatekeeper's `warn` do, so an operator sees what would be refused in a
cluster already running before anything is.

The families are named by the refusal's reason, in one table. The settings guard (G1, G2) is never
a family: a settings ConfigMap that would break the product is refused in every mode.
"""

from __future__ import annotations

from collections.abc import Mapping

from webhook.core.decision import Decision, Reason
from webhook.settings import ClusterSettings

GPU_QUOTA = "gpu-quota"
# Reason -> (family, the settings key that puts it in warn). A refusal whose reason is not here is
# always enforced.
FAMILIES: Mapping[Reason, tuple[str, str]] = {
    Reason.GPU_QUOTA_EXCEEDED: (GPU_QUOTA, "gpu_quota_enforcement"),
}
WOULD_REFUSE_AUDIT = "would-refuse"  # the audit annotation's key (the apiserver prefixes the webhook's name)


def warned_family(decision: Decision, settings: ClusterSettings) -> str | None:
    """The family of a refusal the settings put in warn mode; None for anything to return as is."""
    if decision.allowed or decision.reason is None:
        return None
    found = FAMILIES.get(decision.reason)
    if found is None or getattr(settings, found[1]) != "warn":
        return None
    return found[0]


def as_warning(decision: Decision, family: str) -> Decision:
    """The refusal, admitted: its message as a warning and an audit annotation, its own warnings kept."""
    _, key = next(v for v in FAMILIES.values() if v[0] == family)
    warning = f"admitted because {key} is warn; with enforce this is refused: {decision.message}"
    return Decision.allow(
        warnings=(*decision.warnings, warning), audit={WOULD_REFUSE_AUDIT: f"{family}: {decision.message}"}
    )
