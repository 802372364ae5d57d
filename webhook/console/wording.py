"""What each GPU status means for the people reading the console, and what they can do about it.

Keyed by the GPU API's status codes. A code this table does not know (a status added to the API
later) is still shown: with the server's own message and a generic next step.
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.core.gpu_view import GpuWarning


@dataclass(frozen=True, slots=True)
class Advice:
    code: str
    title: str
    explanation: str
    action: str
    detail: str  # the server's own message


def _drift(w: GpuWarning) -> tuple[str, str, str]:
    return (
        "The Run:ai project is in another department",
        f"Its Run:ai project is in Run:ai department {w.actual or 'unknown'}, but this project belongs in "
        f"{w.expected or 'another department'}. Its GPUs count against the wrong department's quota.",
        f"Ask a Run:ai administrator to move the Run:ai project to department {w.expected or 'expected'} "
        "(an adopted project is not moved by this platform).",
    )


def _not_bound(_: GpuWarning) -> tuple[str, str, str]:
    return (
        "Not linked to Run:ai yet",
        "This project has no Run:ai project yet, so its workloads cannot start: Run:ai only schedules "
        "the namespaces it has bound.",
        "Start a workload, or wait for the background pass, to link it. If it stays unlinked, ask the "
        "platform administrator to check that Run:ai is reachable.",
    )


def _binding_left(w: GpuWarning) -> tuple[str, str, str]:
    return (
        "Still bound to Run:ai although the integration is off",
        f"The Run:ai integration is turned off, but this namespace is still bound to Run:ai project "
        f"{w.actual or ''}, so Run:ai keeps scheduling its pods.",
        "To leave Run:ai, a platform administrator deletes the Run:ai project in Run:ai and then removes "
        "the runai/queue and hopsworks.ai/runai-project-id labels from the namespace.",
    )


def _unreachable(_: GpuWarning) -> tuple[str, str, str]:
    return (
        "Run:ai cannot be reached",
        "The numbers below are from the last time Run:ai answered, or missing. Workloads of linked "
        "projects still start, and Run:ai enforces the quota when it schedules them.",
        "Try again in a few minutes. If it lasts, tell the platform administrator that the Run:ai "
        "control plane does not answer.",
    )


def _missing(w: GpuWarning) -> tuple[str, str, str]:
    return (
        "Run:ai has no such project",
        f"The namespace is labelled for Run:ai project {w.actual or ''}, but Run:ai has no project of "
        "that name, so nothing governs its GPUs.",
        "Ask a platform administrator to recreate the Run:ai project or remove the runai/queue label, "
        "so that the project is bound again.",
    )


def _admission_down(w: GpuWarning) -> tuple[str, str, str]:
    return (
        "Run:ai's admission is down",
        f"Run:ai's admission Deployments in namespace runai ({w.actual or ''}) are not available. Their "
        "webhooks fail closed, so no workload can start in any project linked to Run:ai until they are back.",
        "Restore the Deployments in namespace runai (see the detail below), or ask the Run:ai administrator to.",
    )


_ADVICE = {
    "RUN_AI_ADMISSION_DOWN": _admission_down,
    "RUN_AI_DEPARTMENT_DRIFT": _drift,
    "RUN_AI_PROJECT_NOT_BOUND": _not_bound,
    "RUN_AI_BINDING_LEFT": _binding_left,
    "RUN_AI_UNREACHABLE": _unreachable,
    "RUN_AI_PROJECT_MISSING": _missing,
}


def advice(warning: GpuWarning) -> Advice:
    words = _ADVICE.get(warning.code)
    if words is None:
        title, explanation, action = (
            f"GPU status {warning.code}",
            warning.message,
            "If this stays, show this message to the platform administrator.",
        )
    else:
        title, explanation, action = words(warning)
    return Advice(warning.code, title, explanation, action, warning.message)
