"""S4 against the real Kueue v0.17.0 (its manager, CRDs and webhook configurations, see
tests/support/control_plane/kueue.py), the real Job, Deployment and ReplicaSet controllers,
kube-scheduler and kwok's nodes: the product with `kueue_installed: "true"` and Run:ai off.

- A Job created without a queue label is queued through the project's LocalQueue: ours labels the
  Job at its CREATE, Kueue's job webhook suspends it, Kueue admits its Workload and the pods run in
  the topology domain Kueue assigned.
- A 3-replica Deployment choosing `host` is one Kueue pod group: one Workload, one domain, one node.
- A wrong queue or unit, or a namespace without a LocalQueue, is refused at `kubectl apply` with
  what to change, instead of pods gated for good; with `queue_topology_enforcement: warn` a unit
  that is none is admitted with a warning, and the pod runs through Kueue without it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from tests.e2e.conftest import Cluster, Obj, broken_install
from tests.e2e.runai_steps import admin_token, call_server
from tests.e2e.test_warn_mode import (
    ADMITTED_BY,
    audited_creator,
    counted,
    created_audit,
    until_admitted,
    until_refused,
)
from tests.support.cluster import SCHEDULER
from tests.support.control_plane.install import Install
from tests.support.control_plane.kueue import (
    Kueue,
    cluster_queue,
    kueue_running,
    local_queue,
    resource_flavor,
    topology,
)

pytestmark = pytest.mark.slow

IMAGE = "registry.example/model:1.0"
QUEUE = "kueue.x-k8s.io/queue-name"
CHOICE = "scheduling.hopsworks.ai/topology"
REQUIRED = "kueue.x-k8s.io/podset-required-topology"
GROUP = "kueue.x-k8s.io/pod-group-name"
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


@pytest.fixture(scope="module")
def kueue(local_install: Install) -> Iterator[Kueue]:
    cp = local_install.cp
    with kueue_running(cp, cp.dir / "kueue") as running:
        cp.apply([
            topology(), resource_flavor("tas", "default"), cluster_queue("cq", "tas"),
            # A Topology without hosts: a queue whose units stop at the zone.
            topology("zonal", ("topology.kubernetes.io/region", ZONE)), resource_flavor("zonal", "zonal"),
            cluster_queue("cq-zonal", "zonal"),
        ])  # fmt: skip
        # The replicas list Kueue's kinds again (a CRD missing at start is listed once a minute).
        local_install.scale(0)
        local_install.scale(2)
        yield running


# The projects' default queue. Not "default": Kueue itself labels workloads with a LocalQueue named
# "default" when there is one (LocalQueueDefaulting), and the tests must see our labels, not Kueue's.
TEAM = "team"


async def kueue_project(cluster: Cluster, kueue: Kueue, prefix: str, queues: dict[str, str] | None = None) -> str:
    """A project namespace with LocalQueues (name -> ClusterQueue), once both replicas know them."""
    await cluster.settings(kueue_installed="true", run_ai_enable="false", kueue_project_default_local_queue=TEAM,
                           scheduler=yaml.safe_dump(SCHEDULER))  # fmt: skip
    project = await cluster.project(prefix)
    queues = {TEAM: "cq"} if queues is None else queues
    if queues:
        await cluster.apply(*[local_queue(project, name, cq) for name, cq in queues.items()])
    probe = job("probe", project, labels={QUEUE: next(iter(queues))} if queues else None)

    async def admitted_twice() -> bool:
        # Both replicas (the apiserver picks either) must admit a queued Job: caches and settings synced.
        for _ in range(4):
            result = await cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(probe))
            if result.rc != 0:
                return False
        return True

    if queues:
        await cluster.eventually(admitted_twice, "the LocalQueues in both replicas' caches", 60)
    return project


def job(
    name: str,
    namespace: str,
    *,
    labels: dict[str, str] | None = None,
    unit: str | None = None,
    parallelism: int = 2,
    cpu: str = "1",
) -> Obj:
    annotations = {CHOICE: unit} if unit else {}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 0,
                 "template": {"metadata": {"annotations": annotations},
                              "spec": {"restartPolicy": "Never",
                                       "containers": [{"name": "main", "image": IMAGE,
                                                       "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}}},
    }  # fmt: skip


def deployment(
    name: str, namespace: str, replicas: int, *, unit: str | None, strategy: str = "Recreate", cpu: str = "1"
) -> Obj:
    annotations = {CHOICE: unit} if unit else {}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "strategy": {"type": strategy}, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name, "hopsworks.ai/workload-type": "deployment"},
                                           "annotations": annotations},
                              "spec": {"containers": [{"name": "main", "image": IMAGE,
                                                       "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}}},
    }  # fmt: skip


def workloads(items: list[Obj], owner_kind: str) -> list[Obj]:
    return [w for w in items if any(r.get("kind") == owner_kind for r in w["metadata"].get("ownerReferences", []))]


def topology_domains(workload: Obj) -> list[list[str]]:
    """The domains (a value per level of `levels`, coarsest first) of the Workload's first PodSet."""
    assignment = workload["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    domains: list[list[str]] = []
    for piece in assignment["slices"]:  # v1beta2: slices of domains, a value or values per level
        count = int(piece["domainCount"])
        per_level = []
        for level in piece["valuesPerLevel"]:
            if "universal" in level:
                per_level.append([str(level["universal"])] * count)
            else:
                one = level["individual"]
                per_level.append([f"{one.get('prefix', '')}{r}{one.get('suffix', '')}" for r in one["roots"]])
        domains += [[values[i] for values in per_level] for i in range(count)]
    return domains


async def test_a_job_without_a_queue_label_is_queued_and_admitted_by_kueue(cluster: Cluster, kueue: Kueue) -> None:
    # Held first, so that the Job is seen suspended and pending; then released.
    await cluster.apply({**cluster_queue("cq-held", "tas"), "spec": {**cluster_queue("cq-held", "tas")["spec"],
                                                                    "stopPolicy": "Hold"}})  # fmt: skip
    project = await kueue_project(cluster, kueue, "kjob", {TEAM: "cq-held"})
    await cluster.apply(job("train", project, unit="host"))
    stored = await cluster.get("job", "train", project)
    assert stored["metadata"]["labels"][QUEUE] == TEAM
    assert stored["spec"]["suspend"] is True, "Kueue's job webhook did not suspend the Job"
    assert stored["spec"]["template"]["metadata"]["annotations"][REQUIRED] == HOSTNAME
    pending = await cluster.eventually(lambda: cluster.list("workloads.kueue.x-k8s.io", project), "its Workload", 30)
    (workload,) = workloads(pending, "Job")
    assert workload["spec"]["queueName"] == TEAM
    # Queueing order follows the platform's priority: Kueue takes the template's PriorityClass,
    # which ours wrote into the Job (no WorkloadPriorityClass needed, docs/kueue-colocation.md).
    class_name = stored["spec"]["template"]["spec"]["priorityClassName"]
    value = (await cluster.get("priorityclass", class_name))["value"]
    assert (workload["spec"]["priorityClassRef"]["name"], workload["spec"]["priority"]) == (class_name, value)
    assert not (workload.get("status") or {}).get("admission"), workload["status"]
    assert await cluster.list("pods", project) == []

    await cluster.ok("patch", "clusterqueue", "cq-held", "--type=merge", "-p", '{"spec":{"stopPolicy":"None"}}')

    async def admitted() -> Obj | None:
        items = workloads(await cluster.list("workloads.kueue.x-k8s.io", project), "Job")
        return items[0] if items and (items[0].get("status") or {}).get("admission") else None

    workload = await cluster.eventually(admitted, "the Workload admitted", 60)
    assert workload["status"]["admission"]["clusterQueue"] == "cq-held"
    domains = topology_domains(workload)
    assert len(domains) == 1, domains
    host = domains[0][-1]
    assert (await cluster.get("job", "train", project))["spec"]["suspend"] is False

    async def placed() -> list[Obj] | None:
        pods = await cluster.list("pods", project, "-l", "job-name=train")
        return pods if len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = await cluster.eventually(placed, "both pods on a node", 60)
    assert {p["spec"]["nodeName"] for p in pods} == {host}, (host, [p["spec"] for p in pods])
    for pod in pods:
        assert pod["metadata"]["annotations"][REQUIRED] == HOSTNAME


async def test_three_replicas_choosing_host_land_on_one_host(cluster: Cluster, kueue: Kueue) -> None:
    project = await kueue_project(cluster, kueue, "kdep")
    await cluster.apply(deployment("model", project, 3, unit="host"))

    async def running() -> list[Obj] | None:
        pods = await cluster.list("pods", project, "-l", "app=model")
        ok = len(pods) == 3 and all(p.get("status", {}).get("phase") == "Running" for p in pods)
        return pods if ok else None

    pods = await cluster.eventually(running, "3 pods Running", 90)
    nodes = {p["spec"]["nodeName"] for p in pods}
    groups = {p["metadata"]["labels"].get(GROUP) for p in pods}
    assert len(nodes) == 1, nodes
    assert len(groups) == 1 and None not in groups, groups
    (workload,) = [w for w in await cluster.list("workloads.kueue.x-k8s.io", project)]
    assert workload["spec"]["podSets"][0]["count"] == 3
    domains = topology_domains(workload)
    assert len(domains) == 1 and domains[0][-1] in nodes, domains
    # For the closing note (the time is measured by bench.kueue_colocation, not here).
    print(f"\n3 replicas choosing host: nodes {sorted(nodes)}, Workload {workload['metadata']['name']} "
          f"domains {domains}")  # fmt: skip


async def test_wrong_queues_and_units_are_refused_at_apply(cluster: Cluster, kueue: Kueue) -> None:
    project = await kueue_project(cluster, kueue, "kref", {TEAM: "cq", "zonal": "cq-zonal"})
    cases = [
        (job("nope", project, labels={QUEUE: "nope"}), ("queue nope", "team, zonal")),
        (job("rack", project, unit="rack"), ("topology rack is not a topology unit",)),
        (job("host", project, labels={QUEUE: "zonal"}, unit="host"),
         ("topology host", "is not a level of the Topology behind queue zonal", "it offers: zone, region")),
        (deployment("rolling", project, 3, unit="host", strategy="RollingUpdate"),
         ("one Kueue pod group", "spec.strategy.type: Recreate")),
    ]  # fmt: skip
    for obj, parts in cases:
        stderr = await cluster.refused("apply", "-f", "-", stdin=json.dumps(obj))
        for part in parts:
            assert part in stderr, stderr
    empty = await kueue_project(cluster, kueue, "knone", {})
    stderr = await cluster.refused("apply", "-f", "-", stdin=json.dumps(job("train", empty)))
    assert f"namespace {empty} has no Kueue LocalQueue" in stderr and f"create LocalQueue {TEAM}" in stderr, stderr
    assert await cluster.list("jobs", project) == [] and await cluster.list("deployments", project) == []


def notebook(name: str, namespace: str, unit: str) -> Obj:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"hopsworks.ai/workload-type": "notebook"},
                     "annotations": {CHOICE: unit}},
        "spec": {"containers": [{"name": "main", "image": IMAGE, "resources": {"requests": {"cpu": "1"}}}]},
    }  # fmt: skip


