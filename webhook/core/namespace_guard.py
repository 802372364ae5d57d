"""The project namespace guard: writes to a namespace labelled `hopsworks.ai/project`.

Judges the scheduling annotations (strictly only what the request writes), the department label
(a department edit that would move a Run:ai project this system created is left to the admin move),
the ownership marks only this system writes (R4), and the removal of the project label.

A pure function of (AdmissionReview `request`, cluster snapshot, guard configuration, the Run:ai
department names the cache knows) -> `Decision`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from webhook.core.decision import Decision, Reason
from webhook.core.departments import department_name_error, runai_department_for
from webhook.core.guard_config import GuardConfig, request_kind, requester
from webhook.core.project_settings import ProjectSettingsError, read_project_scheduling
from webhook.settings import ClusterSettings
from webhook.snapshot import (
    AVAILABLE_ANNOTATION,
    DEFAULTS_ANNOTATION,
    DEPARTMENT_LABEL,
    PROJECT_LABEL,
    RUNAI_MOVE_ANNOTATION,
    RUNAI_PROJECT_ID_LABEL,
    RUNAI_QUEUE_LABEL,
    ClusterSnapshot,
    NamespaceInfo,
)

MOVE_API = "POST /api/v1/admin/projects/{namespace}/move"
MOVE_CLI = "scheduling-webhook admin move-project {namespace} {department}"


def _annotation_checks(
    new: NamespaceInfo, old: NamespaceInfo | None, snapshot: ClusterSnapshot
) -> tuple[list[str], list[str]]:
    """(errors, warnings) for the scheduling annotations.

    Only what this request writes is judged strictly: an annotation left as it was, that a later
    cluster settings change made stale, must not block unrelated edits (the reconciler labelling
    the namespace); it gets a warning instead, and pod admission ignores the stale values.
    """
    keys = (AVAILABLE_ANNOTATION, DEFAULTS_ANNOTATION)
    changed = {k: old is None or old.annotations.get(k) != new.annotations.get(k) for k in keys}
    existing = frozenset(snapshot.priority_classes) or None
    strict_available = changed[AVAILABLE_ANNOTATION]
    # A new available subset must still hold the defaults, so they are rechecked with it.
    strict_defaults = any(changed.values())
    try:
        result = read_project_scheduling(
            new.annotations,
            snapshot.settings,
            strict_available=strict_available,
            strict_defaults=strict_defaults,
            existing_priority_classes=existing,
        )
    except ProjectSettingsError as exc:
        if strict_defaults:
            return [str(exc)], []
        return [], [f"the namespace's scheduling annotations are not valid and are ignored: {exc}"]
    return [], [f"ignored by pod admission: {note}" for note in result.notes]


def validate_namespace_change(
    request: Mapping[str, Any],
    snapshot: ClusterSnapshot,
    config: GuardConfig,
    runai_departments: Collection[str] | None = None,
) -> Decision:
    """Judge a write to a project namespace (label `hopsworks.ai/project`); others pass.

    `runai_departments`: names of the Run:ai departments the cache knows; None when unknown, and
    then any department change of a bound project counts as needing a Run:ai move.
    """
    if request_kind(request) != "Namespace" or request.get("operation") not in ("CREATE", "UPDATE"):
        # DELETE: the reconciler's finalizer deletes the Run:ai project (R4); nothing to refuse.
        return Decision.allow()
    new = NamespaceInfo.from_object(request.get("object") or {})
    old_obj = request.get("oldObject")
    old = NamespaceInfo.from_object(old_obj) if request.get("operation") == "UPDATE" and old_obj else None
    if not new.is_project:
        if old is not None and old.is_project:
            return _project_label_removal(request, old, config)
        return Decision.allow()
    settings = snapshot.settings
    own = config.own.matches(request.get("userInfo"))

    invalid, warnings = _annotation_checks(new, old, snapshot)
    forbidden: list[str] = []

    new_dept = new.department
    old_dept = old.department if old is not None else None
    dept_changed = old is not None and new_dept != old_dept
    if new_dept is not None and (old is None or dept_changed):
        error = department_name_error(new_dept)
        if error:
            invalid.append(f"{DEPARTMENT_LABEL}: {error}")

    if old is not None:
        # Bound-ness is judged on the namespace as it is: dropping the Run:ai labels in the same
        # edit would otherwise skip the move and leave the Run:ai project in the old department.
        if dept_changed and old.runai_queue:
            old_target = runai_department_for(old_dept, settings, runai_departments)
            new_target = runai_department_for(new_dept, settings, runai_departments)
            needs_move = old_target is None or new_target is None or old_target != new_target
            created_here = old.runai_project_id is not None
            if needs_move and created_here and not own:
                if settings.run_ai_enable:
                    forbidden.append(_move_refusal(new.name, old_dept, new_dept, old_target, new_target, settings))
                else:
                    # Run:ai off: this system makes no Run:ai calls, so no move could happen anyway;
                    # refusing would only freeze the platform's department management.
                    warnings.append(
                        f"Run:ai is off, so the Run:ai project {old.runai_queue} stays in its Run:ai "
                        "department; its GPU view reports the drift once Run:ai is on again"
                    )
            elif needs_move and not created_here:
                warnings.append(
                    f"the Run:ai project {old.runai_queue} was adopted, not created by this system, so it "
                    "stays in its Run:ai department; the GPU view reports RUN_AI_DEPARTMENT_DRIFT until a "
                    "Run:ai administrator moves it"
                )
        if not own:
            forbidden += _ownership_label_refusals(new, old)
            warnings += _binding_label_warnings(new, old, settings)

    if forbidden:
        return Decision.deny("; ".join(forbidden + invalid), warnings=warnings)
    if invalid:
        return Decision.deny("; ".join(invalid), code=422, reason=Reason.INVALID, warnings=warnings)
    return Decision.allow(warnings=warnings)


def _project_label_removal(request: Mapping[str, Any], old: NamespaceInfo, config: GuardConfig) -> Decision:
    # The label is what every pod webhook selects on: without it the namespace's pods skip
    # scheduling injection, the GPU quota and the Run:ai binding check, while a Run:ai project
    # and GPU reservations may still be attached. Only the installation and this system decide
    # that a namespace stops being a project; a project ends by deleting its namespace.
    if config.own.matches(request.get("userInfo")) or config.installers.matches(request.get("userInfo")):
        return Decision.allow(
            warnings=[f"{old.name} is no longer a project namespace: its pods are no longer checked or scheduled"],
            audit={"project-label-removed": old.name},
        )
    bound = f" (bound to Run:ai project {old.runai_queue})" if old.runai_queue else ""
    return Decision.deny(
        f"{PROJECT_LABEL} cannot be removed from {old.name}{bound}: it switches off the GPU quota, the "
        "scheduling rules and the Run:ai binding for every pod of the project. A project ends by deleting its "
        f"namespace; an installer identity may remove the label; {requester(request)} is not one"
    )


def _move_refusal(
    namespace: str,
    old_dept: str | None,
    new_dept: str | None,
    old_target: str | None,
    new_target: str | None,
    settings: ClusterSettings,
) -> str:
    target = new_dept or settings.run_ai_default_department
    if old_target is not None and new_target is not None:
        why = f"its Run:ai project must move from Run:ai department {old_target} to {new_target}"
    else:
        why = "the Run:ai departments are not known yet, so its Run:ai project may have to move"
    return (
        f"{DEPARTMENT_LABEL} of {namespace} cannot be edited directly from {old_dept or '(default)'} to "
        f"{new_dept or '(default)'}: {why}, which only the admin move does. Use "
        f'{MOVE_API.format(namespace=namespace)} with {{"department": "{target}"}} or '
        f"`{MOVE_CLI.format(namespace=namespace, department=target)}`"
    )


def _ownership_label_refusals(new: NamespaceInfo, old: NamespaceInfo) -> list[str]:
    # The project-id label is this system's mark that it created the Run:ai project, and it deletes
    # and moves only marked ones (R4): letting others add or repoint it would make it delete a
    # Run:ai project it does not own. Removing it is allowed: that gives up ownership.
    # (CREATE is not checked, so restoring a namespace from a backup keeps working.)
    refusals = []
    before, after = old.runai_project_id, new.runai_project_id
    if after is not None and after != before:
        refusals.append(
            f"{RUNAI_PROJECT_ID_LABEL} is set only by this system, on the Run:ai projects it creates; "
            "remove it to give up ownership, but do not add or change it"
        )
    # A department move's intent is also its lock and its recovery record: an edit by anyone else
    # could make the leader finish or roll back a move that never happened.
    if old.annotations.get(RUNAI_MOVE_ANNOTATION) != new.annotations.get(RUNAI_MOVE_ANNOTATION):
        refusals.append(
            f"{RUNAI_MOVE_ANNOTATION} is written only by this system while it moves the project between "
            "departments; use the admin move API"
        )
    return refusals


def _binding_label_warnings(new: NamespaceInfo, old: NamespaceInfo, settings: ClusterSettings) -> list[str]:
    # Removing the binding labels is how an admin leaves Run:ai, so it is allowed; while Run:ai is
    # on, say what will follow, since the Run:ai project still claims the namespace.
    if not settings.run_ai_enable:
        return []
    warnings = []
    if old.runai_queue and new.runai_queue != old.runai_queue:
        warnings.append(
            f"Run:ai is on: the Run:ai project bound to this namespace still exists, and the namespace is "
            f"bound again by the next reconcile pass or workload start (label {RUNAI_QUEUE_LABEL} "
            f"{'removed' if new.runai_queue is None else 'changed'}). To leave Run:ai, delete the Run:ai "
            "project first"
        )
    if old.runai_project_id and new.runai_project_id is None:
        warnings.append(
            f"{RUNAI_PROJECT_ID_LABEL} removed: this system no longer deletes or moves this namespace's Run:ai project"
        )
    return warnings
