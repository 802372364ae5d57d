"""KAI-Scheduler's preemptibility rule, written out again for the Run:ai stand-in.

A second, independent reading of KAI v0.17.0 (`pkg/podgrouper/podgrouper/plugins/defaultgrouper/
default_grouper.go`, `pkg/common/podgroup/preemptible.go`), kept apart from `webhook.core` so that
the table tests compare two implementations instead of one with itself. For a pod without owner
labels (the stand-in never sees owners) and without Run:ai's per-type defaults:

- label `kai.scheduler/preemptibility` = `preemptible` | `non-preemptible` decides;
- else the priority class: the label `priorityClassName` if present, else `spec.priorityClassName`;
  a name with no PriorityClass falls back to `train`, then to the globalDefault class, then 50;
- preemptible iff that value is below 100.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

THRESHOLD = 100


def kai_preemptible(pod: Mapping[str, Any], classes: Mapping[str, int], global_default: int | None = None) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    explicit = labels.get("kai.scheduler/preemptibility")
    if explicit in ("preemptible", "non-preemptible"):
        return bool(explicit == "preemptible")
    spec_class = (pod.get("spec") or {}).get("priorityClassName")
    name = labels.get("priorityClassName", spec_class)
    if name not in classes:
        name = "train"
    fallback = global_default if global_default is not None else 50
    value = classes.get(name, fallback)
    return value < THRESHOLD


def pod_gpus(pod: Mapping[str, Any]) -> float:
    """Whole GPUs (limits) plus a gpu-fraction on its devices: enough for the table tests."""
    whole = sum(
        float((c.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu", 0))
        for c in (pod.get("spec") or {}).get("containers") or ()
    )
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    fraction = float(annotations.get("gpu-fraction", 0)) * float(annotations.get("gpu-fraction-num-devices", 1))
    return whole + fraction


def kai_owners(obj: Mapping[str, Any], objects: Mapping[str, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The owners KAI's pod grouper reads, nearest first (`podgrouper.getResourceOwners`): the first
    ownerReference, then that owner's first, up to one without owners. `objects` holds the objects
    of the namespace by uid; a reference to none of them ends the walk (KAI: the owner is gone)."""
    chain: list[Mapping[str, Any]] = []
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    while refs:
        owner = objects.get(refs[0].get("uid", ""))
        if owner is None:
            break
        chain.append(owner)
        refs = (owner.get("metadata") or {}).get("ownerReferences") or []
    return chain


def kai_preemptible_owned(
    pod: Mapping[str, Any], objects: Mapping[str, Mapping[str, Any]], classes: Mapping[str, int]
) -> bool:
    """`kai_preemptible` of a pod with owners: the preemptibility label of the nearest owner that
    has a valid one decides before the pod's own (`calcPodGroupPreemptibilityWithDefaults`)."""
    for owner in kai_owners(pod, objects):
        said = ((owner.get("metadata") or {}).get("labels") or {}).get("kai.scheduler/preemptibility")
        if said in ("preemptible", "non-preemptible"):
            return bool(said == "preemptible")
    return kai_preemptible(pod, classes)
