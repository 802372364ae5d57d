"""Workload kind and GPU request of a pod: pure functions of the pod dict."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from webhook.settings import PREEMPTIBLE_KINDS, WORKLOAD_KINDS, WorkloadKindRules

WORKLOAD_TYPE_LABEL = "hopsworks.ai/workload-type"
GPU_RESOURCE = "nvidia.com/gpu"
# Run:ai's GPU-sharing annotations.
GPU_FRACTION_ANNOTATION = "gpu-fraction"
GPU_FRACTION_DEVICES_ANNOTATION = "gpu-fraction-num-devices"
GPU_MEMORY_ANNOTATION = "gpu-memory"


def controller_owner(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """(API group, kind) of the object's controller: its ownerReference with `controller: true`."""
    for ref in meta.get("ownerReferences") or ():
        # type() first: parsed JSON is a dict, and the Mapping ABC's check is the slow part here.
        if (type(ref) is dict or isinstance(ref, Mapping)) and ref.get("controller") is True and ref.get("uid"):
            api_version, kind = ref.get("apiVersion"), ref.get("kind")
            # str() only for what the schema check does not guarantee (a folder's object, a cache).
            if type(api_version) is not str:
                api_version = str(api_version or "")
            if type(kind) is not str:
                kind = str(kind or "")
            return (api_version.rpartition("/")[0], kind)  # "batch/v1" -> "batch", "v1" -> ""
    return None


def pod_kind(labels: Mapping[str, Any], meta: Mapping[str, Any], rules: WorkloadKindRules) -> str | None:
    """`classify_workload` of a pod with metadata `meta`; its ownerReferences are read only when
    the labels do not say (most pods: a notebook, an app, a deployment)."""
    return _labelled_kind(labels, rules) or _owned_kind(labels, rules, controller_owner(meta))


def is_job_owner(controller: tuple[str, str] | None, rules: WorkloadKindRules) -> bool:
    return controller is not None and any((o.api_group, o.kind) == controller for o in rules.job_owners)


def classify_workload(
    labels: Mapping[str, Any], rules: WorkloadKindRules, controller: tuple[str, str] | None = None
) -> str | None:
    """The platform's workload kind of a pod, or None when no rule says (quota-checked then).

    Anyone who creates a pod writes its labels, so a label can make a pod a notebook, terminal, app
    or deployment (checked) but never a job (exempt): a job is a pod controlled by one of
    `rules.job_owners`, and labels then only tell a system job from a job. An ownerReference can be
    written too, but the apiserver's garbage collector deletes a pod whose owner does not exist,
    and a pod of a real Job is that Job's pod.
    """
    return _labelled_kind(labels, rules) or _owned_kind(labels, rules, controller)


# What a workload-type label may make a pod: any kind but a job (see `classify_workload`).
_LABELLED_KINDS = frozenset(WORKLOAD_KINDS) - PREEMPTIBLE_KINDS


def _labelled_kind(labels: Mapping[str, Any], rules: WorkloadKindRules) -> str | None:
    """The kind the labels give (a notebook, terminal, app or deployment), else None."""
    explicit = labels.get(WORKLOAD_TYPE_LABEL)
    if isinstance(explicit, str) and explicit in _LABELLED_KINDS:
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
# What a cached pod whose GPU request cannot be read counts as (DESIGN: quota never leaks). The
# apiserver and admission refuse such pods, so one in the cache was created around them; it blocks
# its project's quota until it is removed, and `webhook_pods_unreadable_gpus` says how many exist.
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


def _container_gpus(container: Mapping[str, Any], key: str, index: int) -> float:
    # The field's path is written only for an error: this runs for every container of every review.
    resources = container.get("resources") or {}
    if type(resources) is not dict and not isinstance(resources, Mapping):
        raise GpuRequestError(f"spec.{key}[{index}].resources must be an object")
    for section in ("limits", "requests"):
        amounts = resources.get(section) or {}
        if type(amounts) is not dict and not isinstance(amounts, Mapping):
            raise GpuRequestError(f"spec.{key}[{index}].resources.{section} must be an object")
        if GPU_RESOURCE in amounts:
            try:
                return parse_quantity(amounts[GPU_RESOURCE], MAX_GPUS)
            except ValueError as exc:
                raise GpuRequestError(f"spec.{key}[{index}].resources.{section}[{GPU_RESOURCE}]: {exc}") from None
    return 0.0


def _one_container_gpus(container: Any, key: str, index: int) -> float:
    """The GPUs of one container under `key` (0 for an entry that is not an object)."""
    if type(container) is dict:
        # Admission and the pod cache read every container of every pod, and nearly none asks
        # for a GPU: plain dicts without the resource are passed over here, before the full
        # read below (which would find 0 GPUs and no error in them).
        resources = container.get("resources")
        if type(resources) is dict:
            limits = resources.get("limits")
            requests = resources.get("requests")
            if (limits is None or (type(limits) is dict and GPU_RESOURCE not in limits)) and (
                requests is None or (type(requests) is dict and GPU_RESOURCE not in requests)
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


def _list(spec: Mapping[str, Any], key: str) -> list[Any]:
    value = spec.get(key) or []
    if not isinstance(value, list):
        raise GpuRequestError(f"spec.{key} must be a list")
    return value
