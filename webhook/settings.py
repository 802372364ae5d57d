"""Cluster settings: the `hopsworks-cluster-settings` ConfigMap, parsed and validated.

Flat keys keep the platform's variable names; the `scheduler` key holds YAML describing what the
cluster offers, the subset every project gets, and the cluster defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SETTINGS_CONFIGMAP = "hopsworks-cluster-settings"
DEFAULT_RUNAI_URL = "http://runai-backend-traefik.runai-backend.svc.cluster.local:8080"

WORKLOAD_KINDS = ("notebook", "terminal", "app", "deployment", "job", "system-job")
# The platform's promise: Run:ai may preempt jobs, so they run over quota unchecked. Everything
# else, a kind not recognised (None) included, is non-preemptible and admitted only within the
# project's deserved quota. What Run:ai is told (`RunaiScheduling`) must say the same.
PREEMPTIBLE_KINDS = frozenset({"job", "system-job"})
UNKNOWN_KIND = "unknown"  # the mapping's key for a pod no kind rule recognises
PREEMPTIBLE, NON_PREEMPTIBLE = "preemptible", "non-preemptible"
# The pod label KAI-Scheduler (v0.10+) and Run:ai's scheduler read before any priority value.
KAI_PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"
# Run:ai's own cluster-scoped PriorityClasses and their values: the priority dictionary of
# self-hosted 2.2x/3.0 (very-low ... very-high) and the classes KAI-Scheduler and older Run:ai
# releases install (train, build-preemptible, build, inference). Below 100 is preemptible.
RUNAI_PRIORITY_CLASSES: dict[str, int] = {
    "very-low": 25, "low": 40, "medium-low": 65, "medium": 80, "medium-high": 90, "high": 125, "very-high": 150,
    "train": 50, "build-preemptible": 75, "build": 100, "inference": 125,
}  # fmt: skip
NON_PREEMPTIBLE_PRIORITY = 100


BUILTIN_TOPOLOGIES = {
    "host": "kubernetes.io/hostname",
    "zone": "topology.kubernetes.io/zone",
    "region": "topology.kubernetes.io/region",
}


class SettingsError(ValueError):
    """The settings cannot be used; the message says which key and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _check_label_pairs(values: list[str]) -> list[str]:
    for value in values:
        key, sep, _ = value.partition("=")
        if not sep or not key:
            raise ValueError(f"{value!r} is not a key=value node label")
    return values


class Available(_Strict):
    """What the cluster offers."""

    affinity: list[str] = Field(default_factory=list)
    anti_affinity: list[str] = Field(default_factory=list, alias="antiAffinity")
    priority_classes: list[str] = Field(default_factory=list, alias="priorityClasses")
    topologies: dict[str, str] = Field(default_factory=lambda: dict(BUILTIN_TOPOLOGIES))

    _labels = field_validator("affinity", "anti_affinity")(_check_label_pairs)

    @field_validator("topologies", mode="before")
    @classmethod
    def _extend_builtin_units(cls, value: Any) -> Any:
        # Admins add units (rack, block...); the three built-in ones stay unless overridden.
        if isinstance(value, dict):
            return {**BUILTIN_TOPOLOGIES, **value}
        return value


class Subset(_Strict):
    """What a project may choose from; `None` means everything the cluster offers."""

    affinity: list[str] | None = None
    anti_affinity: list[str] | None = Field(default=None, alias="antiAffinity")
    priority_classes: list[str] | None = Field(default=None, alias="priorityClasses")
    queues: list[str] | None = None


class Defaults(_Strict):
    """Values used when the workload did not choose."""

    affinity: list[str] = Field(default_factory=list)
    anti_affinity: list[str] = Field(default_factory=list, alias="antiAffinity")
    priority_class: str | None = Field(default=None, alias="priorityClass")
    queue: str | None = None
    topology: str | None = None


class LabelRule(_Strict):
    """A pod label that tells the workload kind (value None: any value)."""

    label: str
    value: str | None = None
    kind: str

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        if kind not in WORKLOAD_KINDS:
            raise ValueError(f"unknown workload kind {kind!r}; known: {', '.join(WORKLOAD_KINDS)}")
        return kind


def _default_kind_rules() -> list[LabelRule]:
    return [
        LabelRule(label="jupyter", kind="notebook"),
        LabelRule(label="serving.hops.works/id", kind="deployment"),
    ]


