"""The scheduling offer (`GET /api/v1/projects/{namespace}/scheduling`) and admission agree.

Table tests for `scheduling_offer` (choices, defaults, the level each default came from), then the
proof of agreement: every value the offer lists is admitted by pod mutation, every value outside it
is refused, and a pod that chooses nothing gets the offer's defaults — once on the pure decision,
once over HTTPS (the offer read with the Python client, the pods sent as AdmissionReviews).
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.support.apps import cache_app
from tests.support.cluster import (
    SCHEDULER,
    cluster_queue,
    cluster_state,
    kueue_setup,
    local_queue,
    namespace,
    resource_flavor,
    topology,
)
from tests.support.https import StartHttpsServer
from tests.support.kube_scope import KubeScope
from tests.support.reviews import admitted_labels, apply_patch, assert_valid_pod, owned_by, pod_review
from webhook.client import Forbidden, GpuApiError, GpuClient, NotFound, SchedulingOfferView
from webhook.core.gpu_view import project_gpu_view
from webhook.core.offer import scheduling_offer
from webhook.core.offer_view import gpu_offer, offer_view
from webhook.core.preemptibility import admitted_preemptibility
from webhook.core.quota import validate_pod
from webhook.core.scheduling import mutate_pod
from webhook.http.auth import KubeAuthorizer
from webhook.http.gpu_api import GpuViews
from webhook.http.scheduling_api import scheduling_routes
from webhook.kube.api import KubeApi
from webhook.runai.models import NodePool, Project
from webhook.runai.records import runai_data
from webhook.snapshot import RunaiProjectInfo
from webhook.state.store import ClusterState

ZONE = "topology.kubernetes.io/zone=eu-1a"
A100 = "nvidia.com/gpu.product=A100"
SSD = "disk=ssd"
AV = "scheduling.hopsworks.ai/available"
DF = "scheduling.hopsworks.ai/defaults"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TOPOLOGY = "scheduling.hopsworks.ai/topology"
SCHEDULER_UNITS = {
    "host": "kubernetes.io/hostname",
    "zone": "topology.kubernetes.io/zone",
    "region": "topology.kubernetes.io/region",
}
REQUIRED = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")

NAMESPACES = [
    namespace("churn"),  # the cluster's project subset and defaults
    namespace(
        "fraud",  # its own subset and defaults
        annotations={
            AV: json.dumps(
                {"affinity": [A100, ZONE], "priorityClasses": ["batch", "urgent"], "queues": ["gpu", "cpu"]}
            ),
            DF: json.dumps({"affinity": [A100], "priorityClass": "urgent", "queue": "gpu", "topology": "host"}),
        },
    ),
    namespace("broken", annotations={AV: "{not json"}),  # ignored, with a note: the cluster's subset applies
]
# Queue `team` of churn goes to a ClusterQueue whose only flavor is placed by a Topology of hosts only.
QUEUES = [
    *kueue_setup(),
    topology("hosts", ["kubernetes.io/hostname"]),
    resource_flavor("hosts", "hosts"),
    cluster_queue("cq-hosts", ["hosts"], cohort="research", usage={"hosts": {"cpu": "4"}}, pending=2),
    local_queue("churn", "default"),
    local_queue("churn", "team", "cq-hosts", pendingWorkloads=1),
    local_queue("fraud", "gpu"),
    local_queue("broken", "default"),
]


def state(names: Mapping[str, str] | None = None, **flat: Any) -> ClusterState:
    """The cluster of these tests; `names` renames its project namespaces (churn, fraud, broken)."""
    objects = [*NAMESPACES, *QUEUES]
    if names:
        text = json.dumps(objects)
        for old, new in names.items():
            text = text.replace(json.dumps(old), json.dumps(new))
        objects = json.loads(text)
    projects = [o for o in objects if o["kind"] == "Namespace"]
    return cluster_state(namespaces=projects, extra=[o for o in objects if o["kind"] != "Namespace"], **flat)


def offer_of(st: ClusterState, name: str, kind: str | None = None) -> SchedulingOfferView:
    snap = st.snapshot()
    ns = snap.namespaces[name]
    return offer_view(scheduling_offer(ns, snap), snap, project_gpu_view(ns, snap, None, 0), kind)


# ---- the offer, as a table -------------------------------------------------------------------------

OFFER_CASES = [
    # (id, settings, namespace, kind, expected fields of the answer)
    ("cluster subset and defaults", {}, "churn", None, {
        "affinity": {"choices": [ZONE, SSD], "default": [], "level": "cluster"},
        "anti_affinity": {"choices": ["maintenance=true"], "default": ["maintenance=true"], "level": "cluster"},
        "priority_class": {"choices": [{"name": "batch", "value": 1000, "preemption_policy": "Never"},
                                       {"name": "normal", "value": 10000,
                                        "preemption_policy": "PreemptLowerPriority"}],
                           "default": "normal", "level": "cluster"},
        "kueue_enabled": False, "queue": None, "topology": None, "notes": []}),
    ("project subset and defaults", {}, "fraud", None, {
        "affinity": {"choices": [A100, ZONE], "default": [A100], "level": "project"},
        "anti_affinity": {"choices": ["maintenance=true"], "default": ["maintenance=true"], "level": "cluster"},
        "priority_class": {"choices": [{"name": "batch", "value": 1000, "preemption_policy": "Never"},
                                       {"name": "urgent", "value": 100000,
                                        "preemption_policy": "PreemptLowerPriority"}],
                           "default": "urgent", "level": "project"}}),
    ("kueue: the namespace's LocalQueues, the cluster's default queue", {"kueue_installed": True}, "churn", None, {
        "kueue_enabled": True,
        "queue": {"choices": ["default", "team"], "existing": ["default", "team"], "default": "default",
                  "level": "cluster", "unavailable": [], "default_refused": None},
        "topology": {"choices": [{"name": "host", "node_label": "kubernetes.io/hostname"},
                                 {"name": "zone", "node_label": "topology.kubernetes.io/zone"},
                                 {"name": "region", "node_label": "topology.kubernetes.io/region"}],
                     "default": None, "level": None}}),
    ("kueue: the project's queues and defaults", {"kueue_installed": True}, "fraud", "notebook", {
        "queue": {"choices": ["gpu"], "existing": ["gpu"], "unavailable": ["cpu"], "default": "gpu",
                  "level": "project", "default_refused": None},
        "topology": {"default": "host", "level": "project"}}),
    ("kueue: system jobs get the system queue", {"kueue_installed": True}, "fraud", "system-job", {
        "queue": {"choices": ["gpu"], "existing": ["gpu"], "default": "system", "level": "cluster",
                  "default_refused": None},
        "topology": {"choices": [], "default": None}}),
    ("kueue and run:ai both on: run:ai's queue wins, no queue choice", {"kueue_installed": True,
                                                                         "run_ai_enable": True}, "churn", None, {
        "kueue_enabled": False, "queue": None, "topology": None}),
    ("broken project settings: cluster subset, with a note", {}, "broken", None, {
        "affinity": {"choices": [ZONE, SSD], "default": [], "level": "cluster"}}),
]  # fmt: skip


def _subset(actual: Any, expected: Any) -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), actual
        for key, value in expected.items():
            _subset(actual[key], value)
    else:
        assert actual == expected


@pytest.mark.parametrize(("settings", "name", "kind", "expected"), [pytest.param(*c[1:], id=c[0]) for c in OFFER_CASES])
def test_offer(settings: dict[str, Any], name: str, kind: str | None, expected: dict[str, Any]) -> None:
    st = state(kueue_system_jobs_local_queue="system", **settings)
    _subset(offer_of(st, name, kind).model_dump(mode="json"), expected)


def test_broken_project_settings_are_named_in_the_notes_admission_warns_with() -> None:
    st = state()
    notes = offer_of(st, "broken").notes
    assert len(notes) == 1 and notes[0].startswith("project scheduling settings ignored:") and AV in notes[0]
    decision = mutate_pod(pod_review("broken")["request"], st.snapshot())
    assert decision.allowed and list(decision.warnings) == notes


def test_unknown_kind_is_a_value_error_naming_the_kinds() -> None:
    with pytest.raises(ValueError, match="known: notebook, terminal"):
        offer_of(state(), "churn", "spark")


# ---- GPUs: the offer follows the GPU view, admission follows the same quota -------------------------


def _runai_project(name: str, deserved: float) -> Project:
    return Project.from_api(
        {
            "id": f"id-{name}",
            "name": name,
            "clusterId": "c1",
            "parentId": "d1",
            "requestedNamespace": name,
            "resources": [{"nodePool": {"id": "p1", "name": "default"}, "gpu": {"deserved": deserved}}],
            "status": {"phase": "Ready", "namespace": name},
        }
    )


GPU_CASES = [
    # (id, bound, Run:ai project's deserved GPUs (None: Run:ai has no such project), kind, GPUs allowed)
    ("no-quota-notebook", True, 0, "notebook", False),
    ("quota-notebook", True, 2, "notebook", True),
    ("no-quota-job", True, 0, "job", True),
    ("no-quota-unrecognised-pod", True, 0, None, False),
    ("quota-unrecognised-pod", True, 2, None, True),
    ("not-bound-notebook", False, 2, "notebook", False),
    ("not-bound-job", False, 2, "job", False),
    ("project-missing-in-runai", True, None, "notebook", False),
]


@pytest.mark.parametrize(("bound", "deserved", "kind", "allowed"), [pytest.param(*c[1:], id=c[0]) for c in GPU_CASES])
def test_gpus_are_offered_exactly_when_admission_admits_a_gpu(
    bound: bool, deserved: float | None, kind: str | None, allowed: bool
) -> None:
    ns = namespace("gpu", labels={"runai/queue": "gpu"} if bound else {})
    st = cluster_state(namespaces=[ns], run_ai_enable=True)
    snap = st.snapshot()
    projects = [_runai_project("gpu", deserved)] if deserved is not None else []
    snap.runai_reachable = True
    snap.runai_missing = {"gpu": "gpu"} if bound and deserved is None else {}  # the refresh saw it gone
    snap.runai_projects = {
        p.name: RunaiProjectInfo(id=p.id, name=p.name, namespace=p.name, deserved_gpus=p.gpu_quota) for p in projects
    }
    pools = [NodePool.from_api({"id": "p1", "name": "default", "clusterId": "c1", "isDefault": True})]
    data = runai_data(reachable=True, projects=projects, departments=[], node_pools=pools)
    seen = admitted_preemptibility(kind, {}, None, snap.priority_classes, snap.settings)
    offer = gpu_offer(project_gpu_view(snap.namespaces["gpu"], snap, data, 0), kind, seen)
    assert offer.allowed is allowed, offer
    labels = {"hopsworks.ai/workload-type": kind} if kind else {}
    if bound:
        labels.update({"runai/queue": "gpu", **admitted_labels(kind)})  # as the mutating webhook set them (S5)
    owners = owned_by("Job") if kind in ("job", "system-job") else None  # what makes a job
    decision = validate_pod(pod_review("gpu", labels=labels, gpus=1, owners=owners)["request"], snap, 0)
    assert decision.allowed is allowed, decision.message
    assert offer.quota_checked is (bound and deserved is not None and kind in ("notebook", None))


def test_gpus_with_runai_off_are_kubernetes_to_schedule() -> None:
    offer = offer_of(state(), "churn").gpus
    assert offer.allowed and not offer.quota_checked and offer.status == "RUN_AI_DISABLED"


# ---- agreement: each offered value admitted, each other value refused ------------------------------

Decide = Callable[[dict[str, Any]], Awaitable[tuple[bool, str, dict[str, Any]]]]


def outside(offered: list[str], universe: list[str], made_up: str) -> list[str]:
    return [v for v in universe if v not in offered] + [made_up]


async def assert_agreement(offer: SchedulingOfferView, decide: Decide, universe: dict[str, list[str]]) -> int:
    """Ask `decide` (admission) about every offered value and values outside the offer; returns how
    many reviews were decided."""
    ns = offer.namespace
    asked = 0

    async def ask(**fields: Any) -> tuple[bool, str, dict[str, Any]]:
        nonlocal asked
        asked += 1
        return await decide(pod_review(ns, **fields))

    # A pod that chooses nothing gets the offer's defaults.
    allowed, message, pod = await ask()
    assert allowed, message
    assert pod["spec"].get("priorityClassName") == offer.priority_class.default
    required = pod["spec"].get("affinity", {}).get("nodeAffinity", {})
    terms = required.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    expressions = [e for t in terms for e in t["matchExpressions"]]
    for label in offer.affinity.default:
        key, _, value = label.partition("=")
        assert {"key": key, "operator": "In", "values": [value]} in expressions
    for label in offer.anti_affinity.default:
        key, _, value = label.partition("=")
        assert {"key": key, "operator": "NotIn", "values": [value]} in expressions
    if offer.queue is not None and offer.topology is not None:
        assert pod["metadata"]["labels"][QUEUE_LABEL] == offer.queue.default
        units = {t.name: t.node_label for t in offer.topology.choices}
        topology = pod["metadata"].get("annotations", {}).get("kueue.x-k8s.io/podset-required-topology")
        assert topology == (units[offer.topology.default] if offer.topology.default else None)

    for annotation, choices, what in (
        ("scheduling.hopsworks.ai/affinity", offer.affinity.choices, "affinity"),
        ("scheduling.hopsworks.ai/anti-affinity", offer.anti_affinity.choices, "antiAffinity"),
    ):
        for value in choices:
            allowed, message, pod = await ask(annotations={annotation: value})
            assert allowed, (what, value, message)
            assert_valid_pod(pod)
        for value in outside(choices, universe[what], "made-up=1"):
            allowed, message, _ = await ask(annotations={annotation: value})
            assert not allowed, (what, value)
            assert f"allowed: {', '.join(choices) or 'none'}" in message, message

    names = [c.name for c in offer.priority_class.choices]
    for choice in offer.priority_class.choices:
        allowed, message, pod = await ask(spec={"priorityClassName": choice.name})
        assert allowed, (choice, message)
        assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == (choice.name, choice.value)
    for name in outside(names, universe["priorityClasses"], "made-up"):
        allowed, message, _ = await ask(spec={"priorityClassName": name})
        assert not allowed, name
        assert f"allowed: {', '.join(names)}" in message, message

    if offer.queue is not None and offer.topology is not None:
        for queue in offer.queue.choices:
            allowed, message, pod = await ask(labels={QUEUE_LABEL: queue})
            assert allowed and pod["metadata"]["labels"][QUEUE_LABEL] == queue, message
        for queue in outside(offer.queue.choices, universe["queues"], "made-up"):
            allowed, message, _ = await ask(labels={QUEUE_LABEL: queue})
            # Outside the project's queues, or listed for it but no LocalQueue of the namespace.
            assert not allowed and ("allowed:" in message or "LocalQueues there:" in message), (queue, message)
        for unit in offer.topology.choices:
            allowed, message, pod = await ask(annotations={"scheduling.hopsworks.ai/topology": unit.name})
            assert allowed, message
            assert pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] == unit.node_label
        allowed, message, _ = await ask(annotations={"scheduling.hopsworks.ai/topology": "made-up"})
        assert not allowed and "not a topology unit" in message
    return asked


UNIVERSE = {
    "affinity": [A100, ZONE, SSD],
    "antiAffinity": ["maintenance=true"],
    "priorityClasses": ["batch", "normal", "urgent"],
    "queues": ["default", "team", "gpu", "cpu", "system"],
}
SETTINGS = [{}, {"kueue_installed": True}]


def pure_decide(st: ClusterState) -> Decide:
    async def decide(review: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
        decision = mutate_pod(review["request"], st.snapshot())
        pod = apply_patch(review["request"]["object"], list(decision.patch)) if decision.allowed else {}
        return decision.allowed, decision.message, pod

    return decide


@pytest.mark.parametrize("settings", SETTINGS, ids=["kueue-off", "kueue-on"])
@pytest.mark.parametrize("name", ["churn", "fraud", "broken"])
async def test_admission_admits_exactly_the_offer(settings: dict[str, Any], name: str) -> None:
    st = state(**settings)
    assert await assert_agreement(offer_of(st, name), pure_decide(st), UNIVERSE) > 10


# ---- the same over HTTPS: the API read by the Python client, admission as the apiserver asks -------


@dataclass
class Served:
    base_url: str
    ca_file: str
    post: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
    names: dict[str, str]  # the projects' names in the real cluster: churn, fraud
    alice: str  # the token of a member of both
    bob: str  # the token of a member of neither


async def serve_offers(
    https_server: StartHttpsServer, scope: KubeScope, st: ClusterState
) -> AsyncIterator[tuple[str, str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]]]:
    """The scheduling API over `st`, its callers authenticated and authorized by the real apiserver
    (TokenReview, SubjectAccessReview) as the webhook's ServiceAccount asks them."""
    for kind in st.synced:
        st.synced[kind] = True
    api_client = await scope.webhook_api_client()
    try:
        routes = scheduling_routes(GpuViews(st, None), KubeAuthorizer(KubeApi(api_client, scope.install_ns)))
        srv = await https_server(cache_app(st, routes=routes))

        async def post(review: dict[str, Any]) -> dict[str, Any]:
            async with srv.session.post(srv.url("/mutate/pods"), json=review) as resp:
                assert resp.status == 200
                return await resp.json()

        # The serving certificate names 127.0.0.1 too; the client verifies it against the test CA.
        yield f"https://127.0.0.1:{srv.port}", str(srv.certs.ca_file), post
    finally:
        await api_client.close()


