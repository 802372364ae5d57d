"""Rules S1-S3 compiled into admission policies (`core.admission_policies`), as the real apiserver
runs them, against the webhook's own decision (`core.scheduling.mutate_pod`), the reference.

A differential table: each pod is created (server-side dry run) in a project namespace where only
the compiled policies act, and, as the webhook alone would leave it, in a namespace no policy or
webhook selects: the pod the webhook reviews (after the apiserver's defaults and Priority plugin)
is patched by `mutate_pod` and created there. The stored pods must be identical, and so must the
refusals and their messages. The apiserver is the release KUBE_VERSION chooses; on 1.35 the
MutatingAdmissionPolicy beta is switched on (`admission_policy_args`). The policies are written in
the version its discovery serves. No chart is installed: these pods meet no webhook.
"""

from __future__ import annotations

import copy
import json
import re
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from tests.support.cluster import PRIORITY_CLASSES, SCHEDULER, cluster_state, namespace, priority_class
from tests.support.control_plane.cluster import KUBE_VERSION, ControlPlane, admission_policy_args, control_plane
from tests.support.reviews import apply_patch
from webhook.core.admission_policies import (
    GROUP,
    PARAMS_NAME,
    desired_objects,
    policy_params,
    served_mutating_version,
)
from webhook.core.namespace_plan import make_plan
from webhook.core.quota import validate_pod
from webhook.core.scheduling import mutate_pod
from webhook.snapshot import ADMISSION_POLICIES_LABEL, RUNAI_MOVE_ANNOTATION, RUNAI_QUEUE_LABEL, ClusterSnapshot

pytestmark = pytest.mark.slow

A100 = "nvidia.com/gpu.product=A100"
ZONE = "topology.kubernetes.io/zone=eu-1a"
REFERENCE = "reference"  # no project label: nothing selects its pods
# The label the leader sets once a namespace's parameters are written: the bindings select it.
POLICIES_ON = {ADMISSION_POLICIES_LABEL: "on"}
PROJECTS = [
    namespace("churn", labels=POLICIES_ON),
    namespace(
        "fraud",
        labels=POLICIES_ON,
        annotations={
            "scheduling.hopsworks.ai/available": json.dumps(
                {"affinity": [A100, ZONE], "antiAffinity": ["maintenance=true"], "priorityClasses": ["batch", "urgent"]}
            ),
            "scheduling.hopsworks.ai/defaults": json.dumps({"affinity": [A100, ZONE], "priorityClass": "urgent"}),
        },
    ),
]
# Projects of a cluster with Run:ai on (their parameters are written from those settings): bound,
# not bound yet, and bound but moving to another department.
RUNAI_PROJECTS = [
    namespace("vision", labels={**POLICIES_ON, RUNAI_QUEUE_LABEL: "vision"}),
    namespace("vision-unbound", labels=POLICIES_ON),
    namespace(
        "vision-moving",
        labels={**POLICIES_ON, RUNAI_QUEUE_LABEL: "vision-moving"},
        annotations={RUNAI_MOVE_ANNOTATION: "{}"},
    ),
]
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
AFF, ANTI = "scheduling.hopsworks.ai/affinity", "scheduling.hopsworks.ai/anti-affinity"


def _settings_of(ns: str) -> ClusterSnapshot:
    """The snapshot the webhook decides `ns`'s pods by, and the leader writes its parameters from."""
    if ns.startswith("vision"):
        return cluster_state(namespaces=RUNAI_PROJECTS, run_ai_enable=True).snapshot()
    return cluster_state(namespaces=PROJECTS).snapshot()


