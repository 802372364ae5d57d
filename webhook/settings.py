"""Cluster settings: the `hopsworks-cluster-settings` ConfigMap, parsed and validated.

Flat keys keep the platform's variable names; the `scheduler` key holds YAML describing what the
cluster offers, the subset every project gets, and the cluster defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SETTINGS_CONFIGMAP = "hopsworks-cluster-settings"
DEFAULT_RUNAI_URL = "http://runai-backend-traefik.runai-backend.svc.cluster.local:8080"

WORKLOAD_KINDS = ("notebook", "terminal", "app", "deployment", "job", "system-job")
# Run:ai preempts jobs, so they run over quota unchecked. Everything else, a kind not recognised
# (None) included, is non-preemptible and admitted only within the project's deserved quota.
PREEMPTIBLE_KINDS = frozenset({"job", "system-job"})


def quota_checked(kind: str | None) -> bool:
    """Whether pods of this workload kind count against, and are checked by, the deserved quota."""
    return kind not in PREEMPTIBLE_KINDS


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


class SchedulerConfig(_Strict):
    available: Available = Field(default_factory=Available)
    project: Subset = Field(default_factory=Subset)
    defaults: Defaults = Field(default_factory=Defaults)
    workload_kinds: WorkloadKindRules = Field(default_factory=WorkloadKindRules, alias="workloadKinds")
    # Required node-affinity terms are ORed; crossing them with our affinity groups multiplies them.
    max_node_selector_terms: int = Field(default=16, ge=1, le=256, alias="maxNodeSelectorTerms")

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
