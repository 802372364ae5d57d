"""Which pods the pod webhooks must still see: the `matchConditions` of the chart's pod webhooks.

A pod that matches none of them is decided without a call: by `core.quota.validate_pod` allowing
it (the main validate-pods, Run:ai and Kueue off), or by the compiled policies (the webhooks of the
namespaces they decide, `core.admission_policies`). The condition is made here, from the keys those
modules read and write, and the chart holds what `make manifests` generates from it
(`tests/support/webhook_conditions_template.py`), so that an annotation the policies start to read
or a kind `core.preemptibility` starts to review changes both at once.

Any annotation or label of these systems calls, as does a GPU in a request or limit. Where the
policies decide, these call nothing:
- the annotations the policies read themselves: the priority class and the node label choices,
  and the refusal the mutating policy writes for the validating one;
- the labels the policy writes over whatever the pod came with (`runai/queue`, the preemptibility).
And these still call there, for Run:ai's rules refuse or count them (`core.preemptibility`): a
first ownerReference of a kind not reviewed, and a resource claim.
"""

from __future__ import annotations

from webhook.core.admission_policies import FIRST_OWNER, REFUSAL_ANNOTATION
from webhook.core.pod_updates import OWN_ANNOTATION_PREFIX
from webhook.core.preemptibility import POD_GROUP_ANNOTATION, REVIEWED_REFS
from webhook.settings import KAI_PREEMPTIBILITY_LABEL
from webhook.snapshot import (
    AFFINITY_ANNOTATION,
    ANTI_AFFINITY_ANNOTATION,
    PRIORITY_CLASS_ANNOTATION,
    RUNAI_QUEUE_LABEL,
)

CONDITION_NAME = "needs-the-webhook"
KUEUE_PREFIX = "kueue.x-k8s.io/"
KAI_PREFIX = "kai.scheduler/"
# Read by the policies (the priority class one in every mode; the others once decided).
READ_BY_THE_POLICIES = (PRIORITY_CLASS_ANNOTATION,)
READ_WHERE_DECIDED = (AFFINITY_ANNOTATION, ANTI_AFFINITY_ANNOTATION, REFUSAL_ANNOTATION)


def _not(key: str) -> str:
    return f"k != '{key}'"


def _gpu_in(containers: str) -> str:
    return (
        f"{containers}.exists(c, has(c.resources) &&\n"
        "((has(c.resources.limits) && c.resources.limits.exists(r, r.contains('gpu'))) ||\n"
        "(has(c.resources.requests) && c.resources.requests.exists(r, r.contains('gpu')))))"
    )


def needs_the_pod_webhooks(*, decided: bool) -> str:
    """The CEL of the condition, over `object` (the pod); `decided`: for the webhooks of the
    namespaces the compiled policies decide."""
    exempt = (*READ_BY_THE_POLICIES, *(READ_WHERE_DECIDED if decided else ()))
    own_annotation = " &&\n".join([f"k.startsWith('{OWN_ANNOTATION_PREFIX}')", *map(_not, exempt)])
    annotations = (
        "(has(object.metadata.annotations) && object.metadata.annotations.exists(k,\n"
        f"({own_annotation}) ||\n"
        f"k.startsWith('{KUEUE_PREFIX}') || k.contains('gpu') || k.contains('runai') ||\n"
        f"k.startsWith('{KAI_PREFIX}') || k == '{POD_GROUP_ANNOTATION}'))"
    )
    if decided:
        runai_and_kai = (
            f"(k.startsWith('runai') && {_not(RUNAI_QUEUE_LABEL)}) ||\n"
            f"(k.startsWith('{KAI_PREFIX}') && {_not(KAI_PREEMPTIBILITY_LABEL)})"
        )
    else:
        runai_and_kai = f"k.startsWith('runai') || k.startsWith('{KAI_PREFIX}')"
    labels = (
        "(has(object.metadata.labels) && object.metadata.labels.exists(k,\n"
        f"k.startsWith('{OWN_ANNOTATION_PREFIX}') || k.startsWith('{KUEUE_PREFIX}') || k.contains('gpu') ||\n"
        f"{runai_and_kai}))"
    )
    parts = [annotations, labels]
    if decided:
        reviewed = ", ".join(f"'{version} {kind}'" for version, kind in sorted(REVIEWED_REFS))
        parts += [
            "has(object.spec.resourceClaims)",
            f"(has(object.metadata.ownerReferences) && object.metadata.ownerReferences.size() > 0 &&\n"
            f"!(has({FIRST_OWNER}.apiVersion) && has({FIRST_OWNER}.kind) &&\n"
            f"{FIRST_OWNER}.apiVersion + ' ' + {FIRST_OWNER}.kind in\n"
            f"[{reviewed}]))",
        ]
    parts += [
        _gpu_in("object.spec.containers"),
        f"(has(object.spec.initContainers) && {_gpu_in('object.spec.initContainers')})",
    ]
    return " ||\n".join(parts)
