"""A project namespace's scheduling annotations: the one reader of
`scheduling.hopsworks.ai/available` (the project's subset of what the cluster offers) and
`scheduling.hopsworks.ai/defaults` (its defaults within that subset).

The namespace guard reads them strictly when they are written; pod mutation (through
`core.offer`) reads them leniently on every pod. Each key has its own reader; every reader adds
what it finds wrong to one `_Problems` list, and the caller raises once with all of them, so a
refusal names every problem of the annotation at once (as Kueue's validators build a
`field.ErrorList`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.settings import ClusterSettings, SchedulerConfig
from webhook.snapshot import AVAILABLE_ANNOTATION, DEFAULTS_ANNOTATION, NamespaceInfo

# A queue name ends up as the value of the `kueue.x-k8s.io/queue-name` label and names a LocalQueue,
# so it must be both a label value and a DNS subdomain.
_QUEUE_RE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")

# A project's subset and defaults are a few hundred characters; a bound keeps a hostile annotation
# from costing parse time on every pod of the project.
MAX_SCHEDULING_ANNOTATION_CHARS = 16 * 1024

_AVAILABLE_KEYS = ("affinity", "antiAffinity", "priorityClasses", "queues")
_DEFAULTS_KEYS = ("affinity", "antiAffinity", "priorityClass", "queue", "topology")


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


@dataclass(slots=True)
class _Problems:
    """What is wrong: errors always refuse; a value the cluster no longer offers is an error when
    read strictly and a note (the value dropped) when read leniently."""

    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def bad(self, message: str, strict: bool) -> None:
        (self.errors if strict else self.notes).append(message)


@dataclass(frozen=True, slots=True)
class _Subset:
    """One key of the project's available subset, and where it came from (for messages)."""

    values: list[str]
    source: str


@dataclass(frozen=True, slots=True)
class _Reading:
    """What every reader needs besides the value it reads."""

    cluster: SchedulerConfig
    problems: _Problems
    strict_available: bool
    strict_defaults: bool
    existing_priority_classes: Collection[str] | None


# -- shapes ----------------------------------------------------------------------------------


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
    known = _AVAILABLE_KEYS if key == AVAILABLE_ANNOTATION else _DEFAULTS_KEYS
    unknown = sorted(set(value) - set(known))
    if unknown:
        problems.errors.append(f"{key}: unknown keys {_quote(unknown)}; allowed keys: {_quote(known)}")
    # JSON null means "not set", like an absent key.
    return {k: v for k, v in value.items() if k in known and v is not None}


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


# -- the available subset (one reader per key) -----------------------------------------------


def _read_available_labels_or_classes(
    key: str, available: Mapping[str, Any], cluster_offer: list[str], project: list[str] | None, ctx: _Reading
) -> _Subset:
    """`affinity`, `antiAffinity` or `priorityClasses`: the annotation's list, else the cluster's
    `scheduler.project` list, else all the cluster offers; only what the cluster offers is kept."""
    listed = key in available
    if listed:
        values = _string_list(AVAILABLE_ANNOTATION, key, available[key], ctx.problems) or []
        source = f"its {AVAILABLE_ANNOTATION} annotation"
    elif project is not None:
        values, source = list(project), "the cluster's scheduler.project"
    else:
        values, source = list(cluster_offer), "everything the cluster offers"
    kept = []
    existing = ctx.existing_priority_classes
    for value in values:
        if value not in cluster_offer:
            what = "priority class" if key == "priorityClasses" else f"{key} label"
            ctx.problems.bad(
                f"{AVAILABLE_ANNOTATION}: {what} {value!r} is not offered by the cluster "
                f"(available.{key}: {_quote(cluster_offer)})",
                ctx.strict_available,
            )
        elif key == "priorityClasses" and listed and existing and value not in existing:
            ctx.problems.bad(f"{AVAILABLE_ANNOTATION}: PriorityClass {value!r} does not exist", ctx.strict_available)
        else:
            kept.append(value)
    return _Subset(kept, source)


def _read_available_queues(available: Mapping[str, Any], ctx: _Reading) -> list[str] | None:
    """The project's queue list; None when neither the annotation nor the cluster restricts queues."""
    if "queues" in available:
        listed = _string_list(AVAILABLE_ANNOTATION, "queues", available["queues"], ctx.problems) or []
        return [q for q in listed if _queue_name_ok(AVAILABLE_ANNOTATION, "queues", q, ctx.problems)]
    if ctx.cluster.project.queues is not None:
        return list(ctx.cluster.project.queues)
    return None


# -- the defaults (one reader per key) -------------------------------------------------------


def _read_default_labels(
    key: str, chosen: Mapping[str, Any], subset: _Subset, cluster_default: list[str], ctx: _Reading
) -> list[str]:
    """`affinity` or `antiAffinity`: an explicit list (even []) replaces the cluster default."""
    if key not in chosen:
        return [v for v in cluster_default if v in subset.values]
    values = _string_list(DEFAULTS_ANNOTATION, key, chosen[key], ctx.problems) or []
    kept = []
    for value in values:
        if value in subset.values:
            kept.append(value)
        else:
            ctx.problems.bad(
                f"{DEFAULTS_ANNOTATION}: {key} label {value!r} is outside the project's available {key} "
                f"({_quote(subset.values)}, from {subset.source})",
                ctx.strict_defaults,
            )
    return kept


