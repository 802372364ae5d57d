"""Workload kind and GPU request of a pod: pure functions of the pod dict."""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
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
        if isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("uid"):
            api_version = str(ref.get("apiVersion") or "")
            group = api_version.rpartition("/")[0]  # "batch/v1" -> "batch", "v1" -> ""
            return (group, str(ref.get("kind") or ""))
    return None


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
    explicit = labels.get(WORKLOAD_TYPE_LABEL)
    if isinstance(explicit, str) and explicit in WORKLOAD_KINDS and explicit not in PREEMPTIBLE_KINDS:
        return explicit
    for rule in rules.rules:
        if rule.kind in PREEMPTIBLE_KINDS:
            continue
        if rule.label in labels and (rule.value is None or labels[rule.label] == rule.value):
            return rule.kind
    if is_job_owner(controller, rules):
        job_type = labels.get("job-type")
        if explicit == "system-job" or (job_type is not None and str(job_type) in rules.system_job_types):
            return "system-job"
        return "job"
    return None


# Binary suffixes first: "Mi" must not be read as "M" after stripping "i".
_QUANTITY_SUFFIXES = (
    ("Ki", Decimal(2) ** 10), ("Mi", Decimal(2) ** 20), ("Gi", Decimal(2) ** 30),
    ("m", Decimal("0.001")), ("k", Decimal(10) ** 3), ("M", Decimal(10) ** 6), ("G", Decimal(10) ** 9),
)  # fmt: skip


def parse_quantity(value: Any) -> float:
    """A Kubernetes quantity as a number ("2", "500m", "1k"). Raises ValueError when malformed."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"not a quantity: {value!r}")
        return float(value)
    text = str(value).strip()
    if len(text) <= 15 and text.isdigit() and text.isascii():
        return float(int(text))  # "1", "2": nearly every GPU request, exact and without Decimal
    scale = Decimal(1)
    for suffix, factor in _QUANTITY_SUFFIXES:
        if text.endswith(suffix):
            text, scale = text[: -len(suffix)], factor
            break
    try:
        number = Decimal(text) * scale
    except InvalidOperation:
        raise ValueError(f"not a quantity: {value!r}") from None
    if not number.is_finite() or number < 0:
        raise ValueError(f"not a quantity: {value!r}")
    return float(number)


def _container_gpus(container: Mapping[str, Any]) -> float:
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        amounts = resources.get(section) or {}
        if GPU_RESOURCE in amounts:
            return parse_quantity(amounts[GPU_RESOURCE])
    return 0.0


def pod_gpu_request(pod: Mapping[str, Any]) -> float:
    """GPUs a pod holds while it runs: whole devices plus Run:ai fractions.

    Like the scheduler: the larger of the sum over app containers and the largest init container.
    A `gpu-memory` request cannot be turned into a fraction without the node's GPU, so it counts as
    one device per requested device: an upper bound, so quota never leaks.
    Raises ValueError on a malformed quantity.
    """
    spec = pod.get("spec") or {}
    app = sum(_container_gpus(c) for c in spec.get("containers") or () if isinstance(c, dict))
    init = max(
        (_container_gpus(c) for c in spec.get("initContainers") or () if isinstance(c, dict)),
        default=0.0,
    )
    gpus = max(app, init)
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    devices = 1.0
    if GPU_FRACTION_DEVICES_ANNOTATION in annotations:
        devices = parse_quantity(annotations[GPU_FRACTION_DEVICES_ANNOTATION])
    if GPU_FRACTION_ANNOTATION in annotations:
        fraction = parse_quantity(annotations[GPU_FRACTION_ANNOTATION])
        if fraction > 1:
            raise ValueError(f"{GPU_FRACTION_ANNOTATION} must be at most 1, got {fraction}")
        gpus += fraction * devices
    elif GPU_MEMORY_ANNOTATION in annotations:
        gpus += devices
    return gpus