@pytest.fixture
async def served(https_server: StartHttpsServer, kube_scope: KubeScope) -> AsyncIterator[Served]:
    names = {name: await kube_scope.namespace(name) for name in ("churn", "fraud")}
    alice, alice_token = await kube_scope.user_token("alice")
    for name in names.values():
        await kube_scope.allow(alice, "get", "pods", name)
    _, bob_token = await kube_scope.user_token("bob")
    async for base_url, ca_file, post in serve_offers(https_server, kube_scope, state(names, kueue_installed=True)):
        yield Served(base_url, ca_file, post, names, alice_token, bob_token)


async def test_offer_over_https_agrees_with_admission_over_https(served: Served) -> None:
    async def decide(review: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
        response = (await served.post(review))["response"]
        if not response["allowed"]:
            return False, response["status"]["message"], {}
        patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
        return True, "", apply_patch(review["request"]["object"], patch)

    async with GpuClient(served.base_url, served.alice, served.ca_file) as client:
        for name in served.names.values():
            offer = await client.get_scheduling_offer(name, kind="notebook")
            assert offer.kueue_enabled and offer.queue is not None
            assert await assert_agreement(offer, decide, UNIVERSE) > 10


async def test_offer_is_for_project_members_only(served: Served) -> None:
    churn = served.names["churn"]
    async with GpuClient(served.base_url, served.bob, served.ca_file) as client:
        with pytest.raises(Forbidden):
            await client.get_scheduling_offer(churn)
    async with GpuClient(served.base_url, served.alice, served.ca_file) as client:
        with pytest.raises(GpuApiError) as bad_kind:
            await client.get_scheduling_offer(churn, kind="spark")
        assert bad_kind.value.status == 400 and "known: notebook" in bad_kind.value.reason
    # A namespace alice may not read is a 403 before any lookup, as for the GPU view.
    async with GpuClient(served.base_url, served.alice, served.ca_file) as client:
        with pytest.raises(Forbidden):
            await client.get_scheduling_offer("kube-public")


async def test_not_a_project_is_404_for_someone_who_may_look(
    https_server: StartHttpsServer, kube_scope: KubeScope
) -> None:
    _, root_token = await kube_scope.admin_token("root")
    async for base_url, ca_file, _ in serve_offers(https_server, kube_scope, state()):
        async with GpuClient(base_url, root_token, ca_file) as client:
            for name in ("hopsworks", "nowhere", "Not_A_Name"):
                with pytest.raises(NotFound):
                    await client.get_scheduling_offer(name)


def test_scheduler_fixture_is_what_the_universe_covers() -> None:
    assert set(SCHEDULER["available"]["affinity"]) == set(UNIVERSE["affinity"])


async def test_workload_choices_as_query_parameters(served: Served) -> None:
    ssl_context = ssl.create_default_context(cafile=served.ca_file)
    headers = {"Authorization": f"Bearer {served.alice}"}
    url = f"{served.base_url}/api/v1/projects/{served.names['fraud']}/scheduling"
    async with aiohttp.ClientSession(headers=headers) as session:

        async def get(**query: str) -> tuple[int, dict[str, Any]]:
            async with session.get(url, params=query, ssl=ssl_context) as resp:
                return resp.status, await resp.json()

        status, body = await get(kind="notebook")
        assert status == 200 and body["workload"] is None  # no choices: the answer as before
        status, body = await get(kind="notebook", affinity=ZONE, queue="gpu", priorityClass="batch")
        assert status == 200, body
        workload = body["workload"]
        assert workload["affinity"] == {"value": [ZONE], "level": "workload"}
        assert workload["anti_affinity"] == {"value": ["maintenance=true"], "level": "cluster"}
        assert workload["priority_class"] == {"value": "batch", "level": "workload"}
        assert workload["queue"] == {"value": "gpu", "level": "workload"}
        assert workload["topology"] == {"value": "host", "level": "project"}
        assert workload["errors"] == []
        status, body = await get(topology="rack")
        assert status == 200 and body["workload"]["errors"] == [
            "topology rack is not a topology unit; allowed: host, zone, region"
        ]
        status, body = await get(affinity="no-equals-sign")
        assert status == 400 and "affinity" in str(body), body
        status, body = await get(queue="q" * 300)
        assert status == 400 and "queue: 300 characters" in str(body), body


# ---- per queue: what its ClusterQueue holds, and the units it can place -----------------------------


def test_each_queue_shows_what_its_cluster_queue_holds() -> None:
    queue = offer_of(state(kueue_installed=True), "churn").queue
    assert queue is not None
    views = {v.name: v.model_dump(mode="json") for v in queue.queues}
    assert views["default"] == {
        "name": "default", "cluster_queue": "cq", "cohort": None, "active": True,
        "pending_workloads": 0, "admitted_workloads": 0, "local_pending_workloads": 0,
        "flavors": [{"name": "default", "topology": "default", "usage": {}, "borrowed": {},
                     "nominal_quota": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "8"}}],
        "topologies": ["host", "zone", "region"], "problems": [],
    }  # fmt: skip
    assert views["team"]["cluster_queue"] == "cq-hosts" and views["team"]["cohort"] == "research"
    assert (views["team"]["pending_workloads"], views["team"]["local_pending_workloads"]) == (2, 1)
    assert views["team"]["flavors"][0]["usage"] == {"cpu": "4"} and views["team"]["topologies"] == ["host"]


