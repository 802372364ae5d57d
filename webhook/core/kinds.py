"""Workload kind and GPU request of a pod: pure functions of the pod dict."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, NamedTuple

from webhook.settings import PREEMPTIBLE_KINDS, WORKLOAD_KINDS, WorkloadKindRules

WORKLOAD_TYPE_LABEL = "hopsworks.ai/workload-type"
GPU_RESOURCE = "nvidia.com/gpu"
# The NVIDIA device plugin's MIG instances in its mixed strategy, one resource per profile:
# `nvidia.com/mig-3g.20gb` is 3 of a GPU's 7 compute slices with 20 GB of its memory.
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# The profiles KAI counts (`ExtractGpuAndMemoryFromMigResourceName`): <slices>g.<memory>gb.
_MIG_PROFILE_RE = re.compile(r"nvidia\.com/mig-([0-9]{1,2})g\.([0-9]{1,4})gb")
# Run:ai's GPU-sharing annotations.
GPU_FRACTION_ANNOTATION = "gpu-fraction"
GPU_FRACTION_DEVICES_ANNOTATION = "gpu-fraction-num-devices"
GPU_MEMORY_ANNOTATION = "gpu-memory"


def controller_owner(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """(API group, kind) of the object's controller: its ownerReference with `controller: true`.
    Kueue reads a pod's owner this way; Run:ai's pod grouper does not (`kai_owner`)."""
    for ref in meta.get("ownerReferences") or ():
        # type() first: parsed JSON is a dict, and the Mapping ABC's check is the slow part here.
        if (type(ref) is dict or isinstance(ref, Mapping)) and ref.get("controller") is True and ref.get("uid"):
            return _group_kind(ref)
    return None


def _group_kind(ref: Mapping[str, Any]) -> tuple[str, str]:
    api_version, kind = ref.get("apiVersion"), ref.get("kind")
    # str() only for what the schema check does not guarantee (a folder's object, a cache).
    if type(api_version) is not str:
        api_version = str(api_version or "")
    if type(kind) is not str:
        kind = str(kind or "")
    return (api_version.rpartition("/")[0], kind)  # "batch/v1" -> "batch", "v1" -> ""


class OwnerRef(NamedTuple):
    """An ownerReference as Run:ai's pod grouper follows it (a tuple: made on every review of an
    owned pod, and a tuple is made in C)."""

    group: str
    kind: str
    name: str
    controller: bool  # `controller: true`, with a uid


def kai_owner(meta: Mapping[str, Any]) -> OwnerRef | None:
    """The owner Run:ai's pod grouper reads before the object itself, None when it has none.

    KAI v0.17.0 (`pkg/podgrouper/podgrouper/podgrouper.go`, `getResourceOwners`) follows the first
    ownerReference, of any kind and whether or not it is the controller, then that owner's first,
    up to the top; the preemptibility and priority class labels are taken from those owners before
    the pod, the queue from the top one, and a skip annotation on any of them keeps the pod out.
    Every rule that depends on what Run:ai reads from owners starts here.
    """
    refs = meta.get("ownerReferences")
    if not refs or type(refs) is not list:
        return None
    ref = refs[0]
    if type(ref) is not dict and not isinstance(ref, Mapping):
        return OwnerRef("", "", "", False)  # the apiserver refuses it; nothing can vouch for it
    group, kind = _group_kind(ref)
    name = ref.get("name")
    return OwnerRef(
        group, kind, name if type(name) is str else "", ref.get("controller") is True and bool(ref.get("uid"))
    )


def pod_controller(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """(API group, kind) of the pod's first owner when it is also the controller: the one owner
    that both the controller count of the platform's kinds and Run:ai's pod grouper read. A pod
    whose first ownerReference is not its controller has none here, so no owner makes it a job
    while Run:ai reads its preemptibility from another object."""
    owner = kai_owner(meta)
    return (owner.group, owner.kind) if owner is not None and owner.controller else None


def pod_kind(labels: Mapping[str, Any], meta: Mapping[str, Any], rules: WorkloadKindRules) -> str | None:
    """`classify_workload` of a pod with metadata `meta`; its ownerReferences are read only when
    the labels do not say (most pods: a notebook, an app, a deployment)."""
    return _labelled_kind(labels, rules) or _owned_kind(labels, rules, pod_controller(meta))


def is_job_owner(controller: tuple[str, str] | None, rules: WorkloadKindRules) -> bool:
    return controller is not None and any((o.api_group, o.kind) == controller for o in rules.job_owners)


def classify_workload(
    labels: Mapping[str, Any], rules: WorkloadKindRules, controller: tuple[str, str] | None = None
) -> str | None:
    """The platform's workload kind of a pod, or None when no rule says (quota-checked then).

    Anyone who creates a pod writes its labels, so a label can make a pod a notebook, terminal, app
    or deployment (checked) but never a job (exempt): a job is a pod controlled by one of
    `rules.job_owners` (`controller`: the pod's first ownerReference, when it is the controller;
    see `pod_controller`), and labels then only tell a system job from a job. An ownerReference can be
    written too, but the apiserver's garbage collector deletes a pod whose owner does not exist,
    and a pod of a real Job is that Job's pod.
    """
    return _labelled_kind(labels, rules) or _owned_kind(labels, rules, controller)


# What a workload-type label may make a pod: any kind but a job (see `classify_workload`).
LABELLED_KINDS = frozenset(WORKLOAD_KINDS) - PREEMPTIBLE_KINDS


def _labelled_kind(labels: Mapping[str, Any], rules: WorkloadKindRules) -> str | None:
    """The kind the labels give (a notebook, terminal, app or deployment), else None."""
    explicit = labels.get(WORKLOAD_TYPE_LABEL)
    if isinstance(explicit, str) and explicit in LABELLED_KINDS:
        return explicit
    for rule in rules.rules:
        if rule.kind in PREEMPTIBLE_KINDS:
            continue
        if rule.label in labels and (rule.value is None or labels[rule.label] == rule.value):
            return rule.kind
    return None


def _owned_kind(labels: Mapping[str, Any], rules: WorkloadKindRules, controller: tuple[str, str] | None) -> str | None:
    """A job or system job: a pod of one of `rules.job_owners`; None for any other pod."""
    if is_job_owner(controller, rules):
        job_type = labels.get("job-type")
        if labels.get(WORKLOAD_TYPE_LABEL) == "system-job" or (
            job_type is not None and str(job_type) in rules.system_job_types
        ):
            return "system-job"
        return "job"
    return None


# The Kubernetes quantity grammar: a decimal number, then a binary or decimal SI suffix or a decimal
# exponent. Matched before any arithmetic, so "1e999999999" or a 5,000-digit number never reaches
# Decimal (which overflows) or float (which gives inf or NaN).
_QUANTITY_RE = re.compile(
    r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_SUFFIX_SCALE = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("0.001"),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}  # fmt: skip
# Longer than any quantity a person writes; bounds the work before the grammar is even tried.
MAX_QUANTITY_CHARS = 40
# Beyond any amount of anything this system counts; keeps every sum finite.
MAX_QUANTITY = 1e18
# No node holds more GPUs than this: a larger request is a typo or an attack, never a workload.
MAX_GPUS = 1024.0
# What a cached pod whose GPU request cannot be read counts as: the most a pod may hold, so that a
# pod the quota cannot measure never frees GPUs for others. The apiserver and admission refuse
# such pods, so one in the cache was created around them; it blocks its project's quota until it
# is removed, and `webhook_pods_unreadable_gpus` says how many exist.
UNREADABLE_POD_GPUS = MAX_GPUS


class GpuRequestError(ValueError):
    """A pod's GPU request cannot be read; the message names the field."""


