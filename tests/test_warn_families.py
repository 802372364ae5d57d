"""Warn before enforce for every refusal family (`core.enforcement`), as tables of cases: each
row is refused with its family in `enforce`, and in `warn` admitted with the patch the rules would
make had they allowed the choice, the refusal as a warning and an audit annotation, and the family
for the shell to count. What no family covers stays refused in both modes."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any

import pytest

from tests.support.cluster import cluster_state, kueue_setup, local_queue, namespace, settings_configmap, snapshot
from tests.support.reviews import apply_patch, assert_valid_pod
from tests.test_scheduling import IN_A100, NAMESPACES, NOT_MAINTENANCE, REQUIRED, Case, _all, _eq, expr
from tests.test_workloads import BOUND, NOW, as_cronjob, job_template_labelled, labelled, workload
from webhook.core.decision import Decision, Reason
from webhook.core.enforcement import (
    AFFINITY,
    FAMILIES,
    GPU_QUOTA,
    PREEMPTIBILITY,
    PRIORITY_CLASS,
    QUEUE_TOPOLOGY,
    WOULD_REFUSE_AUDIT,
    as_warning,
    warning_text,
    with_would_refuse,
)
from webhook.core.guard_config import GuardConfig
from webhook.core.owners import mutate_owner
from webhook.core.scheduling import mutate_pod
from webhook.core.workloads import validate_workload
from webhook.http.handlers import admission_handlers
from webhook.metrics import WOULD_REFUSE, WOULD_REFUSE_RECENT
from webhook.settings import ClusterSettings
from webhook.snapshot import RunaiProjectInfo

QUEUE = "kueue.x-k8s.io/queue-name"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE = {"kueue_installed": True}


def warn(*families: str) -> dict[str, str]:
    return {FAMILIES[f]: "warn" for f in families}


@dataclass
class WarnCase:
    """`case` is the pod in warn mode (`families` in warn): admitted, its patch checked. In enforce
    the same pod is refused with `refused` in the message."""

    family: str
    case: Case
    refused: tuple[str, ...]


def _no(*path: str) -> Any:
    def check(pod: dict[str, Any]) -> None:
        node: Any = pod
        for key in path[:-1]:
            node = node.get(key) or {}
        assert path[-1] not in node, f"{'/'.join(path)} set: {node[path[-1]]!r}"

    return check


MUTATION_CASES = [
    WarnCase(
        PRIORITY_CLASS,
        Case(
            "priority class outside the project's subset: the workload's own class, with its value (S3)",
            spec={"priorityClassName": "urgent"},
            check=_all(
                _eq(("spec", "priorityClassName"), "urgent"),
                _eq(("spec", "priority"), 100000),
                _eq(("spec", *REQUIRED), [{"matchExpressions": [NOT_MAINTENANCE]}]),  # the other rules still apply
            ),
        ),
        ("priority class urgent not available in project churn", "allowed: batch, normal"),
    ),
    WarnCase(
        AFFINITY,
        Case(
            "affinity label outside the project's subset: injected as chosen",
            annotations={"scheduling.hopsworks.ai/affinity": "nvidia.com/gpu.product=A100"},
            check=_all(
                _eq(("spec", *REQUIRED), [{"matchExpressions": [IN_A100, NOT_MAINTENANCE]}]),
                _eq(("spec", "priorityClassName"), "normal"),
            ),
        ),
        ("affinity nvidia.com/gpu.product=A100 not available in project churn",),
    ),
    WarnCase(
        AFFINITY,
        Case(
            "anti-affinity label outside the project's subset: injected as chosen",
            annotations={"scheduling.hopsworks.ai/anti-affinity": "gpu=broken"},
            check=_eq(("spec", *REQUIRED), [{"matchExpressions": [expr("gpu", "NotIn", "broken")]}]),
        ),
        ("anti-affinity gpu=broken not available in project churn",),
    ),
    WarnCase(
        QUEUE_TOPOLOGY,
        Case(
            "a chosen queue that is no LocalQueue of the namespace: kept as the pod named it, nothing added",
            settings=KUEUE,
            labels={QUEUE: "other"},
            annotations={"scheduling.hopsworks.ai/topology": "zone"},
            extra=[*kueue_setup(), local_queue("churn", "default")],
            check=_all(_eq(("metadata", "labels", QUEUE), "other"), _no("metadata", "annotations", REQUIRED_TOPOLOGY)),
        ),
        ("queue other", "allowed: default"),
    ),
    WarnCase(
        QUEUE_TOPOLOGY,
        Case(
            "no LocalQueue for the default queue: no queue label (Kueue would hold the pod for good)",
            settings=KUEUE,
            extra=kueue_setup(),
            check=_all(_no("metadata", "labels", QUEUE), _eq(("spec", "priorityClassName"), "normal")),
        ),
        ("default",),
    ),
    WarnCase(
        QUEUE_TOPOLOGY,
        Case(
            "an unknown topology unit: the queue is set, no required topology",
            settings=KUEUE,
            annotations={"scheduling.hopsworks.ai/topology": "galaxy"},
            extra=[*kueue_setup(), local_queue("churn", "default")],
            check=_all(
                _eq(("metadata", "labels", QUEUE), "default"), _no("metadata", "annotations", REQUIRED_TOPOLOGY)
            ),
        ),
        ("topology galaxy", "host, zone, region"),
    ),
]


def _run(case: Case) -> tuple[Decision, dict[str, Any]]:
    data = case.as_review()
    return mutate_pod(data["request"], snapshot(namespaces=NAMESPACES, extra=case.extra, **case.settings)), data


@pytest.mark.parametrize("row", MUTATION_CASES, ids=[r.case.id for r in MUTATION_CASES])
def test_enforce_refuses_the_pod(row: WarnCase) -> None:
    decision, _ = _run(row.case)
    assert not decision.allowed and decision.code == 403
    assert all(part in decision.message for part in row.refused), decision.message
    assert decision.would_refuse == () and WOULD_REFUSE_AUDIT not in decision.audit


@pytest.mark.parametrize("row", MUTATION_CASES, ids=[r.case.id for r in MUTATION_CASES])
def test_warn_admits_the_pod_with_the_patch_it_would_make(row: WarnCase) -> None:
    case = replace(row.case, settings={**row.case.settings, **warn(row.family)})
    decision, data = _run(case)
    assert decision.allowed, decision.message
    assert decision.would_refuse == (row.family,)
    said = [w for w in decision.warnings if w.startswith(f"admitted because {FAMILIES[row.family]} is warn")]
    assert len(said) == 1 and all(part in said[0] for part in row.refused), decision.warnings
    assert decision.audit[WOULD_REFUSE_AUDIT].startswith(f"{row.family}: ")
    patched = apply_patch(data["request"]["object"], list(decision.patch))
    assert_valid_pod(patched)
    assert case.check is not None
    case.check(patched)
    # Reinvocation: the patched pod needs nothing more (and is still a would-be refusal).
    data["request"]["object"] = patched
    again = mutate_pod(data["request"], snapshot(namespaces=NAMESPACES, extra=case.extra, **case.settings))
    assert again.allowed and again.patch == () and again.would_refuse == (row.family,), again


@pytest.mark.parametrize("row", MUTATION_CASES, ids=[r.case.id for r in MUTATION_CASES])
def test_the_other_families_in_warn_leave_it_refused(row: WarnCase) -> None:
    others = [f for f in FAMILIES if f != row.family]
    decision, _ = _run(replace(row.case, settings={**row.case.settings, **warn(*others)}))
    assert not decision.allowed and all(part in decision.message for part in row.refused), decision.message


BOTH = Case(
    "priority class and affinity both outside the subset",
    spec={"priorityClassName": "urgent"},
    annotations={"scheduling.hopsworks.ai/affinity": "nvidia.com/gpu.product=A100"},
)


def test_two_families_in_warn_are_both_said_and_counted() -> None:
    decision, _ = _run(replace(BOTH, settings=warn(PRIORITY_CLASS, AFFINITY)))
    assert decision.allowed and decision.would_refuse == (AFFINITY, PRIORITY_CLASS)
    assert decision.audit[WOULD_REFUSE_AUDIT] == (
        "affinity: affinity nvidia.com/gpu.product=A100 not available in project churn; allowed: "
        "topology.kubernetes.io/zone=eu-1a, disk=ssd; priority-class: priority class urgent not available in "
        "project churn; allowed: batch, normal"
    )


def test_an_enforced_refusal_still_says_the_would_be_ones() -> None:
    decision, _ = _run(replace(BOTH, settings=warn(PRIORITY_CLASS)))
    assert not decision.allowed and "affinity nvidia.com/gpu.product=A100" in decision.message
    assert "priority class" not in decision.message
    assert any(
        w.startswith(
            "priority_class_enforcement is warn, so this alone does not refuse the request; with enforce it does:"
        )
        for w in decision.warnings
    ), decision.warnings


ALWAYS_REFUSED = [
    Case(
        "an affinity annotation that cannot be read",
        annotations={"scheduling.hopsworks.ai/affinity": "no-equals-sign"},
        settings=warn(*FAMILIES),
        allowed=False,
        message=("is not a key=value node label",),
    ),
    Case(
        "a priority class name that is no string",
        spec={"priorityClassName": 7},
        settings=warn(*FAMILIES),
        allowed=False,
        message=("priority class 7 not available",),
    ),
    Case(
        "an unbound project with Run:ai on",
        settings={"run_ai_enable": True, **warn(*FAMILIES)},
        allowed=False,
        message=("not bound to a Run:ai project yet",),
    ),
]


@pytest.mark.parametrize("case", ALWAYS_REFUSED, ids=[c.id for c in ALWAYS_REFUSED])
def test_what_no_family_covers_is_refused_with_every_family_in_warn(case: Case) -> None:
    decision, _ = _run(case)
    assert not decision.allowed and all(part in decision.message for part in case.message), decision.message


# -- the owners: mutated at apply time (`core.owners`), preemptibility checked (`core.workloads`) --


def test_a_deployments_template_is_mutated_past_a_warned_refusal() -> None:
    request = workload(ns="churn", replicas=1, gpus=None, labels={"app": "api"})
    request["object"]["spec"]["template"]["spec"]["priorityClassName"] = "urgent"
    enforced = mutate_owner(request, snapshot(namespaces=NAMESPACES, **KUEUE, extra=[local_queue("churn", "default")]))
    assert not enforced.allowed and "Deployment" in enforced.message and "priority class urgent" in enforced.message
    warned = mutate_owner(
        request,
        snapshot(namespaces=NAMESPACES, **KUEUE, **warn(PRIORITY_CLASS), extra=[local_queue("churn", "default")]),
    )
    assert warned.allowed and warned.would_refuse == (PRIORITY_CLASS,), warned
    patched = apply_patch(request["object"], list(warned.patch))
    template = patched["spec"]["template"]["spec"]
    assert template["priorityClassName"] == "urgent"  # the pods' own priority is set on each pod (S3)
    assert template[REQUIRED[0]][REQUIRED[1]][REQUIRED[2]] == {
        "nodeSelectorTerms": [{"matchExpressions": [NOT_MAINTENANCE]}]
    }
    assert patched["metadata"]["labels"][QUEUE] == "default"


PREEMPTIBLE = {"kai.scheduler/preemptibility": "preemptible"}
PREEMPTIBLE_SAID = "label kai.scheduler/preemptibility=preemptible on this object"

OWNER_CASES = [
    # (id, request, refused in enforce with, and in warn: allowed, message parts of a quota refusal)
    (
        "Deployment of notebooks-like pods labelled preemptible, within the quota",
        lambda: labelled(workload(replicas=1, gpus=1), PREEMPTIBLE),
        "label kai.scheduler/preemptibility=preemptible on this object",
        True,
    ),
    (
        "the same over the quota: the quota is still checked in warn mode",
        lambda: labelled(workload(replicas=3, gpus=2), PREEMPTIBLE),
        "label kai.scheduler/preemptibility=preemptible on this object",
        False,
    ),
    (
        "CronJob whose job template is labelled non-preemptible",
        lambda: job_template_labelled(
            as_cronjob(workload(gpus=4, labels={"job-name": "train"})),
            {"kai.scheduler/preemptibility": "non-preemptible"},
        ),
        "its job template's label kai.scheduler/preemptibility=non-preemptible",
        True,
    ),
]


def owner_state(**settings: Any) -> Any:
    state = cluster_state(namespaces=[BOUND], run_ai_enable=True, **settings)
    state.snapshot().runai_projects = {
        "vision": RunaiProjectInfo(id="7", name="vision", namespace="vision", deserved_gpus=4)
    }
    state.snapshot().runai_reachable = True
    return state


@pytest.mark.parametrize(("request_", "refused", "fits"), [c[1:] for c in OWNER_CASES], ids=[c[0] for c in OWNER_CASES])
def test_a_preemptibility_override_on_an_owner(request_: Any, refused: str, fits: bool) -> None:
    enforced = validate_workload(request_(), owner_state().snapshot(), NOW)
    assert not enforced.allowed and refused in enforced.message and enforced.reason == Reason.FORBIDDEN
    warned = validate_workload(request_(), owner_state(**warn(PREEMPTIBILITY)).snapshot(), NOW)
    assert warned.would_refuse == (PREEMPTIBILITY,)
    assert refused in warned.audit[WOULD_REFUSE_AUDIT]
    assert any(refused in w for w in warned.warnings)
    if fits:
        assert warned.allowed, warned.message
    else:
        assert not warned.allowed and warned.reason == Reason.GPU_QUOTA_EXCEEDED
        # With GPU quota in warn too, both are admitted and both counted.
        both = validate_workload(request_(), owner_state(**warn(PREEMPTIBILITY, GPU_QUOTA)).snapshot(), NOW)
        assert not both.allowed  # the quota's warn mode is the shell's (`as_warning`)
        turned = as_warning(both, GPU_QUOTA)
        assert turned.allowed and turned.would_refuse == (PREEMPTIBILITY, GPU_QUOTA)
        assert turned.audit[WOULD_REFUSE_AUDIT].startswith("preemptibility: ")
        assert "; gpu-quota: " in turned.audit[WOULD_REFUSE_AUDIT]


def test_another_projects_queue_on_an_owner_stays_refused() -> None:
    request = labelled(workload(replicas=1, gpus=1), {"runai/queue": "other"})
    decision = validate_workload(request, owner_state(**warn(*FAMILIES)).snapshot(), NOW)
    assert not decision.allowed and "label runai/queue=other" in decision.message


# -- the settings and the served handlers ----------------------------------------------------


@pytest.mark.parametrize("key", list(FAMILIES.values()))
def test_each_family_takes_only_enforce_or_warn(key: str) -> None:
    from webhook.settings import SettingsError

    assert getattr(ClusterSettings(), key) == "enforce"
    assert getattr(ClusterSettings.from_configmap_data({key: "warn"}), key) == "warn"
    with pytest.raises(SettingsError, match=key):
        ClusterSettings.from_configmap_data({key: "audit"})


def test_the_warning_names_the_setting() -> None:
    assert (
        warning_text(AFFINITY, "x") == "admitted because affinity_enforcement is warn; with enforce this is refused: x"
    )
    assert with_would_refuse(Decision.allow(), []) == Decision.allow()


def _counted(family: str, project: str = "churn") -> float:
    return float(WOULD_REFUSE.labels(family, project)._value.get())


def test_the_served_pod_validation_counts_the_mutations_would_be_refusals_once_per_pod() -> None:
    state = cluster_state(namespaces=NAMESPACES, **warn(PRIORITY_CLASS, AFFINITY))
    served = admission_handlers(state, GuardConfig(install_namespace="hopsworks"))
    before = _counted(PRIORITY_CLASS), _counted(AFFINITY)
    request = BOTH.as_review()["request"]
    # The apiserver may call the mutation twice for one pod (reinvocation): it counts nothing.
    for _ in range(2):
        admitted = asyncio.run(served["/mutate/pods"](request))
        assert admitted.allowed and set(admitted.would_refuse) == {PRIORITY_CLASS, AFFINITY}
        request = request | {"object": apply_patch(request["object"], list(admitted.patch))}
    assert (_counted(PRIORITY_CLASS), _counted(AFFINITY)) == before
    validated = asyncio.run(served["/validate/pods"](request))
    assert validated.allowed and set(validated.would_refuse) == {PRIORITY_CLASS, AFFINITY}
    assert validated.warnings == ()  # kubectl has them from the mutating webhook
    assert (_counted(PRIORITY_CLASS), _counted(AFFINITY)) == (before[0] + 1, before[1] + 1)
    assert asyncio.run(served["/validate/pods"](request | {"dryRun": True})).allowed
    assert (_counted(PRIORITY_CLASS), _counted(AFFINITY)) == (before[0] + 1, before[1] + 1)  # a dry run: not counted
    listed = {(p, rule) for p, rule, _, _ in WOULD_REFUSE_RECENT.recent(time.time())}
    assert {("churn", PRIORITY_CLASS), ("churn", AFFINITY)} <= listed


def test_with_every_family_enforced_the_validation_does_not_judge_the_mutation_again() -> None:
    state = cluster_state(namespaces=NAMESPACES, **warn(GPU_QUOTA, PREEMPTIBILITY))
    served = admission_handlers(state, GuardConfig(install_namespace="hopsworks"))
    # Refused by the mutation in enforce: had it been let through, the validation would not say so.
    assert asyncio.run(served["/validate/pods"](BOTH.as_review()["request"])).would_refuse == ()


def test_a_pod_refused_by_its_validation_is_not_counted() -> None:
    from tests.test_enforcement import notebook_review

    bound = namespace("vision", labels={"runai/queue": "vision", "hopsworks.ai/runai-project-id": "7"})
    state = cluster_state(namespaces=[bound], run_ai_enable=True, **warn(PRIORITY_CLASS))
    state.snapshot().runai_projects = {
        "vision": RunaiProjectInfo(id="7", name="vision", namespace="vision", deserved_gpus=2, node_pool="default",
                                   allocated_non_preemptible=1, sampled_at=0)
    }  # fmt: skip
    served = admission_handlers(state, GuardConfig(install_namespace="hopsworks"))
    request = notebook_review()
    request["object"]["spec"]["priorityClassName"] = "urgent"
    before = _counted(PRIORITY_CLASS, "vision")
    refused = asyncio.run(served["/validate/pods"](request))
    assert not refused.allowed and refused.reason == Reason.GPU_QUOTA_EXCEEDED
    assert _counted(PRIORITY_CLASS, "vision") == before


def test_an_owner_update_that_keeps_its_override_is_not_counted_again() -> None:
    request = labelled(
        workload("reqonly-deployment-update-oldobject.json", replicas=1, gpus=1, old_gpus=1, old_replicas=1),
        PREEMPTIBLE,
    )
    request["oldObject"]["metadata"].setdefault("labels", {}).update(PREEMPTIBLE)
    snap = owner_state(**warn(PREEMPTIBILITY)).snapshot()
    kept = validate_workload(request, snap, NOW)
    assert kept.allowed and kept.would_refuse == () and PREEMPTIBLE_SAID in kept.audit[WOULD_REFUSE_AUDIT]
    assert any(PREEMPTIBLE_SAID in w for w in kept.warnings)
    del request["oldObject"]["metadata"]["labels"]["kai.scheduler/preemptibility"]
    added = validate_workload(request, snap, NOW)
    assert added.allowed and added.would_refuse == (PREEMPTIBILITY,)


@pytest.mark.parametrize("run_ai", [True, False], ids=["run:ai", "kueue"])
async def test_the_admin_view_and_console_list_every_familys_projects(aiohttp_client: Any, run_ai: bool) -> None:
    """The admin view lists the last hour's would-be refusals of any family; with Kueue instead of
    Run:ai too, where the queue and topology family applies."""
    from tests.support.apps import cache_app
    from tests.test_enforcement import EXAMPLE_CLUSTER
    from webhook.local_mode import folder_mode_routes
    from webhook.state.folder import load_into
    from webhook.state.store import ClusterState

    state = ClusterState("hopsworks")
    load_into(state, EXAMPLE_CLUSTER)
    if not run_ai:
        state.apply(settings_configmap(kueue_installed=True, run_ai_enable=False))
    assert state.snapshot().settings.run_ai_enable is run_ai
    client = await aiohttp_client(cache_app(state, routes=folder_mode_routes(state, EXAMPLE_CLUSTER, "127.0.0.1")))
    local = {"Host": "localhost"}
    rule = PREEMPTIBILITY if run_ai else QUEUE_TOPOLOGY
    WOULD_REFUSE_RECENT.record(rule, "fraud-detection", time.time())
    resp = await client.get("/api/v1/admin/runai", headers=local)
    assert resp.status == 200, await resp.text()
    rows = [r for r in (await resp.json())["would_refuse"] if r["project"] == "fraud-detection" and r["rule"] == rule]
    assert len(rows) == 1 and rows[0]["count"] >= 1
    page = await (await client.get("/ui/admin/", headers=local)).text()
    assert 'id="would-refuse"' in page and f'<td data-field="rule">{rule}</td>' in page


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"kueue_installed": "true", "run_ai_enable": "true"}, "cannot both be true"),  # G1
        ({"run_ai_enable": "true"}, "run_ai_enable"),  # G2: not an installer
    ],
    ids=["G1", "G2"],
)
def test_the_settings_guard_is_enforced_with_every_family_in_warn(change: dict[str, str], said: str) -> None:
    from tests.test_guard import cm_request

    state = cluster_state(namespaces=NAMESPACES, **warn(*FAMILIES))
    settings = admission_handlers(state, GuardConfig(install_namespace="hopsworks"))["/validate/settings"]
    old = {key: "warn" for key in FAMILIES.values()}
    user = {"username": "someone", "groups": ["system:authenticated"]}
    decision = asyncio.run(settings(cm_request("UPDATE", {**old, **change}, old, user)))
    assert not decision.allowed and said in decision.message, decision
    assert decision.would_refuse == ()