class JobOwner(_Strict):
    """A controller kind whose pods are jobs (`apiGroup` without version: `batch`, `ray.io`)."""

    api_group: str = Field(alias="apiGroup")
    kind: str


def _default_job_owners() -> list[JobOwner]:
    return [JobOwner(apiGroup="batch", kind="Job")]


class WorkloadKindRules(_Strict):
    rules: list[LabelRule] = Field(default_factory=_default_kind_rules)
    # Values of the `job-type` label that mark the platform's own system jobs.
    system_job_types: list[str] = Field(
        default_factory=lambda: ["system", "materialization", "statistics"], alias="systemJobTypes"
    )
    # A pod is a job (or system job) only when its controller (the ownerReference with
    # `controller: true`) is one of these; labels alone never make a pod a job.
    job_owners: list[JobOwner] = Field(default_factory=_default_job_owners, alias="jobOwners")


def _promised_preemptibility() -> dict[str, str]:
    return {
        kind: PREEMPTIBLE if kind in PREEMPTIBLE_KINDS else NON_PREEMPTIBLE for kind in (*WORKLOAD_KINDS, UNKNOWN_KIND)
    }


class RunaiScheduling(_Strict):
    """What each pod tells Run:ai's scheduler about itself (Run:ai on), by workload kind.

    Run:ai decides preemptibility from the pod, not from the platform's kinds: an explicit label
    first, else the value of the priority class (100 and over: non-preemptible). The platform's
    classes are worth far more than 100, so the webhook writes the label; for Run:ai releases that
    do not read it, `priorityClasses` names one of Run:ai's own classes per kind, written as the
    pod label `priorityClassName` (Run:ai's priority inside the project; `spec.priorityClassName`,
    what the Kubernetes scheduler reads, stays the platform's)."""

    preemptibility: dict[str, str] = Field(default_factory=_promised_preemptibility)
    preemptibility_label: str = Field(default=KAI_PREEMPTIBILITY_LABEL, alias="preemptibilityLabel")
    priority_classes: dict[str, str] = Field(default_factory=dict, alias="priorityClasses")

    @field_validator("preemptibility", "priority_classes")
    @classmethod
    def _known_kinds(cls, value: dict[str, str]) -> dict[str, str]:
        known = (*WORKLOAD_KINDS, UNKNOWN_KIND)
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"unknown workload kinds {unknown}; known: {', '.join(known)}")
        return value

    @field_validator("preemptibility", mode="after")
    @classmethod
    def _values(cls, value: dict[str, str]) -> dict[str, str]:
        for kind, said in value.items():
            if said not in (PREEMPTIBLE, NON_PREEMPTIBLE):
                raise ValueError(f"{kind}: {said!r} is neither {PREEMPTIBLE} nor {NON_PREEMPTIBLE}")
        return {**_promised_preemptibility(), **value}  # a kind left out keeps the promised value

    def promise_error(self) -> str | None:
        """Why these settings would make Run:ai treat a kind otherwise than the platform promises
        (jobs preemptible and unchecked; the rest non-preemptible and held to the quota)."""
        problems = []
        for kind, said in sorted(self.preemptibility.items()):
            promised = _promised_preemptibility()[kind]
            if said != promised:
                why = (
                    "jobs are admitted without a quota check, so Run:ai must be free to run them over quota "
                    "(a non-preemptible job over quota waits pending)"
                    if promised == PREEMPTIBLE
                    else "the platform promises these are never preempted, so they are held to the deserved quota"
                )
                problems.append(f"runai.preemptibility.{kind} must be {promised}, not {said}: {why}")
        for kind, name in sorted(self.priority_classes.items()):
            value = RUNAI_PRIORITY_CLASSES.get(name)
            wanted_preemptible = self.preemptibility[kind] == PREEMPTIBLE
            if value is None:
                problems.append(
                    f"runai.priorityClasses.{kind}: {name!r} is not one of Run:ai's priority classes "
                    f"({', '.join(RUNAI_PRIORITY_CLASSES)})"
                )
            elif (value < NON_PREEMPTIBLE_PRIORITY) != wanted_preemptible:
                side = "below" if wanted_preemptible else "at least"
                problems.append(
                    f"runai.priorityClasses.{kind}: {name} is worth {value}; a {self.preemptibility[kind]} "
                    f"{kind} needs a class worth {side} {NON_PREEMPTIBLE_PRIORITY}"
                )
        if not self.preemptibility_label:
            missing = [k for k in (*WORKLOAD_KINDS, UNKNOWN_KIND) if k not in self.priority_classes]
            if missing:
                problems.append(
                    "runai.preemptibilityLabel is empty, so only runai.priorityClasses tells Run:ai which pods it may "
                    f"preempt, and it names no class for {', '.join(missing)}"
                )
        return "; ".join(problems) or None