def _terms(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": list(terms)}}}}


def _expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


@dataclass(frozen=True)
class Pod:
    id: str
    spec: Mapping[str, Any] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    owners: list[dict[str, Any]] = field(default_factory=list)


PODS = [
    Pod("names nothing"),
    Pod("names an offered class", spec={"priorityClassName": "batch"}),
    Pod("names a class outside the subset", spec={"priorityClassName": "urgent"}),
    Pod("one own term", spec=_terms({"matchExpressions": [_expr("disk", "In", "ssd")]})),
    Pod(
        "two own terms, one by field",
        spec=_terms(
            {"matchExpressions": [_expr("disk", "In", "ssd")]},
            {"matchFields": [_expr("metadata.name", "In", "kwok-a1")]},
        ),
    ),
    Pod(
        "preferred affinity only",
        spec={
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 1, "preference": {"matchExpressions": [_expr("disk", "In", "ssd")]}}
                    ]
                }
            }
        },
    ),
    Pod(
        "pod affinity but no node affinity",
        spec={
            "affinity": {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}
                    ]
                }
            }
        },
    ),
    Pod("with labels", labels={"app": "x"}),
    Pod("17 own terms", spec=_terms(*({"matchExpressions": [_expr("disk", "In", f"d{i}")]} for i in range(17)))),
    Pod("9 own terms", spec=_terms(*({"matchExpressions": [_expr("disk", "In", f"d{i}")]} for i in range(9)))),
    Pod(
        "an own term that already has the defaults",
        spec=_terms({"matchExpressions": [_expr("maintenance", "NotIn", "true"), _expr("disk", "In", "ssd")]}),
    ),
    Pod("chooses an offered label", annotations={AFF: ZONE}),
    Pod("chooses two keys, a repeat and spaces", annotations={AFF: f" {ZONE} , disk=ssd,,{ZONE} , disk = ssd"}),
    Pod("chooses a label outside the subset", annotations={AFF: "disk=hdd, " + ZONE}),
    Pod("chooses an empty list", annotations={AFF: " , "}),
    Pod("chooses anti-affinity only", annotations={ANTI: "maintenance=true"}),
    Pod("chooses anti-affinity outside the subset", annotations={ANTI: "maintenance=false"}),
    Pod("an unreadable choice", annotations={AFF: "zone-eu"}),
    Pod("a choice of more than 4096 characters", annotations={AFF: "disk=ssd," * 500}),
    Pod(
        "a choice and own terms",
        spec=_terms({"matchExpressions": [_expr("disk", "In", "ssd")]}),
        annotations={AFF: f"{ZONE},disk=ssd"},
    ),
    Pod(
        "both choices unreadable and a class outside the subset",
        spec={"priorityClassName": "urgent"},
        annotations={AFF: "=x", ANTI: "nothing"},
    ),
    Pod(
        "17 own terms and a class outside the subset",
        spec={
            **_terms(*({"matchExpressions": [_expr("disk", "In", f"d{i}")]} for i in range(17))),
            "priorityClassName": "urgent",
        },
    ),
]


def _owned_by(api_version: str, kind: str, controller: bool = True) -> list[dict[str, Any]]:
    return [{"apiVersion": api_version, "kind": kind, "name": "owner",
             "uid": "6d5f2a7e-1111-4c1e-9a8e-0123456789ab", "controller": controller}]  # fmt: skip


# S5 with Run:ai on: the kind decides the labels (core.kinds.pod_kind, core.preemptibility.runai_labels).
RUNAI_PODS = [
    Pod("a notebook by its label", labels={"jupyter": "lab"}),
    Pod("an app by the workload-type label", labels={"hopsworks.ai/workload-type": "app"}),
    Pod("a label cannot make a job", labels={"hopsworks.ai/workload-type": "job"}),
    Pod("a Job's pod", owners=_owned_by("batch/v1", "Job")),
    Pod("a system job's pod", labels={"job-type": "materialization"}, owners=_owned_by("batch/v1", "Job")),
    Pod(
        "a Job's pod by the workload-type label",
        labels={"hopsworks.ai/workload-type": "system-job"},
        owners=_owned_by("batch/v1", "Job"),
    ),
    Pod("a Job first but not the controller", owners=_owned_by("batch/v1", "Job", controller=False)),
    Pod("a ReplicaSet's pod", labels={"serving.hops.works/id": "7"}, owners=_owned_by("apps/v1", "ReplicaSet")),
    Pod(
        "another queue and preemptibility, overwritten",
        labels={RUNAI_QUEUE_LABEL: "someone-else", "kai.scheduler/preemptibility": "preemptible"},
    ),
]


