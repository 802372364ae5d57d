"""Co-location that holds for a Deployment: its pods as one Kueue plain-pod group.

Kueue places by topology per Workload, and every plain pod is a Workload of its own, so a
"same host" unit on each pod of a Deployment co-locates nothing. Pods carrying one
`kueue.x-k8s.io/pod-group-name` label and one `pod-group-total-count` annotation are admitted as
one Workload (Kueue v0.17.0, pkg/controller/jobs/pod), so Topology-Aware Scheduling puts them in
one domain. The group is a ReplicaSet's pods: the ReplicaSet's name carries the pod-template hash,
and `core.owners` writes the replica count into the template, so a new template or a new count is
a new ReplicaSet and a new group. The count is the Deployment's, from the watch-fed ReplicaSet
cache; nothing is asked of the apiserver.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from webhook.snapshot import ReplicaSetInfo

# A label value holds 63 characters at most, and Kueue names the group's Workload after it.
MAX_GROUP_NAME = 63


@dataclass(frozen=True, slots=True)
class PodGroup:
    name: str
    total: int


def replica_set_of(meta: Mapping[str, Any]) -> str | None:
    """The name of the ReplicaSet controlling a pod, or None."""
    for ref in meta.get("ownerReferences") or ():
        if (
            (type(ref) is dict or isinstance(ref, Mapping))  # type() first: the ABC's check is slow
            and ref.get("controller") is True
            and ref.get("kind") == "ReplicaSet"
            and ref.get("apiVersion") == "apps/v1"
            and isinstance(name := ref.get("name"), str)
        ):
            return name
    return None


def group_name(replica_set: str, total: int) -> str:
    """`<ReplicaSet>-n<count>`; a name too long for a label keeps a prefix and a hash of the whole."""
    name = f"{replica_set}-n{total}"
    if len(name) <= MAX_GROUP_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    suffix = f"-{digest}-n{total}"
    return replica_set[: MAX_GROUP_NAME - len(suffix)].rstrip("-.") + suffix


# Immutable like a frozen dataclass, but made for every review: a NamedTuple is built in a fifth
# of the time (a frozen dataclass sets each field through object.__setattr__).
class GroupAnswer(NamedTuple):
    group: PodGroup | None = None  # None: the pod needs no group
    missing: str | None = None  # the ReplicaSet the pod names but the cache does not have yet


NO_GROUP = GroupAnswer()  # made once: most pods need no group, and a NamedTuple's __new__ runs Python


def deployment_pod_group(
    meta: Mapping[str, Any], replica_sets: Mapping[str, Mapping[str, ReplicaSetInfo]], namespace: str
) -> GroupAnswer:
    """The group of a Deployment's pod that chose a topology unit: its ReplicaSet's pods, when the
    Deployment wants more than one. A single pod (a notebook, one replica) gets no group."""
    name = replica_set_of(meta)
    if name is None:
        return NO_GROUP
    info = replica_sets.get(namespace, {}).get(name)
    if info is None:
        return GroupAnswer(None, name)
    if info.deployment is None or info.replicas <= 1:
        return NO_GROUP
    return GroupAnswer(PodGroup(group_name(name, info.replicas), info.replicas))