def _read_default_priority_class(chosen: Mapping[str, Any], subset: _Subset, ctx: _Reading) -> str | None:
    """The project's own default priority class (None: not set, or not usable)."""
    if "priorityClass" not in chosen:
        return None
    pc = _string(DEFAULTS_ANNOTATION, "priorityClass", chosen["priorityClass"], ctx.problems)
    if pc is None:
        return None
    if pc not in subset.values:
        ctx.problems.bad(
            f"{DEFAULTS_ANNOTATION}: priorityClass {pc!r} is outside the project's available "
            f"priorityClasses ({_quote(subset.values)}, from {subset.source})",
            ctx.strict_defaults,
        )
        return None
    existing = ctx.existing_priority_classes
    if existing and pc not in existing:
        ctx.problems.bad(f"{DEFAULTS_ANNOTATION}: PriorityClass {pc!r} does not exist", ctx.strict_defaults)
        return None
    return pc


def _read_default_queue(chosen: Mapping[str, Any], queues: list[str] | None, ctx: _Reading) -> str | None:
    """The project's own default queue (None: not set, or not usable)."""
    if "queue" not in chosen:
        return None
    queue = _string(DEFAULTS_ANNOTATION, "queue", chosen["queue"], ctx.problems)
    if queue is None or not _queue_name_ok(DEFAULTS_ANNOTATION, "queue", queue, ctx.problems):
        return None
    if queues is not None and queue not in queues:
        ctx.problems.bad(
            f"{DEFAULTS_ANNOTATION}: queue {queue!r} is outside the project's available queues ({_quote(queues)})",
            ctx.strict_defaults,
        )
        return None
    return queue


def _read_default_topology(chosen: Mapping[str, Any], ctx: _Reading) -> str | None:
    """The project's own default topology unit (None: not set, or not usable)."""
    if "topology" not in chosen:
        return None
    unit = _string(DEFAULTS_ANNOTATION, "topology", chosen["topology"], ctx.problems)
    topologies = ctx.cluster.available.topologies
    if unit is not None and unit not in topologies:
        ctx.problems.bad(
            f"{DEFAULTS_ANNOTATION}: topology {unit!r} is not a topology unit of the cluster "
            f"({_quote(sorted(topologies))})",
            ctx.strict_defaults,
        )
        return None
    return unit


# -- the whole reading -----------------------------------------------------------------------


def read_project_scheduling(
    annotations: Mapping[str, str],
    settings: ClusterSettings,
    *,
    strict_available: bool,
    strict_defaults: bool,
    existing_priority_classes: Collection[str] | None,
) -> ProjectScheduling:
    """Both annotations, each with its own strictness (the namespace guard judges strictly only
    what a request writes). Raises ProjectSettingsError naming every error found."""
    cluster = settings.scheduler
    problems = _Problems()
    ctx = _Reading(cluster, problems, strict_available, strict_defaults, existing_priority_classes)

    available = _load_json_object(annotations, AVAILABLE_ANNOTATION, problems)
    affinity = _read_available_labels_or_classes(
        "affinity", available, cluster.available.affinity, cluster.project.affinity, ctx
    )
    anti_affinity = _read_available_labels_or_classes(
        "antiAffinity", available, cluster.available.anti_affinity, cluster.project.anti_affinity, ctx
    )
    priority_classes = _read_available_labels_or_classes(
        "priorityClasses", available, cluster.available.priority_classes, cluster.project.priority_classes, ctx
    )
    queues = _read_available_queues(available, ctx)

    chosen = _load_json_object(annotations, DEFAULTS_ANNOTATION, problems)
    default_affinity = _read_default_labels("affinity", chosen, affinity, cluster.defaults.affinity, ctx)
    default_anti = _read_default_labels("antiAffinity", chosen, anti_affinity, cluster.defaults.anti_affinity, ctx)
    project_pc = _read_default_priority_class(chosen, priority_classes, ctx)
    project_queue = _read_default_queue(chosen, queues, ctx)
    project_topology = _read_default_topology(chosen, ctx)
    if problems.errors:
        raise ProjectSettingsError("; ".join(problems.errors))

    # Which defaults the project's annotation set, before the cluster's defaults fill the gaps.
    from_project: set[str] = {key for key in ("affinity", "antiAffinity") if key in chosen}
    from_project.update(
        key
        for key, value in (("priorityClass", project_pc), ("queue", project_queue), ("topology", project_topology))
        if value is not None
    )
    default_pc = project_pc
    if default_pc is None and cluster.defaults.priority_class in priority_classes.values:
        default_pc = cluster.defaults.priority_class
    default_queue = project_queue
    if default_queue is None and cluster.defaults.queue and (queues is None or cluster.defaults.queue in queues):
        default_queue = cluster.defaults.queue
    return ProjectScheduling(
        affinity=tuple(affinity.values),
        anti_affinity=tuple(anti_affinity.values),
        priority_classes=tuple(priority_classes.values),
        queues=None if queues is None else tuple(queues),
        default_affinity=tuple(default_affinity),
        default_anti_affinity=tuple(default_anti),
        default_priority_class=default_pc,
        default_queue=default_queue,
        default_topology=project_topology or cluster.defaults.topology,
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
    return read_project_scheduling(
        ns.annotations,
        settings,
        strict_available=strict,
        strict_defaults=strict,
        existing_priority_classes=existing_priority_classes,
    )