def _manifest(pod: Pod, name: str, ns: str) -> dict[str, Any]:
    spec = {"containers": [{"name": "main", "image": "busybox"}], "automountServiceAccountToken": False}
    spec.update(copy.deepcopy(dict(pod.spec)))
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if pod.labels:
        meta["labels"] = dict(pod.labels)
    if pod.annotations:
        meta["annotations"] = dict(pod.annotations)
    if pod.owners:
        meta["ownerReferences"] = copy.deepcopy(pod.owners)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _call(cp: ControlPlane, method: str, path: str, body: Any, content_type: str = "application/json") -> Any:
    """One call over HTTPS as the admin, without a kubectl process: the timing test needs the resolution."""
    config = yaml.safe_load(cp.admin_kubeconfig.read_text())
    user = config["users"][0]["user"]
    context = ssl.create_default_context(cafile=str(cp.pki.ca_file))
    context.load_cert_chain(user["client-certificate"], user["client-key"])
    request = urllib.request.Request(
        f"{cp.url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": content_type}, method=method
    )
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        return json.loads(response.read())


def _create(cp: ControlPlane, pod: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The pod the apiserver would store (a server-side dry run), or None and its refusal message."""
    try:
        return _call(cp, "POST", f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods?dryRun=All", pod), ""
    except urllib.error.HTTPError as error:
        message = json.loads(error.read()).get("message", "")
        match = re.search(r"denied request: (.*)$", message)
        return None, match.group(1) if match else message


def _stored(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What two stored pods of different namespaces must share."""
    meta = pod["metadata"]
    return {
        "labels": meta.get("labels"),
        "annotations": meta.get("annotations"),
        "spec": pod["spec"],
    }


def _served(cp: ControlPlane) -> dict[str, list[str]]:
    served: dict[str, list[str]] = {}
    for version in ("v1", "v1beta1", "v1alpha1"):
        result = cp.kubectl("get", "--raw", f"/apis/{GROUP}/{version}", check=False)
        if result.returncode == 0:
            served[f"{GROUP}/{version}"] = [r["kind"] for r in json.loads(result.stdout)["resources"]]
    return served


def _write_params(cp: ControlPlane, snapshot: ClusterSnapshot) -> None:
    """The parameter ConfigMaps the leader would write for `snapshot`."""
    cp.apply([o for o in desired_objects(snapshot, "v1") if o["kind"] == "ConfigMap"])


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with control_plane(tmp_path_factory.mktemp("policies-cp"), apiserver_args=admission_policy_args()) as plane:
        plane.apply([priority_class(n, v, p, g) for n, v, p, g in PRIORITY_CLASSES])
        plane.apply([*PROJECTS, *RUNAI_PROJECTS, namespace(REFERENCE, project=False),
                     namespace("unparametrised", labels=POLICIES_ON)])  # fmt: skip
        version = served_mutating_version(_served(plane))
        # GA (v1) from 1.36; 1.35 serves the beta once switched on.
        assert version == ("v1beta1" if admission_policy_args() else "v1"), (KUBE_VERSION, _served(plane))
        plane.apply(desired_objects(cluster_state(namespaces=PROJECTS).snapshot(), version))
        _write_params(plane, _settings_of("vision"))
        deadline = time.monotonic() + 60
        for ns in (*PROJECTS, *RUNAI_PROJECTS, namespace(REFERENCE, project=False)):  # ServiceAccount admission
            while plane.kubectl("get", "sa", "default", "-n", ns["metadata"]["name"], check=False).returncode:
                assert time.monotonic() < deadline, "no default ServiceAccount"
                time.sleep(0.2)
        _wait_policies_active(plane)
        yield plane


def _wait_policies_active(cp: ControlPlane) -> None:
    """The apiserver loads each policy and binding from its informers, the validating ones apart
    from the mutating ones: wait until a pod is mutated and one the mutation marks is refused."""
    deadline = time.monotonic() + 30
    while True:
        stored, _ = _create(cp, _manifest(Pod("probe"), "probe", "churn"))
        outside, message = _create(cp, _manifest(Pod("probe", spec={"priorityClassName": "urgent"}), "probe", "churn"))
        if (
            stored is not None
            and stored["spec"].get("priorityClassName") == "normal"
            and outside is None
            and "not available" in message
        ):
            return
        assert time.monotonic() < deadline, f"policies never applied: {stored}, {outside}, {message}"
        time.sleep(0.2)


def _through_webhook(
    cp: ControlPlane, pod: Pod, ns: str, snapshot: ClusterSnapshot
) -> tuple[dict[str, Any] | None, str]:
    """What the webhook alone makes of `pod` in `ns`: the stored pod, or its refusal message."""
    reviewed, message = _create(cp, _manifest(pod, "webhook", REFERENCE))  # defaults and Priority, as reviewed
    assert reviewed is not None, message
    reviewed["metadata"]["namespace"] = ns
    request = {
        "uid": "1",
        "operation": "CREATE",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": ns,
        "object": reviewed,
    }
    decision = mutate_pod(request, snapshot)
    if not decision.allowed:
        return None, decision.message
    patched = apply_patch(reviewed, list(decision.patch or ()))
    validated = validate_pod({**request, "object": patched}, snapshot)  # the validating phase, on what was mutated
    if not validated.allowed:
        return None, validated.message
    patched["metadata"]["namespace"] = REFERENCE
    for key in ("uid", "creationTimestamp", "resourceVersion"):
        patched["metadata"].pop(key, None)
    return _create(cp, patched)


CASES = [
    *((ns["metadata"]["name"], pod) for ns in PROJECTS for pod in PODS),
    *(("vision", pod) for pod in (*PODS, *RUNAI_PODS)),
    *(("vision-unbound", pod) for pod in PODS[:3]),
    *(("vision-moving", pod) for pod in PODS[:3]),
]
# The cases both sides must refuse: the table holds refusals, not only admissions that agree.
REFUSED = {
    ("churn", "names a class outside the subset"),
    ("churn", "17 own terms"),
    ("fraud", "17 own terms"),
    ("fraud", "9 own terms"),  # 9 terms x 2 affinity keys
    ("churn", "17 own terms and a class outside the subset"),  # both refusals, joined
    ("fraud", "17 own terms and a class outside the subset"),
    ("vision", "names a class outside the subset"),
    ("vision", "17 own terms"),
    ("vision", "17 own terms and a class outside the subset"),
    *(
        (ns, pod)
        for ns in ("churn", "fraud", "vision")
        for pod in (
            "chooses a label outside the subset",
            "chooses anti-affinity outside the subset",
            "an unreadable choice",
            "a choice of more than 4096 characters",
            "both choices unreadable and a class outside the subset",
            "chooses two keys, a repeat and spaces",  # "disk = ssd" is an item, spaces and all: offered nowhere
        )
    ),
    ("fraud", "a choice and own terms"),  # disk=ssd is not offered there
    # Not bound: held before any rule. Moving: the rules' refusal first, else the move's.
    *(("vision-unbound", pod.id) for pod in PODS[:3]),
    *(("vision-moving", pod.id) for pod in PODS[:3]),
}


@pytest.mark.parametrize(("ns", "pod"), CASES, ids=[f"{ns}: {pod.id}" for ns, pod in CASES])
def test_compiled_policies_store_what_the_webhook_would(cp: ControlPlane, ns: str, pod: Pod) -> None:
    snapshot = _settings_of(ns)
    expected, expected_message = _through_webhook(cp, pod, ns, snapshot)
    stored, message = _create(cp, _manifest(pod, "policy", ns))
    assert message == expected_message
    assert (expected is None) == ((ns, pod.id) in REFUSED), expected_message
    if expected is not None:
        assert stored is not None
        assert _stored(stored) == _stored(expected)


def test_a_project_without_parameters_is_refused_naming_the_cause(cp: ControlPlane) -> None:
    """Fail closed: the binding denies when a namespace it selects has no parameter ConfigMap."""
    stored, message = _create(cp, _manifest(Pod("plain"), "plain", "unparametrised"))
    assert stored is None
    assert "no params found" in message or PARAMS_NAME in message, message


def _class_of_next_pod(cp: ControlPlane, ns: str) -> str | None:
    stored, message = _create(cp, _manifest(Pod("next"), "next", ns))
    assert stored is not None, message
    name = stored["spec"].get("priorityClassName")
    return None if name is None else str(name)


def test_a_changed_default_takes_effect_soon_then_stays(cp: ControlPlane, pytestconfig: pytest.Config) -> None:
    """Settings change while pods are created: the apiserver reads parameters from its informer,
    so the pods switch to the new default some time after the write (eventually consistent), and
    from the first pod that has it, every later pod has it too (stable)."""
    assert _class_of_next_pod(cp, "churn") == "normal"
    changed: dict[str, Any] = copy.deepcopy(SCHEDULER)
    changed["defaults"]["priorityClass"] = "batch"
    created: list[tuple[float, float, str | None]] = []  # (sent, answered, class)
    stop = threading.Event()

    def create_pods() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            created.append((sent, time.monotonic(), _class_of_next_pod(cp, "churn")))

    creator = threading.Thread(target=create_pods)
    creator.start()
    try:
        time.sleep(0.5)
        snapshot = cluster_state(namespaces=PROJECTS, scheduler=changed).snapshot()
        data = policy_params(make_plan(snapshot.namespaces["churn"], snapshot), None)
        write_sent = time.monotonic()
        path = f"/api/v1/namespaces/churn/configmaps/{PARAMS_NAME}"
        _call(cp, "PATCH", path, {"data": data}, "application/merge-patch+json")
        write_done = time.monotonic()
        deadline = write_done + 30
        while not any(c == "batch" for _, _, c in created):
            assert time.monotonic() < deadline, "the new default never applied"
            time.sleep(0.05)
        time.sleep(1.0)
    finally:
        stop.set()
        creator.join()
        _write_params(cp, cluster_state(namespaces=PROJECTS).snapshot())
    classes = [c for _, _, c in created]
    first_new = classes.index("batch")
    assert set(classes[:first_new]) == {"normal"}
    # Stable: no pod after the first with the new default goes back to the old one.
    assert set(classes[first_new:]) == {"batch"}, classes
    assert len(classes) - first_new >= 5
    last_old_sent = max((sent for sent, _, c in created if c == "normal"), default=write_sent)
    first_new_sent = created[first_new][0]
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"compiled policies: parameter write took {write_done - write_sent:.3f} s; last pod with the old default "
            f"sent {last_old_sent - write_done:+.3f} s and first with the new one {first_new_sent - write_done:+.3f} s "
            f"after it returned; {len(classes)} pods, {len(classes) - first_new} with the new default"
        )


