"""Rules S1–S6, driven by a table of pod CREATE reviews built from real apiserver fixtures."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.cluster import cluster_state, kueue_setup, local_queue, namespace, priority_class, snapshot
from tests.support.reviews import apply_patch, assert_decision, assert_valid_pod, owned_by, pod_review, review
from webhook.core.decision import Reason
from webhook.core.scheduling import mutate_pod, unseen_namespace

ZONE = "topology.kubernetes.io/zone=eu-1a"
A100 = "nvidia.com/gpu.product=A100"
REQUIRED = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")

NAMESPACES = [
    namespace("churn"),
    namespace(
        "fraud",
        annotations={
            "scheduling.hopsworks.ai/available": json.dumps(
                {"affinity": [A100, ZONE], "antiAffinity": ["maintenance=true"], "priorityClasses": ["batch", "urgent"]}
            ),
            "scheduling.hopsworks.ai/defaults": json.dumps({"affinity": [A100], "priorityClass": "urgent"}),
        },
    ),
    namespace("bound", labels={"runai/queue": "bound", "hopsworks.ai/runai-project-id": "42"}),
    namespace("plain", project=False),
]


def terms(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    node: Any = pod["spec"]
    for key in REQUIRED:
        node = node[key]
    return node


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)}


NOT_MAINTENANCE = expr("maintenance", "NotIn", "true")
IN_ZONE = expr("topology.kubernetes.io/zone", "In", "eu-1a")
IN_A100 = expr("nvidia.com/gpu.product", "In", "A100")
OWN_TERMS = [
    {"matchExpressions": [expr("kubernetes.io/arch", "In", "amd64")]},
    {"matchExpressions": [expr("kubernetes.io/arch", "In", "arm64")], "matchFields": []},
]


@dataclass
class Case:
    id: str
    namespace: str = "churn"
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)
    owners: list[dict[str, Any]] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    extra: list[dict[str, Any]] = field(default_factory=list)
    base: str = "pod-create-kubectl-run.json"
    allowed: bool = True
    changed: bool = True
    message: tuple[str, ...] = ()
    warning: str | None = None
    check: Callable[[dict[str, Any]], None] | None = None

    def as_review(self) -> dict[str, Any]:
        """The case's pod as a CREATE review of its namespace."""
        return pod_review(
            self.namespace, base=self.base, labels=self.labels, annotations=self.annotations, spec=self.spec,
            owners=self.owners,
        )  # fmt: skip


def _eq(path: tuple[Any, ...], expected: Any) -> Callable[[dict[str, Any]], None]:
    def check(pod: dict[str, Any]) -> None:
        node: Any = pod
        for key in path:
            node = node[key]
        assert node == expected, f"{'/'.join(path)} = {node!r}, expected {expected!r}"

    return check