async def running_pods(cluster: Cluster, namespace: str, selector: str, count: int) -> list[Obj] | None:
    pods = await cluster.list("pods", namespace, "-l", selector)
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    ok = len(live) == count and all(p.get("status", {}).get("phase") == "Running" for p in live)
    return live if ok else None


async def test_a_notebook_choosing_host_is_admitted_alone(cluster: Cluster, kueue: Kueue) -> None:
    project = await kueue_project(cluster, kueue, "knb")
    await cluster.apply(notebook("nb", project, "host"))
    stored = await cluster.get("pod", "nb", project)
    assert stored["metadata"]["labels"][QUEUE] == TEAM
    assert stored["metadata"]["labels"]["kueue.x-k8s.io/managed"] == "true", "Kueue's pod webhook did not gate it"
    assert GROUP not in stored["metadata"]["labels"], "a single pod needs no group"
    await cluster.eventually(lambda: running_pods(cluster, project, "hopsworks.ai/workload-type=notebook", 1),
                             "the notebook Running", 60)  # fmt: skip
    (workload,) = await cluster.list("workloads.kueue.x-k8s.io", project)
    assert workload["spec"]["podSets"][0]["count"] == 1


async def test_replicas_choosing_zone_share_one_zone_across_nodes(cluster: Cluster, kueue: Kueue) -> None:
    project = await kueue_project(cluster, kueue, "kzone")
    # 20 CPUs each: no node (32) holds two, so the group spreads over the nodes of one zone.
    await cluster.apply(deployment("wide", project, 2, unit="zone", cpu="20"))
    pods = await cluster.eventually(lambda: running_pods(cluster, project, "app=wide", 2), "2 pods Running", 90)
    nodes = {p["spec"]["nodeName"] for p in pods}
    zones = {(await cluster.get("node", n))["metadata"]["labels"][ZONE] for n in nodes}
    assert len(nodes) == 2 and len(zones) == 1, (nodes, zones)


