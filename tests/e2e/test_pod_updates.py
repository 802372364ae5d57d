"""G5 on the real control plane: a pod's scheduling labels and annotations stay as admitted.

`kubectl label`, `annotate` and `patch` of a running pod, and of a pending GPU pod of a project
bound to Run:ai, as a project member (RBAC's `edit` role in the project) and as the cluster admin:
each class of edit is refused with the key named, other edits pass. The controllers' own writes to
pods still work: a Deployment rolls out a new template, a Job completes (the Job controller takes
its tracking finalizer off each pod), the garbage collector orphans the pods of a Deployment
deleted with `--cascade=orphan`, and KAI's pod grouper (as its identity) names a pod's PodGroup.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import Cluster, Obj
from tests.e2e.runai_steps import create_pod, gpu_notebook, wait_bound
from tests.e2e.test_kubectl import pod, turn_runai_on
from tests.support.control_plane.install import Install
from webhook.metrics import ADMISSION_OUTCOMES

pytestmark = pytest.mark.slow

HOOK = "validate-pod-updates.scheduling.hopsworks.ai"
MEMBER = ("--as", "alice")
# KAI's pod grouper as its default install names it (the chart's `podGroupers` default).
POD_GROUPER = ("--as", "system:serviceaccount:kai-scheduler:pod-grouper")
PREEMPTIBILITY = "kai.scheduler/preemptibility"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
IMAGE = "registry.example/trainer:1.0"
ENDPOINT = "validate_pod-updates"  # the route's series in webhook_admission_requests_total


async def member_project(cluster: Cluster, prefix: str) -> str:
    """A project whose member alice may edit pods (`edit`), as the platform grants it; the pod
    grouper may patch pods there as KAI's ClusterRole lets it."""
    project = await cluster.project(prefix)
    await cluster.ok("create", "rolebinding", "members", "--clusterrole=edit", "--user=alice", "-n", project)
    await cluster.ok("create", "rolebinding", "pod-grouper", "--clusterrole=edit", f"--user={POD_GROUPER[1]}",
                     "-n", project)  # fmt: skip
    return project


async def running(cluster: Cluster, name: str, namespace: str) -> Obj:
    async def phase() -> Obj | None:
        stored = await cluster.get("pod", name, namespace)
        return stored if stored.get("status", {}).get("phase") == "Running" else None

    return dict(await cluster.eventually(phase, f"pod {name} Running", 60))


async def refused(cluster: Cluster, *args: str) -> str:
    stderr = await cluster.refused(*args)
    assert f'admission webhook "{HOOK}" denied the request' in stderr, stderr
    return stderr


