"""The /validate/pods path's shortcuts give the answers of the full reads they skip.

`pod_gpu_request` passes over containers asking for CPU, memory or ephemeral storage alone before
reading them in full, `runai_pod_refusal` lets a pod without owners or any annotation it reads
through at once, `unreviewed_owner` passes the usual owners with one set lookup, and
`runai_preemptibility` makes each answer once per PriorityClass record or settings label. Each is
held here against the full read, on tables and on random pods.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core import preemptibility
from webhook.core.gpu_sharing import gpu_sharing_error
from webhook.core.kinds import GpuRequestError, kai_owner, parse_quantity, pod_gpu_request
from webhook.core.preemptibility import (
    REVIEWED_OWNERS,
    escapes_pod_grouper,
    runai_preemptibility,
    unreviewed_owner,
)
from webhook.core.runai_admission import runai_pod_refusal
from webhook.settings import ClusterSettings
from webhook.snapshot import PriorityClassInfo

GPU = "nvidia.com/gpu"


def pod(*containers: Any, init: Any = None, annotations: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init is not None:
        spec["initContainers"] = init
    meta: dict[str, Any] = {"name": "p"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": spec}


def c(limits: Any = None, requests: Any = None, **more: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": "c", "resources": resources, **more}


GPU_CASES = [
    ("no containers", pod(), 0.0),
    ("no resources", pod({"name": "c"}), 0.0),
    ("cpu only", pod(c({"cpu": "2"}, {"cpu": "1"})), 0.0),
    ("one limit", pod(c({GPU: "2"})), 2.0),
    ("a request only", pod(c(None, {GPU: "1"})), 1.0),
    ("the limit before the request", pod(c({GPU: "2"}, {GPU: "1"})), 2.0),
    ("app containers add up", pod(c({GPU: "1"}), c({"cpu": "1"}), c({GPU: "3"})), 4.0),
    ("the largest init container when larger", pod(c({GPU: "1"}), init=[c({GPU: "3"}), c({GPU: "2"})]), 3.0),
    ("an int quantity", pod(c({GPU: 2})), 2.0),
    ("milli", pod(c({GPU: "500m"})), 0.5),
    ("an exponent", pod(c({GPU: "1e1"})), 10.0),
    ("padded digits", pod(c({GPU: " 2"})), 2.0),
    ("null sections", pod(c(None, None, resources={"limits": None, "requests": None})), 0.0),
    ("a fraction", pod(c({"cpu": "1"}), annotations={"gpu-fraction": "0.5"}), 0.5),
    ("a fraction on devices", pod(annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}), 1.0),
    ("memory counts a device", pod(annotations={"gpu-memory": "2000"}), 1.0),
    ("a container that is not an object is passed over", pod("x", c({GPU: "1"})), 1.0),
    # Sidecars (init containers with restartPolicy Always) run beside the app containers: their
    # GPUs add up, as the scheduler adds them; they were read as one more init container.
    ("a sidecar adds to the app", pod(c({GPU: "1"}), init=[c({GPU: "2"}, restartPolicy="Always")]), 3.0),
    ("sidecars alone", pod(c(), init=[c({GPU: "1"}, restartPolicy="Always")] * 2), 2.0),
    (
        "an init container runs beside the sidecars before it",
        pod(c({GPU: "1"}), init=[c({GPU: "1"}, restartPolicy="Always"), c({GPU: "3"})]),
        4.0,
    ),
    (
        "but not beside those after it",
        pod(c({GPU: "1"}), init=[c({GPU: "3"}), c({GPU: "1"}, restartPolicy="Always")]),
        3.0,
    ),
    ("another restartPolicy is no sidecar", pod(c({GPU: "1"}), init=[c({GPU: "2"}, restartPolicy="Never")]), 2.0),
    # What the scheduler counts is the request; the apiserver makes it equal to the limit.
    ("a request above a limit of 0 counts", pod(c({GPU: "0"}, {GPU: "3"})), 3.0),
    ("MIG instances count their slices (mixed strategy)", pod(c({"nvidia.com/mig-3g.20gb": "4"})), 12.0),
    ("a MIG request only", pod(c(None, {"nvidia.com/mig-1g.5gb": "2"})), 2.0),
    ("MIG beside a whole GPU", pod(c({GPU: "1", "nvidia.com/mig-2g.10gb": "1"})), 3.0),
    ("MIG in an init container", pod(c(), init=[c({"nvidia.com/mig-7g.80gb": "1"})]), 7.0),
]


@pytest.mark.parametrize(("pod_", "expected"), [(p, e) for _, p, e in GPU_CASES], ids=[i for i, _, _ in GPU_CASES])
def test_gpu_request(pod_: dict[str, Any], expected: float) -> None:
    assert pod_gpu_request(pod_) == expected


GPU_ERRORS = [
    ("a word", pod(c({GPU: "two"})), "spec.containers[0].resources.limits[nvidia.com/gpu]: not a quantity: 'two'"),
    ("second container", pod(c(), c(None, {GPU: "-1"})), "spec.containers[1].resources.requests[nvidia.com/gpu]"),
    ("an init container", pod(init=[c(), c({GPU: "x"})]), "spec.initContainers[1].resources.limits[nvidia.com/gpu]"),
    ("too many", pod(c({GPU: "2000"})), "quantity '2000' is more than 1024"),
    ("too many digits", pod(c({GPU: "9" * 16})), "is more than 1024"),
    ("unicode digits", pod(c({GPU: "２"})), "not a quantity"),
    ("superscript", pod(c({GPU: "²"})), "not a quantity"),
    ("a bool", pod(c({GPU: True})), "not a quantity: True"),
    ("NaN", pod(c({GPU: math.nan})), "not a finite, non-negative quantity"),
    ("resources a list", pod({"name": "c", "resources": []}), None),  # falsy: no resources
    ("resources a string", pod({"name": "c", "resources": "x"}), "spec.containers[0].resources must be an object"),
    ("limits a string", pod(c("x")), "spec.containers[0].resources.limits must be an object"),
    ("requests a number", pod(c({"cpu": "1"}, 3)), "spec.containers[0].resources.requests must be an object"),
    ("containers an object", {"spec": {"containers": {}}}, None),  # falsy: none
    ("containers a string", {"spec": {"containers": "x"}}, "spec.containers must be a list"),
    ("spec a list", {"spec": ["x"]}, "spec must be an object"),
    ("annotations a list", pod(annotations=["x"]), "metadata.annotations must be an object"),
    ("a fraction above 1", pod(annotations={"gpu-fraction": "2"}), "must be at most 1"),
    (
        "a MIG profile that cannot be counted",
        pod(c({"nvidia.com/mig-1c.3g.20gb": "1"})),
        "resources.limits[nvidia.com/mig-1c.3g.20gb]: nvidia.com/mig-1c.3g.20gb is a MIG profile whose GPU share",
    ),
    ("a MIG quantity", pod(c({"nvidia.com/mig-1g.5gb": "x"})), "limits[nvidia.com/mig-1g.5gb]: not a quantity"),
    ("a request beside a limit", pod(c({GPU: "1"}, {GPU: "x"})), "requests[nvidia.com/gpu]: not a quantity"),
]


@pytest.mark.parametrize(("pod_", "error"), [(p, e) for _, p, e in GPU_ERRORS], ids=[i for i, _, _ in GPU_ERRORS])
def test_gpu_request_stays_strict(pod_: dict[str, Any], error: str | None) -> None:
    if error is None:
        assert pod_gpu_request(pod_) == 0.0
        return
    with pytest.raises(GpuRequestError) as raised:
        pod_gpu_request(pod_)
    assert error in str(raised.value)


@pytest.mark.parametrize("text", ["1", "2", "0", "007", "1024", "123456789012345"])
def test_digits_fast_path_matches_the_grammar(text: str) -> None:
    assert parse_quantity(text) == float(int(text))
    assert parse_quantity(text) == parse_quantity(f" {text}")  # the padded form takes the full path


MIG = "nvidia.com/mig-3g.20gb"  # 3 of a GPU's 7 slices: 3 GPUs to the quota, as KAI counts it


# The plain reading, written apart from the shortcut: every container's limits and requests in
# full, each GPU resource the larger of its limit and its request.
def reference_gpus(pod_: dict[str, Any]) -> float:
    spec = pod_.get("spec") or {}

    def one(container: dict[str, Any]) -> float:
        resources = container.get("resources") or {}
        if not isinstance(resources, dict):
            raise GpuRequestError("resources")
        counted = {GPU: 0.0, MIG: 0.0}
        for section in ("limits", "requests"):
            amounts = resources.get(section) or {}
            if not isinstance(amounts, dict):
                raise GpuRequestError(section)
            for name, each in ((GPU, 1.0), (MIG, 3.0)):
                if name in amounts:
                    counted[name] = max(counted[name], parse_quantity(amounts[name], 1024.0) * each)
        return counted[GPU] + counted[MIG]

    app = sum(one(x) for x in spec.get("containers") or [] if isinstance(x, dict))
    # Sidecars (restartPolicy Always) as the scheduler counts them: beside the app containers and
    # beside every init container after them.
    sidecars = peak = 0.0
    for x in spec.get("initContainers") or []:
        if isinstance(x, dict):
            sidecar = x.get("restartPolicy") == "Always"
            sidecars += one(x) if sidecar else 0.0
            peak = max(peak, sidecars if sidecar else sidecars + one(x))
    return max(app + sidecars, peak)


AMOUNT = st.one_of(st.sampled_from(["1", "2", "500m", "x", "-1", "", "1e2"]), st.integers(-1, 3), st.none())
SECTION = st.one_of(
    st.none(),
    st.sampled_from(["", "x", 0, []]),
    st.dictionaries(st.sampled_from([GPU, MIG, "cpu", "memory"]), AMOUNT, max_size=3),
)
CONTAINER = st.one_of(
    st.builds(lambda limits, requests, policy: {"name": "c", "resources": {"limits": limits, "requests": requests},
                                                **policy}, SECTION, SECTION,
              st.sampled_from([{}, {"restartPolicy": "Always"}, {"restartPolicy": "Never"}])),
    st.builds(lambda resources: {"name": "c", "resources": resources}, st.sampled_from([None, {}, "", "x", 0, []])),
    st.sampled_from([{"name": "c"}, "x", None]),
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(CONTAINER, max_size=4), st.lists(CONTAINER, max_size=3))
def test_container_shortcut_reads_as_the_full_read(app: list[Any], init: list[Any]) -> None:
    pod_ = {"spec": {"containers": app, "initContainers": init}}
    try:
        expected: float | None = reference_gpus(pod_)
    except ValueError:
        expected = None
    if expected is None:
        with pytest.raises(GpuRequestError):
            pod_gpu_request(pod_)
    else:
        assert pod_gpu_request(pod_) == expected


# -- runai_pod_refusal's early exit ---------------------------------------------------------------

# Each value is refused on its own (the container name: as no string).
READ_ANNOTATIONS: dict[str, Any] = {
    "gpu-fraction": "0.5",
    "gpu-memory": "abc",
    "gpu-fraction-num-devices": "2",
    "mps": "true",
    "gpu-fraction-container-name": 5,
    "pod-group-name": "g",
    "kai.scheduler/skip-podgrouper": "true",
}


def full_refusal(pod_: dict[str, Any]) -> tuple[str | None, str | None]:
    meta = pod_.get("metadata") or {}
    if not isinstance(meta, dict):
        return gpu_sharing_error(pod_), None
    return gpu_sharing_error(pod_), unreviewed_owner(meta) or escapes_pod_grouper(meta)


@pytest.mark.parametrize("key", sorted(READ_ANNOTATIONS))
def test_each_annotation_read_still_reaches_the_checks(key: str) -> None:
    pod_ = pod(c({GPU: "1"}), annotations={"other": "x", key: READ_ANNOTATIONS[key]})
    sharing, escape = full_refusal(pod_)
    assert sharing is not None or escape is not None
    refused = runai_pod_refusal(pod_)
    assert refused is not None and not refused.allowed
    assert (sharing or escape or "") in refused.message


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.none(),
        st.sampled_from(["x", [], 0]),
        st.dictionaries(
            st.sampled_from([*READ_ANNOTATIONS, "other", "prometheus.io/scrape"]),
            st.one_of(st.sampled_from(["true", "0.5", "2", "abc", "c", "", "g"]), st.integers(0, 2)),
            max_size=4,
        ),
    ),
    st.booleans(),
    st.sampled_from([None, ("apps/v1", "ReplicaSet"), ("v1", "ConfigMap"), ("ray.io/v1", "RayCluster")]),
)
def test_early_exit_refuses_as_the_full_checks(
    annotations: Any, whole_gpu: bool, owned: tuple[str, str] | None
) -> None:
    pod_ = pod(c({GPU: "1"} if whole_gpu else {"cpu": "1"}), annotations=annotations)
    if owned:
        api_version, kind = owned
        ref = {"apiVersion": api_version, "kind": kind, "name": "r", "uid": "u", "controller": True}
        pod_["metadata"]["ownerReferences"] = [ref]
    sharing, escape = full_refusal(pod_)
    refused = runai_pod_refusal(pod_)
    assert (refused is None) == (sharing is None and escape is None)
    if refused is not None:
        assert any(reason in refused.message for reason in (sharing, escape) if reason)


# -- runai_preemptibility's answers, made once per cluster object ----------------------------------

SETTINGS = ClusterSettings()
LABEL = SETTINGS.scheduler.runai.preemptibility_label


def fresh(labels: dict[str, Any], priority: Any, classes: dict[str, PriorityClassInfo]) -> tuple[bool, str]:
    """What the function answers with its memo emptied first."""
    preemptibility._class_answers.clear()
    preemptibility._label_answers.clear()
    seen = runai_preemptibility(labels, priority, classes, SETTINGS)
    return seen.preemptible, seen.why


CLASSES = {"low": PriorityClassInfo("low", 10), "high": PriorityClassInfo("high", 1000)}
PREEMPTIBILITY_CASES = [
    ({LABEL: "preemptible"}, None, (True, f"label {LABEL}=preemptible")),
    ({LABEL: "non-preemptible"}, "low", (False, f"label {LABEL}=non-preemptible")),
    ({LABEL: "other"}, "low", (True, "spec.priorityClassName low (value 10)")),
    ({"priorityClassName": "high"}, "low", (False, "label priorityClassName high (value 1000)")),
    ({"priorityClassName": "low"}, None, (True, "label priorityClassName low (value 10)")),
    ({}, "high", (False, "spec.priorityClassName high (value 1000)")),
    ({}, "missing", (False, "no existing priority class: Run:ai's default for the workload type")),
    ({}, ["not", "a", "name"], (False, "no existing priority class: Run:ai's default for the workload type")),
]


@pytest.mark.parametrize(("labels", "priority", "expected"), PREEMPTIBILITY_CASES)
def test_memoised_answers_are_the_fresh_ones(labels: dict[str, Any], priority: Any, expected: Any) -> None:
    assert fresh(labels, priority, CLASSES) == expected
    for _ in range(2):  # from the memo now
        seen = runai_preemptibility(labels, priority, CLASSES, SETTINGS)
        assert (seen.preemptible, seen.why) == expected


def test_a_replaced_priority_class_is_answered_anew() -> None:
    classes = {"team": PriorityClassInfo("team", 10)}
    assert runai_preemptibility({}, "team", classes, SETTINGS).preemptible
    classes["team"] = PriorityClassInfo("team", 1000)  # the watch replaced the record
    seen = runai_preemptibility({}, "team", classes, SETTINGS)
    assert (seen.preemptible, seen.why) == (False, "spec.priorityClassName team (value 1000)")


def test_another_settings_label_has_its_own_answer() -> None:
    settings_b = ClusterSettings.from_configmap_data(
        {"scheduler": "runai:\n  preemptibilityLabel: example.com/preemptible\n"}
    )
    a = runai_preemptibility({LABEL: "preemptible"}, None, {}, SETTINGS)
    b = runai_preemptibility({"example.com/preemptible": "preemptible"}, None, {}, settings_b)
    assert a.why == f"label {LABEL}=preemptible"
    assert b.why == "label example.com/preemptible=preemptible"
    assert not runai_preemptibility({LABEL: "preemptible"}, None, {}, settings_b).preemptible


def test_the_memo_is_bounded() -> None:
    for i in range(3 * preemptibility._MEMO_LIMIT):
        cls = PriorityClassInfo(f"c{i}", i)
        runai_preemptibility({}, cls.name, {cls.name: cls}, SETTINGS)
    assert len(preemptibility._class_answers) <= preemptibility._MEMO_LIMIT


# -- unreviewed_owner's set lookup of the usual owners ----------------------------------------------

OWNER_REFS = [
    ("apps/v1", "ReplicaSet"), ("apps/v1beta2", "ReplicaSet"), ("v1", "Pod"), ("batch/v1", "Job"),
    ("batch/v1", "CronJob"), ("v1", "ReplicationController"), ("apps/v1", "DaemonSet"), ("v1", "ConfigMap"),
    ("apps/v1", "ControllerRevision"), ("rbac.authorization.k8s.io/v1", "Role"), ("ray.io/v1", "RayCluster"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet"), ("example.com/v1", "ReplicaSet"), ("v2", "Pod"), ("", "Pod"),
]  # fmt: skip


@pytest.mark.parametrize(("api_version", "kind"), OWNER_REFS)
def test_the_usual_owners_lookup_answers_as_the_full_read(api_version: str, kind: str) -> None:
    meta = {"ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": "o", "uid": "u"}]}
    owner = kai_owner(meta)
    assert owner is not None
    group = owner.group
    builtin = group in ("", "apps", "batch", "autoscaling", "policy") or (
        group.endswith(".k8s.io") and not group.endswith(".x-k8s.io")
    )
    expected_refused = builtin and (group, kind) not in REVIEWED_OWNERS
    assert (unreviewed_owner(meta) is not None) is expected_refused
