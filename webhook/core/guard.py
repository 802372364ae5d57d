"""Settings guard and project settings guard (DESIGN G1-G3; issue 4, points 2, 5 and 6).

Pure functions of (AdmissionReview `request` dict, cluster snapshot, guard configuration) ->
`Decision`. They never call out and have no side effects, so a dryRun request is judged exactly
like a real one.

`parse_project_scheduling` is the single reader of a project namespace's scheduling annotations:
the validating webhook calls it strictly when the annotations are written, pod mutation calls it
leniently on every pod.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.core.decision import Decision
from webhook.settings import SETTINGS_CONFIGMAP, ClusterSettings, SettingsError
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
# Where the server sends the Run:ai client secret, and which secret: whoever may change these
# could have the secret sent to a host of their choosing, so, like run_ai_enable, only the
# installation changes them.
INSTALLER_ONLY = ("run_ai_url", "run_ai_client_id", "run_ai_client_secret_name", "run_ai_client_secret_key")
# How many namespaces a refusal message names before it says "and N more".
MAX_LISTED_NAMESPACES = 10

# Same rule as Run:ai department names: up to 63 of [a-z0-9-], alphanumeric at both ends.
_DEPARTMENT_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# A queue name ends up as the value of the `kueue.x-k8s.io/queue-name` label and names a LocalQueue,
# so it must be both a label value and a DNS subdomain.
_QUEUE_RE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")

# A project's subset and defaults are a few hundred characters; a bound keeps a hostile annotation
# from costing parse time on every pod of the project.
MAX_SCHEDULING_ANNOTATION_CHARS = 16 * 1024

_AVAILABLE_KEYS = ("affinity", "antiAffinity", "priorityClasses", "queues")
_DEFAULTS_KEYS = ("affinity", "antiAffinity", "priorityClass", "queue", "topology")


# -- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Identities:
    """Kubernetes users and groups, as the apiserver reports them in `userInfo`."""

    usernames: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()

    def matches(self, user_info: Mapping[str, Any] | None) -> bool:
        info = user_info or {}
        if info.get("username") in self.usernames:
            return True
        return not self.groups.isdisjoint(info.get("groups") or ())

    def __bool__(self) -> bool:
        return bool(self.usernames or self.groups)

    @classmethod
    def parse(cls, values: Iterable[str]) -> Identities:
        """From command-line/config strings: `group:NAME` is a group, anything else a username."""
        users: set[str] = set()
        groups: set[str] = set()
        for value in values:
            value = value.strip()
            if value.startswith("group:"):
                groups.add(value.removeprefix("group:"))
            elif value:
                users.add(value)
        return cls(frozenset(users), frozenset(groups))


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """Server configuration the guards need; never read from the ConfigMap they guard."""

    install_namespace: str = "hopsworks"
    # Who may change run_ai_enable: the Helm/installer identities.
    installers: Identities = field(default_factory=Identities)
    # This system's own identities (the webhook/reconciler service account): they perform moves.
    own: Identities = field(default_factory=Identities)


# -- project scheduling ----------------------------------------------------------------------


class ProjectSettingsError(ValueError):
    """A project's scheduling annotations cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class ProjectScheduling:
    """A project's effective choices, always within what the cluster offers.

    Defaults are the project's own (annotation) where it set a key, else the cluster's
    `scheduler.defaults`, kept only when inside the project's subset. `default_queue` does not
    include `kueue_project_default_local_queue`/`kueue_system_jobs_local_queue`: those depend on
    the workload kind. `default_topology` is a unit name (`host`), see `available.topologies`.
    """

    affinity: tuple[str, ...] = ()
    anti_affinity: tuple[str, ...] = ()
    priority_classes: tuple[str, ...] = ()
    queues: tuple[str, ...] | None = None  # None: the annotation does not restrict queues
    default_affinity: tuple[str, ...] = ()
    default_anti_affinity: tuple[str, ...] = ()
    default_priority_class: str | None = None
    default_queue: str | None = None
    default_topology: str | None = None
    # Lenient reading only: what was ignored because the cluster no longer offers it.
    notes: tuple[str, ...] = ()
    # Which defaults the project's own annotation set (keys of DEFAULTS_ANNOTATION); the rest
    # come from the cluster.
    project_defaults: frozenset[str] = frozenset()


def department_name_error(name: str) -> str | None:
    """Why `name` is not a valid department name, or None when it is."""
    if _DEPARTMENT_RE.fullmatch(name):
        return None
    return (
        f"department {name!r} is not a valid name: use up to 63 lowercase letters, digits and '-', "
        "starting and ending with a letter or digit"
    )