def parse_quantity(value: Any, maximum: float = MAX_QUANTITY) -> float:
    """A Kubernetes quantity as a number ("2", "500m", "1k", "1e3"). Raises ValueError unless it is
    a finite, non-negative number of at most `maximum` written in ASCII by the quantity grammar."""
    if type(value) is str and len(value) <= 15 and value.isdigit() and value.isascii():
        # "1", "2": nearly every GPU request, exact, finite and not negative by its grammar.
        number = float(int(value))
        if number > maximum:
            raise ValueError(f"quantity {_shown(value)} is more than {maximum:g}")
        return number
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        number = float(value) if -(2**63) <= value < 2**63 else math.inf  # no int->str of 5,000 digits
    elif isinstance(value, float):
        number = value
    elif isinstance(value, str):
        number = _parse_quantity_text(value)
    else:
        raise ValueError(f"not a quantity: a {type(value).__name__}")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"not a finite, non-negative quantity: {_shown(value)}")
    if number > maximum:
        raise ValueError(f"quantity {_shown(value)} is more than {maximum:g}")
    return number


def _parse_quantity_text(value: str) -> float:
    text = value.strip(" \t")
    if len(text) > MAX_QUANTITY_CHARS or not text.isascii():
        raise ValueError(f"not a quantity: {_shown(value)}")
    if text.isdigit() and len(text) <= 15:
        return float(int(text))  # "1", "2": nearly every GPU request, exact and without Decimal
    match = _QUANTITY_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a quantity: {_shown(value)}")
    suffix = match["suffix"] or ""
    if len(suffix) > 1 and suffix[0] in ("e", "E"):
        exponent = int(suffix[1:])
        if abs(exponent) > 40:  # 40 digits at most, so a larger exponent is out of range anyway
            return math.inf if exponent > 0 and Decimal(match["number"]) else 0.0
        scale = Decimal(10) ** exponent
    else:
        scale = _SUFFIX_SCALE[suffix]
    return float(Decimal(match["number"]) * scale)


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str | float) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def mig_gpus(resource: str) -> float:
    """What one instance of a MIG resource counts against the GPU quota, as KAI counts it
    (`GpuResourceRequirement.GetGpusQuota`): its compute slices as whole GPUs, so `mig-3g.20gb`
    is 3. Raises ValueError for a profile that grammar does not read (KAI would count it as 0)."""
    match = _MIG_PROFILE_RE.fullmatch(resource)
    if match is None:
        raise ValueError(
            f"{resource[:80]} is a MIG profile whose GPU share cannot be read (only {MIG_RESOURCE_PREFIX}<n>g.<m>gb "
            "is counted against the GPU quota): ask for nvidia.com/gpu or a MIG profile of that form"
        )
    return float(match[1])