async def test_a_running_pods_scheduling_keys_cannot_be_edited(cluster: Cluster) -> None:
    project = await member_project(cluster, "edits")
    job_pod = pod("trainer", project, annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "1"})
    job_pod["metadata"]["labels"].update({PREEMPTIBILITY: "preemptible", "runai/queue": project,
                                         KUEUE_QUEUE: "lq-team"})  # fmt: skip
    await cluster.apply(job_pod)
    await running(cluster, "trainer", project)
    target = ("pod", "trainer", "-n", project)

    for who in (MEMBER, ()):  # a project member, then the cluster admin
        stderr = await refused(cluster, "label", *target, f"{PREEMPTIBILITY}=non-preemptible", "--overwrite", *who)
        assert f"label {PREEMPTIBILITY} changed from 'preemptible' to 'non-preemptible'" in stderr, stderr
        assert "create the pod again" in stderr, stderr
        stderr = await refused(cluster, "annotate", *target, "gpu-fraction=0.9", "--overwrite", *who)
        assert "annotation gpu-fraction changed from '0.5' to '0.9'" in stderr, stderr
        stderr = await refused(cluster, "annotate", *target, "gpu-fraction-num-devices=4", "--overwrite", *who)
        assert "annotation gpu-fraction-num-devices changed from '1' to '4'" in stderr, stderr
        stderr = await refused(cluster, "annotate", *target, "pod-group-name=pg-urgent", *who)
        assert "annotation pod-group-name added ('pg-urgent')" in stderr, stderr
        stderr = await refused(cluster, "annotate", *target, "kai.scheduler/skip-podgrouper=true", *who)
        assert "annotation kai.scheduler/skip-podgrouper added ('true')" in stderr, stderr
        stderr = await refused(cluster, "label", *target, "runai/queue=finance", "--overwrite", *who)
        assert f"label runai/queue changed from '{project}' to 'finance'" in stderr, stderr
        stderr = await refused(cluster, "label", *target, f"{KUEUE_QUEUE}-", *who)
        assert f"label {KUEUE_QUEUE} removed (was 'lq-team')" in stderr, stderr
        patch = {"metadata": {"labels": {KUEUE_QUEUE: "lq-other", "hopsworks.ai/workload-type": "deployment"}}}
        stderr = await refused(cluster, "patch", *target, "--type=merge", "-p", json.dumps(patch), *who)
        assert f"label {KUEUE_QUEUE} changed from 'lq-team' to 'lq-other'" in stderr, stderr
        assert "label hopsworks.ai/workload-type changed from 'notebook' to 'deployment'" in stderr, stderr
        # A server-side dry run is judged the same way.
        await refused(cluster, "label", *target, "runai/queue=finance", "--overwrite", "--dry-run=server", *who)

    # An owner KAI would read the preemptibility from before the pod's own label: a ConfigMap the
    # member labels non-preemptible and names as the pod's first owner.
    await cluster.ok("create", "configmap", "cm", "-n", project, *MEMBER)
    await cluster.ok("label", "configmap", "cm", f"{PREEMPTIBILITY}=non-preemptible", "-n", project, *MEMBER)
    cm = await cluster.get("configmap", "cm", project)
    owners = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": cm["metadata"]["uid"]}]
    patch = {"metadata": {"ownerReferences": owners}}
    stderr = await refused(cluster, "patch", *target, "--type=merge", "-p", json.dumps(patch), *MEMBER)
    assert "first ownerReference ConfigMap cm added" in stderr, stderr

    # Everything else on the pod stays the member's to edit, and KAI's pod grouper names its group.
    await cluster.ok("label", *target, "team=blue", *MEMBER)
    await cluster.ok("annotate", *target, "note=retrained", *MEMBER)
    await cluster.ok("label", *target, "team=red", "--overwrite")
    await cluster.ok("annotate", *target, "pod-group-name=pg-trainer-1", *POD_GROUPER)
    await refused(cluster, "label", *target, f"{PREEMPTIBILITY}=non-preemptible", "--overwrite", *POD_GROUPER)
    stored = (await cluster.get(*target[:2], project))["metadata"]
    assert stored["labels"][PREEMPTIBILITY] == "preemptible" and stored["labels"]["runai/queue"] == project
    assert stored["labels"][KUEUE_QUEUE] == "lq-team" and stored["labels"]["team"] == "red"
    assert stored["annotations"]["gpu-fraction"] == "0.5" and stored["annotations"]["note"] == "retrained"
    assert stored["annotations"]["pod-group-name"] == "pg-trainer-1"
    assert "kai.scheduler/skip-podgrouper" not in stored["annotations"]
    assert "ownerReferences" not in stored


async def test_a_pending_gpu_pod_of_a_runai_project_keeps_what_admission_wrote(cluster: Cluster) -> None:
    await turn_runai_on(cluster)
    project = await member_project(cluster, "pending")
    await wait_bound(cluster, project)
    # Run:ai's scheduler is not running here: the pod stays Pending, as it is before KAI places it.
    result = await create_pod(cluster, gpu_notebook("nb", project))
    assert result.rc == 0, str(result)
    labels = (await cluster.get("pod", "nb", project))["metadata"]["labels"]
    assert labels[PREEMPTIBILITY] == "non-preemptible" and labels["runai/queue"] == project, labels
    target = ("pod", "nb", "-n", project)
    stderr = await refused(cluster, "label", *target, f"{PREEMPTIBILITY}=preemptible", "--overwrite", *MEMBER)
    assert f"label {PREEMPTIBILITY} changed from 'non-preemptible' to 'preemptible'" in stderr, stderr
    stderr = await refused(cluster, "label", *target, "runai/queue=other-team", "--overwrite", *MEMBER)
    assert f"label runai/queue changed from '{project}' to 'other-team'" in stderr, stderr
    stderr = await refused(cluster, "annotate", *target, "gpu-memory=80000", *MEMBER)
    assert "annotation gpu-memory added ('80000')" in stderr, stderr
    await cluster.ok("annotate", *target, "note=waiting", *MEMBER)


