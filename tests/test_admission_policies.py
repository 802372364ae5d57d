"""The compiler of rules S1-S3 and S5's queue label into admission policies: its parameters, read
from the same plan the webhook decides by, and the API version it writes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.cluster import namespace, snapshot
from webhook.core.admission_policies import (
    PARAMS_NAME,
    POLICY_NAME,
    encode_groups,
    params_config_map,
    policy_objects,
    policy_params,
    served_mutating_version,
)
from webhook.core.namespace_plan import make_plan

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
        assert binding["spec"]["paramRef"] == {"name": PARAMS_NAME, "parameterNotFoundAction": "Deny"}
    assert params_config_map("fraud", {"a": "b"})["metadata"]["name"] == PARAMS_NAME


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
