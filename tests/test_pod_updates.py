"""G5: a pod keeps the scheduling labels and annotations it was admitted with (`core.pod_updates`).

One table of pod UPDATEs, each class of edit an attacker with `patch pods` would try and each
write a controller makes, on a real pod CREATE review from the shared fixtures turned into an
UPDATE as the apiserver sends it (old and new object, the writer's userInfo); then the same
decision served by the real server over HTTPS.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.apps import cache_app
from tests.support.cluster import cluster_state, namespace
from tests.support.https import StartHttpsServer
from tests.support.reviews import owned_by, pod_review
from webhook.core.guard_config import GuardConfig, Identities
from webhook.core.pod_updates import protected_labels, validate_pod_update
from webhook.settings import ClusterSettings

NS = "vision"
POD_GROUPER = "system:serviceaccount:kai-scheduler:pod-grouper"
CONFIG = GuardConfig(pod_groupers=Identities.parse([POD_GROUPER]))
SETTINGS = ClusterSettings()

MEMBER = {"username": "alice", "groups": ["vision-members", "system:authenticated"]}
ADMIN = {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}
GROUPER = {"username": POD_GROUPER, "groups": ["system:serviceaccounts", "system:authenticated"]}
KAI_BINDER = {"username": "system:serviceaccount:kai-scheduler:binder", "groups": ["system:serviceaccounts"]}
KUEUE = {"username": "system:serviceaccount:kueue-system:kueue-controller-manager", "groups": []}
GC = {"username": "system:serviceaccount:kube-system:generic-garbage-collector", "groups": []}

# A GPU job pod as admission left it: Run:ai's queue and labels, a fraction of a GPU, a group.
ADMITTED_LABELS = {
    "kai.scheduler/preemptibility": "preemptible",
    "priorityClassName": "train",
    "runai/queue": "vision",
    "kueue.x-k8s.io/queue-name": "lq-vision",
    "hopsworks.ai/workload-type": "notebook",
    "app": "trainer",
}
ADMITTED_ANNOTATIONS = {
    "gpu-fraction": "0.5",
    "gpu-fraction-num-devices": "1",
    "scheduling.hopsworks.ai/topology": "rack",
    "kueue.x-k8s.io/podset-required-topology": "example.com/rack",
    "note": "free text",
}

Edit = Callable[[dict[str, Any]], None]


def pod_update(edit: Edit, user: dict[str, Any], owners: bool = True) -> dict[str, Any]:
    """The apiserver's review of an UPDATE that applies `edit` to the admitted pod."""
    request: dict[str, Any] = pod_review(
        NS,
        labels=ADMITTED_LABELS,
        annotations=ADMITTED_ANNOTATIONS,
        owners=owned_by("Job") if owners else None,
    )["request"]
    request["operation"] = "UPDATE"
    request["userInfo"] = user
    request["options"] = {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}
    request["oldObject"] = copy.deepcopy(request["object"])
    edit(request["object"])
    return request


def labels(changes: dict[str, Any]) -> Edit:
    """Set pod labels; a value of None removes the label."""
    return _meta("labels", changes)


def annotations(changes: dict[str, Any]) -> Edit:
    return _meta("annotations", changes)


def _meta(field: str, changes: dict[str, Any]) -> Edit:
    def edit(pod: dict[str, Any]) -> None:
        values = pod["metadata"].setdefault(field, {})
        for key, value in changes.items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value

    return edit


def spec(**changes: Any) -> Edit:
    def edit(pod: dict[str, Any]) -> None:
        pod["spec"].update(changes)

    return edit


def meta(**changes: Any) -> Edit:
    def edit(pod: dict[str, Any]) -> None:
        pod["metadata"].update(changes)

    return edit


def both(*edits: Edit) -> Edit:
    def edit(pod: dict[str, Any]) -> None:
        for one in edits:
            one(pod)

    return edit


JOB_REFS = owned_by("Job")
CONFIGMAP_REF = {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "uid-cm"}


def owners_to(*refs: dict[str, Any]) -> Edit:
    return meta(ownerReferences=list(refs))


@dataclass(frozen=True)
class Case:
    edit: Edit
    user: dict[str, Any]
    refused: tuple[str, ...] = ()  # each must be in the message; empty: allowed
    owners: bool = True