async def test_a_grouped_deployment_scales_by_its_spec_and_keeps_its_group(cluster: Cluster, kueue: Kueue) -> None:
    project = await kueue_project(cluster, kueue, "kscale")
    await cluster.apply(deployment("model", project, 2, unit="host"))
    first = await cluster.eventually(lambda: running_pods(cluster, project, "app=model", 2), "2 pods Running", 90)
    stderr = await cluster.refused("scale", "deployment", "model", "-n", project, "--replicas=3")
    assert "change spec.replicas in the Deployment itself" in stderr, stderr
    await cluster.ok("patch", "deployment", "model", "-n", project, "--type=merge", "-p", '{"spec":{"replicas":3}}')

    async def regrouped() -> list[Obj] | None:
        pods = await running_pods(cluster, project, "app=model", 3)
        groups = {p["metadata"]["labels"].get(GROUP) for p in pods or []}
        return pods if pods and len(groups) == 1 and groups != {first[0]["metadata"]["labels"][GROUP]} else None

    pods = await cluster.eventually(regrouped, "3 pods Running in a new group", 90)
    assert len({p["spec"]["nodeName"] for p in pods}) == 1
    # A deleted pod: the ReplicaSet replaces it in the same group, which stays admitted.
    await cluster.ok("delete", "pod", pods[0]["metadata"]["name"], "-n", project, "--wait=false")

    async def replaced() -> list[Obj] | None:
        now = await running_pods(cluster, project, "app=model", 3)
        names = {p["metadata"]["name"] for p in now or []}
        return now if now and pods[0]["metadata"]["name"] not in names else None

    after = await cluster.eventually(replaced, "the deleted pod replaced and Running", 90)
    assert {p["metadata"]["labels"][GROUP] for p in after} == {pods[1]["metadata"]["labels"][GROUP]}


