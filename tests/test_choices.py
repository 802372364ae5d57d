"""A workload's choices resolved against its project's offer (`webhook.core.choices`, rule S1):
a table of what each choice resolves to and the level it came from, then agreement with pod
admission over every single choice of the test universe.
"""

from __future__ import annotations

from itertools import product
from typing import Any

import pytest

from tests.support.reviews import apply_patch, pod_review
from tests.test_scheduling_offer import A100, QUEUE_LABEL, SSD, UNIVERSE, ZONE, offer_of, state
from webhook.core.choices import WorkloadChoices, resolve_choices
from webhook.core.gpu_view import project_gpu_view
from webhook.core.offer import scheduling_offer
from webhook.core.offer_view import offer_view
from webhook.core.scheduling import mutate_pod

KUEUE = {"kueue_installed": True}

CASES = [
    # (id, settings, namespace, kind, choices, expected fields of `workload`)
    ("nothing chosen: the defaults and their levels", {}, "fraud", None, WorkloadChoices(), {
        "affinity": {"value": [A100], "level": "project"},
        "anti_affinity": {"value": ["maintenance=true"], "level": "cluster"},
        "priority_class": {"value": "urgent", "level": "project"},
        "queue": None, "topology": None, "errors": []}),
    ("affinity chosen beats the project default", {}, "fraud", None, WorkloadChoices(affinity=(ZONE,)), {
        "affinity": {"value": [ZONE], "level": "workload"}, "errors": []}),
    ("an empty affinity choice is a choice", {}, "fraud", None, WorkloadChoices(affinity=()), {
        "affinity": {"value": [], "level": "workload"}}),
    ("affinity outside the project's subset", {}, "fraud", None, WorkloadChoices(affinity=(SSD,)), {
        "errors": [f"affinity {SSD} not available in project fraud; allowed: {A100}, {ZONE}"]}),
    ("priority class chosen beats the cluster default", {}, "churn", None, WorkloadChoices(priority_class="batch"), {
        "priority_class": {"value": "batch", "level": "workload"}}),
    ("priority class outside the subset", {}, "churn", None, WorkloadChoices(priority_class="urgent"), {
        "priority_class": {"value": None, "level": None},
        "errors": ["priority class urgent not available in project churn; allowed: batch, normal"]}),
    ("kueue: queue and topology chosen", KUEUE, "churn", None, WorkloadChoices(queue="default", topology="zone"), {
        "queue": {"value": "default", "level": "workload"}, "topology": {"value": "zone", "level": "workload"},
        "errors": []}),
    ("kueue: a unit the chosen queue's Topology lacks", KUEUE, "churn", None,
     WorkloadChoices(queue="team", topology="zone"), {
        "queue": {"value": "team", "level": "workload"}, "topology": {"value": None, "level": None},
        "errors": ["topology zone (topology.kubernetes.io/zone) is not a level of the Topology behind queue team "
                   "(ClusterQueue cq-hosts); it offers: host"]}),
    ("kueue: the project's default queue and topology", KUEUE, "fraud", "notebook", WorkloadChoices(), {
        "queue": {"value": "gpu", "level": "project"}, "topology": {"value": "host", "level": "project"}}),
    ("kueue: a system job's default is the system queue", KUEUE, "fraud", "system-job", WorkloadChoices(), {
        "queue": {"value": "system", "level": "cluster"}}),
    ("kueue: queue and topology outside the offer", KUEUE, "fraud", None,
     WorkloadChoices(queue="team", topology="rack"), {
        "errors": ["queue team not available in project fraud; allowed: gpu, cpu",
                   "topology rack is not a topology unit; allowed: host, zone, region"]}),
    ("kueue: a queue the project lists but that is no LocalQueue here", KUEUE, "fraud", None,
     WorkloadChoices(queue="cpu"), {
        "queue": {"value": None, "level": None},
        "errors": ["queue cpu is not a LocalQueue of namespace fraud; LocalQueues there: gpu"]}),
    ("kueue off: no queue, no topology", {}, "churn", None, WorkloadChoices(queue="team"), {
        "queue": None, "topology": None, "errors": []}),
]  # fmt: skip


