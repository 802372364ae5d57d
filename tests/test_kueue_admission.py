"""S4 against Kueue's own behaviour: `/validate/pods` refuses a pod that names a queue but that
Kueue's pod integration did not take (defence in depth, as S5 is for `runai/queue`), and lets
through the pods Kueue admits through a managed owner.

What Kueue v0.17.0 does to a pod it manages (pkg/controller/jobs/pod/pod_webhook.go, `Default`):
the label `kueue.x-k8s.io/managed: "true"` and the scheduling gate `kueue.x-k8s.io/admission`; the
pods of a queued Job it leaves alone (jobframework.FindAncestorJobManagedByKueue).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.cluster import kueue_setup, local_queue, namespace, snapshot
from tests.support.reviews import assert_decision, owned_by, pod_review
from webhook.core.quota import validate_pod

QUEUE = "kueue.x-k8s.io/queue-name"
MANAGED = "kueue.x-k8s.io/managed"
GATE = {"name": "kueue.x-k8s.io/admission"}
TAS_GATE = {"name": "kueue.x-k8s.io/topology"}
NOT_ACTING = "Kueue's pod integration is not acting on it"


@dataclass
class Case:
    id: str
    labels: dict[str, str] = field(default_factory=dict)
    gates: list[dict[str, str]] | None = None
    owners: list[dict[str, Any]] | None = None
    namespace: str = "churn"
    settings: dict[str, Any] = field(default_factory=lambda: {"kueue_installed": True})
    allowed: bool = True
    message: tuple[str, ...] = ()


CASES = [
    Case("gated by Kueue's pod webhook", labels={QUEUE: "default", MANAGED: "true"}, gates=[GATE, TAS_GATE]),
    Case(
        "a queue but neither label nor gate: Kueue's pod integration is off",
        labels={QUEUE: "default"},
        allowed=False,
        message=(NOT_ACTING, 'list "pod"', "integrations.frameworks", "mpod.kb.io", "namespace churn"),
    ),
    Case("the label without the gate", labels={QUEUE: "default", MANAGED: "true"}, allowed=False,
         message=(NOT_ACTING,)),
    Case("the gate without the label", labels={QUEUE: "default"}, gates=[GATE], allowed=False, message=(NOT_ACTING,)),
    Case(
        "the label with another value", labels={QUEUE: "default", MANAGED: "false"}, gates=[GATE], allowed=False,
        message=(NOT_ACTING,),
    ),
    Case("a pod of a Job: admitted through the Job", labels={QUEUE: "default"}, owners=owned_by("Job")),
    Case("a Spark executor: its driver pod is the owner", labels={QUEUE: "default"}, owners=owned_by("Pod", "v1")),
    Case(
        "a Deployment's pod is gated one by one: ungated is refused",
        labels={QUEUE: "default"},
        owners=owned_by("ReplicaSet", "apps/v1", "web-5d8f"),
        allowed=False,
        message=(NOT_ACTING,),
    ),
    Case(
        "an ownerReference that is not the controller does not count",
        labels={QUEUE: "default"},
        owners=owned_by("Job", controller=False),
        allowed=False,
        message=(NOT_ACTING,),
    ),
    Case("no queue label: nothing for Kueue to take", labels={}),
    Case("Kueue off", labels={QUEUE: "default"}, settings={}),
    Case("not a project namespace", labels={QUEUE: "default"}, namespace="plain"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_pod_naming_a_queue_is_kueues(case: Case) -> None:
    snap = snapshot(
        namespaces=[namespace("churn"), namespace("plain", project=False)],
        extra=[*kueue_setup(), local_queue("churn", "default")],
        **case.settings,
    )
    spec = {"schedulingGates": case.gates} if case.gates is not None else {}
    review = pod_review(case.namespace, labels=case.labels, spec=spec, owners=case.owners)
    decision = validate_pod(review["request"], snap, 0.0)
    assert_decision(decision, allowed=case.allowed, message=case.message)
    if not case.allowed:
        assert decision.code == 403