def runai_department_for(
    department: str | None, settings: ClusterSettings, runai_departments: Collection[str] | None
) -> str | None:
    """The Run:ai department a platform department maps to; None when that cannot be known."""
    default = settings.run_ai_default_department
    # No department label is the default department; the default Run:ai department exists
    # (a prerequisite), so both map there whatever the cache knows.
    if department is None or department == default:
        return default
    if runai_departments is None:
        return None
    return department if department in runai_departments else default


class _Problems:
    """Collects what is wrong: errors when strict, notes (and dropped values) when lenient."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.notes: list[str] = []

    def bad(self, message: str, strict: bool) -> None:
        (self.errors if strict else self.notes).append(message)


def _quote(values: Iterable[str]) -> str:
    listed = ", ".join(repr(v) for v in values)
    return listed or "none"


def _load_json_object(annotations: Mapping[str, str], key: str, problems: _Problems) -> dict[str, Any]:
    raw = annotations.get(key)
    if raw is None or raw.strip() == "":
        return {}
    if len(raw) > MAX_SCHEDULING_ANNOTATION_CHARS:
        problems.errors.append(
            f"{key}: {len(raw)} characters, more than the limit of {MAX_SCHEDULING_ANNOTATION_CHARS}"
        )
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        problems.errors.append(f"{key}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
        return {}
    except (ValueError, RecursionError) as exc:
        # A number past Python's digit limit, or nesting past the stack: not what this annotation holds.
        problems.errors.append(f"{key}: cannot be read: {type(exc).__name__}: {str(exc)[:100]}")
        return {}
    if not isinstance(value, dict):
        problems.errors.append(f"{key}: must be a JSON object, got {type(value).__name__}")
        return {}
    unknown = sorted(set(value) - set(_known_keys(key)))
    if unknown:
        problems.errors.append(f"{key}: unknown keys {_quote(unknown)}; allowed keys: {_quote(_known_keys(key))}")
    # JSON null means "not set", like an absent key.
    return {k: v for k, v in value.items() if k in _known_keys(key) and v is not None}


def _known_keys(annotation: str) -> tuple[str, ...]:
    return _AVAILABLE_KEYS if annotation == AVAILABLE_ANNOTATION else _DEFAULTS_KEYS


def _string_list(annotation: str, key: str, value: Any, problems: _Problems) -> list[str] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.errors.append(f"{annotation}: {key} must be a list of non-empty strings, got {value!r}")
        return None
    return list(dict.fromkeys(value))  # drop duplicates, keep order


def _string(annotation: str, key: str, value: Any, problems: _Problems) -> str | None:
    if not isinstance(value, str) or not value:
        problems.errors.append(f"{annotation}: {key} must be a non-empty string, got {value!r}")
        return None
    return value


def _queue_name_ok(annotation: str, key: str, name: str, problems: _Problems) -> bool:
    if _QUEUE_RE.fullmatch(name):
        return True
    problems.errors.append(
        f"{annotation}: {key} {name!r} is not a valid queue name (up to 63 lowercase letters, digits, "
        "'-' and '.', starting and ending with a letter or digit)"
    )
    return False


def _scheduling(
    annotations: Mapping[str, str],
    settings: ClusterSettings,
    *,
    strict_available: bool,
    strict_defaults: bool,
    existing_priority_classes: Collection[str] | None,
) -> ProjectScheduling:
    problems = _Problems()
    cluster = settings.scheduler
    offered: dict[str, list[str]] = {
        "affinity": cluster.available.affinity,
        "antiAffinity": cluster.available.anti_affinity,
        "priorityClasses": cluster.available.priority_classes,
    }
    project: dict[str, list[str] | None] = {
        "affinity": cluster.project.affinity,
        "antiAffinity": cluster.project.anti_affinity,
        "priorityClasses": cluster.project.priority_classes,
    }
    avail = _load_json_object(annotations, AVAILABLE_ANNOTATION, problems)
    subset: dict[str, list[str]] = {}
    source: dict[str, str] = {}
    for key, cluster_offer in offered.items():
        if key in avail:
            values = _string_list(AVAILABLE_ANNOTATION, key, avail[key], problems) or []
            source[key] = f"its {AVAILABLE_ANNOTATION} annotation"
        elif project[key] is not None:
            values = list(project[key] or ())
            source[key] = "the cluster's scheduler.project"
        else:
            values = list(cluster_offer)
            source[key] = "everything the cluster offers"
        kept = []
        for value in values:
            if value not in cluster_offer:
                what = "priority class" if key == "priorityClasses" else f"{key} label"
                problems.bad(
                    f"{AVAILABLE_ANNOTATION}: {what} {value!r} is not offered by the cluster "
                    f"(available.{key}: {_quote(cluster_offer)})",
                    strict_available,
                )
            elif (
                key == "priorityClasses"
                and key in avail
                and existing_priority_classes
                and value not in existing_priority_classes
            ):
                problems.bad(f"{AVAILABLE_ANNOTATION}: PriorityClass {value!r} does not exist", strict_available)
            else:
                kept.append(value)
        subset[key] = kept

    queues: list[str] | None = None
    if "queues" in avail:
        listed = _string_list(AVAILABLE_ANNOTATION, "queues", avail["queues"], problems) or []
        queues = [q for q in listed if _queue_name_ok(AVAILABLE_ANNOTATION, "queues", q, problems)]
    elif cluster.project.queues is not None:
        queues = list(cluster.project.queues)

    chosen = _load_json_object(annotations, DEFAULTS_ANNOTATION, problems)

    def within(key: str, label: str, defaults_key: str) -> list[str]:
        values = _string_list(DEFAULTS_ANNOTATION, defaults_key, chosen[defaults_key], problems) or []
        kept = []
        for value in values:
            if value in subset[key]:
                kept.append(value)
            else:
                problems.bad(
                    f"{DEFAULTS_ANNOTATION}: {label} {value!r} is outside the project's available {key} "
                    f"({_quote(subset[key])}, from {source[key]})",
                    strict_defaults,
                )
        return kept

    # An explicit list in the project's defaults (even []) replaces the cluster default.
    if "affinity" in chosen:
        default_affinity = within("affinity", "affinity label", "affinity")
    else:
        default_affinity = [v for v in cluster.defaults.affinity if v in subset["affinity"]]
    if "antiAffinity" in chosen:
        default_anti = within("antiAffinity", "antiAffinity label", "antiAffinity")
    else:
        default_anti = [v for v in cluster.defaults.anti_affinity if v in subset["antiAffinity"]]

    default_pc: str | None = None
    if "priorityClass" in chosen:
        pc = _string(DEFAULTS_ANNOTATION, "priorityClass", chosen["priorityClass"], problems)
        if pc is not None and pc not in subset["priorityClasses"]:
            problems.bad(
                f"{DEFAULTS_ANNOTATION}: priorityClass {pc!r} is outside the project's available "
                f"priorityClasses ({_quote(subset['priorityClasses'])}, from {source['priorityClasses']})",
                strict_defaults,
            )
        elif pc is not None and existing_priority_classes and pc not in existing_priority_classes:
            problems.bad(f"{DEFAULTS_ANNOTATION}: PriorityClass {pc!r} does not exist", strict_defaults)
        else:
            default_pc = pc
    project_pc = default_pc
    if default_pc is None and cluster.defaults.priority_class in subset["priorityClasses"]:
        default_pc = cluster.defaults.priority_class

    default_queue: str | None = None
    if "queue" in chosen:
        queue = _string(DEFAULTS_ANNOTATION, "queue", chosen["queue"], problems)
        if queue is not None and _queue_name_ok(DEFAULTS_ANNOTATION, "queue", queue, problems):
            if queues is not None and queue not in queues:
                problems.bad(
                    f"{DEFAULTS_ANNOTATION}: queue {queue!r} is outside the project's available queues "
                    f"({_quote(queues)})",
                    strict_defaults,
                )
            else:
                default_queue = queue
    project_queue = default_queue
    if default_queue is None and cluster.defaults.queue and (queues is None or cluster.defaults.queue in queues):
        default_queue = cluster.defaults.queue

    default_topology: str | None = None
    if "topology" in chosen:
        unit = _string(DEFAULTS_ANNOTATION, "topology", chosen["topology"], problems)
        if unit is not None and unit not in cluster.available.topologies:
            problems.bad(
                f"{DEFAULTS_ANNOTATION}: topology {unit!r} is not a topology unit of the cluster "
                f"({_quote(sorted(cluster.available.topologies))})",
                strict_defaults,
            )
        else:
            default_topology = unit
    # Read before the cluster's defaults fill the gaps: which of these the project's annotation set.
    from_project = {key for key in ("affinity", "antiAffinity") if key in chosen}
    from_project.update(
        key
        for key, value in (("priorityClass", project_pc), ("queue", project_queue), ("topology", default_topology))
        if value is not None
    )
    if default_topology is None:
        default_topology = cluster.defaults.topology

    if problems.errors:
        raise ProjectSettingsError("; ".join(problems.errors))
    return ProjectScheduling(
        affinity=tuple(subset["affinity"]),
        anti_affinity=tuple(subset["antiAffinity"]),
        priority_classes=tuple(subset["priorityClasses"]),
        queues=None if queues is None else tuple(queues),
        default_affinity=tuple(default_affinity),
        default_anti_affinity=tuple(default_anti),
        default_priority_class=default_pc,
        default_queue=default_queue,
        default_topology=default_topology,
        notes=tuple(problems.notes),
        project_defaults=frozenset(from_project),
    )


def parse_project_scheduling(
    ns: NamespaceInfo,
    settings: ClusterSettings,
    *,
    strict: bool = False,
    existing_priority_classes: Collection[str] | None = None,
) -> ProjectScheduling:
    """The project's effective available subset and defaults.

    Raises ProjectSettingsError when an annotation is malformed (bad JSON, not an object, unknown
    keys, wrong types, invalid queue names). Values the cluster no longer offers (settings changed
    after the annotation was written) are dropped and explained in `notes`; with `strict=True`
    they are errors too. `existing_priority_classes`, when non-empty, also checks that the
    annotations' priority classes exist.
    """
    return _scheduling(
        ns.annotations,
        settings,
        strict_available=strict,
        strict_defaults=strict,
        existing_priority_classes=existing_priority_classes,
    )


# -- request helpers -------------------------------------------------------------------------


def _request_kind(request: Mapping[str, Any]) -> str:
    kind = (request.get("kind") or {}).get("kind")
    if kind:
        return str(kind)
    obj = request.get("object") or request.get("oldObject") or {}
    return str(obj.get("kind") or "")


def _who(request: Mapping[str, Any]) -> str:
    return str((request.get("userInfo") or {}).get("username") or "(unknown user)")


def _list_capped(names: Sequence[str], limit: int = MAX_LISTED_NAMESPACES) -> str:
    shown = ", ".join(names[:limit])
    rest = len(names) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown


# -- settings guard (G1-G3) ------------------------------------------------------------------


def _flags_of(data: Mapping[str, Any] | None, fallback: ClusterSettings) -> ClusterSettings:
    """run_ai_enable/kueue_installed of a ConfigMap that may not parse as a whole.

    A broken ConfigMap (written while the webhook was down) must still be fixable, and the flags
    it held are still what the change is measured against; if even they do not parse, the last
    good settings the caches hold are.
    """
    try:
        return ClusterSettings.from_configmap_data(data)
    except SettingsError:
        pass
    if not isinstance(data, Mapping):
        return fallback
    flags = {k: v for k, v in data.items() if k in ("run_ai_enable", "kueue_installed", *INSTALLER_ONLY)}
    try:
        return ClusterSettings.from_configmap_data(flags)
    except SettingsError:
        return fallback


def _bound_namespaces(snapshot: ClusterSnapshot) -> list[str]:
    # Any namespace with the label, project or not: Run:ai's webhooks select on it alone.
    return sorted(name for name, ns in snapshot.namespaces.items() if RUNAI_QUEUE_LABEL in ns.labels)


def validate_settings_change(request: Mapping[str, Any], snapshot: ClusterSnapshot, config: GuardConfig) -> Decision:
    """Judge a write to the settings ConfigMap (G1-G3); other ConfigMaps pass.

    The change is measured between the settings before and after the request; an absent ConfigMap
    means the default settings (the caches treat a deleted one so). Hence DELETE is allowed
    unless it would turn Run:ai off: deleting the ConfigMap while run_ai_enable is true is a
    change of run_ai_enable, so only the installer may do it (helm uninstall). Deleting the
    whole install namespace is always allowed: refusing there would leave it stuck terminating.
    """
    if _request_kind(request) != "ConfigMap":
        return Decision.allow()
    operation = request.get("operation")
    obj = request.get("object") or {}
    old_obj = request.get("oldObject") or {}
    meta = obj.get("metadata") or old_obj.get("metadata") or {}
    name = request.get("name") or meta.get("name")
    namespace = request.get("namespace") or meta.get("namespace")
    if name != SETTINGS_CONFIGMAP or namespace != config.install_namespace:
        return Decision.allow()
    if operation not in ("CREATE", "UPDATE", "DELETE"):
        return Decision.allow()

    if operation == "CREATE":
        before = ClusterSettings()
    elif old_obj:
        before = _flags_of(old_obj.get("data"), snapshot.settings)
    else:
        # Old apiservers send no oldObject on DELETE: the caches' view is the best we have.
        before = snapshot.settings

    if operation == "DELETE":
        install_ns = snapshot.namespaces.get(config.install_namespace)
        if install_ns is not None and install_ns.deleting:
            return Decision.allow(audit={"settings-deleted-with-namespace": config.install_namespace})
        after = ClusterSettings()
    else:
        try:
            after = ClusterSettings.from_configmap_data(obj.get("data"))
        except SettingsError as exc:
            return Decision.deny(f"{SETTINGS_CONFIGMAP}: {exc}", code=422, reason="Invalid")

    exclusion = after.exclusion_error()
    if exclusion:
        return Decision.deny(
            f"{SETTINGS_CONFIGMAP}: {exclusion}; set kueue_installed to false, or turn Run:ai off through "
            "the installation first",
            code=422,
            reason="Invalid",
        )

    warnings: list[str] = []
    audit: dict[str, str] = {}
    if after.run_ai_enable != before.run_ai_enable:
        change = f"{str(before.run_ai_enable).lower()}->{str(after.run_ai_enable).lower()}"
        if not config.installers.matches(request.get("userInfo")):
            hint = "" if config.installers else " (no installer identities are configured on this webhook)"
            verb = "deleting the settings would change" if operation == "DELETE" else "cannot change"
            return Decision.deny(
                f"{SETTINGS_CONFIGMAP}: {verb} run_ai_enable ({change}): it is set only by the installation. "
                f"Set hopsworks.variables.run_ai_enable in the Hopsworks Helm values and run helm upgrade; "
                f"{_who(request)} is not an installer identity{hint}"
            )
        audit["run-ai-enable"] = change
        if not after.run_ai_enable:
            bound = _bound_namespaces(snapshot)
            if bound:
                warnings.append(
                    f"Run:ai is turned off but {len(bound)} namespaces stay bound to it and Run:ai keeps "
                    f"scheduling their pods ({_list_capped(bound)}); their GPU view reports "
                    "RUN_AI_BINDING_LEFT. See the README on leaving Run:ai."
                )

    # DELETE resets them to the shipped defaults, which send the secret nowhere of a caller's choosing.
    changed = [key for key in INSTALLER_ONLY if getattr(after, key) != getattr(before, key)]
    if changed and operation != "DELETE":
        if not config.installers.matches(request.get("userInfo")):
            hint = "" if config.installers else " (no installer identities are configured on this webhook)"
            return Decision.deny(
                f"{SETTINGS_CONFIGMAP}: cannot change {', '.join(changed)}: they say where the Run:ai client "
                "secret is sent and which secret it is, so they are set only by the installation. Set them in "
                f"the Hopsworks Helm values and run helm upgrade; {_who(request)} is not an installer identity{hint}"
            )
        audit["run-ai-connection-changed"] = ",".join(changed)

    if after.kueue_installed and not before.kueue_installed:
        bound = _bound_namespaces(snapshot)
        if bound:
            return Decision.deny(
                f"{SETTINGS_CONFIGMAP}: cannot turn kueue_installed on while namespaces are still bound to "
                f"Run:ai ({_list_capped(bound)}): Run:ai's admission webhooks and Kueue would both act on "
                "their pods. Unbind each one first: delete its Run:ai project in Run:ai (this stops its "
                f"workloads), then remove the {RUNAI_QUEUE_LABEL} and {RUNAI_PROJECT_ID_LABEL} labels "
                f"(kubectl label namespace NAME {RUNAI_QUEUE_LABEL}- {RUNAI_PROJECT_ID_LABEL}-)"
            )
        audit["kueue-installed"] = "false->true"
    return Decision.allow(warnings=warnings, audit=audit)


# -- project namespace guard -----------------------------------------------------------------


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
        result = _scheduling(
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
    if _request_kind(request) != "Namespace" or request.get("operation") not in ("CREATE", "UPDATE"):
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
        return Decision.deny("; ".join(invalid), code=422, reason="Invalid", warnings=warnings)
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
        f"namespace; an installer identity may remove the label; {_who(request)} is not one"
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


def validate_settings_request(
    request: Mapping[str, Any],
    snapshot: ClusterSnapshot,
    config: GuardConfig,
    runai_departments: Collection[str] | None = None,
) -> Decision:
    """`POST /validate/settings`: the settings ConfigMap and project namespaces."""
    kind = _request_kind(request)
    if kind == "ConfigMap":
        return validate_settings_change(request, snapshot, config)
    if kind == "Namespace":
        return validate_namespace_change(request, snapshot, config, runai_departments)
    return Decision.allow()
