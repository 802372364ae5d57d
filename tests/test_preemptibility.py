"""Preemptibility as Run:ai reads a pod: workload kind x priority class value x override.

For every cell, three readings must agree once the mutating webhook has labelled the pod:
`core.preemptibility` (what admission, the cache, the GPU view and the offer ask), the patch it
wrote, and the quota check itself (a non-preemptible pod over quota is refused, a preemptible one
is not). The promise: jobs preemptible, everything else not, whatever class was chosen. What KAI's
real podgrouper makes of the label (the PodGroup's preemptibility) is shown through the real
scheduler in tests/e2e/test_kai.py.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from tests.support.cluster import SCHEDULER, cluster_state, namespace, settings_configmap
from tests.support.reviews import apply_patch, assert_decision, owned_by, pod_review
from webhook.core.decision import Reason
from webhook.core.guard_config import GuardConfig
from webhook.core.preemptibility import runai_preemptibility
from webhook.core.quota import validate_pod
from webhook.core.scheduling import mutate_pod
from webhook.core.settings_guard import validate_settings_change
from webhook.settings import ClusterSettings, SettingsError
from webhook.snapshot import RunaiProjectInfo
from webhook.state.store import pod_record

LABEL = "kai.scheduler/preemptibility"
# Platform classes offered to workloads, one on each side of Run:ai's threshold and one on it.
PLATFORM_CLASSES = {"scavenger": 50, "edge": 100, "normal": 10000}
# Run:ai's own classes, in the cluster beside them (its install creates them).
RUNAI_CLASSES = {"very-low": 25, "train": 50, "high": 125, "very-high": 150}
CLASS_VALUES = {**PLATFORM_CLASSES, **RUNAI_CLASSES}
KINDS: dict[str, tuple[dict[str, str], list[dict[str, Any]] | None]] = {
    "notebook": ({"jupyter": "true"}, None),
    "terminal": ({"hopsworks.ai/workload-type": "terminal"}, None),
    "app": ({"hopsworks.ai/workload-type": "app"}, None),
    "deployment": ({"serving.hops.works/id": "7"}, None),
    "job": ({"job-name": "train"}, owned_by("Job")),
    "system-job": ({"job-type": "statistics"}, owned_by("Job")),
    "unknown": ({"app": "streamlit"}, None),
}
# What the pod's creator wrote that Run:ai also reads: nothing, the preemptibility label either
# way (or a value Run:ai ignores), or Run:ai's priority label naming one of its own classes.
OVERRIDES: dict[str, dict[str, str]] = {
    "none": {},
    "label preemptible": {LABEL: "preemptible"},
    "label non-preemptible": {LABEL: "non-preemptible"},
    "label invalid": {LABEL: "sometimes"},
    "priorityClassName=very-high": {"priorityClassName": "very-high"},
    "priorityClassName=very-low": {"priorityClassName": "very-low"},
}
NS = namespace("vision", labels={"runai/queue": "vision", "hopsworks.ai/runai-project-id": "7"})
GPUS = 2


def scheduler() -> dict[str, Any]:
    config = copy.deepcopy(dict(SCHEDULER))
    config["available"]["priorityClasses"] = list(PLATFORM_CLASSES)
    config["project"].pop("priorityClasses")
    config["defaults"]["priorityClass"] = "normal"
    return config


def state() -> Any:
    classes = [(name, value, None, False) for name, value in CLASS_VALUES.items()]
    st = cluster_state(namespaces=[NS], scheduler=scheduler(), priority_classes=classes, run_ai_enable=True)
    snap = st.snapshot()
    snap.runai_reachable = True
    snap.runai_projects = {"vision": RunaiProjectInfo(id="7", name="vision", namespace="vision", deserved_gpus=0)}
    return st


CELLS = list(itertools.product(KINDS, PLATFORM_CLASSES, OVERRIDES))


@pytest.mark.parametrize(("kind", "chosen", "override"), CELLS, ids=["/".join(c) for c in CELLS])
def test_function_patch_standin_and_quota_check_agree(kind: str, chosen: str, override: str) -> None:
    st = state()
    snap = st.snapshot()
    labels, owners = KINDS[kind]
    data = pod_review("vision", labels={**labels, **OVERRIDES[override]}, gpus=GPUS, owners=owners)
    pod = data["request"]["object"]
    pod["spec"]["priorityClassName"] = chosen
    promised_preemptible = kind in ("job", "system-job")

    mutated = mutate_pod(data["request"], snap)
    assert mutated.allowed, mutated.message
    patched = apply_patch(pod, list(mutated.patch))
    assert patched["metadata"]["labels"][LABEL] == ("preemptible" if promised_preemptible else "non-preemptible")
    assert patched["spec"]["priorityClassName"] == chosen  # the Kubernetes scheduler's class is untouched
    assert patched["spec"]["priority"] == CLASS_VALUES[chosen]

    # The one function, as admission, the cache and the GPU view ask it.
    seen = runai_preemptibility(patched["metadata"]["labels"], chosen, snap.priority_classes, snap.settings)
    assert seen.preemptible is promised_preemptible, seen.why
    assert pod_record(patched, snap.settings, snap.priority_classes).preemptible is promised_preemptible

    # The quota check follows: with no deserved GPUs, only what Run:ai may preempt starts.
    request = copy.deepcopy(data["request"])
    request["object"] = patched
    decision = validate_pod(request, snap, now=0)
    if promised_preemptible:
        assert_decision(decision, allowed=True)
    else:
        assert_decision(decision, allowed=False, reason=Reason.GPU_QUOTA_EXCEEDED, message=("0 of 0 deserved GPUs",))


def test_a_pod_that_would_escape_run_ais_pod_grouper_is_refused_before_it_is_counted() -> None:
    snap = state().snapshot()
    for escape in ({"kai.scheduler/skip-podgrouper": "true"}, {"pod-group-name": "mine"}):
        labels = {"jupyter": "true", "runai/queue": "vision"}
        data = pod_review("vision", labels=labels, annotations=escape, gpus=1)
        for decide in (mutate_pod, validate_pod):
            decision = decide(data["request"], snap)
            assert_decision(decision, allowed=False, reason=Reason.FORBIDDEN, message=("remove the annotation",))
    # A pod of a Job keeps its owner: Run:ai re-groups it whatever pod-group-name says.
    data = pod_review(
        "vision", labels={"job-name": "t"}, annotations={"pod-group-name": "x"}, gpus=1, owners=owned_by()
    )
    assert mutate_pod(data["request"], snap).allowed


def workload(kind: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    group = "batch/v1" if kind == "Job" else "apps/v1"
    template_labels = {"job-name": "t"} if kind == "Job" else {"jupyter": "true"}
    obj = {
        "apiVersion": group,
        "kind": kind,
        "metadata": {"name": "w", "namespace": "vision", "labels": labels, "annotations": annotations or {}},
        "spec": {
            "template": {
                "metadata": {"labels": template_labels},
                "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            }
        },
    }
    return {
        "uid": "r",
        "kind": {"group": group.split("/")[0], "version": "v1", "kind": kind},
        "resource": {"group": group.split("/")[0], "version": "v1", "resource": kind.lower() + "s"},
        "namespace": "vision",
        "operation": "CREATE",
        "object": obj,
    }


@pytest.mark.parametrize(
    ("kind", "labels", "annotations", "refused"),
    [
        ("Job", {LABEL: "non-preemptible"}, None, "would make Run:ai treat its pods (job) as non-preemptible"),
        ("Job", {LABEL: "preemptible"}, None, None),
        ("Deployment", {LABEL: "preemptible"}, None, "(notebook) as preemptible"),
        ("StatefulSet", {}, {"kai.scheduler/skip-podgrouper": "true"}, "keeps Run:ai's pod grouper away"),
        ("Deployment", {"priorityClassName": "very-low"}, None, None),  # a priority only: our pod label decides
    ],
)
def test_owner_labels_run_ai_reads_before_the_pods_are_kept_in_line(
    kind: str, labels: dict[str, str], annotations: dict[str, str] | None, refused: str | None
) -> None:
    from webhook.core.workloads import validate_workload

    snap = state().snapshot()
    decision = validate_workload(workload(kind, labels, annotations), snap)
    if refused is None:
        assert decision.allowed or decision.reason == Reason.GPU_QUOTA_EXCEEDED, decision.message
    else:
        assert_decision(decision, allowed=False, reason=Reason.FORBIDDEN, message=(refused,))


def settings(runai: dict[str, Any] | None = None, classes: list[str] | None = None, **flat: Any) -> dict[str, Any]:
    config = copy.deepcopy(dict(SCHEDULER))
    if runai is not None:
        config["runai"] = runai
    if classes is not None:
        config["available"]["priorityClasses"] = classes
        config["project"]["priorityClasses"] = classes[:1]
        config["defaults"]["priorityClass"] = classes[0]
    return settings_configmap(scheduler=config, **flat)


@pytest.mark.parametrize(
    ("runai", "classes", "refused"),
    [
        ({}, None, None),
        ({"preemptibility": {"job": "non-preemptible"}}, None, "runai.preemptibility.job must be preemptible"),
        (
            {"preemptibility": {"notebook": "preemptible"}},
            None,
            "runai.preemptibility.notebook must be non-preemptible",
        ),
        ({"preemptibility": {"unknown": "preemptible"}}, None, "runai.preemptibility.unknown must be non-preemptible"),
        ({"preemptibilityLabel": ""}, None, "only runai.priorityClasses tells Run:ai"),
        (
            {
                "preemptibilityLabel": "",
                "priorityClasses": {k: "high" for k in KINDS} | {"job": "low", "system-job": "low"},
            },
            None,
            None,
        ),
        (
            {"priorityClasses": {"job": "high"}},
            None,
            "high is worth 125; a preemptible job needs a class worth below 100",
        ),
        (
            {"priorityClasses": {"notebook": "medium"}},
            None,
            "a non-preemptible notebook needs a class worth at least 100",
        ),
        ({"priorityClasses": {"job": "gold"}}, None, "'gold' is not one of Run:ai's priority classes"),
        ({}, ["low", "normal", "high"], "priority classes ['high', 'low'] are also Run:ai's own"),
        ({}, ["hopsworks-low", "hopsworks-normal"], None),
    ],
)
def test_the_settings_guard_refuses_what_would_break_the_promise(
    runai: dict[str, Any], classes: list[str] | None, refused: str | None
) -> None:
    cm = settings(runai, classes, run_ai_enable=True)
    parsed = ClusterSettings.from_configmap_data(cm["data"])
    assert parsed.runai_error() == (None if refused is None else parsed.runai_error())
    if refused is not None:
        assert refused in (parsed.runai_error() or "")
    request = {
        "uid": "u",
        "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
        "namespace": "hopsworks",
        "name": cm["metadata"]["name"],
        "operation": "UPDATE",
        "object": cm,
        "oldObject": settings(run_ai_enable=True),
        "userInfo": {"username": "admin"},
    }
    decision = validate_settings_change(request, state().snapshot(), GuardConfig(install_namespace="hopsworks"))
    if refused is None:
        assert decision.allowed, decision.message
    else:
        assert_decision(decision, allowed=False, reason=Reason.FORBIDDEN, message=(refused,))


def test_with_run_ai_off_the_names_and_mapping_are_not_judged() -> None:
    cm = settings({"preemptibility": {"job": "non-preemptible"}}, ["low", "high"], run_ai_enable=False)
    assert ClusterSettings.from_configmap_data(cm["data"]).runai_error() is None


def test_a_mapping_value_that_is_neither_is_a_settings_error() -> None:
    with pytest.raises(SettingsError, match="neither preemptible nor non-preemptible"):
        ClusterSettings.from_configmap_data(settings({"preemptibility": {"job": "maybe"}})["data"])


def test_a_refused_mapping_in_the_configmap_keeps_the_last_good_settings() -> None:
    st = state()
    st.apply(settings({"preemptibility": {"job": "non-preemptible"}}, run_ai_enable=True))
    assert st.snapshot().settings.scheduler.runai.preemptibility["job"] == "preemptible"
    assert "runai.preemptibility.job must be preemptible" in (st.snapshot().settings_error or "")


def test_the_install_and_examples_name_no_priority_class_like_run_ais() -> None:
    import pathlib

    import yaml

    from webhook.settings import RUNAI_PRIORITY_CLASSES

    root = pathlib.Path(__file__).resolve().parent.parent
    files = [root / "examples" / "priorityclasses.yaml", *sorted((root / "examples" / "cluster").glob("*.yaml"))]
    names = {
        doc["metadata"]["name"]
        for f in files
        for doc in yaml.safe_load_all(f.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "PriorityClass"
    }
    assert names and not names & set(RUNAI_PRIORITY_CLASSES), names
    example = yaml.safe_load((root / "examples" / "cluster" / "20-settings.yaml").read_text())
    settings_ = ClusterSettings.from_configmap_data(example["data"])
    assert settings_.run_ai_enable and settings_.runai_error() is None