def test_a_default_moved_out_of_the_subset_refuses_no_pod_while_the_change_lands(cp: ControlPlane) -> None:
    """An operator makes `batch` the default and takes `normal` out of the subset, and back, while
    pods that choose nothing are created. Each policy reads the parameters from the apiserver's
    informer at its own moment; a pod whose default was written from the parameters of before must
    not be judged by those of after. Flipped many times under concurrent creations, the window
    between the two readings is hit: with the class judged again by the validating policy, pods
    were refused "priority class normal not available"."""
    moved: dict[str, Any] = copy.deepcopy(SCHEDULER)
    moved["project"]["priorityClasses"] = ["batch"]
    moved["defaults"]["priorityClass"] = "batch"
    states = []
    for scheduler in (SCHEDULER, moved):
        snapshot = cluster_state(namespaces=PROJECTS, scheduler=scheduler).snapshot()
        states.append(policy_params(make_plan(snapshot.namespaces["churn"], snapshot), None))
    assert states[0]["allowedPriorityClasses"] == "batch,normal" and states[1]["allowedPriorityClasses"] == "batch"
    classes: list[str | None] = []
    refused: list[str] = []
    stop = threading.Event()

    def create_pods() -> None:
        while not stop.is_set():
            stored, message = _create(cp, _manifest(Pod("plain"), "plain", "churn"))
            if stored is None:
                refused.append(message)
            else:
                classes.append(stored["spec"].get("priorityClassName"))

    creators = [threading.Thread(target=create_pods) for _ in range(4)]
    for creator in creators:
        creator.start()
    path = f"/api/v1/namespaces/churn/configmaps/{PARAMS_NAME}"
    try:
        for flip in range(60):
            _call(cp, "PATCH", path, {"data": states[flip % 2]}, "application/merge-patch+json")
            time.sleep(0.05)
    finally:
        stop.set()
        for creator in creators:
            creator.join()
        _write_params(cp, cluster_state(namespaces=PROJECTS).snapshot())
    assert refused == [], (len(refused), len(classes), refused[:3])
    assert {"normal", "batch"} <= set(classes), set(classes)  # both states were in force
