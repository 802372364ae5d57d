"""What the pod cache keeps of a pod, and how it gets it: `slim_pod` of a watch event's pod,
`decode_pod_list` of a list page, as one schema.

At 50,000 pods the first list is hundreds of megabytes of JSON, most of it managedFields, volumes,
container statuses and the rest of each spec. msgspec skips what the schema below leaves out while it
parses: no Python object is made for it, so the list is parsed faster, with less garbage and a
lower peak. A watch event's pod is parsed whole and then slimmed to the same fields, so a listed pod
and a watched one reach the store alike (tests/test_slim_pods.py holds the two together).

Each kept field is `Any`: a value of an unexpected type reaches the store as a plain JSON parse
gives it, and the record's parser decides (as for a watch event). Only the structure is typed, and
a page whose structure differs (an item that is not an object; the apiserver sends none) is not
decoded here: the watch then parses it whole (`PageDecoder`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

import msgspec

Obj = dict[str, Any]
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


class _Metadata(TypedDict, total=False):
    name: Any
    generateName: Any
    namespace: Any
    uid: Any
    resourceVersion: Any
    creationTimestamp: Any
    deletionTimestamp: Any
    labels: Any
    annotations: Any
    ownerReferences: Any
    finalizers: Any


class _Container(TypedDict, total=False):
    name: Any
    resources: Any
    # An init container that restarts is a sidecar: its GPUs are held beside the app containers'.
    restartPolicy: Any


class _Spec(TypedDict, total=False):
    containers: list[_Container]
    initContainers: list[_Container]
    nodeName: Any
    priorityClassName: Any
    priority: Any
    preemptionPolicy: Any
    schedulerName: Any


class _Status(TypedDict, total=False):
    phase: Any


class _Pod(TypedDict, total=False):
    apiVersion: Any
    kind: Any
    metadata: _Metadata
    spec: _Spec
    status: _Status


class _PodList(TypedDict, total=False):
    metadata: Any
    items: list[_Pod]


_DECODER = msgspec.json.Decoder(_PodList)


def decode_pod_list(body: bytes) -> Mapping[str, Any] | None:
    """The page with each pod slimmed as `slim_pod` slims it; None when its structure is not a
    pod list's."""
    try:
        page = _DECODER.decode(body)
    except msgspec.ValidationError:
        return None
    for pod in page.get("items") or ():
        annotations = pod.get("metadata", {}).get("annotations")
        if isinstance(annotations, dict) and _LAST_APPLIED in annotations:
            del annotations[_LAST_APPLIED]  # a copy of the whole object as applied: kilobytes
    return page


_METADATA = tuple(_Metadata.__annotations__)
_CONTAINER = tuple(_Container.__annotations__)
_SPEC_SCALARS = tuple(k for k in _Spec.__annotations__ if k not in ("containers", "initContainers"))


def slim_pod(pod: Obj) -> Obj:
    """What `decode_pod_list` would keep of `pod` in a list page: the same fields, where present. A
    part that is not an object is passed on as it is, for the record's parser to refuse."""
    out: Obj = {k: pod[k] for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in pod}
    meta = pod.get("metadata")
    if isinstance(meta, Mapping):
        out["metadata"] = slim_meta = {k: meta[k] for k in _METADATA if k in meta}
        annotations = slim_meta.get("annotations")
        if isinstance(annotations, Mapping) and _LAST_APPLIED in annotations:
            slim_meta["annotations"] = {k: v for k, v in annotations.items() if k != _LAST_APPLIED}
    spec = pod.get("spec")
    if isinstance(spec, Mapping):
        out["spec"] = slim_spec = {k: spec[k] for k in _SPEC_SCALARS if k in spec}
        for key in ("containers", "initContainers"):
            if isinstance(spec.get(key), list):
                slim_spec[key] = [{k: c[k] for k in _CONTAINER if k in c} for c in spec[key] if isinstance(c, Mapping)]
    status = pod.get("status")
    if isinstance(status, Mapping):
        out["status"] = {"phase": status["phase"]} if "phase" in status else {}
    return out