async def test_each_queue_admits_exactly_the_units_it_offers() -> None:
    st = state(kueue_installed=True)
    offer = offer_of(st, "churn")
    assert offer.queue is not None
    decide = pure_decide(st)
    for view in offer.queue.queues:
        for unit, label in SCHEDULER_UNITS.items():
            review = pod_review("churn", labels={QUEUE_LABEL: view.name}, annotations={TOPOLOGY: unit})
            allowed, message, pod = await decide(review)
            assert allowed is (unit in view.topologies), (view.name, unit, message)
            if allowed:
                assert pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] == label
            else:
                assert message.endswith(f"it offers: {', '.join(view.topologies)}"), message


def test_a_namespace_without_local_queue_is_refused_with_what_to_create() -> None:
    st = state(kueue_installed=True)
    st.apply(namespace("empty"))
    offer = offer_of(st, "empty")
    assert offer.queue is not None and offer.queue.choices == [] and offer.queue.default_refused
    assert "create LocalQueue default in empty" in offer.queue.default_refused
    decision = mutate_pod(pod_review("empty")["request"], st.snapshot())
    assert not decision.allowed and decision.message == offer.queue.default_refused
    # A system job keeps the system queue, and is told Kueue will hold it.
    system = offer_of(st, "empty", "system-job")
    assert system.queue is not None and system.queue.default_refused is None
    job = pod_review("empty", labels={"job-type": "materialization"}, owners=owned_by("Job"))
    decision = mutate_pod(job["request"], st.snapshot())
    assert decision.allowed, decision.message
    assert any("LocalQueue system does not exist in namespace empty" in w for w in decision.warnings)


