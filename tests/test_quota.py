"""R2/R3 at pod creation as pure decisions: binding state and GPU quota."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.support.cluster import SCHEDULER, cluster_state, namespace, settings_configmap
from tests.support.reviews import assert_decision, owned_by, pod_review
from webhook.core.decision import Reason
from webhook.core.kinds import parse_quantity
from webhook.core.quota import format_gpus, gpus_in_use, gpus_left, validate_pod
from webhook.quota.reservations import DEFAULT_TTL_S
from webhook.snapshot import GpuReservation, RunaiDepartmentInfo, RunaiProjectInfo, department_namespaces
from webhook.state.store import FREED_RETENTION_S, ClusterState

NOW = 1_000_000.0
BOUND = namespace("vision", labels={"runai/queue": "vision", "hopsworks.ai/runai-project-id": "7"})
UNBOUND = namespace("nlp")
MOVING_NS = namespace(
    "moving",
    labels={"runai/queue": "moving", "hopsworks.ai/runai-project-id": "8"},
    annotations={"scheduling.hopsworks.ai/runai-move": '{"v":1,"phase":"deleted"}'},
)
NOTEBOOK = {"jupyter": "true"}
PREEMPTIBILITY = "kai.scheduler/preemptibility"


def said_by_kind(kind: str) -> str:
    return "preemptible" if kind in ("job", "system-job") else "non-preemptible"


def running_pod(name: str, gpus: float, kind: str = "notebook", phase: str = "Running") -> dict[str, Any]:
    """A pod of `kind`; a job is a pod the Job controller created (labels alone make no job)."""
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "vision",
            "uid": f"uid-{name}",
            # As the mutating webhook labels it (core.preemptibility): Run:ai reads the label.
            "labels": {"hopsworks.ai/workload-type": kind, PREEMPTIBILITY: said_by_kind(kind)},
            **({"ownerReferences": owned_by("Job", name=name)} if kind in ("job", "system-job") else {}),
        },
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": phase},
    }


@dataclass
class Case:
    id: str
    namespace: str = "vision"
    labels: dict[str, str] = field(default_factory=lambda: dict(NOTEBOOK))
    annotations: dict[str, str] = field(default_factory=dict)
    gpus: float | None = 1
    deserved: float | None = 2
    pods: list[dict[str, Any]] = field(default_factory=list)
    reservations: dict[str, float] = field(default_factory=dict)
    owners: list[dict[str, Any]] | None = None
    run_ai: bool = True
    reachable: bool | None = True  # what the last Run:ai directory refresh found
    missing: dict[str, str] = field(default_factory=dict)  # namespace -> queue Run:ai did not have
    allowed: bool = True
    reason: str = ""
    message: tuple[str, ...] = ()
    warning: str = ""
    queue: str | None = "vision"  # the pod's runai/queue label, as the mutating webhook set it
    preemptibility: str = "non-preemptible"  # the label the mutating webhook set with runai/queue
    spec: dict[str, Any] | None = None  # pod spec fields to set (containers replace the fixture's)


def gpu_container(
    limits: dict[str, str] | None = None, requests: dict[str, str] | None = None, **more: Any
) -> dict[str, Any]:
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    return {"name": "c", "image": "i", "resources": resources, **more}


DRA_SPEC = {
    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
    "containers": [{"name": "c", "image": "i", "resources": {"claims": [{"name": "gpu"}]}}],
}


CASES = [
    Case("Run:ai off: nothing checked", run_ai=False, gpus=8),
    Case("not a project namespace", namespace="kube-public", gpus=8),
    Case(
        "R2 unbound namespace is refused with a reason the shell binds on",
        namespace="nlp",
        allowed=False,
        reason=Reason.RUNAI_PROJECT_NOT_BOUND,
    ),
    Case("R3 within quota", gpus=2),
    Case(
        "S5 a pod of a bound project without runai/queue did not pass Run:ai's admission",
        queue=None,
        gpus=0,
        allowed=False,
        reason=Reason.RUNAI_QUEUE_MISSING,
        message=("lacks runai/queue=vision", "create it again"),
    ),
    Case(
        "S5 a pod labelled with another project's queue is refused",
        queue="nlp",
        allowed=False,
        reason=Reason.RUNAI_QUEUE_MISSING,
    ),
    Case("S5 Run:ai off: runai/queue is not required", run_ai=False, queue=None),
    Case(
        "R5 a project moving between departments starts nothing",
        namespace="moving",
        gpus=0,
        allowed=False,
        reason="ProjectMoving",
    ),
    Case(
        "R3 over quota says how many are left of how many",
        gpus=2,
        pods=[running_pod("a", 1)],
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
        message=("1 of 2 deserved GPUs left", "asks for 2"),
    ),
    Case("R3 finished pods do not count", gpus=2, pods=[running_pod("a", 1, phase="Succeeded")]),
    Case(
        "R3 waiting pods count",
        gpus=2,
        pods=[running_pod("a", 1, phase="Pending")],
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
    ),
    Case("R3 preemptible jobs do not count", gpus=2, pods=[running_pod("a", 2, kind="job")]),
    Case(
        "R3 jobs are never checked",
        labels={"job-name": "train"},
        owners=owned_by("Job"),
        gpus=16,
        preemptibility="preemptible",
    ),
    Case(
        "R3 system jobs are never checked",
        labels={"job-type": "system"},
        owners=owned_by("Job"),
        gpus=16,
        preemptibility="preemptible",
    ),
    # What makes a job: its controller, not what the pod says about itself.
    Case(
        "R3 a pod labelled as a job but created by no Job is checked",
        labels={"job-name": "train"},
        gpus=16,
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
    ),
    Case(
        "R3 a pod saying workload-type job without a Job owner is checked",
        labels={"hopsworks.ai/workload-type": "job"},
        gpus=16,
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
    ),
    Case(
        "R3 a pod saying it is a system job without a Job owner is checked",
        labels={"job-type": "system"},
        gpus=16,
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
    ),
    Case(
        "R3 an ownerReference to a Job that is not the controller does not make a job",
        labels={"job-name": "train"},
        owners=owned_by("Job", controller=False),
        gpus=16,
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
    ),
    Case(
        "R3 a Job of another API group is no batch Job",
        owners=owned_by("Job", api_version="example.com/v1"),
        labels={},
        gpus=16,
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
    ),
    Case(
        "R3 an unrecognised kind (app: streamlit) is checked",
        labels={"app": "streamlit"},
        gpus=3,
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
        message=("2 of 2 deserved GPUs left", "asks for 3"),
    ),
    Case("R3 a pod with no labels is checked", labels={}, gpus=3, allowed=False, reason=Reason.GPU_QUOTA_EXCEEDED),
    Case(
        "R3 a Ray worker is checked",
        labels={"ray.io/node-type": "worker", "ray.io/cluster": "rc"},
        owners=owned_by("RayCluster", api_version="ray.io/v1", name="rc"),
        gpus=3,
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
    ),
    Case("R3 an unrecognised kind within quota is admitted", labels={"app": "streamlit"}, gpus=2),
    Case(
        "R3 waiting pods of unrecognised kinds count",
        labels={},
        gpus=1,
        pods=[running_pod("s", 2, kind="", phase="Pending")],
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
    ),
    Case("R3 pods without GPUs are not checked", gpus=None, deserved=0),
    Case(
        "R3 Run:ai fractions count",
        gpus=None,
        annotations={"gpu-fraction": "0.5"},
        pods=[running_pod("a", 1.5)],
        allowed=True,
    ),
    Case(
        "R3 fractions beyond what is left are refused",
        gpus=None,
        annotations={"gpu-fraction": "0.5"},
        pods=[running_pod("a", 1.75)],
        deserved=2.2,
        reservations={"pending": 0.1},
        allowed=False,
        message=("0.35 of 2.2",),
    ),
    Case(
        "R3 admitted but not yet seen pods count",
        gpus=1,
        reservations={"r1": 1.5},
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
    ),
    Case("R3 deserved 0 refuses any GPU notebook", deserved=0, allowed=False, message=("0 of 0 deserved GPUs left",)),
    Case(
        "R3 terminal, app and deployment are checked",
        labels={"hopsworks.ai/workload-type": "app"},
        gpus=3,
        allowed=False,
    ),
    Case(
        "R2 bound + Run:ai unreachable: admitted, quota skipped",
        deserved=None,
        reachable=False,
        gpus=64,
        warning="Run:ai control plane unreachable",
    ),
    Case(
        "R2 bound, Run:ai reachable, project not known to this replica: never admitted unchecked",
        deserved=None,
        allowed=False,
        reason=Reason.RUNAI_PROJECT_NOT_KNOWN_HERE,
        message=("no record yet of Run:ai project vision", "try again"),
    ),
    Case(
        "R2 bound, never refreshed yet: not admitted unchecked either",
        deserved=None,
        reachable=None,
        allowed=False,
        reason=Reason.RUNAI_PROJECT_NOT_KNOWN_HERE,
    ),
    Case(
        "R2 bound to a Run:ai project that Run:ai no longer has: refused, saying so and what to do",
        deserved=None,
        missing={"vision": "vision"},
        allowed=False,
        reason=Reason.RUNAI_PROJECT_MISSING,
        message=("Run:ai project vision, which no longer exists in Run:ai", "remove the labels runai/queue"),
    ),
    Case(
        "R2 a missing record for another queue than the label names now is not trusted",
        deserved=None,
        missing={"vision": "old-queue"},
        allowed=False,
        reason=Reason.RUNAI_PROJECT_NOT_KNOWN_HERE,
    ),
    Case(
        "malformed fraction is a clear 400",
        gpus=None,
        annotations={"gpu-fraction": "lots"},
        allowed=False,
        reason="Invalid",
    ),
    Case(
        "a fraction on 1e999999 devices (NaN GPUs) is a 400 naming the annotation",
        gpus=None,
        annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "1e999999"},
        allowed=False,
        reason="Invalid",
        message=("gpu-fraction-num-devices",),
    ),
    Case(
        "an overflowing fraction is a 400",
        gpus=None,
        annotations={"gpu-fraction": "1e999999999"},
        allowed=False,
        reason="Invalid",
        message=("annotation gpu-fraction must be more than 0 and less than 1",),
    ),
    # GPUs the quota must count as the scheduler counts them, or refuse saying what it cannot count.
    Case(
        "MIG instances (mixed strategy) count their slices as GPUs: 4 x 3g.20gb is 12",
        gpus=None,
        spec={"containers": [gpu_container({"nvidia.com/mig-3g.20gb": "4"})]},
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
        message=("2 of 2 deserved GPUs left", "asks for 12"),
    ),
    Case(
        "MIG instances within the quota",
        gpus=None,
        spec={"containers": [gpu_container({"nvidia.com/mig-1g.5gb": "2"})]},
    ),
    Case(
        "a MIG profile KAI cannot count is a 400 naming it",
        gpus=None,
        spec={"containers": [gpu_container({"nvidia.com/mig-1c.3g.20gb": "1"})]},
        allowed=False,
        reason="Invalid",
        message=("nvidia.com/mig-1c.3g.20gb is a MIG profile whose GPU share cannot be read",),
    ),
    Case(
        "a GPU request above a limit of 0 counts what the scheduler counts: the request",
        gpus=None,
        spec={"containers": [gpu_container({"nvidia.com/gpu": "0"}, {"nvidia.com/gpu": "3"})]},
        allowed=False,
        reason=Reason.GPU_QUOTA_EXCEEDED,
        message=("asks for 3",),
    ),
    Case(
        "GPUs through DRA claims cannot be counted: a non-preemptible pod is refused saying so",
        gpus=None,
        spec=DRA_SPEC,
        allowed=False,
        reason=Reason.FORBIDDEN,
        message=("DRA resource claims of this pod (gpu)", "cannot be counted", "nvidia.com/gpu"),
    ),
    Case(
        "DRA claims beside whole GPUs are refused too",
        gpus=1,
        spec=DRA_SPEC,
        allowed=False,
        reason=Reason.FORBIDDEN,
        message=("DRA resource claims",),
    ),
    Case(
        "a job's DRA claims are not counted: jobs are never checked",
        labels={"job-name": "train"},
        owners=owned_by("Job"),
        gpus=None,
        spec=DRA_SPEC,
        preemptibility="preemptible",
    ),
    Case("Run:ai off: DRA claims are not Run:ai's", run_ai=False, gpus=None, spec=DRA_SPEC),
    # Owners as Run:ai's pod grouper reads them: the first ownerReference (tests/test_kai_owners.py).
    Case(
        "issue: [ConfigMap labelled non-preemptible, Job (controller)], labelled preemptible: refused, not 8 of 2",
        labels={"job-name": "train"},
        owners=[
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "uid-cm"},
            *owned_by("Job"),
        ],
        gpus=8,
        preemptibility="preemptible",
        allowed=False,
        reason=Reason.FORBIDDEN,
        message=("first ownerReference is ConfigMap cm",),
    ),
    Case(
        "a job's unreadable GPU request is refused too (it would be cached as NaN)",
        labels={"job-name": "train"},
        gpus=None,
        annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "1.5"},
        allowed=False,
        reason="Invalid",
        message=("whole number",),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_pod_validation(case: Case) -> None:
    state = cluster_state(namespaces=[BOUND, UNBOUND, MOVING_NS], extra=case.pods, run_ai_enable=case.run_ai)
    snap = state.snapshot()
    snap.runai_reachable = case.reachable
    snap.runai_missing = case.missing
    if case.deserved is not None:
        snap.runai_projects = {
            "vision": RunaiProjectInfo(id="7", name="vision", namespace="vision", deserved_gpus=case.deserved)
        }
    snap.gpu_reservations = {
        "vision": {
            k: GpuReservation(key=k, namespace="vision", gpus=g, expires_at=NOW + 60)
            for k, g in case.reservations.items()
        }
    }
    labels = {**case.labels, **({"runai/queue": case.queue, PREEMPTIBILITY: case.preemptibility} if case.queue else {})}
    data = pod_review(
        case.namespace, labels=labels, annotations=case.annotations, gpus=case.gpus, owners=case.owners, spec=case.spec
    )
    decision = validate_pod(data["request"], snap, now=NOW)
    assert_decision(decision, allowed=case.allowed, reason=case.reason, message=case.message, warning=case.warning)


def test_expired_reservations_and_reservations_of_visible_pods_do_not_count() -> None:
    state = cluster_state(namespaces=[BOUND], extra=[running_pod("a", 1)], run_ai_enable=True)
    snap = state.snapshot()
    snap.gpu_reservations = {
        "vision": {
            "old": GpuReservation("old", "vision", 4, expires_at=NOW - 1),
            "uid-a": GpuReservation("uid-a", "vision", 1, expires_at=NOW + 60),  # the pod is in the cache
        }
    }
    assert gpus_in_use(snap, "vision", NOW) == 1


@pytest.mark.parametrize(("value", "text"), [(0, "0"), (2, "2"), (0.5, "0.5"), (1.25, "1.25"), (0.3333, "0.33")])
def test_gpu_numbers_read_well(value: float, text: str) -> None:
    assert format_gpus(value) == text


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", 1.0), ("0", 0.0), (" 2 ", 2.0), ("16", 16.0), (3, 3.0), (0.5, 0.5), ("500m", 0.5),
        ("1k", 1000.0), ("1Ki", 1024.0), ("2Mi", 2.0 * 2**20), ("1G", 1e9), ("1.5", 1.5),
        ("9" * 16, float("9" * 16)), ("1e3", 1000.0), ("2E-1", 0.2), (".5", 0.5), ("1E", 1e18),
    ],
)  # fmt: skip
def test_gpu_quantities_parse_like_kubernetes(raw: object, expected: float) -> None:
    assert parse_quantity(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "", "-1", "1x", "1e", "nan", True, float("nan"), -2, "Mi", "inf", "Infinity", "0x10", "1_000",
        # values that would overflow Decimal, or become inf or NaN, or pass as a digit
        "1e999999999", "1e999999", "1" + "0" * 400, "9" * 5_000, 10**5_000, float("inf"), "1e41",
        "\uff11", "\u0663", "1\u00a0", None, [], {"a": 1},
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, int) and v > 2**64 else repr(v)[:30],
)  # fmt: skip
def test_malformed_gpu_quantities_are_refused(raw: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity(raw)


def test_gpu_quantities_beyond_any_node_are_refused_with_the_field() -> None:
    from webhook.core.kinds import GpuRequestError, pod_gpu_request

    pod = running_pod("a", 1)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "5000"
    with pytest.raises(GpuRequestError, match=r"spec.containers\[0\].resources.limits\[nvidia.com/gpu\]"):
        pod_gpu_request(pod)


@pytest.mark.parametrize(
    "annotations",
    [
        {"gpu-fraction": "1e999999999"},  # decimal.Overflow before the fix
        {"gpu-fraction": "0", "gpu-fraction-num-devices": "1e999999"},  # NaN before the fix
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "\u0663"},
    ],
)
def test_a_cached_pod_with_an_unreadable_gpu_request_counts_conservatively(annotations: dict[str, str]) -> None:
    # The pod is kept, counted as the most a pod may ask for (never NaN, never 0),
    # the other pods still count, and the metric says how many such pods there are.
    from webhook.core.kinds import UNREADABLE_POD_GPUS
    from webhook.metrics import REGISTRY

    poison = running_pod("poison", 0)
    poison["metadata"]["annotations"] = annotations
    state = cluster_state(namespaces=[BOUND], extra=[running_pod("a", 1)], run_ai_enable=True)
    state.replace_all("Pod", [running_pod("a", 1), poison, running_pod("b", 2)])
    used = gpus_in_use(state.snapshot(), "vision", NOW)
    assert used == 3 + UNREADABLE_POD_GPUS
    assert REGISTRY.get_sample_value("webhook_pods_unreadable_gpus") == 1
    snap = state.snapshot()
    snap.runai_projects = {"vision": RunaiProjectInfo(id="7", name="vision", namespace="vision", deserved_gpus=8)}
    labels = {**NOTEBOOK, "runai/queue": "vision"}  # as the mutating webhook set it (S5)
    decision = validate_pod(pod_review("vision", labels=labels, gpus=1)["request"], snap, now=NOW)
    assert_decision(decision, allowed=False, reason=Reason.GPU_QUOTA_EXCEEDED, message=("cannot be read", "poison"))
    state.delete(poison)
    assert gpus_in_use(state.snapshot(), "vision", NOW) == 3
    assert REGISTRY.get_sample_value("webhook_pods_unreadable_gpus") == 0


def test_gpu_pods_cached_under_old_workload_kind_rules_get_the_new_kind_but_count_as_run_ai_sees_them() -> None:
    # A rule added to the settings after the pods were cached (or pods listed before the settings
    # arrived): the pods' kinds follow the rules in force. What they hold of the quota does not:
    # Run:ai reads preemptibility from the pod as stored, labelled when it was admitted.
    state = cluster_state(run_ai_enable=True)
    pod = running_pod("spark", 2)
    pod["metadata"]["labels"] = {"spark-role": "driver", PREEMPTIBILITY: "non-preemptible"}
    pod["metadata"]["ownerReferences"] = owned_by("SparkApplication", "sparkoperator.k8s.io/v1beta2", "etl")
    state.apply(pod)  # no job owner knows it yet: unknown kind, labelled non-preemptible
    assert state.snapshot().pods["vision"]["uid-spark"].kind is None
    assert gpus_in_use(state.snapshot(), "vision", NOW) == 2
    scheduler = copy.deepcopy(dict(SCHEDULER))
    scheduler["workloadKinds"] = {
        "jobOwners": [
            {"apiGroup": "batch", "kind": "Job"},
            {"apiGroup": "sparkoperator.k8s.io", "kind": "SparkApplication"},
        ]
    }
    state.apply(settings_configmap(scheduler=scheduler, run_ai_enable=True))
    assert state.snapshot().pods["vision"]["uid-spark"].kind == "job"
    assert gpus_in_use(state.snapshot(), "vision", NOW) == 2  # Run:ai still holds it non-preemptible
    relabelled = copy.deepcopy(pod)
    relabelled["metadata"]["labels"][PREEMPTIBILITY] = "preemptible"  # its next pod, admitted as a job
    state.apply(relabelled)
    assert gpus_in_use(state.snapshot(), "vision", NOW) == 0


def test_a_refused_settings_configmap_keeps_the_last_good_settings_and_says_so() -> None:
    from webhook.metrics import REGISTRY

    state = cluster_state(run_ai_enable=True)
    state.apply(settings_configmap(run_ai_enable=True, kueue_installed=True))  # G1: never both
    assert state.settings.run_ai_enable and not state.settings.kueue_installed  # the last good ones
    assert "cannot both be true" in (state.snapshot().settings_error or "")
    assert REGISTRY.get_sample_value("webhook_settings_rejected") == 1
    state.apply(settings_configmap(run_ai_enable=False))
    assert state.snapshot().settings_error is None
    assert REGISTRY.get_sample_value("webhook_settings_rejected") == 0


# -- GPUs left: freed pods, reservations and Run:ai's count (R3) -------------------------------------


def _left_state(*pods: dict[str, Any], allocated: float = 0.0, sampled_at: float = NOW - 10) -> ClusterState:
    state = cluster_state(namespaces=[BOUND], extra=pods, run_ai_enable=True)
    state.clock = lambda: NOW - 5  # the cache learns what happens next after Run:ai's sample
    state.snapshot().runai_projects = {
        "vision": RunaiProjectInfo(
            id="7",
            name="vision",
            namespace="vision",
            deserved_gpus=2,
            node_pool="default",
            allocated_non_preemptible=allocated,
            sampled_at=sampled_at,
        )
    }
    return state


def _reserve(state: ClusterState, *keys: str) -> None:
    state.snapshot().gpu_reservations = {
        "vision": {k: GpuReservation(k, "vision", 1, expires_at=NOW + 100) for k in keys}
    }


def _on_node(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["nodeName"] = "gpu-1"
    return pod


def test_a_deleted_pods_reservation_stops_counting_at_once_an_unseen_ones_still_counts() -> None:
    state = _left_state(running_pod("a", 1))
    _reserve(state, "uid-a", "uid-unseen")  # a's pod is cached; the other one not yet
    assert gpus_left(state.snapshot(), "vision", NOW).pods_in_use == 2
    state.delete(running_pod("a", 1))
    left = gpus_left(state.snapshot(), "vision", NOW)
    assert left.pods_in_use == 1 and left.left == 1  # the unseen pod's reservation still holds its GPU


def test_a_finished_pods_reservation_does_not_count() -> None:
    state = _left_state(running_pod("a", 1))
    _reserve(state, "uid-a")
    state.apply(running_pod("a", 1, phase="Succeeded"))
    state.delete(running_pod("a", 1, phase="Succeeded"))  # the pod cache loses it: still freed
    assert gpus_left(state.snapshot(), "vision", NOW).pods_in_use == 0


def test_a_pod_deleted_while_the_watch_was_down_is_freed_by_the_relist() -> None:
    state = _left_state(running_pod("a", 1), running_pod("b", 1))
    _reserve(state, "uid-a")
    state.replace_all("Pod", [running_pod("b", 1)])
    assert gpus_left(state.snapshot(), "vision", NOW).pods_in_use == 1


def test_runai_count_sampled_before_a_scheduled_pod_left_is_lowered_by_it() -> None:
    state = _left_state(_on_node(running_pod("a", 1)), running_pod("w", 1, phase="Pending"), allocated=1)
    state.delete(running_pod("w", 1, phase="Pending"))  # never on a node: Run:ai never counted it
    assert gpus_left(state.snapshot(), "vision", NOW).runai_in_use == 1
    state.delete(_on_node(running_pod("a", 1)))
    assert gpus_left(state.snapshot(), "vision", NOW).runai_in_use == 0
    # A later sample already reflects it: nothing more is taken off.
    project = state.snapshot().runai_projects["vision"]
    later = dataclasses.replace(project, allocated_non_preemptible=1, sampled_at=NOW)
    assert gpus_left(state.snapshot(), "vision", NOW, project=later).runai_in_use == 1


def test_gpus_left_is_the_larger_of_runai_and_the_pods_not_their_sum() -> None:
    state = _left_state(running_pod("a", 1), allocated=1)
    left = gpus_left(state.snapshot(), "vision", NOW)
    assert (left.runai_in_use, left.pods_in_use, left.in_use, left.left) == (1, 1, 1, 1)
    assert gpus_left(_left_state(allocated=2).snapshot(), "vision", NOW).left == 0


def test_freed_pods_are_remembered_longer_than_a_reservation_lives() -> None:
    assert FREED_RETENTION_S > DEFAULT_TTL_S


def test_a_sidecars_gpus_count_beside_the_notebooks() -> None:
    # An init container with restartPolicy Always runs for the pod's whole life: 1 + 2 GPUs held,
    # over the 2 deserved. Read as an ordinary init container (the larger of 1 and 2) it passed.
    state = cluster_state(namespaces=[BOUND], run_ai_enable=True)
    snap = state.snapshot()
    snap.runai_reachable = True
    snap.runai_projects = {"vision": RunaiProjectInfo(id="7", name="vision", namespace="vision", deserved_gpus=2)}
    labels = {**NOTEBOOK, "runai/queue": "vision", PREEMPTIBILITY: "non-preemptible"}
    sidecar = {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
    data = pod_review("vision", labels=labels, gpus=1, spec={"initContainers": [sidecar]})
    decision = validate_pod(data["request"], snap, now=NOW)
    assert_decision(decision, allowed=False, reason="GpuQuotaExceeded")


# -- the department's GPUs left (R3): Run:ai's scheduler checks every queue up the hierarchy -------

AUDIO = namespace("audio", labels={"runai/queue": "audio", "hopsworks.ai/runai-project-id": "9"})
OTHER = namespace("other", labels={"runai/queue": "other", "hopsworks.ai/runai-project-id": "11"})


def pod_in(ns: str, name: str, gpus: float, kind: str = "notebook") -> dict[str, Any]:
    pod = running_pod(name, gpus, kind)
    pod["metadata"]["namespace"] = ns
    return pod


@dataclass
class DeptCase:
    id: str
    department: float | None  # the department's deserved GPUs; None: no record of the department
    gpus: float = 1
    runai_department: float = 0.0  # Run:ai's allocatedNonPreemptible of the department
    pods: list[dict[str, Any]] = field(default_factory=list)
    allowed: bool = True
    message: tuple[str, ...] = ()


DEPT_CASES = [
    DeptCase(
        "a sibling project's notebook uses the department's only GPU",
        department=1,
        pods=[pod_in("audio", "n", 1)],
        allowed=False,
        message=("department research has 0 of 1 deserved GPUs left", "project vision has 2 of 2", "asks for 1"),
    ),
    DeptCase(
        "Run:ai's count of the department is enough (pods this replica does not know of)",
        department=1,
        runai_department=1,
        allowed=False,
        message=("department research has 0 of 1",),
    ),
    DeptCase("the boundary: 1 of 2 left takes 1", department=2, pods=[pod_in("audio", "n", 1)]),
    DeptCase(
        "the boundary: 1 of 2 left refuses 2",
        department=2,
        gpus=2,
        pods=[pod_in("audio", "n", 1)],
        allowed=False,
        message=("department research has 1 of 2 deserved GPUs left", "asks for 2"),
    ),
    DeptCase(
        "the project is the limit: its message names the project",
        department=8,
        gpus=3,
        allowed=False,
        message=("project vision has 2 of 2 deserved GPUs left",),
    ),
    DeptCase("a department quota of -1 is no limit", department=-1, pods=[pod_in("audio", "n", 5)]),
    DeptCase(
        "a department quota of 0 is a limit of 0, as the scheduler reads it",
        department=0,
        allowed=False,
        message=("department research has 0 of 0",),
    ),
    DeptCase("no record of the department: the project alone", department=None, runai_department=5),
    DeptCase("a sibling's preemptible job does not count", department=1, pods=[pod_in("audio", "j", 1, "job")]),
    DeptCase("another department's pods do not count", department=1, pods=[pod_in("other", "n", 1)]),
]


def _department_snapshot(case: DeptCase) -> ClusterState:
    state = cluster_state(namespaces=[BOUND, AUDIO, OTHER], extra=case.pods, run_ai_enable=True)
    snap = state.snapshot()
    snap.runai_reachable = True
    research = (
        None
        if case.department is None
        else RunaiDepartmentInfo(
            id="d1",
            name="research",
            deserved_gpus=case.department,
            allocated_non_preemptible=case.runai_department,
            sampled_at=NOW - 10,
        )
    )
    elsewhere = RunaiDepartmentInfo(id="d2", name="elsewhere", deserved_gpus=1)

    def info(ns: str, project_id: str, department: RunaiDepartmentInfo | None) -> RunaiProjectInfo:
        return RunaiProjectInfo(id=project_id, name=ns, namespace=ns, deserved_gpus=2, department=department)

    snap.runai_projects = {
        "vision": info("vision", "7", research),
        "audio": info("audio", "9", research),
        "other": info("other", "11", elsewhere),
    }
    return state


@pytest.mark.parametrize("indexed", [False, True], ids=["summed per call", "index published"])
@pytest.mark.parametrize("case", DEPT_CASES, ids=[c.id for c in DEPT_CASES])
def test_a_notebook_fits_its_departments_gpus_too(case: DeptCase, indexed: bool) -> None:
    snap = _department_snapshot(case).snapshot()
    if indexed:  # as the directory publishes the records
        snap.runai_department_namespaces = department_namespaces(snap.runai_projects)
    labels = {**NOTEBOOK, "runai/queue": "vision", PREEMPTIBILITY: "non-preemptible"}
    decision = validate_pod(pod_review("vision", labels=labels, gpus=case.gpus)["request"], snap, now=NOW)
    reason = "" if case.allowed else Reason.GPU_QUOTA_EXCEEDED
    assert_decision(decision, allowed=case.allowed, reason=reason, message=case.message)


def test_the_departments_runai_count_is_lowered_by_a_scheduled_pod_that_left_since() -> None:
    pod = _on_node(pod_in("audio", "n", 1))
    state = _department_snapshot(DeptCase("", department=1, runai_department=1, pods=[pod]))
    state.clock = lambda: NOW - 5  # after the department's sample
    assert gpus_left(state.snapshot(), "vision", NOW).left == 0
    state.delete(pod)
    left = gpus_left(state.snapshot(), "vision", NOW)
    assert left.department is not None and left.department.runai_in_use == 0 and left.left == 1