def _subset(actual: Any, expected: Any) -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), actual
        for key, value in expected.items():
            _subset(actual[key], value)
    else:
        assert actual == expected


@pytest.mark.parametrize(
    ("settings", "name", "kind", "choices", "expected"), [pytest.param(*c[1:], id=c[0]) for c in CASES]
)
def test_workload_choices(
    settings: dict[str, Any], name: str, kind: str | None, choices: WorkloadChoices, expected: dict[str, Any]
) -> None:
    snap = state(**settings).snapshot()
    ns = snap.namespaces[name]
    view = offer_view(scheduling_offer(ns, snap), snap, project_gpu_view(ns, snap, None, 0), kind, choices)
    assert view.workload is not None
    _subset(view.workload.model_dump(mode="json"), expected)


def test_no_choices_no_workload_section() -> None:
    assert offer_of(state(), "churn").workload is None


def _single_choices() -> list[WorkloadChoices]:
    made_up = ["made-up=1"]
    return [
        WorkloadChoices(),
        *(WorkloadChoices(affinity=(v,)) for v in UNIVERSE["affinity"] + made_up),
        *(WorkloadChoices(anti_affinity=(v,)) for v in UNIVERSE["antiAffinity"] + made_up),
        *(WorkloadChoices(priority_class=v) for v in UNIVERSE["priorityClasses"] + ["made-up"]),
        *(WorkloadChoices(queue=v) for v in UNIVERSE["queues"] + ["made-up"]),
        *(WorkloadChoices(topology=v) for v in ("host", "zone", "region", "made-up")),
    ]


def _review(name: str, choices: WorkloadChoices) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if choices.affinity is not None:
        annotations["scheduling.hopsworks.ai/affinity"] = ",".join(choices.affinity)
    if choices.anti_affinity is not None:
        annotations["scheduling.hopsworks.ai/anti-affinity"] = ",".join(choices.anti_affinity)
    if choices.topology is not None:
        annotations["scheduling.hopsworks.ai/topology"] = choices.topology
    spec = {"priorityClassName": choices.priority_class} if choices.priority_class else {}
    labels = {QUEUE_LABEL: choices.queue} if choices.queue else {}
    return pod_review(name, annotations=annotations, spec=spec, labels=labels)


@pytest.mark.parametrize(("settings", "name"), list(product([{}, KUEUE], ["churn", "fraud", "broken"])))
def test_resolution_is_what_admission_applies(settings: dict[str, Any], name: str) -> None:
    st = state(**settings)
    snap = st.snapshot()
    offer = scheduling_offer(snap.namespaces[name], snap)
    for choices in _single_choices():
        resolved = resolve_choices(offer, choices, snap)
        review = _review(name, choices)
        decision = mutate_pod(review["request"], snap)
        if not offer.kueue and (choices.queue or choices.topology):
            continue  # Kueue off: admission ignores them (a warning), nothing to resolve
        assert decision.allowed is not resolved.errors, (choices, decision.message, resolved.errors)
        if not decision.allowed:
            assert decision.message == "; ".join(resolved.errors)
            continue
        pod = apply_patch(review["request"]["object"], list(decision.patch))
        assert pod["spec"].get("priorityClassName") == resolved.priority_class.value, choices
        if resolved.queue is not None:
            assert pod["metadata"]["labels"][QUEUE_LABEL] == resolved.queue.value
        if resolved.topology is not None:
            topology = pod["metadata"].get("annotations", {}).get("kueue.x-k8s.io/podset-required-topology")
            expected = offer.topologies.get(resolved.topology.value) if resolved.topology.value else None
            assert topology == expected, choices
        affinity = decision.audit.get("affinity", "")
        assert affinity == ",".join(resolved.affinity.value), choices
        assert decision.audit.get("anti-affinity", "") == ",".join(resolved.anti_affinity.value), choices
