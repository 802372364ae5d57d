"""G5: a pod keeps the scheduling labels and annotations it was admitted with: a pure function of
a pod UPDATE.

Admission reviews a pod once, at its creation, from its labels and annotations; KAI's pod grouper,
Kueue and this server's own cache read them again for as long as the pod lives. So a key that
decides the pod's queue, preemptibility, GPU request or group must not change afterwards: a
project member with `patch pods` could otherwise relabel an over-quota job non-preemptible, or
grow its GPU share after the quota check. The keys, by who reads them after creation:

- KAI's pod grouper (v0.17.0, `pkg/podgrouper`: the pod controller and the default grouper),
  on every reconcile of the pod: the labels `kai.scheduler/preemptibility` and
  `priorityClassName` (the PodGroup's preemptibility and priority are rewritten from them), the
  queue label (`runai/queue` on Run:ai, `kai.scheduler/queue` on KAI's defaults) and the node-pool
  label `kai.scheduler/node-pool` (both read when a PodGroup is made), and the annotations
  `kai.scheduler/skip-podgrouper`, `pod-group-name` (a pod without owner that names a group is
  left in it), `kai.scheduler/preemption-delay` and `kai.scheduler/staleness-grace-period` (how
  long the PodGroup is kept from preemption, and how long it may run short of its members: a long
  delay on an over-quota job would keep its GPUs from being reclaimed). Its queue fallback, the
  label `project`, is read only on a pod without a queue label, and every admitted pod of a bound
  project has `runai/queue`: `project` is not guarded, so that none of Run:ai's own writers of it
  is ever refused;
- KAI's binder and scheduler: the GPU-sharing annotations `gpu-fraction`,
  `gpu-fraction-num-devices`, `gpu-memory`, `gpu-fraction-container-name` and `mps`;
- Kueue (v0.17.0, plain pods): the labels `kueue.x-k8s.io/queue-name` and
  `kueue.x-k8s.io/pod-group-name`, and the annotations this server writes beside them
  (`kueue.x-k8s.io/podset-required-topology`, `pod-group-total-count`, `pod-group-serving`);
- this server's pod cache (`state/store.py`): the preemptibility label of the settings, the GPU
  annotations above, and the labels that tell the workload kind (`hopsworks.ai/workload-type`,
  `job-type`, and the label of each of the settings' kind rules);
- this server's own annotations (`scheduling.hopsworks.ai/...`), which say what the workload chose.

The first ownerReference is read the same way (`core.kinds.kai_owner`): KAI's pod grouper takes
the preemptibility of the nearest owner that has the label before the pod's own, on every
reconcile. So the first owner may not be replaced after admission: a member could otherwise put a
ConfigMap labelled non-preemptible in front of a job pod's Job. What Kubernetes itself does to
owners passes when the new first owner is one whose labels the platform reviews
(`core.preemptibility.unreviewed_owner`): the garbage collector dropping owners (what is left is
the end of the list it had), and a controller adopting a pod that had no owner.

Only one writer changes one of them in the normal course: KAI's pod grouper annotates every pod it
groups with `pod-group-name`. The identities in `GuardConfig.pod_groupers` may change that one
annotation and nothing else. Kubernetes' own controllers (the kubelet's and scheduler's status,
the garbage collector's owners and finalizers, Kueue lifting its scheduling gate) change none of
these keys; the webhook configuration does not even send an update that leaves labels and
annotations as they were. Everyone else, cluster admins included, is refused with the keys named:
the way to other values is a new pod (a controller makes one when its template changes).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from webhook.core.decision import Decision
from webhook.core.gpu_sharing import SHARING_ANNOTATIONS
from webhook.core.guard_config import GuardConfig
from webhook.core.kinds import WORKLOAD_TYPE_LABEL
from webhook.core.preemptibility import (
    POD_GROUP_ANNOTATION,
    POD_GROUPER_ANNOTATIONS,
    RUNAI_PRIORITY_LABEL,
    unreviewed_owner,
)
from webhook.settings import KAI_PREEMPTIBILITY_LABEL, ClusterSettings
from webhook.snapshot import (
    KUEUE_POD_GROUP_COUNT_ANNOTATION,
    KUEUE_POD_GROUP_LABEL,
    KUEUE_POD_GROUP_SERVING_ANNOTATION,
    KUEUE_QUEUE_LABEL,
    KUEUE_TOPOLOGY_ANNOTATION,
    MIRROR_POD_ANNOTATION,
    RUNAI_QUEUE_LABEL,
)

# KAI's own names for what Run:ai names otherwise (KAI v0.17.0 `pkg/common/constants`,
# `pkg/podgrouper/podgrouper/plugins/constants`): its default queue label and node-pool label, and
# the annotations its default grouper reads the PodGroup's preemption delay and staleness from.
KAI_QUEUE_LABEL = "kai.scheduler/queue"
KAI_PREEMPTION_DELAY_ANNOTATION = "kai.scheduler/preemption-delay"
KAI_STALENESS_ANNOTATION = "kai.scheduler/staleness-grace-period"
KAI_NODE_POOL_LABEL = "kai.scheduler/node-pool"
# The label `core.kinds` reads to tell a system job from a job.
JOB_TYPE_LABEL = "job-type"
# Every annotation of this server's own: what a workload chose, read at admission.
OWN_ANNOTATION_PREFIX = "scheduling.hopsworks.ai/"

FIXED_LABELS = frozenset(
    {
        KAI_PREEMPTIBILITY_LABEL,
        RUNAI_PRIORITY_LABEL,
        RUNAI_QUEUE_LABEL,
        KAI_QUEUE_LABEL,
        KAI_NODE_POOL_LABEL,
        KUEUE_QUEUE_LABEL,
        KUEUE_POD_GROUP_LABEL,
        WORKLOAD_TYPE_LABEL,
        JOB_TYPE_LABEL,
    }
)
FIXED_ANNOTATIONS = frozenset(
    {
        *SHARING_ANNOTATIONS,
        *POD_GROUPER_ANNOTATIONS,
        KAI_PREEMPTION_DELAY_ANNOTATION,
        KAI_STALENESS_ANNOTATION,
        KUEUE_TOPOLOGY_ANNOTATION,
        KUEUE_POD_GROUP_COUNT_ANNOTATION,
        KUEUE_POD_GROUP_SERVING_ANNOTATION,
    }
)
# What the pod grouper writes on every pod it groups.
POD_GROUPER_WRITES = frozenset({POD_GROUP_ANNOTATION})
# How much of a value a refusal quotes: enough to recognise it, never a 256 KiB annotation.
SHOWN_VALUE_CHARS = 60


def protected_labels(settings: ClusterSettings) -> frozenset[str]:
    """The pod labels that stay as admitted, under these settings."""
    extra = {rule.label for rule in settings.scheduler.workload_kinds.rules}
    label = settings.scheduler.runai.preemptibility_label
    if label:
        extra.add(label)
    return FIXED_LABELS | extra


def is_protected_annotation(key: str) -> bool:
    return key in FIXED_ANNOTATIONS or key.startswith(OWN_ANNOTATION_PREFIX)


def _updated_pod(request: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """(metadata before, metadata after) of an UPDATE of a pod itself; None for any other request."""
    if request.get("operation") != "UPDATE" or request.get("subResource"):
        return None
    kind = request.get("kind") or {}
    if kind.get("kind") != "Pod" or kind.get("group", "") != "":
        return None
    old, new = request.get("oldObject"), request.get("object")
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None
    old_meta, new_meta = old.get("metadata"), new.get("metadata")
    return (old_meta if isinstance(old_meta, dict) else {}, new_meta if isinstance(new_meta, dict) else {})


def _map(meta: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = meta.get(key)
    return value if isinstance(value, dict) else {}


_ABSENT = object()


def _changes(before: Mapping[str, Any], after: Mapping[str, Any], protected: Any) -> Iterator[tuple[str, Any, Any]]:
    """(key, value before, value after) of each protected key that was added, removed or changed;
    `_ABSENT` stands for a key the map does not have."""
    if before == after:
        return
    for key in sorted(set(before) | set(after)):
        if not protected(key):
            continue
        was, now = before.get(key, _ABSENT), after.get(key, _ABSENT)
        if was != now:
            yield key, was, now


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    if len(text) > SHOWN_VALUE_CHARS:
        text = text[:SHOWN_VALUE_CHARS] + "..."
    return repr(text) if isinstance(value, str) else text


def _described(what: str, key: str, was: Any, now: Any) -> str:
    if was is _ABSENT:
        return f"{what} {key} added ({_shown(now)})"
    if now is _ABSENT:
        return f"{what} {key} removed (was {_shown(was)})"
    return f"{what} {key} changed from {_shown(was)} to {_shown(now)}"


def _owner_refs(meta: Mapping[str, Any]) -> list[Any]:
    refs = meta.get("ownerReferences")
    return refs if isinstance(refs, list) else []


def _first_owner_change(old_meta: Mapping[str, Any], new_meta: Mapping[str, Any]) -> str | None:
    """What replaced the pod's first ownerReference, None when nothing did or Kubernetes' own
    owner writes did (owners dropped from the front, an ownerless pod adopted by a reviewed kind)."""
    before, after = _owner_refs(old_meta), _owner_refs(new_meta)
    if before == after or (before[:1] == after[:1]):
        return None
    if not after:
        return None  # every owner removed: the pod's own labels decide, and they are guarded
    dropped = before[len(before) - len(after) :] == after  # owners removed: the rest was behind them
    if (dropped or not before) and unreviewed_owner(new_meta) is None:
        return None  # the new first owner is one whose labels the platform reviews
    first = after[0] if isinstance(after[0], dict) else {}
    was = before[0] if before and isinstance(before[0], dict) else None
    now = f"{first.get('kind')} {first.get('name')}"
    return (
        f"first ownerReference changed from {was.get('kind')} {was.get('name')} to {now}"
        if was is not None
        else f"first ownerReference {now} added"
    )


def validate_pod_update(request: Mapping[str, Any], settings: ClusterSettings, config: GuardConfig) -> Decision:
    """`POST /validate/pod-updates`: refuse a change to a pod's scheduling labels and annotations
    (see the module's docstring for which, and who may write what)."""
    metas = _updated_pod(request)
    if metas is None:
        return Decision.allow()
    old_meta, new_meta = metas
    if MIRROR_POD_ANNOTATION in _map(old_meta, "annotations"):
        return Decision.allow()  # a static pod's mirror: the kubelet's, and the apiserver refuses edits anyway
    labels = protected_labels(settings)
    changed = [
        _described("label", key, was, now)
        for key, was, now in _changes(_map(old_meta, "labels"), _map(new_meta, "labels"), labels.__contains__)
    ]
    grouper = config.pod_groupers.matches(request.get("userInfo"))
    changed += [
        _described("annotation", key, was, now)
        for key, was, now in _changes(
            _map(old_meta, "annotations"), _map(new_meta, "annotations"), is_protected_annotation
        )
        if not (grouper and key in POD_GROUPER_WRITES)
    ]
    owner = _first_owner_change(old_meta, new_meta)
    if owner is not None:
        changed.append(owner)
    if not changed:
        return Decision.allow()
    name = new_meta.get("name") or old_meta.get("name") or "(unnamed)"
    namespace = request.get("namespace") or new_meta.get("namespace") or ""
    return Decision.deny(
        f"pod {namespace}/{name}: {'; '.join(changed)}. These labels, annotations and owners decide the pod's queue, "
        "preemptibility, GPU request and group, and stay as they were when the pod was admitted; for other "
        "values, change them on the pod's owner (its Deployment or Job) or create the pod again",
        code=403,
    )