def _all(*checks: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def check(pod: dict[str, Any]) -> None:
        for one in checks:
            one(pod)

    return check


# `batch` as the cluster's globalDefault class, and a pod the Priority plugin gave it to.
GLOBAL_LOW = priority_class("batch", 1000, "Never", True)
PLUGIN_LOW = {"priorityClassName": "batch", "priority": 1000, "preemptionPolicy": "Never"}

CASES = [
    Case("S6 namespace that is not a project passes unchanged", namespace="plain", changed=False),
    Case("S6 unknown namespace passes unchanged", namespace="nowhere", changed=False),
    Case(
        "S1 cluster defaults when nobody chose",
        check=_all(
            _eq(("spec", "priorityClassName"), "normal"),
            _eq(("spec", "priority"), 10000),
            _eq(("spec", "preemptionPolicy"), "PreemptLowerPriority"),
            _eq(("spec", *REQUIRED), [{"matchExpressions": [NOT_MAINTENANCE]}]),
        ),
    ),
    Case(
        "S1 project defaults beat cluster defaults",
        namespace="fraud",
        check=_all(
            _eq(("spec", "priorityClassName"), "urgent"),
            _eq(("spec", "priority"), 100000),
            lambda pod: _eq(("spec", *REQUIRED), [{"matchExpressions": [IN_A100, NOT_MAINTENANCE]}])(pod),
        ),
    ),
    Case(
        "S1 workload choice beats project default",
        namespace="fraud",
        annotations={"scheduling.hopsworks.ai/affinity": ZONE},
        spec={"priorityClassName": "batch"},
        check=_all(
            _eq(("spec", "priorityClassName"), "batch"),
            _eq(("spec", "priority"), 1000),
            _eq(("spec", "preemptionPolicy"), "Never"),
            lambda pod: _eq(("spec", *REQUIRED), [{"matchExpressions": [IN_ZONE, NOT_MAINTENANCE]}])(pod),
        ),
    ),
    Case(
        "S1 affinity outside the project subset is refused naming the allowed values",
        annotations={"scheduling.hopsworks.ai/affinity": A100},
        allowed=False,
        message=(
            "affinity nvidia.com/gpu.product=A100 not available in project churn",
            "topology.kubernetes.io/zone=eu-1a, disk=ssd",
        ),
    ),
    Case(
        "S1 priority class outside the subset is refused",
        spec={"priorityClassName": "urgent"},
        allowed=False,
        message=("priority class urgent", "allowed: batch, normal"),
    ),
    Case(
        "S1 anti-affinity outside the subset is refused",
        annotations={"scheduling.hopsworks.ai/anti-affinity": "gpu=broken"},
        allowed=False,
        message=("anti-affinity gpu=broken", "allowed: maintenance=true"),
    ),
    Case(
        "S1 malformed affinity annotation is refused with the entry",
        annotations={"scheduling.hopsworks.ai/affinity": "zone-eu"},
        allowed=False,
        message=("'zone-eu' is not a key=value node label",),
    ),
    Case(
        "S1 a global default class the Priority plugin set is not a choice",
        spec={"priorityClassName": "everyone", "priority": 5},
        extra=[priority_class("everyone", 5, None, True)],
        check=_all(_eq(("spec", "priorityClassName"), "normal"), _eq(("spec", "priority"), 10000)),
    ),
    # The Priority plugin filled in the cluster's globalDefault class (spec.priority with it); the
    # webhook cannot tell that from a choice, so the class yields unless the pod says it chose it.
    Case(
        "S1 a global default class inside the project's subset yields to the project default",
        namespace="fraud",
        spec=PLUGIN_LOW,
        extra=[GLOBAL_LOW],
        check=_all(
            _eq(("spec", "priorityClassName"), "urgent"),
            _eq(("spec", "priority"), 100000),
            _eq(("spec", "preemptionPolicy"), "PreemptLowerPriority"),
        ),
    ),
    Case(
        "S1 a global default class the workload says it chose is kept",
        namespace="fraud",
        spec=PLUGIN_LOW,
        annotations={"scheduling.hopsworks.ai/priority-class": "batch"},
        extra=[GLOBAL_LOW],
        check=_all(_eq(("spec", "priorityClassName"), "batch"), _eq(("spec", "priority"), 1000)),
    ),
    Case(
        "S1 the annotation naming another class does not make the global default a choice",
        namespace="fraud",
        spec=PLUGIN_LOW,
        annotations={"scheduling.hopsworks.ai/priority-class": "urgent"},
        extra=[GLOBAL_LOW],
        check=_eq(("spec", "priorityClassName"), "urgent"),
    ),
    Case(
        "S1 a global default class chosen explicitly outside the subset is refused",
        spec={"priorityClassName": "everyone", "priority": 5},
        annotations={"scheduling.hopsworks.ai/priority-class": "everyone"},
        extra=[priority_class("everyone", 5, None, True)],
        allowed=False,
        message=("priority class everyone not available in project churn", "allowed: batch, normal"),
    ),
    Case(
        "S1 an explicit class that is not the global default still beats the project default",
        namespace="fraud",
        spec={"priorityClassName": "urgent", "priority": 100000},
        extra=[GLOBAL_LOW],
        check=_eq(("spec", "priorityClassName"), "urgent"),
    ),
    Case(
        "S2 affinity labels of different keys are ORed as separate terms",
        annotations={"scheduling.hopsworks.ai/affinity": f"{ZONE}, disk=ssd"},
        check=lambda pod: _eq(
            ("spec", *REQUIRED),
            [
                {"matchExpressions": [IN_ZONE, NOT_MAINTENANCE]},
                {"matchExpressions": [expr("disk", "In", "ssd"), NOT_MAINTENANCE]},
            ],
        )(pod),
    ),
    Case(
        "S2 the pod's own required terms are ANDed, never widened",
        annotations={"scheduling.hopsworks.ai/affinity": ZONE},
        spec={
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": OWN_TERMS}}
            }
        },
        check=lambda pod: _eq(
            ("spec", *REQUIRED),
            [
                {"matchExpressions": [expr("kubernetes.io/arch", "In", "amd64"), IN_ZONE, NOT_MAINTENANCE]},
                {
                    "matchExpressions": [expr("kubernetes.io/arch", "In", "arm64"), IN_ZONE, NOT_MAINTENANCE],
                    "matchFields": [],
                },
            ],
        )(pod),
    ),
    Case(
        "S2 existing pod anti-affinity and preferred terms are kept",
        spec={
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 10,
                            "podAffinityTerm": {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": {"a": "b"}},
                            },
                        }
                    ]
                },
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 1, "preference": {"matchExpressions": [expr("disk", "In", "ssd")]}}
                    ]
                },
            }
        },
        check=_all(
            lambda pod: _eq(("spec", *REQUIRED), [{"matchExpressions": [NOT_MAINTENANCE]}])(pod),
            lambda pod: _eq(
                ("spec", "affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution", 0, "weight"), 1
            )(pod),
            lambda pod: _eq(
                ("spec", "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution", 0, "weight"),
                10,
            )(pod),
        ),
    ),
    Case(
        "S2 a null nodeAffinity or null required affinity is replaced, not patched into",
        spec={"affinity": {"nodeAffinity": None, "podAffinity": None}},
        check=_eq(("spec", *REQUIRED), [{"matchExpressions": [NOT_MAINTENANCE]}]),
    ),
    Case(
        "S2 a null required node affinity is replaced",
        spec={"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": None}}},
        check=_eq(("spec", *REQUIRED), [{"matchExpressions": [NOT_MAINTENANCE]}]),
    ),
    Case(
        "S2 too many resulting terms are refused with a clear message",
        annotations={"scheduling.hopsworks.ai/affinity": f"{ZONE},disk=ssd"},
        spec={
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [expr("rack", "In", str(i))]} for i in range(9)]
                    }
                }
            }
        },
        allowed=False,
        message=("would need 18 terms", "limit of 16"),
    ),
    Case(
        "S4 Kueue: default local queue and cluster topology unit",
        settings={"kueue_installed": True},
        annotations={"scheduling.hopsworks.ai/topology": "zone"},
        extra=[*kueue_setup(), local_queue("churn", "default")],
        check=_all(
            _eq(("metadata", "labels", "kueue.x-k8s.io/queue-name"), "default"),
            _eq(("metadata", "annotations", "kueue.x-k8s.io/podset-required-topology"), "topology.kubernetes.io/zone"),
        ),
    ),
    Case(
        "S4 Kueue: system jobs go to the system queue",
        settings={"kueue_installed": True},
        labels={"job-type": "materialization"},
        owners=owned_by("Job"),
        extra=[local_queue("churn", "system")],
        check=_eq(("metadata", "labels", "kueue.x-k8s.io/queue-name"), "system"),
    ),
    Case(
        "S4 Kueue: a chosen queue must exist in the namespace",
        settings={"kueue_installed": True},
        labels={"kueue.x-k8s.io/queue-name": "other"},
        extra=[local_queue("churn", "default")],
        allowed=False,
        message=("queue other", "allowed: default"),
    ),
    Case(
        "S4 Kueue: an unknown topology unit is refused",
        settings={"kueue_installed": True},
        annotations={"scheduling.hopsworks.ai/topology": "galaxy"},
        allowed=False,
        message=("topology galaxy", "host, zone, region"),
    ),
    Case(
        "S4 Kueue off: topology has no effect and says so",
        annotations={"scheduling.hopsworks.ai/topology": "host"},
        warning="Kueue is not installed",
        check=lambda pod: _eq(("metadata", "annotations", "scheduling.hopsworks.ai/topology"), "host")(pod),
    ),
    Case(
        "S5 Run:ai on and namespace bound: runai/queue label",
        namespace="bound",
        settings={"run_ai_enable": True},
        check=_eq(("metadata", "labels", "runai/queue"), "bound"),
    ),
    Case(
        "S5 a pod cannot pick another project's Run:ai queue",
        namespace="bound",
        settings={"run_ai_enable": True},
        labels={"runai/queue": "someone-else"},
        warning="replaced",
        check=_eq(("metadata", "labels", "runai/queue"), "bound"),
    ),
    Case(
        "S5 Run:ai on, namespace unbound: refused, never admitted without runai/queue (the shell binds first)",
        settings={"run_ai_enable": True},
        allowed=False,
        message=("not bound to a Run:ai project yet",),
    ),
    Case(
        "S5 Run:ai off: a bound namespace gets no Run:ai label",
        namespace="bound",
        check=lambda pod: (
            pytest.fail("runai/queue set") if "runai/queue" in pod["metadata"].get("labels", {}) else None
        ),
    ),
    Case(
        "S6 ReplicaSet pod with generateName and initContainers",
        base="pod-create-replicaset-generatename-initcontainers.json",
        check=_eq(("spec", "priorityClassName"), "normal"),
    ),
    Case(
        "S6 pod with initContainer and a custom toleration",
        base="reqonly-pod-create-initcontainer-tolerations.json",
        check=lambda pod: _eq(("spec", "tolerations"), pod["spec"]["tolerations"])(pod),
    ),
    Case(
        "S6 mirror pods pass unchanged",
        annotations={"kubernetes.io/config.mirror": "abc"},
        changed=False,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_scheduling_rules(case: Case) -> None:
    snap = snapshot(namespaces=NAMESPACES, extra=case.extra, **case.settings)
    data = case.as_review()
    decision = mutate_pod(data["request"], snap)
    assert_decision(decision, allowed=case.allowed, message=case.message, warning=case.warning)
    if not case.allowed:
        assert decision.code == 403
        return
    assert bool(decision.patch) is case.changed, decision.patch
    patched = apply_patch(data["request"]["object"], list(decision.patch))
    assert_valid_pod(patched)
    if case.check:
        case.check(patched)
    # S6 + reinvocation: the patched pod needs nothing more.
    data["request"]["object"] = patched
    again = mutate_pod(data["request"], snap)
    assert again.allowed and again.patch == (), again.patch


def test_replacing_the_plugins_class_replaces_priority_and_preemption_policy() -> None:
    # S3: the plugin set spec.priority (and preemptionPolicy) from its class; the patch replaces
    # them from the new class, with `replace` for fields that exist and `add` for ones that do not.
    snap = snapshot(namespaces=NAMESPACES, extra=[GLOBAL_LOW])
    data = pod_review("fraud", spec=PLUGIN_LOW)
    decision = mutate_pod(data["request"], snap)
    ops = {op["path"]: op for op in decision.patch if op["path"].startswith("/spec/p")}
    assert ops == {
        "/spec/priorityClassName": {"op": "replace", "path": "/spec/priorityClassName", "value": "urgent"},
        "/spec/priority": {"op": "replace", "path": "/spec/priority", "value": 100000},
        "/spec/preemptionPolicy": {"op": "replace", "path": "/spec/preemptionPolicy", "value": "PreemptLowerPriority"},
    }
    del data["request"]["object"]["spec"]["preemptionPolicy"]  # a pod without it: added, not replaced
    decision = mutate_pod(data["request"], snap)
    assert {"op": "add", "path": "/spec/preemptionPolicy", "value": "PreemptLowerPriority"} in decision.patch
    patched = apply_patch(data["request"]["object"], list(decision.patch))
    assert_valid_pod(patched)


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_non_create_operations_pass_unchanged(operation: str) -> None:
    snap = snapshot(namespaces=NAMESPACES)
    data = pod_review("churn", operation=operation)
    decision = mutate_pod(data["request"], snap)
    assert decision.allowed and not decision.patch and not decision.warnings


@pytest.mark.parametrize(
    "name",
    ["reqonly-pod-delete-oldobject.json", "pod-exec-connect-v1beta1.json", "deployment-create.json"],
)
def test_real_non_pod_create_reviews_pass_unchanged(name: str) -> None:
    data = review(name)
    ns = data["request"].get("namespace") or "default"
    snap = snapshot(namespaces=[namespace(ns)])
    decision = mutate_pod(data["request"], snap)
    assert decision.allowed and not decision.patch


def test_patch_escapes_slashes_and_never_removes() -> None:
    snap = snapshot(namespaces=NAMESPACES, run_ai_enable=True)
    data = pod_review("bound")
    decision = mutate_pod(data["request"], snap)
    ops = list(decision.patch)
    assert all(op["op"] == "add" or (op["op"] == "replace" and op["path"].startswith("/spec/")) for op in ops)
    assert {"op": "add", "path": "/metadata/labels/runai~1queue", "value": "bound"} in ops


def test_pod_without_labels_gets_the_label_map_created() -> None:
    snap = snapshot(namespaces=NAMESPACES, run_ai_enable=True)
    data = pod_review("bound", base="pod-create-minimal-no-namespace.json")
    data["request"]["object"]["metadata"].pop("labels", None)
    decision = mutate_pod(data["request"], snap)
    labels = {"runai/queue": "bound", "kai.scheduler/preemptibility": "non-preemptible"}
    assert {"op": "add", "path": "/metadata/labels", "value": labels} in decision.patch
    assert_valid_pod(apply_patch(data["request"]["object"], list(decision.patch)))


def test_settings_change_applies_to_the_next_decision() -> None:
    from tests.support.cluster import cluster_state, settings_configmap

    state = cluster_state(namespaces=NAMESPACES)
    data = pod_review("bound")
    assert "runai/queue" not in json.dumps(mutate_pod(data["request"], state.snapshot()).patch)
    state.apply(settings_configmap(run_ai_enable=True))
    assert "runai~1queue" in json.dumps(mutate_pod(data["request"], state.snapshot()).patch)


SEEN = 5_000.0  # when the replica's cache first showed the binding


@pytest.mark.parametrize(
    ("now", "seen_at", "allowed"),
    [
        (None, SEEN, True),  # no clock given (the offline `review`): no wait
        (SEEN + 0.2, SEEN, False),  # bound moments ago: the apiserver may not select Run:ai's webhook yet
        (SEEN + 0.99, SEEN, False),
        (SEEN + 1.0, SEEN, True),
        (SEEN + 0.2, 0.0, True),  # bound before this replica's first list
    ],
)
def test_s5_pods_wait_for_a_fresh_binding_to_settle(now: float | None, seen_at: float, allowed: bool) -> None:
    state = cluster_state(run_ai_enable=True)
    listed = [namespace("hopsworks", project=False), namespace("bound", labels={"runai/queue": "bound"})]
    state.replace_all("Namespace", listed)  # the initial list: bound before this replica started
    state.clock = lambda: seen_at
    state.apply(namespace("bound", labels={"runai/queue": "bound", "x": "y"}))  # the label stays: stamp kept
    assert state.namespaces["bound"].runai_queue_seen_at == 0.0
    state.apply(namespace("bound"))  # unbound, then bound again: a new binding
    state.apply(namespace("bound", labels={"runai/queue": "bound"}))
    assert state.namespaces["bound"].runai_queue_seen_at == seen_at
    decision = mutate_pod(pod_review("bound")["request"], state.snapshot(), now, settle_s=1.0)
    assert decision.allowed is allowed, decision.message
    if not allowed:
        assert decision.reason == Reason.RUNAI_BINDING_SETTLING and decision.code == 503
        assert "moments ago" in decision.message and "again" in decision.message


# -- a namespace this replica has not seen yet ---------------------------------------------------


def _request(namespace: str, **changes: Any) -> dict[str, Any]:
    return {**pod_review(namespace)["request"], **changes}


UNSEEN_CASES = [
    # (request, what unseen_namespace answers)
    (_request("brand-new"), "brand-new"),  # a pod CREATE in a namespace missing from the cache
    (_request("churn"), None),  # known: decided as usual
    (pod_review("brand-new", operation="UPDATE")["request"], None),  # only CREATE is ever mutated
    (_request("brand-new", subResource="status"), None),
    (_request("brand-new", kind={"group": "", "version": "v1", "kind": "Service"}), None),
    (_request("", object={"metadata": {}}), None),  # no namespace to read
]


@pytest.mark.parametrize(("request_", "expected"), UNSEEN_CASES)
def test_unseen_namespace_names_only_a_pod_creates_namespace_missing_from_the_cache(
    request_: dict[str, Any], expected: str | None
) -> None:
    assert unseen_namespace(request_, snapshot(namespaces=NAMESPACES)) == expected