# What nearly every container asks for, none of it a GPU resource.
_PLAIN_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
_PLAIN_AND_WHOLE_GPUS = _PLAIN_RESOURCES | {GPU_RESOURCE}


def _container_gpus(container: Mapping[str, Any], key: str, index: int) -> float:
    """Whole GPUs and MIG instances, each the larger of its limit and its request: the scheduler
    counts the request, which the apiserver makes equal to the limit for these resources (it
    fills in a missing request and refuses two that differ), so on any pod it admits this is the
    scheduler's count, and on any other never less."""
    # The field's path is written only for an error: this runs for every container of every review.
    resources = container.get("resources") or {}
    if type(resources) is not dict and not isinstance(resources, Mapping):
        raise GpuRequestError(f"spec.{key}[{index}].resources must be an object")
    whole = 0.0
    mig: dict[str, float] | None = None
    for section in ("limits", "requests"):
        amounts = resources.get(section) or {}
        if type(amounts) is not dict and not isinstance(amounts, Mapping):
            raise GpuRequestError(f"spec.{key}[{index}].resources.{section} must be an object")
        name = GPU_RESOURCE
        try:
            if GPU_RESOURCE in amounts:
                whole = max(whole, parse_quantity(amounts[GPU_RESOURCE], MAX_GPUS))
            if _PLAIN_AND_WHOLE_GPUS.issuperset(amounts):
                continue  # nearly every container: no MIG resource to look for
            for name, value in amounts.items():
                if type(name) is str and name.startswith(MIG_RESOURCE_PREFIX):
                    mig = mig if mig is not None else {}
                    mig[name] = max(mig.get(name, 0.0), parse_quantity(value, MAX_GPUS) * mig_gpus(name))
        except ValueError as exc:
            raise GpuRequestError(f"spec.{key}[{index}].resources.{section}[{name}]: {exc}") from None
    return whole + math.fsum(mig.values()) if mig else whole


def _one_container_gpus(container: Any, key: str, index: int) -> float:
    """The GPUs of one container under `key` (0 for an entry that is not an object)."""
    if type(container) is dict:
        # Admission and the pod cache read every container of every pod, and nearly none asks
        # for a GPU: plain dicts asking for CPU, memory or ephemeral storage alone are passed over
        # here, with two set checks in C, before the full read above (which would find 0 GPUs
        # and no error in them); any other container takes the full read.
        resources = container.get("resources")
        if type(resources) is dict:
            limits = resources.get("limits")
            requests = resources.get("requests")
            if (limits is None or (type(limits) is dict and _PLAIN_RESOURCES.issuperset(limits))) and (
                requests is None or (type(requests) is dict and _PLAIN_RESOURCES.issuperset(requests))
            ):
                return 0.0
        elif resources is None:
            return 0.0
    elif not isinstance(container, dict):
        return 0.0
    return _container_gpus(container, key, index)


