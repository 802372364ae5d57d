"""Whether Run:ai's own admission can admit pods: a pure reading of the watched Deployments.

Run:ai's admission webhooks (Deployments `runai-admission-controller` and `admission` in namespace
`runai`) fail closed: while either is down, no pod can be created in a namespace bound to Run:ai,
whatever this webhook says. Operators are told so here, in the admin view, the console and the
metric `webhook_runai_admission_available`.
"""

from __future__ import annotations

from webhook.core.gpu_view import GpuCode, GpuWarning
from webhook.snapshot import RUNAI_ADMISSION_DEPLOYMENTS, RUNAI_NAMESPACE, ClusterSnapshot


def runai_admission_down(snapshot: ClusterSnapshot) -> list[str]:
    """Names of Run:ai's admission Deployments that are missing or unavailable (Run:ai on and
    their watch listed; else nothing is known and nothing is said)."""
    known = snapshot.runai_admission
    if not snapshot.settings.run_ai_enable or known is None:
        return []
    return [name for name in RUNAI_ADMISSION_DEPLOYMENTS if name not in known or not known[name].available]


def runai_admission_warning(snapshot: ClusterSnapshot) -> GpuWarning | None:
    down = runai_admission_down(snapshot)
    if not down:
        return None
    known = snapshot.runai_admission or {}
    parts = []
    for name in down:
        found = known.get(name)
        if found is None:
            parts.append(f"{name} not found (or this server may not read Deployments in namespace {RUNAI_NAMESPACE})")
        else:
            parts.append(f"{name} has {found.available_replicas} of {found.replicas} replicas available")
    return GpuWarning(
        code=GpuCode.ADMISSION_DOWN,
        message=(
            f"Run:ai's admission in namespace {RUNAI_NAMESPACE} is down: {'; '.join(parts)}. While it is, no pod "
            "can be created in a namespace bound to Run:ai (its webhooks fail closed): restore the Deployment "
            f"(kubectl -n {RUNAI_NAMESPACE} get deployment {' '.join(down)})"
        ),
        actual=",".join(down),
    )