async def test_our_webhook_after_kueues_leaves_pods_ungated_and_they_are_refused(
    cluster: Cluster, kueue: Kueue
) -> None:
    local = cluster.needs_local("re-applies the install's webhook configurations")
    project = await kueue_project(cluster, kueue, "korder")

    def after_kueue(objects: list[Obj]) -> None:
        for obj in objects:
            if obj["kind"] == "MutatingWebhookConfiguration":  # both: each keeps a name of its own
                obj["metadata"]["name"] = "zz-" + obj["metadata"]["name"]

    with broken_install(local, after_kueue):
        stderr = await cluster.refused("apply", "-f", "-", stdin=json.dumps(notebook("late", project, "host")))
    assert "Kueue's pod integration is not acting on it" in stderr, stderr
    assert "must sort before Kueue's" in stderr, stderr


async def test_a_group_with_no_domain_big_enough_stays_gated_and_its_workload_says_why(
    cluster: Cluster, kueue: Kueue
) -> None:
    project = await kueue_project(cluster, kueue, "kroom")
    # 3 x 20 CPUs on one host: no node has 60 (the quota would allow it).
    await cluster.apply(deployment("big", project, 3, unit="host", cpu="20"))

    async def pending() -> Obj | None:
        items = await cluster.list("workloads.kueue.x-k8s.io", project)
        conditions = (items[0].get("status") or {}).get("conditions") or [] if items else []
        reserved = [c for c in conditions if c["type"] == "QuotaReserved" and c["status"] == "False"]
        return reserved[0] if reserved else None

    condition = await cluster.eventually(pending, "the Workload pending with a reason", 60)
    assert "topology" in condition["message"].lower(), condition
    pods = await cluster.list("pods", project, "-l", "app=big")
    assert len(pods) == 3 and all(not p["spec"].get("nodeName") for p in pods)
    assert all(any(g["name"] == "kueue.x-k8s.io/admission" for g in p["spec"].get("schedulingGates", []))
               for p in pods)  # fmt: skip
    # The project's view (the scheduling API, the console's project page) shows the queue's pending
    # Workload, from Kueue's own LocalQueue status, read as a user of the API reads it.
    local = cluster.needs_local("calls the install's API")
    token = await admin_token(cluster)

    async def shown_pending() -> Obj | None:
        status, body = await call_server(local, "GET", f"/api/v1/projects/{project}/scheduling", token)
        assert status == 200, body
        views = {q["name"]: q for q in body["queue"]["queues"]}
        return views[TEAM] if (views[TEAM].get("local_pending_workloads") or 0) >= 1 else None

    view = await cluster.eventually(shown_pending, "the pending Workload in the project's view", 60)
    assert view["cluster_queue"] == "cq" and view["topologies"] == ["host", "zone", "region"], view