def _containers_gpus(spec: Mapping[str, Any]) -> float:
    """The GPUs a pod's containers hold, as the scheduler counts a pod's requests: the app
    containers and the sidecars (init containers with `restartPolicy: Always`, which keep running
    beside them), or, when larger, the most held while the init containers run one by one, each
    beside the sidecars started before it."""
    app = 0.0
    for index, container in enumerate(_list(spec, "containers")):
        app += _one_container_gpus(container, "containers", index)
    sidecars = init_peak = 0.0
    for index, container in enumerate(_list(spec, "initContainers")):
        gpus = _one_container_gpus(container, "initContainers", index)
        if isinstance(container, dict) and container.get("restartPolicy") == "Always":
            sidecars += gpus
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + gpus)
    return max(app + sidecars, init_peak)


def _annotation_quantity(annotations: Mapping[str, Any], key: str) -> float:
    try:
        return parse_quantity(annotations[key], MAX_GPUS)
    except ValueError as exc:
        raise GpuRequestError(f"annotation {key}: {exc}") from None


def pod_gpu_request(pod: Mapping[str, Any]) -> float:
    """GPUs a pod holds while it runs: whole devices plus Run:ai fractions.

    Like the scheduler: the app containers and sidecars, or the largest init container beside the
    sidecars before it when that is more (`_containers_gpus`). A `gpu-memory` request cannot be
    turned into a fraction without the node's GPU, so it counts as one device per requested
    device: an upper bound, so quota never leaks.
    Raises GpuRequestError (a ValueError) naming the field when a quantity cannot be read.
    """
    spec = pod.get("spec") or {}
    if type(spec) is not dict and not isinstance(spec, Mapping):
        raise GpuRequestError("spec must be an object")
    gpus = _containers_gpus(spec)
    meta = pod.get("metadata") or {}
    annotations = (meta.get("annotations") or {}) if type(meta) is dict or isinstance(meta, Mapping) else {}
    if type(annotations) is not dict and not isinstance(annotations, Mapping):
        raise GpuRequestError("metadata.annotations must be an object")
    if not annotations:
        return gpus
    devices = 1.0
    if GPU_FRACTION_DEVICES_ANNOTATION in annotations:
        devices = _annotation_quantity(annotations, GPU_FRACTION_DEVICES_ANNOTATION)
        if devices < 1 or devices != int(devices):
            raise GpuRequestError(f"annotation {GPU_FRACTION_DEVICES_ANNOTATION} must be a whole number of at least 1")
    if GPU_FRACTION_ANNOTATION in annotations:
        fraction = _annotation_quantity(annotations, GPU_FRACTION_ANNOTATION)
        if fraction > 1:
            raise GpuRequestError(f"annotation {GPU_FRACTION_ANNOTATION} must be at most 1, got {fraction:g}")
        gpus += fraction * devices
    elif GPU_MEMORY_ANNOTATION in annotations:
        gpus += devices
    return gpus


def dra_claims(spec: Mapping[str, Any]) -> list[str]:
    """The DRA resource claims a pod (or pod template) takes part in: the entries of
    `spec.resourceClaims` and the claims that its pod-level resources and its containers name. What
    a claim allocates (GPUs, a network card, anything a DeviceClass offers) is written in a
    ResourceClaim or ResourceClaimTemplate, not in the pod, so it cannot be counted from the pod."""
    names: list[str] = []

    def add(entries: Any) -> None:
        if isinstance(entries, list):
            for entry in entries:
                name = entry.get("name") if isinstance(entry, Mapping) else None
                names.append(name if isinstance(name, str) and name else "(unnamed)")

    add(spec.get("resourceClaims"))
    resources = spec.get("resources")
    if isinstance(resources, Mapping):
        add(resources.get("claims"))
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        for container in containers if isinstance(containers, list) else ():
            resources = container.get("resources") if isinstance(container, Mapping) else None
            if isinstance(resources, Mapping):
                add(resources.get("claims"))
    return sorted(set(names))


def _list(spec: Mapping[str, Any], key: str) -> list[Any]:
    value = spec.get(key) or []
    if not isinstance(value, list):
        raise GpuRequestError(f"spec.{key} must be a list")
    return value
