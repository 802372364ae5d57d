"""Preemptibility as Run:ai's scheduler will decide it, from what a pod carries: a pure function.

Run:ai (and KAI-Scheduler, its open core) does not know the platform's workload kinds. Its pod
grouper gives each pod's PodGroup (KAI v0.17.0, `pkg/podgrouper/podgrouper/plugins/defaultgrouper`):

1. preemptibility from the label `kai.scheduler/preemptibility` (`preemptible`/`non-preemptible`;
   another value is ignored), on the pod's owners first (its first ownerReference, that one's
   first, and so on up: `core.kinds.kai_owner`), then on the pod;
2. else the per-workload-type default Run:ai configures (not visible here);
3. else from the priority: the PriorityClass named by the label `priorityClassName` (owners, then
   pod) or else `spec.priorityClassName`, when that class exists; else the workload type's default
   class, else `train`, else the cluster's globalDefault class, else 50. A value below 100 is
   preemptible (`pkg/common/podgroup/preemptible.go`).

The webhook writes the label on every pod of a bound project (`runai_labels`), so admission, the
GPU view, the offer and the cache all ask `runai_preemptibility` of the pod as labelled. Owners'
labels are kept in line by the workload check (`core.workloads`), and an owner of a kind that
check never sees is refused where it would be read (`unreviewed_owner`). Where Run:ai would fall
to a default this module cannot see, the pod counts as non-preemptible: quota never leaks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.kinds import kai_owner
from webhook.settings import (
    NON_PREEMPTIBLE,
    NON_PREEMPTIBLE_PRIORITY,
    PREEMPTIBLE,
    UNKNOWN_KIND,
    ClusterSettings,
)
from webhook.snapshot import PriorityClassInfo

# The pod (and owner) label KAI's pod grouper reads for the PodGroup's priority class.
RUNAI_PRIORITY_LABEL = "priorityClassName"
# Pod annotations with which a pod escapes Run:ai's pod grouper, and so any preemptibility the
# webhook gives it: it joins a PodGroup someone else wrote (an orphan pod naming one), or none.
POD_GROUP_ANNOTATION = "pod-group-name"
SKIP_POD_GROUPER_ANNOTATION = "kai.scheduler/skip-podgrouper"
# KAI's fallback class, and the priority it uses when no class can be found.
FALLBACK_CLASS = "train"
DEFAULT_PRIORITY = 50


@dataclass(frozen=True, slots=True)
class RunaiPreemptibility:
    preemptible: bool
    why: str  # what decided it, for refusals and logs

    @property
    def quota_checked(self) -> bool:
        """Non-preemptible pods may use only in-quota GPUs: admission holds them to the quota."""
        return not self.preemptible


def runai_preemptibility(
    labels: Mapping[str, Any],
    priority_class: Any,
    classes: Mapping[str, PriorityClassInfo],
    settings: ClusterSettings,
) -> RunaiPreemptibility:
    """How Run:ai will classify a pod with these labels and `spec.priorityClassName`."""
    label = settings.scheduler.runai.preemptibility_label
    said = labels.get(label) if label else None
    if said in (PREEMPTIBLE, NON_PREEMPTIBLE):
        return _label_answer(label, said == PREEMPTIBLE)
    named = labels.get(RUNAI_PRIORITY_LABEL)
    from_label = named is not None
    if not from_label:
        named = priority_class
    found = classes.get(named) if isinstance(named, str) and named else None
    if found is None:
        # Run:ai takes the workload type's default (not visible here) before its fallbacks.
        return _NO_CLASS
    return _class_answer(found, from_label)


# -- answers cached per cluster object ---------------------------------------------------------
# Every review and every cached GPU pod asks; the answer is one of a few per settings label and
# per PriorityClass record, so it is made once for each. The keys are the settings' label (and
# one of its two values) and the identity of a class record of the cluster, never what a request
# carries; an entry holds its record, so the identity is not reused while the entry lives, and a
# replaced record's entry is never hit again. Emptied when full: a bound, not an eviction policy.
_NO_CLASS = RunaiPreemptibility(False, "no existing priority class: Run:ai's default for the workload type")
_MEMO_LIMIT = 256
_label_answers: dict[tuple[str, bool], RunaiPreemptibility] = {}
_class_answers: dict[tuple[int, bool], tuple[PriorityClassInfo, RunaiPreemptibility]] = {}


def _label_answer(label: str, preemptible: bool) -> RunaiPreemptibility:
    answer = _label_answers.get((label, preemptible))
    if answer is None:
        if len(_label_answers) >= _MEMO_LIMIT:
            _label_answers.clear()
        said = PREEMPTIBLE if preemptible else NON_PREEMPTIBLE
        answer = _label_answers[label, preemptible] = RunaiPreemptibility(preemptible, f"label {label}={said}")
    return answer


def _class_answer(found: PriorityClassInfo, from_label: bool) -> RunaiPreemptibility:
    entry = _class_answers.get((id(found), from_label))
    if entry is not None and entry[0] is found:
        return entry[1]
    source = f"label {RUNAI_PRIORITY_LABEL}" if from_label else "spec.priorityClassName"
    answer = RunaiPreemptibility(found.value < NON_PREEMPTIBLE_PRIORITY, f"{source} {found.name} (value {found.value})")
    if len(_class_answers) >= _MEMO_LIMIT:
        _class_answers.clear()
    _class_answers[id(found), from_label] = (found, answer)
    return answer


def intended(kind: str | None, settings: ClusterSettings) -> str:
    """`preemptible` or `non-preemptible`: what a pod of this kind tells Run:ai (the settings)."""
    return settings.scheduler.runai.preemptibility[kind or UNKNOWN_KIND]


def runai_labels(kind: str | None, settings: ClusterSettings) -> dict[str, str]:
    """The labels the webhook writes on a pod of `kind` in a bound project (Run:ai on)."""
    runai = settings.scheduler.runai
    labels = {}
    if runai.preemptibility_label:
        labels[runai.preemptibility_label] = intended(kind, settings)
    named = runai.priority_classes.get(kind or UNKNOWN_KIND)
    if named:
        labels[RUNAI_PRIORITY_LABEL] = named
    return labels


def admitted_preemptibility(
    kind: str | None,
    labels: Mapping[str, Any],
    priority_class: Any,
    classes: Mapping[str, PriorityClassInfo],
    settings: ClusterSettings,
) -> RunaiPreemptibility:
    """How Run:ai will classify a pod of `kind` once the webhook has labelled it (Run:ai on); with
    Run:ai off, the pod as it is (nothing is labelled, nothing checked)."""
    if settings.run_ai_enable:
        labels = {**labels, **runai_labels(kind, settings)}
    return runai_preemptibility(labels, priority_class, classes, settings)


# Every annotation `escapes_pod_grouper` reads: a pod with none of them does not escape.
POD_GROUPER_ANNOTATIONS = (SKIP_POD_GROUPER_ANNOTATION, POD_GROUP_ANNOTATION)


def escapes_pod_grouper(meta: Mapping[str, Any]) -> str | None:
    """Why Run:ai would take this pod's preemptibility from somewhere the webhook does not write
    (None: it does not)."""
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        return None
    if str(annotations.get(SKIP_POD_GROUPER_ANNOTATION, "")) == "true":
        return f"annotation {SKIP_POD_GROUPER_ANNOTATION}: true keeps Run:ai's pod grouper away from it"
    if POD_GROUP_ANNOTATION in annotations and not meta.get("ownerReferences"):
        return (
            f"annotation {POD_GROUP_ANNOTATION} on a pod without owner puts it in a PodGroup written by someone "
            "else, whose preemptibility Run:ai would use"
        )
    return None


# The kinds of Kubernetes' own API groups that may be the first owner of a pod, or of a pod's
# owner, in a project bound to Run:ai: those whose controllers make pods or pod owners. Their
# labels are reviewed: a pod's by the pod webhooks, the others' by `/validate/workloads`.
REVIEWED_OWNERS = frozenset(
    {
        ("", "Pod"),
        ("", "ReplicationController"),
        ("apps", "Deployment"),
        ("apps", "ReplicaSet"),
        ("apps", "StatefulSet"),
        ("apps", "DaemonSet"),
        ("batch", "Job"),
        ("batch", "CronJob"),
    }
)
_KUBERNETES_GROUPS = frozenset({"", "apps", "batch", "autoscaling", "policy"})
# The same kinds as their controllers write them (apiVersion, kind), so that the owner of nearly
# every pod is passed over with one set lookup before the full read.
REVIEWED_REFS = frozenset((f"{group}/v1" if group else "v1", kind) for group, kind in REVIEWED_OWNERS)


def _kubernetes_group(group: str) -> bool:
    """An API group of Kubernetes itself (the core group, apps, ..., *.k8s.io), not a custom
    resource's: `*.x-k8s.io` are the SIGs' custom resources (Kueue, JobSet, LeaderWorkerSet)."""
    return group in _KUBERNETES_GROUPS or (group.endswith(".k8s.io") and not group.endswith(".x-k8s.io"))


def unreviewed_owner(meta: Mapping[str, Any]) -> str | None:
    """Why Run:ai would read this object's preemptibility, priority class, queue or skip annotation
    from an owner whose labels the platform never reviews (None: it would not, as far as this
    check sees).

    A ConfigMap, Secret, Service or any other object of Kubernetes' own kinds that no controller
    makes pods from can be created and labelled by any project member and named as a pod's first
    owner; the garbage collector keeps the pod as long as that object exists. Custom resources are
    not judged here: their kinds are the operators' (Ray, Spark, Kubeflow), and the README says to
    keep these labels off them.
    """
    refs = meta.get("ownerReferences")
    if type(refs) is list and refs and type(refs[0]) is dict:
        first = refs[0]
        version, kind = first.get("apiVersion"), first.get("kind")
        if type(version) is str and type(kind) is str and (version, kind) in REVIEWED_REFS:
            return None
    owner = kai_owner(meta)
    if owner is None or not _kubernetes_group(owner.group) or (owner.group, owner.kind) in REVIEWED_OWNERS:
        return None
    what = f"{owner.kind or 'an unnamed kind'} {owner.name[:63]}".rstrip()
    return (
        f"its first ownerReference is {what}, whose labels the platform never reviews, and Run:ai reads the "
        "preemptibility, priority class, queue and skip annotation from that owner before the pod: make the "
        "controller the first ownerReference, or remove the reference"
    )
