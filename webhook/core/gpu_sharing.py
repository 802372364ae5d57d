"""Run:ai's GPU-sharing annotations as its admission validates them: a pure function of the pod.

Run:ai's admission (KAI-Scheduler v0.17.0, `pkg/binder/plugins/gpusharing/gpu-request` and the
gpusharing admission plugin) refuses a pod whose GPU-sharing request it cannot honour. The same
rules, checked in the same order, with our own words:

- `mps: "true"` needs a fraction or memory request;
- `gpu-fraction` is not combined with an `nvidia.com/gpu` limit on any container;
- `gpu-memory` is not combined with `gpu-fraction` or an `nvidia.com/gpu` limit;
- `gpu-fraction-num-devices` needs `gpu-fraction` or `gpu-memory`;
- `gpu-memory` is a whole number of MiB above 0 (Go's ParseUint: digits only);
- `gpu-fraction` is a decimal number strictly between 0 and 1 (Go's ParseFloat, and a Kubernetes
  quantity: no SI suffix, no hex, no NaN);
- `gpu-fraction-num-devices` is a whole number above 0;
- `gpu-fraction-container-name`, with a fraction or memory request, names one of its containers.

What counts against the quota is `core.kinds.pod_gpu_request`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from webhook.core.kinds import (
    GPU_FRACTION_ANNOTATION,
    GPU_FRACTION_DEVICES_ANNOTATION,
    GPU_MEMORY_ANNOTATION,
    GPU_RESOURCE,
)

MPS_ANNOTATION = "mps"
FRACTION_CONTAINER_ANNOTATION = "gpu-fraction-container-name"
# Every annotation `gpu_sharing_error` reads: a pod with none of them has nothing it can refuse.
SHARING_ANNOTATIONS = (
    GPU_FRACTION_ANNOTATION,
    GPU_MEMORY_ANNOTATION,
    GPU_FRACTION_DEVICES_ANNOTATION,
    MPS_ANNOTATION,
    FRACTION_CONTAINER_ANNOTATION,
)
# Both Go's strconv.ParseFloat and the Kubernetes quantity grammar accept these; nothing else is.
_FRACTION_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_UINT_RE = re.compile(r"[0-9]+")
_UINT64_MAX = 2**64 - 1
MAX_ANNOTATION_CHARS = 40  # longer than any number a person writes; bounds the work on a hostile one


def _whole_gpu_limit(spec: Mapping[str, Any]) -> bool:
    """An `nvidia.com/gpu` limit on any container or init container, whatever its value (as KAI)."""
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        for container in containers if isinstance(containers, list) else ():
            resources = container.get("resources") if isinstance(container, Mapping) else None
            limits = resources.get("limits") if isinstance(resources, Mapping) else None
            if isinstance(limits, Mapping) and GPU_RESOURCE in limits:
                return True
    return False


def _shown(value: str) -> str:
    return repr(value[:MAX_ANNOTATION_CHARS]) + ("..." if len(value) > MAX_ANNOTATION_CHARS else "")


def _positive_uint(value: str) -> bool:
    return len(value) <= MAX_ANNOTATION_CHARS and bool(_UINT_RE.fullmatch(value)) and 0 < int(value) <= _UINT64_MAX


def _fraction_error(value: str) -> str | None:
    if len(value) > MAX_ANNOTATION_CHARS or not _FRACTION_RE.fullmatch(value):
        return (
            f"annotation {GPU_FRACTION_ANNOTATION} must be a decimal number between 0 and 1 written with a "
            f"decimal point or an exponent (like 0.5 or 5e-1), got {_shown(value)}"
        )
    number = float(value)
    if not (math.isfinite(number) and 0 < number < 1):
        return f"annotation {GPU_FRACTION_ANNOTATION} must be more than 0 and less than 1, got {value}"
    return None


def _container_names(spec: Mapping[str, Any]) -> set[str]:
    names = set()
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        for container in containers if isinstance(containers, list) else ():
            if isinstance(container, Mapping) and isinstance(container.get("name"), str):
                names.add(container["name"])
    return names


def gpu_sharing_error(pod: Mapping[str, Any]) -> str | None:
    """Why Run:ai's admission would refuse this pod's GPU-sharing request (None: it would not)."""
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping):
        return None
    for key in SHARING_ANNOTATIONS:
        if key in annotations and not isinstance(annotations[key], str):
            return f"annotation {key} must be a string"
    fraction = annotations.get(GPU_FRACTION_ANNOTATION)
    memory = annotations.get(GPU_MEMORY_ANNOTATION)
    devices = annotations.get(GPU_FRACTION_DEVICES_ANNOTATION)
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    sharing = fraction is not None or memory is not None
    whole = _whole_gpu_limit(spec)
    frac, mem, dev = GPU_FRACTION_ANNOTATION, GPU_MEMORY_ANNOTATION, GPU_FRACTION_DEVICES_ANNOTATION
    if not sharing and annotations.get(MPS_ANNOTATION) == "true":
        return f"annotation {MPS_ANNOTATION}: true (GPU sharing through MPS) needs a {frac} or {mem} request"
    if fraction is not None and whole:
        return f"annotation {frac} cannot be combined with a {GPU_RESOURCE} limit: ask for part of a GPU or whole GPUs"
    if memory is not None and (fraction is not None or whole):
        other = frac if fraction is not None else f"a {GPU_RESOURCE} limit"
        return f"annotation {mem} cannot be combined with {other}: ask for GPU memory or for GPUs"
    if devices is not None and not sharing:
        return f"annotation {dev} needs {frac} or {mem}: it says on how many GPUs that share is taken"
    if memory is not None and not _positive_uint(memory):
        return f"annotation {mem} must be a whole number of MiB above 0 (digits only), got {_shown(memory)}"
    if fraction is not None and (error := _fraction_error(fraction)) is not None:
        return error
    if devices is not None and not _positive_uint(devices):
        return f"annotation {dev} must be a whole number above 0 (digits only), got {_shown(devices)}"
    container = annotations.get(FRACTION_CONTAINER_ANNOTATION)
    if sharing and container is not None and container not in _container_names(spec):
        return f"annotation {FRACTION_CONTAINER_ANNOTATION} names {_shown(container)}, not a container of this pod"
    return None