def test_a_default_unit_the_default_queue_cannot_place_is_dropped_with_a_warning() -> None:
    st = state(kueue_installed=True)
    st.apply(namespace("lab", annotations={DF: json.dumps({"queue": "team", "topology": "zone"})}))
    st.apply(local_queue("lab", "team", "cq-hosts"))
    offer = offer_of(st, "lab")
    assert offer.topology is not None and offer.topology.default is None
    assert [c.name for c in offer.topology.choices] == ["host"]
    decision = mutate_pod(pod_review("lab")["request"], st.snapshot())
    assert decision.allowed and list(decision.warnings) == offer.notes, (decision.warnings, offer.notes)
    pod = apply_patch(pod_review("lab")["request"]["object"], list(decision.patch))
    assert pod["metadata"]["labels"][QUEUE_LABEL] == "team"
    assert "kueue.x-k8s.io/podset-required-topology" not in pod["metadata"].get("annotations", {})
    assert any(n.startswith("default topology zone") and n.endswith("none set") for n in offer.notes)


def test_a_queue_whose_cluster_queue_is_missing_offers_no_unit_and_says_why() -> None:
    st = state(kueue_installed=True)
    st.apply(local_queue("churn", "orphan", "nowhere"))
    offer = offer_of(st, "churn")
    assert offer.queue is not None
    orphan = next(v for v in offer.queue.queues if v.name == "orphan")
    assert orphan.cluster_queue == "nowhere" and orphan.topologies == []
    assert orphan.problems[0] == "ClusterQueue nowhere of LocalQueue orphan does not exist"
    review = pod_review("churn", labels={QUEUE_LABEL: "orphan"}, annotations={TOPOLOGY: "host"})
    decision = mutate_pod(review["request"], st.snapshot())
    assert not decision.allowed and "it offers no topology unit (ClusterQueue nowhere" in decision.message
    plain = mutate_pod(pod_review("churn", labels={QUEUE_LABEL: "orphan"})["request"], st.snapshot())
    assert plain.allowed and any("Kueue will hold the pod" in w for w in plain.warnings)