def reviews_of_pod_updates(local: Install) -> float:
    """How many pod updates both replicas have reviewed, whatever the answer."""
    return sum(
        sum(local.metric("webhook_admission_requests_total", endpoint=ENDPOINT, outcome=outcome))
        for outcome in ADMISSION_OUTCOMES
    )


def deployment(name: str, namespace: str, replicas: int) -> Obj:
    labels = {"app": name, "hopsworks.ai/workload-type": "deployment"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "main", "image": IMAGE}]}}},
    }  # fmt: skip


def job(name: str, namespace: str) -> Obj:
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace},
        "spec": {"completions": 2, "parallelism": 2, "backoffLimit": 0,
                 "template": {"spec": {"restartPolicy": "Never",
                                       "containers": [{"name": "main", "image": IMAGE}]}}},
    }  # fmt: skip


async def test_the_controllers_writes_to_pods_still_pass(cluster: Cluster) -> None:
    local = cluster.needs_local("reads the replicas' metrics")
    project = await member_project(cluster, "controllers")
    reviewed = reviews_of_pod_updates(local)
    await cluster.apply(deployment("web", project, 2), job("etl", project))

    # The Deployment rolls out a new template: new pods Running, the old ones scaled away.
    await cluster.ok("rollout", "status", "deployment/web", "-n", project, "--timeout=90s")
    await cluster.ok("set", "image", "deployment/web", f"main={IMAGE}-2", "-n", project)
    await cluster.ok("rollout", "status", "deployment/web", "-n", project, "--timeout=90s")

    async def rolled() -> list[Obj] | None:
        pods = await cluster.list("pods", project, "-l", "app=web")
        images = {p["spec"]["containers"][0]["image"] for p in pods if not p["metadata"].get("deletionTimestamp")}
        return pods if images == {f"{IMAGE}-2"} else None

    await cluster.eventually(rolled, "only pods of the new template", 60)

    # The Job completes: kwok ends its pods Succeeded, the Job controller takes its finalizer off them.
    await cluster.ok("wait", "--for=condition=Complete", "job/etl", "-n", project, "--timeout=90s")

    async def untracked() -> list[Obj] | None:
        pods = await cluster.list("pods", project, "-l", "job-name=etl")
        done = len(pods) == 2 and all(not p["metadata"].get("finalizers") for p in pods)
        return pods if done else None

    await cluster.eventually(untracked, "the Job's tracking finalizer off its pods", 30)

    # None of these writes changed a label, an annotation or an owner: matchConditions kept them away.
    assert reviews_of_pod_updates(local) == reviewed

    # The garbage collector orphans the pods of a ReplicaSet deleted with --cascade=orphan: an owner
    # change, so each is reviewed, and allowed (every owner removed).
    (replica_set,) = [
        rs["metadata"]["name"]
        for rs in await cluster.list("replicasets", project, "-l", "app=web")
        if rs["spec"]["replicas"] > 0
    ]
    await cluster.ok("delete", "deployment", "web", "-n", project, "--cascade=orphan")
    await cluster.ok("delete", "replicaset", replica_set, "-n", project, "--cascade=orphan")

    async def orphaned() -> list[Obj] | None:
        pods = await cluster.list("pods", project, "-l", "app=web")
        return pods if pods and all(not p["metadata"].get("ownerReferences") for p in pods) else None

    orphans = await cluster.eventually(orphaned, "the garbage collector took the owners off the pods", 60)
    # One review per orphaned pod at least (the garbage collector retries a patch that conflicts).
    assert reviews_of_pod_updates(local) >= reviewed + len(orphans)
    reviewed = reviews_of_pod_updates(local)
    pods = await cluster.list("pods", project, "-l", "app=web")
    await cluster.ok("label", "pod", pods[0]["metadata"]["name"], "-n", project, "team=blue")
    assert reviews_of_pod_updates(local) == reviewed + 1