class SchedulerConfig(_Strict):
    available: Available = Field(default_factory=Available)
    project: Subset = Field(default_factory=Subset)
    defaults: Defaults = Field(default_factory=Defaults)
    workload_kinds: WorkloadKindRules = Field(default_factory=WorkloadKindRules, alias="workloadKinds")
    # Required node-affinity terms are ORed; crossing them with our affinity groups multiplies them.
    max_node_selector_terms: int = Field(default=16, ge=1, le=256, alias="maxNodeSelectorTerms")
    runai: RunaiScheduling = Field(default_factory=RunaiScheduling)

    @model_validator(mode="after")
    def _subset_within_available(self) -> SchedulerConfig:
        offered = {
            "affinity": self.available.affinity,
            "antiAffinity": self.available.anti_affinity,
            "priorityClasses": self.available.priority_classes,
        }
        chosen = {
            "affinity": self.project.affinity,
            "antiAffinity": self.project.anti_affinity,
            "priorityClasses": self.project.priority_classes,
        }
        for key, values in chosen.items():
            outside = sorted(set(values or ()) - set(offered[key]))
            if outside:
                raise ValueError(f"project.{key} {outside} not in available.{key} {offered[key]}")
        if self.defaults.topology and self.defaults.topology not in self.available.topologies:
            raise ValueError(f"defaults.topology {self.defaults.topology!r} not in {sorted(self.available.topologies)}")
        return self


