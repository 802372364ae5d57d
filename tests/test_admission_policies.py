"""The compiler of rules S1-S3 and S5's queue label into admission policies: its parameters, read
from the same plan the webhook decides by, and the API version it writes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.cluster import SCHEDULER, namespace, snapshot
from webhook.core.admission_policies import (
    PARAMS_NAME,
    POLICY_NAME,
    decided_by_policies,
    desired_objects,
    encode_groups,
    params_config_map,
    policy_objects,
    policy_params,
    runai_labels_compilable,
    runai_params,
    served_mutating_version,
)
from webhook.core.namespace_plan import make_plan
from webhook.snapshot import ADMISSION_POLICIES_LABEL

A100 = "nvidia.com/gpu.product=A100"
ZONE = "topology.kubernetes.io/zone=eu-1a"

FRAUD = namespace(
    "fraud",
    annotations={
        "scheduling.hopsworks.ai/available": json.dumps(
            {"affinity": [A100, ZONE], "antiAffinity": ["maintenance=true"], "priorityClasses": ["batch", "urgent"]}
        ),
        "scheduling.hopsworks.ai/defaults": json.dumps({"affinity": [A100], "priorityClass": "urgent"}),
    },
)
BOUND = namespace("bound", labels={"runai/queue": "bound", "hopsworks.ai/runai-project-id": "42"})

PARAM_CASES: list[tuple[str, dict[str, Any], str, dict[str, str]]] = [
    (
        "cluster defaults: the cluster's anti-affinity and class, the project subset of classes",
        {},
        "churn",
        {
            "compiled": "true",
            "affinityIn": "",
            "antiAffinityNotIn": "maintenance=true",
            "priorityClassName": "normal",
            "priority": "10000",
            "preemptionPolicy": "PreemptLowerPriority",
            "affinityAllowed": "topology.kubernetes.io/zone=eu-1a,disk=ssd",
            "antiAffinityAllowed": "maintenance=true",
            "enforceAffinity": "true",
            "allowedPriorityClasses": "batch,normal",
            "enforcePriorityClasses": "true",
            "runaiQueue": "",
        },
    ),
    (
        "project defaults beat the cluster's",
        {},
        "fraud",
        {
            "affinityIn": "nvidia.com/gpu.product=A100",
            "antiAffinityNotIn": "maintenance=true",
            "priorityClassName": "urgent",
            "priority": "100000",
            "allowedPriorityClasses": "batch,urgent",
        },
    ),
    (
        "priority class warn mode is left to the webhook",
        {"priority_class_enforcement": "warn"},
        "churn",
        {"enforcePriorityClasses": "false"},
    ),
    ("Run:ai on: the bound namespace's queue", {"run_ai_enable": True}, "bound", {"runaiQueue": "bound"}),
    ("Run:ai off: no queue label even when bound", {}, "bound", {"runaiQueue": ""}),
]


@pytest.mark.parametrize(("settings", "name", "expected"),
                         [c[1:] for c in PARAM_CASES], ids=[c[0] for c in PARAM_CASES])  # fmt: skip
def test_params_follow_the_webhooks_plan(settings: dict[str, Any], name: str, expected: dict[str, str]) -> None:
    snap = snapshot(namespaces=[namespace("churn"), FRAUD, BOUND], **settings)
    data = policy_params(make_plan(snap.namespaces[name], snap), None)
    assert {k: data[k] for k in expected} == expected


def test_grouped_labels_are_written_as_key_values_lists() -> None:
    assert encode_groups((("zone", ("a", "b")), ("disk", ("ssd",)))) == "zone=a|b;disk=ssd"
    assert encode_groups(()) == ""


def test_the_config_map_is_the_one_the_bindings_name() -> None:
    objects = policy_objects("v1beta1")
    assert [o["kind"] for o in objects] == [
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    assert objects[0]["apiVersion"] == "admissionregistration.k8s.io/v1beta1"
    for binding in objects[1::2]:
        assert binding["spec"]["policyName"] == POLICY_NAME
    assert objects[1]["spec"]["paramRef"] == {"name": PARAMS_NAME, "parameterNotFoundAction": "Deny"}
    assert params_config_map("fraud", {"a": "b"})["metadata"]["name"] == PARAMS_NAME


def test_the_validating_policy_reads_no_parameters() -> None:
    """Each policy reads the parameters from the apiserver's informer at its own moment: a refusal
    judged by the validating policy from a second reading could contradict the defaults the
    mutating one wrote from the first (a default class taken out of the subset by the same change
    refused a pod that chose nothing). Every refusal is decided in the mutating policy."""
    _, _, validating, binding = policy_objects("v1")
    assert "paramKind" not in validating["spec"] and "paramRef" not in binding["spec"]
    assert "params." not in json.dumps(validating)


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        ({"admissionregistration.k8s.io/v1": ["MutatingAdmissionPolicy", "ValidatingAdmissionPolicy"]}, "v1"),
        (
            {
                "admissionregistration.k8s.io/v1": ["ValidatingAdmissionPolicy"],
                "admissionregistration.k8s.io/v1beta1": ["MutatingAdmissionPolicy"],
            },
            "v1beta1",
        ),
        ({"admissionregistration.k8s.io/v1": ["ValidatingAdmissionPolicy"]}, None),
    ],
    ids=["1.36+ GA", "1.35 beta switched on", "1.35 default: policies off"],
)
def test_the_mutating_version_is_the_one_the_apiserver_serves(
    served: dict[str, list[str]], expected: str | None
) -> None:
    assert served_mutating_version(served) == expected


def _kinds_and_namespaces(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"].get("namespace", "")) for o in objects]


def test_the_leader_writes_nothing_where_the_apiserver_serves_no_mutating_policy() -> None:
    assert desired_objects(snapshot(namespaces=[namespace("churn")]), None) == []


def test_the_leader_writes_the_policies_and_the_parameters_of_every_project() -> None:
    snap = snapshot(namespaces=[namespace("churn"), FRAUD, namespace("plain", project=False)])
    assert _kinds_and_namespaces(desired_objects(snap, "v1"))[4:] == [("ConfigMap", "churn"), ("ConfigMap", "fraud")]


def test_with_runai_every_projects_parameters_are_compiled_the_policy_reads_the_binding_itself() -> None:
    """An unbound project is not labelled (`decided_by_policies`), but its parameters still say what
    the policy would do: the apiserver may see the label go after the parameters change."""
    snap = snapshot(namespaces=[namespace("churn"), BOUND], run_ai_enable=True)
    objects = desired_objects(snap, "v1")
    assert _kinds_and_namespaces(objects)[4:] == [("ConfigMap", "bound"), ("ConfigMap", "churn")]
    assert [o["data"]["compiled"] for o in objects[4:]] == ["true", "true"]
    assert [o["data"]["runaiEnabled"] for o in objects[4:]] == ["true", "true"]


def test_run_ai_labels_the_parameters_cannot_carry_leave_nothing_compiled() -> None:
    scheduler = {**SCHEDULER, "runai": {"preemptibilityLabel": "bad=label"}}
    snap = snapshot(namespaces=[BOUND], run_ai_enable=True, scheduler=scheduler)
    assert not runai_labels_compilable(snap.settings)
    assert desired_objects(snap, "v1")[4]["data"]["compiled"] == "false"
    assert decided_by_policies(snap.namespaces["bound"], snap) is False
    off = snapshot(namespaces=[BOUND], scheduler=scheduler)  # Run:ai off: no label is written
    assert desired_objects(off, "v1")[4]["data"]["compiled"] == "true"


RUNAI_PARAM_CASES: list[tuple[str, dict[str, Any], dict[str, str | None]]] = [
    (
        "the platform's kind rules, job owners, system job types and each kind's labels",
        {},
        {
            "kindRules": "jupyter|notebook;serving.hops.works/id|deployment",
            "jobOwners": "batch|Job",
            "systemJobTypes": "system|materialization|statistics",
            "runaiLabels.notebook": "kai.scheduler/preemptibility=non-preemptible",
            "runaiLabels.job": "kai.scheduler/preemptibility=preemptible",
            "runaiLabels.system-job": "kai.scheduler/preemptibility=preemptible",
            "runaiLabels.unknown": "kai.scheduler/preemptibility=non-preemptible",
        },
    ),
    (
        "a rule with a value; a rule that could make a job is not one a label may apply",
        {"workloadKinds": {"rules": [{"label": "app", "value": "", "kind": "app"}, {"label": "x", "kind": "job"}]}},
        {"kindRules": "app=|app"},
    ),
    (
        "no system job types: the key is absent, an empty type is kept",
        {"workloadKinds": {"systemJobTypes": []}},
        {"systemJobTypes": None},
    ),
    ("an empty system job type", {"workloadKinds": {"systemJobTypes": [""]}}, {"systemJobTypes": ""}),
    (
        "a value no label can hold never matches, and is left out",
        {"workloadKinds": {"systemJobTypes": ["a|b", "c"], "jobOwners": [{"apiGroup": "", "kind": "Pod;x"}]}},
        {"systemJobTypes": "c", "jobOwners": ""},
    ),
    (
        "Run:ai's own priority class per kind, as a second label",
        {"runai": {"priorityClasses": {"notebook": "inference"}}},
        {"runaiLabels.notebook": "kai.scheduler/preemptibility=non-preemptible;priorityClassName=inference"},
    ),
    (
        "no preemptibility label: only the classes",
        {
            "runai": {
                "preemptibilityLabel": "",
                "priorityClasses": {
                    **{k: "build" for k in ("notebook", "terminal", "app", "deployment", "unknown")},
                    **{k: "train" for k in ("job", "system-job")},
                },
            }
        },
        {"runaiLabels.job": "priorityClassName=train", "runaiLabels.notebook": "priorityClassName=build"},
    ),
]


@pytest.mark.parametrize(("scheduler", "expected"),
                         [c[1:] for c in RUNAI_PARAM_CASES], ids=[c[0] for c in RUNAI_PARAM_CASES])  # fmt: skip
def test_runai_params_carry_what_the_webhook_labels_by(
    scheduler: dict[str, Any], expected: dict[str, str | None]
) -> None:
    snap = snapshot(namespaces=[BOUND], run_ai_enable=True, scheduler={**SCHEDULER, **scheduler})
    data = runai_params(snap.settings)
    assert {k: data.get(k) for k in expected} == expected


def test_the_parameters_name_the_clusters_global_default_class() -> None:
    classes = [("batch", 1000, "Never", False), ("normal", 10000, None, True), ("urgent", 100000, None, False)]
    snap = snapshot(namespaces=[namespace("churn")], priority_classes=classes)
    assert desired_objects(snap, "v1")[4]["data"]["globalDefaultClass"] == "normal"


@pytest.mark.parametrize(
    ("settings", "decided"),
    [
        ({}, True),
        ({"run_ai_enable": True}, False),  # not bound yet: the webhook binds it on a first pod (R2)
        ({"kueue_installed": True}, False),  # S4's queue label
        ({"priority_class_enforcement": "warn"}, False),  # the warning and its count
        ({"affinity_enforcement": "warn"}, False),  # a workload's choice outside the subset: the warning
    ],
)
def test_the_policies_decide_a_projects_plain_pods_only_where_the_webhook_adds_nothing(
    settings: dict[str, Any], decided: bool
) -> None:
    snap = snapshot(namespaces=[namespace("churn"), namespace("plain", project=False)], **settings)
    assert decided_by_policies(snap.namespaces["churn"], snap) is decided
    assert decided_by_policies(snap.namespaces["plain"], snap) is False


def test_a_project_whose_annotations_cannot_be_read_is_left_to_the_webhook_which_warns() -> None:
    broken = namespace("broken", annotations={"scheduling.hopsworks.ai/available": "{not json"})
    snap = snapshot(namespaces=[broken])
    assert snap is not None and make_plan(snap.namespaces["broken"], snap).offer.notes
    assert decided_by_policies(snap.namespaces["broken"], snap) is False


def test_the_bindings_select_only_namespaces_the_leader_labelled() -> None:
    for binding in [o for o in policy_objects("v1") if o["kind"].endswith("Binding")]:
        expressions = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert {"key": ADMISSION_POLICIES_LABEL, "operator": "In", "values": ["on"]} in expressions
        assert {"key": "hopsworks.ai/project", "operator": "Exists"} in expressions


@pytest.mark.parametrize(
    ("labels", "annotations", "decided"),
    [
        ({"runai/queue": "bound"}, {}, True),  # bound: the policy labels its pods
        ({}, {}, False),  # not bound: the webhook binds on a first pod
        ({"runai/queue": "bound"}, {"scheduling.hopsworks.ai/runai-move": "{}"}, False),  # moving: 409s
    ],
    ids=["bound", "unbound", "moving"],
)
def test_with_runai_the_policies_decide_a_bound_project_not_moving(
    labels: dict[str, str], annotations: dict[str, str], decided: bool
) -> None:
    snap = snapshot(namespaces=[namespace("vision", labels=labels, annotations=annotations)], run_ai_enable=True)
    assert decided_by_policies(snap.namespaces["vision"], snap) is decided


def test_node_labels_a_choice_could_not_be_split_from_leave_the_project_to_the_webhook() -> None:
    scheduler = {**SCHEDULER, "available": {**SCHEDULER["available"], "affinity": ["zone=a,b"]},
                 "project": {**SCHEDULER["project"], "affinity": ["zone=a,b"]}}  # fmt: skip
    snap = snapshot(namespaces=[namespace("churn")], scheduler=scheduler)
    assert decided_by_policies(snap.namespaces["churn"], snap) is False