CASES = {
    # The classes of edit, by a project member and by the cluster admin.
    "preemptible job relabelled non-preemptible": Case(
        labels({"kai.scheduler/preemptibility": "non-preemptible"}),
        MEMBER,
        ("label kai.scheduler/preemptibility changed from 'preemptible' to 'non-preemptible'",),
    ),
    "the admin relabels it too": Case(
        labels({"kai.scheduler/preemptibility": "non-preemptible"}), ADMIN, ("label kai.scheduler/preemptibility",)
    ),
    "preemptibility label removed": Case(
        labels({"kai.scheduler/preemptibility": None}),
        MEMBER,
        ("label kai.scheduler/preemptibility removed (was 'preemptible')",),
    ),
    "Run:ai priority label changed": Case(labels({"priorityClassName": "build"}), MEMBER, ("label priorityClassName",)),
    "gpu-fraction grown after the quota check": Case(
        annotations({"gpu-fraction": "0.9"}), MEMBER, ("annotation gpu-fraction changed from '0.5' to '0.9'",)
    ),
    "gpu-fraction-num-devices grown": Case(
        annotations({"gpu-fraction-num-devices": "4"}), MEMBER, ("annotation gpu-fraction-num-devices",)
    ),
    "gpu-memory added": Case(annotations({"gpu-memory": "40000"}), ADMIN, ("annotation gpu-memory added ('40000')",)),
    "mps and the fraction's container": Case(
        annotations({"mps": "true", "gpu-fraction-container-name": "main"}),
        MEMBER,
        ("annotation gpu-fraction-container-name added", "annotation mps added"),
    ),
    "pod-group-name added by a member": Case(
        annotations({"pod-group-name": "pg-urgent"}), MEMBER, ("annotation pod-group-name added ('pg-urgent')",)
    ),
    "pod-group-name on a pod without owner": Case(
        annotations({"pod-group-name": "pg-urgent"}), ADMIN, ("annotation pod-group-name",), owners=False
    ),
    "skip-podgrouper added": Case(
        annotations({"kai.scheduler/skip-podgrouper": "true"}), MEMBER, ("annotation kai.scheduler/skip-podgrouper",)
    ),
    "a preemption delay added to an over-quota job": Case(
        annotations({"kai.scheduler/preemption-delay": "720h"}),
        MEMBER,
        ("annotation kai.scheduler/preemption-delay added ('720h')",),
    ),
    "a staleness grace period added": Case(
        annotations({"kai.scheduler/staleness-grace-period": "720h"}),
        MEMBER,
        ("annotation kai.scheduler/staleness-grace-period added",),
    ),
    "runai/queue moved to another project's queue": Case(
        labels({"runai/queue": "finance"}), MEMBER, ("label runai/queue changed from 'vision' to 'finance'",)
    ),
    "KAI's own queue label added": Case(labels({"kai.scheduler/queue": "finance"}), MEMBER, ("kai.scheduler/queue",)),
    "KAI's node-pool label added": Case(
        labels({"kai.scheduler/node-pool": "a100"}), MEMBER, ("label kai.scheduler/node-pool",)
    ),
    "Kueue queue label removed": Case(
        labels({"kueue.x-k8s.io/queue-name": None}), MEMBER, ("label kueue.x-k8s.io/queue-name removed",)
    ),
    "Kueue queue label changed": Case(
        labels({"kueue.x-k8s.io/queue-name": "lq-other"}), ADMIN, ("label kueue.x-k8s.io/queue-name changed",)
    ),
    "Kueue pod group added": Case(
        both(
            labels({"kueue.x-k8s.io/pod-group-name": "g"}),
            annotations({"kueue.x-k8s.io/pod-group-total-count": "2"}),
        ),
        MEMBER,
        ("label kueue.x-k8s.io/pod-group-name added", "annotation kueue.x-k8s.io/pod-group-total-count added"),
    ),
    "Kueue topology annotation removed": Case(
        annotations({"kueue.x-k8s.io/podset-required-topology": None}),
        MEMBER,
        ("annotation kueue.x-k8s.io/podset-required-topology removed",),
    ),
    "workload kind relabelled": Case(
        labels({"hopsworks.ai/workload-type": "deployment"}), MEMBER, ("label hopsworks.ai/workload-type",)
    ),
    "a kind rule's label added (the settings' jupyter)": Case(
        labels({"jupyter": "x"}), MEMBER, ("label jupyter added",)
    ),
    "job-type changed": Case(labels({"job-type": "system"}), MEMBER, ("label job-type added",)),
    "one of the product's own annotations": Case(
        annotations({"scheduling.hopsworks.ai/topology": "host"}),
        MEMBER,
        ("annotation scheduling.hopsworks.ai/topology changed",),
    ),
    "an own annotation the product never wrote on this pod": Case(
        annotations({"scheduling.hopsworks.ai/priority-class": "urgent"}),
        MEMBER,
        ("annotation scheduling.hopsworks.ai/priority-class added",),
    ),
    "labels and annotations all removed": Case(
        meta(labels=None, annotations=None),
        MEMBER,
        ("label kai.scheduler/preemptibility removed", "annotation gpu-fraction removed", "label runai/queue removed"),
    ),
    "a non-string value in a hostile review": Case(
        labels({"runai/queue": 5}),
        MEMBER,
        ("label runai/queue changed from 'vision' to 5",),
    ),
    "a huge value is quoted shortened": Case(
        annotations({"gpu-fraction": "0." + "9" * 5000}), MEMBER, (f"to '0.{'9' * 58}...'",)
    ),
    # The first ownerReference: KAI reads the nearest owner's preemptibility before the pod's own.
    "a ConfigMap put in front of the job pod's Job": Case(
        owners_to(CONFIGMAP_REF, *JOB_REFS),
        MEMBER,
        ("first ownerReference changed from Job train to ConfigMap cm",),
    ),
    "the Job replaced by a ConfigMap": Case(
        owners_to(CONFIGMAP_REF), ADMIN, ("first ownerReference changed from Job train to ConfigMap cm",)
    ),
    "a ConfigMap made the first owner of an ownerless pod": Case(
        owners_to(CONFIGMAP_REF), MEMBER, ("first ownerReference ConfigMap cm added",), owners=False
    ),
    "a controller adopts an ownerless pod": Case(
        owners_to(*owned_by("ReplicaSet", "apps/v1", "api-1")), MEMBER, owners=False
    ),
    "an owner appended behind the Job": Case(owners_to(*JOB_REFS, CONFIGMAP_REF), MEMBER),
    # The pod grouper's own write, and only that one.
    "the pod grouper names the pod's group": Case(annotations({"pod-group-name": "pg-train-uid"}), GROUPER),
    "the pod grouper moves a pod to another group": Case(
        both(annotations({"pod-group-name": "pg-train-uid"}), annotations({"pod-group-name": "pg-a"})), GROUPER
    ),
    "the pod grouper may not relabel preemptibility": Case(
        both(annotations({"pod-group-name": "pg-a"}), labels({"kai.scheduler/preemptibility": "non-preemptible"})),
        GROUPER,
        ("label kai.scheduler/preemptibility",),
    ),
    "the pod grouper may not skip itself": Case(
        annotations({"kai.scheduler/skip-podgrouper": "true"}), GROUPER, ("annotation kai.scheduler/skip-podgrouper",)
    ),
    "the pod grouper's subgroup label": Case(labels({"kai.scheduler/subgroup-name": "workers"}), GROUPER),
    # What controllers and users do every day.
    "KAI's binder: GPU group label and the received resource type": Case(
        both(labels({"runai-gpu-group": "g-1"}), annotations({"received-resource-type": "Fraction"})), KAI_BINDER
    ),
    "Kueue lifts its scheduling gate": Case(spec(schedulingGates=[]), KUEUE),
    "the garbage collector orphans the pod": Case(meta(ownerReferences=[], finalizers=[]), GC),
    "an unrelated label and annotation": Case(both(labels({"team": "blue"}), annotations({"note": "edited"})), MEMBER),
    "KAI's queue fallback, read only without a queue label": Case(labels({"project": "vision"}), MEMBER),
    "a protected key written again with its own value": Case(
        both(labels({"runai/queue": "vision"}), annotations({"gpu-fraction": "0.5"})), MEMBER
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_pod_update_table(case: Case) -> None:
    request = pod_update(case.edit, case.user, case.owners)
    settings = ClusterSettings.model_validate(
        {"scheduler": {"workloadKinds": {"rules": [{"label": "jupyter", "kind": "notebook"}]}}}
    )
    decision = validate_pod_update(request, settings, CONFIG)
    if not case.refused:
        assert decision.allowed, decision.message
        return
    assert not decision.allowed
    assert decision.code == 403 and decision.reason == "Forbidden"
    assert decision.message.startswith(f"pod {NS}/nginx: "), decision.message
    for part in case.refused:
        assert part in decision.message, decision.message
    assert "create the pod again" in decision.message


@pytest.mark.parametrize(
    ("behind", "refused"),
    [
        (owned_by("ReplicaSet", "apps/v1", "api-1", controller=False), ""),
        ([CONFIGMAP_REF], "first ownerReference changed from Job train to ConfigMap cm"),
    ],
    ids=["a reviewed owner left first", "a ConfigMap left first"],
)
def test_owners_dropped_from_the_front_leave_a_reviewed_owner_first(behind: list[dict[str, Any]], refused: str) -> None:
    """The garbage collector drops an owner that is gone: what stays first must be one whose labels
    the platform reviews, or the pod's preemptibility would come from an owner nobody checked."""
    request = pod_update(owners_to(*behind), GC)
    request["oldObject"]["metadata"]["ownerReferences"] = [*JOB_REFS, *behind]
    decision = validate_pod_update(request, SETTINGS, CONFIG)
    assert decision.allowed is not refused
    assert refused in (decision.message or "")


def test_only_the_edited_keys_are_named() -> None:
    request = pod_update(labels({"runai/queue": "finance", "team": "blue"}), MEMBER)
    message = validate_pod_update(request, SETTINGS, CONFIG).message
    assert "runai/queue" in message
    assert "team" not in message and "gpu-fraction" not in message


@pytest.mark.parametrize(
    "change",
    [
        {"operation": "CREATE"},
        {"operation": "DELETE"},
        {"subResource": "status"},
        {"kind": {"group": "apps", "version": "v1", "kind": "Deployment"}},
        {"oldObject": None},
    ],
    ids=["create", "delete", "status", "other kind", "no old object"],
)
def test_only_updates_of_pods_themselves_are_judged(change: dict[str, Any]) -> None:
    request = pod_update(labels({"runai/queue": "finance"}), MEMBER)
    request.update(change)
    assert validate_pod_update(request, SETTINGS, CONFIG).allowed


def test_a_mirror_pod_is_the_kubelets() -> None:
    def mirrored(pod: dict[str, Any]) -> None:
        pod["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "hash"

    request = pod_update(labels({"runai/queue": "finance"}), MEMBER)
    mirrored(request["oldObject"])
    mirrored(request["object"])
    assert validate_pod_update(request, SETTINGS, CONFIG).allowed


def test_without_pod_groupers_configured_nobody_names_a_group() -> None:
    request = pod_update(annotations({"pod-group-name": "pg-a"}), GROUPER)
    assert not validate_pod_update(request, SETTINGS, GuardConfig()).allowed


def test_a_group_of_pod_groupers() -> None:
    config = GuardConfig(pod_groupers=Identities.parse(["group:system:serviceaccounts:kai-scheduler"]))
    user = {"username": "system:serviceaccount:kai-scheduler:x", "groups": ["system:serviceaccounts:kai-scheduler"]}
    assert validate_pod_update(pod_update(annotations({"pod-group-name": "pg-a"}), user), SETTINGS, config).allowed


def test_the_settings_preemptibility_label_is_protected_too() -> None:
    settings = ClusterSettings.model_validate({"scheduler": {"runai": {"preemptibilityLabel": "runai/preemptible"}}})
    assert {"runai/preemptible", "kai.scheduler/preemptibility"} <= protected_labels(settings)
    request = pod_update(labels({"runai/preemptible": "true"}), MEMBER)
    assert "label runai/preemptible added" in validate_pod_update(request, settings, CONFIG).message


async def test_served_by_the_http_shell(https_server: StartHttpsServer) -> None:
    """The same decision through the real server, over HTTPS, as the apiserver calls it."""
    state = cluster_state(namespaces=[namespace(NS)])
    srv = await https_server(cache_app(state))
    for edit, allowed in ((labels({"runai/queue": "finance"}), False), (labels({"team": "blue"}), True)):
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": pod_update(edit, MEMBER)}
        async with srv.session.post(srv.url("/validate/pod-updates"), json=body) as resp:
            assert resp.status == 200
            answer = (await resp.json())["response"]
        assert answer["allowed"] is allowed, answer
        if not allowed:
            assert answer["status"]["code"] == 403
            assert "label runai/queue changed from 'vision' to 'finance'" in answer["status"]["message"]


async def test_a_hostile_review_is_a_clear_refusal_not_a_500(https_server: StartHttpsServer) -> None:
    srv = await https_server(cache_app(cluster_state(namespaces=[namespace(NS)])))
    request = pod_update(labels({"team": "blue"}), MEMBER)
    request["oldObject"]["metadata"]["labels"] = ["runai/queue", "vision"]
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    async with srv.session.post(srv.url("/validate/pod-updates"), json=body) as resp:
        assert resp.status == 200
        answer = (await resp.json())["response"]
    assert answer["allowed"] is False and answer["status"]["code"] == 400, answer
    assert "oldObject.metadata.labels" in answer["status"]["message"]


def test_stock_settings_protect_the_stock_kind_rules_labels() -> None:
    assert protected_labels(SETTINGS) >= {"jupyter", "serving.hops.works/id", "runai/queue", "priorityClassName"}