class ClusterSettings(_Strict):
    run_ai_enable: bool = False
    run_ai_url: str = DEFAULT_RUNAI_URL
    run_ai_client_id: str = ""
    run_ai_client_secret_name: str = ""
    run_ai_client_secret_key: str = ""
    # The Run:ai cluster this Kubernetes cluster is, by its name in Run:ai; empty: the tenant's only
    # cluster (with several and no name, nothing is bound and the reason is logged).
    run_ai_cluster_name: str = ""
    run_ai_default_department: str = "default"
    run_ai_project_gpu_quota: float = Field(default=0, ge=0)
    run_ai_reconcile_interval_s: float = Field(default=300, gt=0)
    # How often every replica re-reads Run:ai's projects and departments (quota numbers, drift).
    # A project bound in between is looked up on demand, so this is about freshness, not safety.
    run_ai_directory_refresh_s: float = Field(default=15, ge=1)
    # `warn` admits a pod or workload over its project's GPU quota, with the refusal as a warning,
    # an audit annotation and a metric: what an operator looks at before turning it to `enforce`.
    gpu_quota_enforcement: Literal["enforce", "warn"] = "enforce"
    # The same choice for the other refusal families (`core.enforcement`): a workload's priority
    # class or affinity labels outside its project's subset (S1), a Kueue queue or topology unit
    # that cannot be used (S4), and an owner's label overriding the preemptibility the platform
    # gives its pods (R3).
    priority_class_enforcement: Literal["enforce", "warn"] = "enforce"
    affinity_enforcement: Literal["enforce", "warn"] = "enforce"
    queue_topology_enforcement: Literal["enforce", "warn"] = "enforce"
    preemptibility_enforcement: Literal["enforce", "warn"] = "enforce"
    # How long a GPU reservation counts for a pod the pod watch has not shown yet. It covers the
    # watch's lag behind the apiserver; it is short because a review nobody stored (forged, or
    # refused by a later webhook) holds the project's GPUs for that long, and no longer.
    gpu_reservation_confirm_s: float = Field(default=10, ge=1, le=120)
    kueue_installed: bool = False
    kueue_project_default_local_queue: str = "default"
    kueue_system_jobs_local_queue: str = "system"
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)

    model_config = ConfigDict(extra="ignore", frozen=True)

    def exclusion_error(self) -> str | None:
        """G1: Kueue and Run:ai never both on."""
        if self.kueue_installed and self.run_ai_enable:
            return "kueue_installed and run_ai_enable cannot both be true: a cluster uses Kueue, Run:ai, or neither"
        return None

    def runai_error(self) -> str | None:
        """Settings that would break the quota promise on a Run:ai cluster: what Run:ai is told
        about preemptibility, and platform PriorityClass names that are Run:ai's own."""
        if not self.run_ai_enable:
            return None
        problems = [e for e in (self.scheduler.runai.promise_error(),) if e]
        named = {*self.scheduler.available.priority_classes, *(self.scheduler.project.priority_classes or ())}
        if self.scheduler.defaults.priority_class:
            named.add(self.scheduler.defaults.priority_class)
        clash = sorted(named & set(RUNAI_PRIORITY_CLASSES))
        if clash:
            problems.append(
                f"priority classes {clash} are also Run:ai's own cluster-scoped classes "
                f"({', '.join(RUNAI_PRIORITY_CLASSES)}), "
                "whose values decide preemptibility: with Run:ai on, give the platform's classes names of their own "
                "(the install's are hopsworks-low, hopsworks-normal, hopsworks-high)"
            )
        return "; ".join(problems) or None

    @classmethod
    def from_configmap_data(cls, data: Any) -> ClusterSettings:
        """Parse ConfigMap `data` (all values strings). Raises SettingsError naming the key, and
        only SettingsError: a stored ConfigMap of any content must leave the server serving."""
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise SettingsError(f"data must be a map of strings, got {type(data).__name__}")
        values: dict[str, Any] = {}
        for key, raw in data.items():
            if not isinstance(key, str) or not (raw is None or isinstance(raw, str | bool | int | float)):
                raise SettingsError(f"data.{str(key)[:60]}: values must be strings")
            if isinstance(raw, int) and not isinstance(raw, bool) and abs(raw) >= 2**63:
                raise SettingsError(f"{key}: number out of range")
            if key == "scheduler":
                values[key] = _load_scheduler(raw)
            elif key in cls.model_fields:
                values[key] = _coerce_flat(raw)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise SettingsError(_describe(exc)) from None
        except (ValueError, TypeError, RecursionError) as exc:  # e.g. a validator meeting a value it did not expect
            raise SettingsError(f"settings: {type(exc).__name__}: {str(exc)[:200]}") from None


# The scheduler block is a few kilobytes; this bounds the YAML parser's work on a hostile one.
MAX_SCHEDULER_CHARS = 64 * 1024
MAX_SCHEDULER_DEPTH = 12  # the schema nests 4 deep


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that stops at MAX_SCHEDULER_DEPTH instead of recursing until the stack runs out
    (which costs a second of event loop on a ConfigMap-sized run of brackets)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_SCHEDULER_DEPTH:
                raise yaml.YAMLError(f"nested more than {MAX_SCHEDULER_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _load_scheduler(raw: Any) -> Any:
    if not isinstance(raw, str):
        raise SettingsError("scheduler: must be a string holding YAML")
    if len(raw) > MAX_SCHEDULER_CHARS:
        raise SettingsError(f"scheduler: {len(raw)} characters, more than the limit of {MAX_SCHEDULER_CHARS}")
    try:
        parsed = yaml.load(raw, Loader=_BoundedLoader)  # a SafeLoader
    except yaml.YAMLError as exc:
        raise SettingsError(f"scheduler: not valid YAML: {str(exc)[:300]}") from None
    except (ValueError, RecursionError, OverflowError) as exc:
        # An integer past Python's digit limit (ValueError), or nesting past the stack.
        raise SettingsError(f"scheduler: cannot be read: {type(exc).__name__}: {str(exc)[:200]}") from None
    _check_plain(parsed, "scheduler")
    return parsed or {}


def _check_plain(value: Any, where: str) -> None:
    """Refuse integers the schema never holds before pydantic sees them (the loader bounds depth)."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key, where)
            _check_plain(item, f"{where}.{str(key)[:60]}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        raise SettingsError(f"{where}: number out of range")


def _coerce_flat(raw: Any) -> Any:
    # ConfigMap values are strings; pydantic turns "true"/"1.5" into bool/float in lax mode.
    return raw.strip() if isinstance(raw, str) else raw


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "settings"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