async def test_a_kueue_pods_queue_and_group_stay_as_admitted(cluster: Cluster, kueue: Kueue) -> None:
    """G5 with Kueue's own writes: Kueue lifts its gates and the pods of a 2-replica group run; the
    queue label, the group and the topology on a running pod cannot then be changed or removed.
    Kueue's own pod webhook (vpod.kb.io) guards its queue and group labels too; validating webhooks
    run in parallel, so either refusal may be the one kubectl shows for those."""
    project = await kueue_project(cluster, kueue, "kkeep")
    await cluster.apply(deployment("pair", project, 2, unit="host"))

    async def running() -> list[Obj] | None:
        pods = await cluster.list("pods", project, "-l", "app=pair")
        ok = len(pods) == 2 and all(p.get("status", {}).get("phase") == "Running" for p in pods)
        return pods if ok else None

    pods = await cluster.eventually(running, "2 pods Running (Kueue's gates lifted)", 90)
    name = pods[0]["metadata"]["name"]
    group = pods[0]["metadata"]["labels"][GROUP]
    target = ("pod", name, "-n", project)
    ours = 'admission webhook "validate-pod-updates.scheduling.hopsworks.ai" denied the request'
    kueues = 'admission webhook "vpod.kb.io" denied the request'
    for args, key, said in [
        (("label", *target, f"{QUEUE}-"), QUEUE, f"label {QUEUE} removed (was '{TEAM}')"),
        (("label", *target, f"{QUEUE}=other", "--overwrite"), QUEUE, f"label {QUEUE} changed from '{TEAM}' to 'other'"),
        (("label", *target, f"{GROUP}=mine", "--overwrite"), GROUP, f"label {GROUP} changed from '{group}' to 'mine'"),
    ]:
        stderr = await cluster.refused(*args)
        assert (ours in stderr and said in stderr) or (kueues in stderr and key in stderr), stderr
    # The topology Kueue placed the group by is ours alone to guard.
    stderr = await cluster.refused("annotate", *target, f"{REQUIRED}-")
    assert ours in stderr and f"annotation {REQUIRED} removed (was '{HOSTNAME}')" in stderr, stderr
    stored = (await cluster.get(*target[:2], project))["metadata"]
    assert stored["labels"][QUEUE] == TEAM and stored["labels"][GROUP] == group, stored
    await cluster.ok("label", *target, "team=blue")


async def test_a_unit_the_queue_cannot_place_warns_then_is_refused(cluster: Cluster, kueue: Kueue) -> None:
    """`queue_topology_enforcement: warn`: a notebook choosing a unit that is none is stored with the
    project's queue and no required topology, so Kueue admits and runs it; kubectl prints the
    would-be refusal, the audit log has it and the metric counts the pod once (the mutating
    webhook is called twice for it, Kueue's webhook changing the pod after ours). Switched to
    `enforce`, the next one is refused."""
    local = cluster.needs_local("reads the replicas' metrics and the audit log")
    project = await kueue_project(cluster, kueue, "kwarn")
    creator = await audited_creator(cluster, local, project)
    said = "topology rack is not a topology unit"
    try:
        await cluster.settings(queue_topology_enforcement="warn")
        since = local.cp.audit.mark()
        warned = await until_admitted(cluster, creator, yaml.safe_dump(notebook("nb-rack", project, "rack")), said)
        assert ADMITTED_BY.format(key="queue_topology_enforcement") + said in warned.stderr, str(warned)
        stored = await cluster.get("pod", "nb-rack", project)
        assert stored["metadata"]["labels"][QUEUE] == TEAM and REQUIRED not in stored["metadata"]["annotations"]
        await cluster.eventually(
            lambda: running_pods(cluster, project, "hopsworks.ai/workload-type=notebook", 1), "the notebook Running", 60
        )
        assert counted(local, "queue-topology", project) == 1
        audit = created_audit(local, since, "pods", project)
        assert said in audit.get("mutate-pods.scheduling.hopsworks.ai/would-refuse", ""), audit
        # The apiserver called our mutating webhook again after Kueue's changed the pod (round 1).
        again = [v for k, v in audit.items() if k.startswith("mutation.webhook.admission.k8s.io/round_1")]
        assert any('"webhook":"mutate-pods.scheduling.hopsworks.ai"' in v for v in again), audit

        await cluster.settings(queue_topology_enforcement="enforce")
        again = yaml.safe_dump(notebook("nb-next", project, "rack"))
        refused = await until_refused(cluster, creator, again, "pod", "nb-next", project)
        assert refused.stderr.startswith("Error from server (Forbidden)") and said in refused.stderr, str(refused)
    finally:
        await cluster.settings(queue_topology_enforcement="enforce")
