"""The GPU promise through the real scheduler: KAI-Scheduler v0.17.0 (tests/support/control_plane/
kai.py) places the product's pods on kwok's GPU nodes, with the chart's install (two replicas),
Run:ai's REST stand-in and its cluster side (each department and project a KAI Queue, `allocated`
read back from the Queues' status), and the Run:ai admission stand-in that only sets
`schedulerName: runai-scheduler`; KAI's own admission, podgrouper, scheduler, binder and
controllers do the rest.

What KAI stores is quoted in each test: the PodGroup its podgrouper writes for a pod (`spec.queue`,
`spec.preemptibility`), the node its binder binds the pod to, the Queue's status, and the reason
its scheduler leaves a pod pending (`NonPreemptibleOverQuota`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Cluster, Obj
from tests.e2e.runai_steps import (
    DEPARTMENT_LABEL,
    admin_token,
    call_server,
    create_pod,
    delete_pods,
    ensure_department,
    gpu_notebook,
    in_standin,
    move,
    wait_bound,
)
from tests.e2e.test_kubectl import turn_runai_on
from tests.support.control_plane.cluster import KEEP_RUNNING_ANNOTATION
from tests.support.control_plane.install import Install
from tests.support.control_plane.kai import (
    QUEUE_LABEL,
    RESERVATION_NAMESPACE,
    SCHEDULER_NAME,
    Kai,
    QueueSync,
    kai_running,
    queue_usage,
    set_department_quota,
)
from tests.test_gpu_sharing import CASES as GPU_SHARING_CASES
from webhook.core.gpu_sharing import MAX_ANNOTATION_CHARS

pytestmark = pytest.mark.slow

PREEMPTIBILITY = "kai.scheduler/preemptibility"
CLUSTER_GPUS = 10  # kwok-a1 and kwok-a2 have 4 each, kwok-c1 2 (cluster.DEFAULT_NODES)


@pytest.fixture(scope="module")
def kai(local_install: Install) -> Iterator[Kai]:
    cp = local_install.cp
    runai = local_install.runai
    with kai_running(cp, cp.dir / "kai") as running:
        # Run:ai's default department, with the cluster's GPUs as its quota: KAI checks a
        # non-preemptible pod against every queue up its hierarchy, the department's included.
        before = in_standin(local_install, lambda: (runai.department("default") or {})["totalResources"]["gpuQuota"])
        in_standin(local_install, lambda: set_department_quota(runai, "default", CLUSTER_GPUS))
        sync = QueueSync(cp, runai, local_install.background).start()
        try:
            yield running
        finally:
            sync.stop()
            in_standin(local_install, lambda: set_department_quota(runai, "default", before))
            assert sync.errors == [], sync.errors


async def bound_project(cluster: Cluster, kai: Kai, prefix: str, quota: int = 2) -> str:
    """A project bound to Run:ai with `quota` deserved GPUs, once KAI has its Queue."""
    await turn_runai_on(cluster)
    await cluster.settings(run_ai_project_gpu_quota=str(quota))
    project = await cluster.project(prefix)
    await wait_bound(cluster, project)

    def has_queue() -> Obj | None:
        q = kai.queue(project)
        return q if q and q["spec"]["resources"]["gpu"]["quota"] == quota else None

    q = await cluster.eventually(has_queue, f"KAI Queue {project}", 30)
    assert q["spec"]["parentQueue"] == "default", q["spec"]
    return project


async def pod_json(cluster: Cluster, namespace: str, name: str) -> Obj:
    return await cluster.get("pod", name, namespace)


async def running(cluster: Cluster, namespace: str, name: str, within_s: float = 60) -> Obj:
    async def check() -> Obj | None:
        pod = await pod_json(cluster, namespace, name)
        return pod if pod.get("status", {}).get("phase") == "Running" else None

    return dict(await cluster.eventually(check, f"pod {namespace}/{name} Running", within_s))


async def pod_group(cluster: Cluster, kai: Kai, namespace: str, name: str, within_s: float = 30) -> Obj:
    found = await cluster.eventually(lambda: kai.pod_group_of(namespace, name), f"PodGroup of {name}", within_s)
    return dict(found)


def unschedulable(group: Obj) -> list[Obj]:
    """The reasons KAI's scheduler wrote on a PodGroup it could not place."""
    conditions = (group.get("status") or {}).get("schedulingConditions") or []
    return [r for c in conditions for r in (c.get("reasons") or [])]


async def events_of(cluster: Cluster, namespace: str, name: str) -> list[Obj]:
    out = await cluster.ok("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}",
                           "-o", "json")  # fmt: skip
    return list(json.loads(out)["items"])


def gpus_of(usage: tuple[float, float, float]) -> dict[str, float]:
    return dict(zip(("allocated", "allocatedNonPreemptible", "requested"), usage, strict=True))


async def test_a_notebook_within_quota_is_grouped_bound_and_running_by_kai(cluster: Cluster, kai: Kai) -> None:
    """Item 1. The notebook our webhook admits goes through KAI's podgrouper (a PodGroup in queue
    <project>, `preemptibility: non-preemptible` as we labelled it), KAI's scheduler and binder (the
    pod bound to a GPU node) and runs; the project's Queue then shows the GPU as allocated and
    non-preemptible, and the Run:ai stand-in reports what the Queue says."""
    project = await bound_project(cluster, kai, "kai-in")
    result = await create_pod(cluster, gpu_notebook("nb", project))
    assert result.rc == 0, str(result)
    stored = await pod_json(cluster, project, "nb")
    assert stored["spec"]["schedulerName"] == SCHEDULER_NAME
    assert stored["metadata"]["labels"][QUEUE_LABEL] == project
    assert stored["metadata"]["labels"][PREEMPTIBILITY] == "non-preemptible"
    group = await pod_group(cluster, kai, project, "nb")
    assert group["spec"]["queue"] == project, group["spec"]
    assert group["spec"]["preemptibility"] == "non-preemptible", group["spec"]
    assert group["spec"]["minMember"] == 1, group["spec"]
    pod = await running(cluster, project, "nb")
    assert pod["spec"]["nodeName"] in ("kwok-a1", "kwok-a2", "kwok-c1"), pod["spec"].get("nodeName")
    scheduled = [e for e in await events_of(cluster, project, "nb") if e["reason"] == "Scheduled"]
    assert scheduled and scheduled[0]["source"].get("component") == SCHEDULER_NAME, scheduled

    async def queue_counts() -> dict[str, float] | None:
        q = kai.queue(project)
        usage = gpus_of(queue_usage(q)) if q else {}
        return usage if usage.get("allocatedNonPreemptible") == 1 else None

    usage = await cluster.eventually(queue_counts, f"Queue {project} status allocated", 60)
    assert usage["allocated"] == 1, usage
    local = cluster.needs_local("the Run:ai stand-in")

    def reported() -> dict[str, Any]:
        p = local.runai.project(project)
        assert p is not None
        return dict(p["status"]["quotaStatus"])

    status = await cluster.eventually(
        lambda: (s := in_standin(local, reported))["allocatedNonPreemptible"]["gpu"] == 1 and s, "Run:ai reports it"
    )
    assert status["allocated"]["gpu"] == 1, status


async def test_over_quota_our_refusal_replaces_the_wait_in_kai(cluster: Cluster, kai: Kai) -> None:
    """Item 2, at the boundary: quota 2 with 1 held, a 1-GPU notebook runs and the next is refused
    by us naming 0 GPUs left. The same notebook where our quota check does not reach (a namespace
    that is not a project, its pod in the project's queue) is admitted and stays Pending in KAI,
    whose scheduler records `NonPreemptibleOverQuota` on its PodGroup."""
    project = await bound_project(cluster, kai, "kai-over")
    for name in ("nb1", "nb2"):
        result = await create_pod(cluster, gpu_notebook(name, project))
        assert result.rc == 0, str(result)
        await running(cluster, project, name)
    # Both held: KAI's Queue and then the stand-in say so (what our check reads).
    await cluster.eventually(lambda: gpus_of(queue_usage(kai.queue(project) or {}))["allocatedNonPreemptible"] == 2,
                             "both notebooks allocated in the Queue", 60)  # fmt: skip
    result = await create_pod(cluster, gpu_notebook("nb3", project))
    assert result.rc != 0 and result.stderr.startswith("Error from server (GpuQuotaExceeded)"), str(result)
    assert f"project {project} has 0 of 2 deserved GPUs left; this notebook asks for 1" in result.stderr, result.stderr

    # The counterfactual: not a project namespace (our webhooks do not select it), labelled for
    # Run:ai so that its admission sets the scheduler name; the pod names the project's queue.
    outside = await cluster.plain_namespace("kai-outside")
    await cluster.ok("label", "namespace", outside, f"{QUEUE_LABEL}={project}")
    notebook = gpu_notebook("nb3", outside)
    notebook["metadata"]["labels"].update({QUEUE_LABEL: project, PREEMPTIBILITY: "non-preemptible"})
    await cluster.apply(notebook)
    stored = await pod_json(cluster, outside, "nb3")
    assert stored["spec"]["schedulerName"] == SCHEDULER_NAME

    async def refused_by_kai() -> list[Obj]:
        group = kai.pod_group_of(outside, "nb3")
        return unschedulable(group) if group else []

    reasons = await cluster.eventually(refused_by_kai, "KAI's reason on the PodGroup", 60)
    assert [r["reason"] for r in reasons] == ["NonPreemptibleOverQuota"], reasons
    message = reasons[0]["message"]
    assert f"queue '{project}'" in message or project in message, message
    await asyncio.sleep(3)  # several scheduling cycles (1 s each): still not placed
    pod = await pod_json(cluster, outside, "nb3")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName"), pod["status"]


def gpu_job(name: str, namespace: str, pods: int, gpus: int) -> Obj:
    container = {
        "name": "main",
        "image": "registry.example/train:1.0",
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 100,
                 "template": {"metadata": {"annotations": {KEEP_RUNNING_ANNOTATION: "true"}},
                              "spec": {"restartPolicy": "Never", "containers": [container]}}},
    }  # fmt: skip


async def gpu_pods_anywhere(cluster: Cluster) -> list[str]:
    """Pods holding GPUs in the whole cluster (those of earlier tests' namespaces still going)."""
    out = json.loads(await cluster.ok("get", "pods", "-A", "-o", "json"))["items"]
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in out
            if any("nvidia.com/gpu" in (c.get("resources", {}).get("limits") or {}) for c in p["spec"]["containers"])
            and p["status"].get("phase") in ("Pending", "Running")]  # fmt: skip


async def test_a_job_over_quota_runs_on_idle_gpus_until_a_notebook_needs_them(cluster: Cluster, kai: Kai) -> None:
    """Item 3. A GPU Job of a project with quota 0 runs on every idle GPU (its pods are preemptible,
    as we label them, and KAI lets a queue go over its quota on idle GPUs). When another project's
    notebook, within its quota of 2, needs GPUs, KAI's scheduler evicts a job pod and the notebook
    runs."""
    await cluster.eventually(lambda: _none(gpu_pods_anywhere(cluster)), "no GPU pod of earlier tests", 90)
    jobs = await bound_project(cluster, kai, "kai-jobs", quota=0)
    await cluster.apply(gpu_job("train", jobs, pods=CLUSTER_GPUS // 2, gpus=2))

    async def all_running() -> list[Obj] | None:
        pods = await cluster.list("pods", jobs, "-l", "job-name=train")
        up = [p for p in pods if p["status"].get("phase") == "Running"]
        return up if len(up) == CLUSTER_GPUS // 2 else None

    first = await cluster.eventually(all_running, "the job's 5 pods Running on the 10 GPUs", 90)
    assert {p["metadata"]["labels"][PREEMPTIBILITY] for p in first} == {"preemptible"}
    group = await pod_group(cluster, kai, jobs, first[0]["metadata"]["name"])
    assert group["spec"]["preemptibility"] == "preemptible" and group["spec"]["queue"] == jobs, group["spec"]
    usage = await cluster.eventually(
        lambda: (u := gpus_of(queue_usage(kai.queue(jobs) or {})))["allocated"] == CLUSTER_GPUS and u,
        "the job's GPUs in its Queue", 60)  # fmt: skip
    assert usage["allocatedNonPreemptible"] == 0, usage  # all over the quota of 0, all preemptible

    notebooks = await bound_project(cluster, kai, "kai-nb", quota=2)
    result = await create_pod(cluster, gpu_notebook("nb", notebooks, gpus=2))
    assert result.rc == 0, str(result)
    pod = await running(cluster, notebooks, "nb", within_s=120)
    first_names = {p["metadata"]["name"] for p in first}
    now = {p["metadata"]["name"]: p for p in await cluster.list("pods", jobs, "-l", "job-name=train")}
    evicted = sorted(first_names - {n for n, p in now.items() if not p["metadata"].get("deletionTimestamp")})
    assert evicted, (first_names, list(now))
    # KAI records the eviction on the job's PodGroup (one for the Job's pods), naming the pod, the
    # notebook's PodGroup and both queues' quota and fair share.
    events = json.loads(await cluster.ok("get", "events", "-n", jobs, "-o", "json"))["items"]
    evictions = [e["message"] for e in events if e["reason"] == "Evict" and e["involvedObject"]["kind"] == "PodGroup"]
    assert any(f"Pod {jobs}/{evicted[0]} was preempted by workload {notebooks}/pg-nb-" in m for m in evictions), (
        evictions
    )
    assert any(f"{jobs} uses <GPU: 10, " in m and "with a quota of <GPU: 0, " in m for m in evictions), evictions
    assert pod["spec"]["nodeName"], pod["spec"]


async def _none(coro: Any) -> bool:
    return not await coro


async def test_with_runai_unreachable_kai_still_schedules_and_keeps_the_quota(cluster: Cluster, kai: Kai) -> None:
    """Item 6. Run:ai's control plane unreachable: our quota check is skipped (the pod is admitted
    with a warning, as documented), KAI goes on scheduling the bound project's pods, and KAI alone
    keeps a non-preemptible pod over the quota Pending (`NonPreemptibleOverQuota`)."""
    project = await bound_project(cluster, kai, "kai-down", quota=1)
    await cluster.settings(run_ai_directory_refresh_s="1")  # the replicas learn it is down within a second
    local = cluster.needs_local("the Run:ai stand-in")
    probe = yaml.safe_dump(gpu_notebook("probe", project))

    async def known_to_both() -> bool:
        # Both replicas (the apiserver picks either) have the project's record: checked, not skipped.
        for _ in range(4):
            result = await cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=probe)
            if result.rc != 0 or "not checked" in result.stderr:
                return False
        return True

    await cluster.eventually(known_to_both, "the project's Run:ai record on both replicas", 60)
    local.background.run(local.runai.stop_listening())
    try:

        async def skipped_on_both() -> bool:
            # A directory refresh of each replica found Run:ai unreachable: the check is skipped.
            for _ in range(4):
                result = await cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=probe)
                if result.rc != 0 or "GPU quota not checked: Run:ai control plane unreachable" not in result.stderr:
                    return False
            return True

        await cluster.eventually(skipped_on_both, "the quota check skipped on both replicas", 60)
        first = await create_pod(cluster, gpu_notebook("nb1", project))
        assert first.rc == 0, str(first)
        assert "GPU quota not checked: Run:ai control plane unreachable" in first.stderr, first.stderr
        await running(cluster, project, "nb1")
        second = await create_pod(cluster, gpu_notebook("nb2", project))
        assert second.rc == 0, str(second)
        assert "GPU quota not checked: Run:ai control plane unreachable" in second.stderr, second.stderr

        async def kais_reasons() -> list[Obj]:
            group = kai.pod_group_of(project, "nb2")
            return unschedulable(group) if group else []

        reasons = await cluster.eventually(kais_reasons, "KAI's reason on nb2's PodGroup", 60)
        assert [r["reason"] for r in reasons] == ["NonPreemptibleOverQuota"], reasons
        assert (await pod_json(cluster, project, "nb2"))["status"]["phase"] == "Pending"
    finally:
        local.background.run(local.runai.resume())


async def test_what_kais_podgrouper_does_when_a_running_pod_is_relabelled(cluster: Cluster, kai: Kai) -> None:
    """Item 7. A pod's labels can be edited after it was admitted. On KAI's real podgrouper, with
    our webhooks out of the way (a namespace that is not a project, its Job's pods in a project's
    queue, as in a project they would be): a running job pod relabelled
    `kai.scheduler/preemptibility=non-preemptible` makes its PodGroup non-preemptible, so the
    project's Queue holds a non-preemptible GPU over its quota of 0, which KAI would never have
    placed; `runai/queue` changed to another project leaves the PodGroup in the first queue. In a
    project our webhook refuses both edits."""
    jobs = await bound_project(cluster, kai, "kai-edit", quota=0)
    other = await bound_project(cluster, kai, "kai-other", quota=2)
    outside = await cluster.plain_namespace("kai-edit-outside")
    await cluster.ok("label", "namespace", outside, f"{QUEUE_LABEL}={jobs}")
    job = gpu_job("train", outside, pods=1, gpus=1)
    job["spec"]["template"]["metadata"]["labels"] = {QUEUE_LABEL: jobs, PREEMPTIBILITY: "preemptible"}
    # Labels of its own, as a project's Job has (else the Job takes its template's, and KAI's
    # podgrouper reads an owner's preemptibility label before the pod's).
    job["metadata"]["labels"] = {"app": "train"}
    await cluster.apply(job)

    async def one_running() -> Obj | None:
        pods = await cluster.list("pods", outside, "-l", "job-name=train")
        return next((p for p in pods if p["status"].get("phase") == "Running"), None)

    pod = await cluster.eventually(one_running, "the job's pod Running", 90)
    name = pod["metadata"]["name"]
    before = await pod_group(cluster, kai, outside, name)
    assert (before["spec"]["preemptibility"], before["spec"]["queue"]) == ("preemptible", jobs), before["spec"]

    await cluster.ok("label", "pod", name, "-n", outside, f"{PREEMPTIBILITY}=non-preemptible", "--overwrite")

    def group_spec() -> dict[str, Any]:
        return dict((kai.pod_group_of(outside, name) or {}).get("spec") or {})

    await cluster.eventually(lambda: group_spec().get("preemptibility") == "non-preemptible",
                             "the PodGroup non-preemptible after the pod's relabel", 30)  # fmt: skip
    usage = await cluster.eventually(
        lambda: (u := gpus_of(queue_usage(kai.queue(jobs) or {})))["allocatedNonPreemptible"] == 1 and u,
        f"Queue {jobs} holding a non-preemptible GPU over its quota of 0", 60)  # fmt: skip
    assert usage["allocated"] == 1, usage
    assert (await pod_json(cluster, outside, name))["status"]["phase"] == "Running"

    await cluster.ok("label", "pod", name, "-n", outside, f"{QUEUE_LABEL}={other}", "--overwrite")
    await asyncio.sleep(5)  # the podgrouper has seen the update (it acted on the first within seconds)
    assert group_spec()["queue"] == jobs, group_spec()
    assert gpus_of(queue_usage(kai.queue(other) or {}))["allocated"] == 0

    # In a project, our webhook refuses both edits of a running job pod, naming the key.
    await cluster.apply(gpu_job("train", jobs, pods=1, gpus=1))

    async def ours_running() -> Obj | None:
        pods = await cluster.list("pods", jobs, "-l", "job-name=train")
        return next((p for p in pods if p["status"].get("phase") == "Running"), None)

    mine = (await cluster.eventually(ours_running, "the project's job pod Running", 90))["metadata"]["name"]
    for key, value in ((PREEMPTIBILITY, "non-preemptible"), (QUEUE_LABEL, other)):
        stderr = await cluster.refused("label", "pod", mine, "-n", jobs, f"{key}={value}", "--overwrite")
        assert f"label {key} changed from " in stderr, stderr
    mine_group = kai.pod_group_of(jobs, mine) or {}
    assert (mine_group["spec"]["preemptibility"], mine_group["spec"]["queue"]) == ("preemptible", jobs), mine_group


def fraction_notebook(name: str, namespace: str, **annotations: str) -> Obj:
    notebook = gpu_notebook(name, namespace)
    notebook["spec"]["containers"][0].pop("resources")
    notebook["metadata"]["annotations"] = dict(annotations)
    return notebook


GPU_INDEX = "run.ai/reserve_for_gpu_index"


async def with_reservations_played(cluster: Cluster, check: Callable[[], Any], what: str, within_s: float) -> Any:
    """Polls `check` while playing the container of KAI's GPU reservation pods: the binder starts
    one on the chosen node and waits for its container to write the GPU it was given (NVML's UUID)
    on the pod; kwok runs no container, so each running reservation pod gets it written here."""

    async def step() -> Any:
        for p in await cluster.list("pods", RESERVATION_NAMESPACE):
            if p["status"].get("phase") == "Running" and GPU_INDEX not in (p["metadata"].get("annotations") or {}):
                name = p["metadata"]["name"]
                await cluster.kubectl("annotate", "pod", name, "-n", RESERVATION_NAMESPACE, f"{GPU_INDEX}=GPU-{name}")
        got = check()
        return await got if asyncio.iscoroutine(got) else got

    return await cluster.eventually(step, what, within_s)


async def test_a_fraction_notebook_is_placed_by_kai_but_not_bound(cluster: Cluster, kai: Kai) -> None:
    """Item 4, as the chain is: a `gpu-fraction: "0.5"` notebook is admitted by us, grouped by KAI's
    podgrouper (0.5 GPU requested) and placed by KAI's scheduler, which has a GPU reservation pod
    started on the node; KAI's binder then refuses to bind it, because KAI's mutating admission
    never acted on it: the pod had no `runai-scheduler` scheduler name when that webhook was called
    (Run:ai's stand-in sets it later), and a webhook not called is not called again."""
    project = await bound_project(cluster, kai, "kai-frac")
    result = await create_pod(cluster, fraction_notebook("half", project, **{"gpu-fraction": "0.5"}))
    assert result.rc == 0, str(result)
    stored = await pod_json(cluster, project, "half")
    assert stored["spec"]["schedulerName"] == SCHEDULER_NAME
    assert not stored["spec"]["containers"][0].get("env"), stored["spec"]["containers"][0]  # KAI's mutation: none
    group = await pod_group(cluster, kai, project, "half")
    assert group["spec"]["preemptibility"] == "non-preemptible", group["spec"]

    async def binding_error() -> list[str]:
        return [e["message"] for e in await events_of(cluster, project, "half") if e["reason"] == "BindingError"]

    errors = await with_reservations_played(cluster, binding_error, "KAI's binder's error", 90)
    scheduled = [e["message"] for e in await events_of(cluster, project, "half") if e["reason"] == "Scheduled"]
    node = scheduled[0].rsplit(" to node ", 1)[1].split(" ")[0]
    assert errors[0] == (
        f"Failed to bind pod {project}/half to node {node}: plugin gpusharing failed in PreBind: failed to create "
        "capabilities configmap: failed to get capabilities configmap name: no desired configmap name found in pod "
        f"{project}/half annotations"
    ), errors
    assert (await pod_json(cluster, project, "half"))["status"]["phase"] == "Pending"


async def test_a_fraction_notebook_naming_runai_scheduler_itself_runs(cluster: Cluster, kai: Kai) -> None:
    """Item 4, with `schedulerName: runai-scheduler` written by the pod's creator (as Run:ai tells
    its users): KAI's mutating admission acts on it at its first call, and KAI's scheduler and
    binder place and bind it on a shared GPU."""
    project = await bound_project(cluster, kai, "kai-frac2")
    notebook = fraction_notebook("half", project, **{"gpu-fraction": "0.5"})
    notebook["spec"]["schedulerName"] = SCHEDULER_NAME
    result = await create_pod(cluster, notebook)
    assert result.rc == 0, str(result)
    stored = await pod_json(cluster, project, "half")

    async def placed() -> Obj | None:
        pod = await pod_json(cluster, project, "half")
        errors = [e for e in await events_of(cluster, project, "half") if e["reason"] == "BindingError"]
        return pod if pod["spec"].get("nodeName") or errors else None

    pod = await with_reservations_played(cluster, placed, "the notebook bound (or KAI's binder's error)", 120)
    # KAI's admission: the GPU share's environment from a ConfigMap it names on the pod.
    env = {e["name"]: e["valueFrom"]["configMapKeyRef"]["name"] for e in stored["spec"]["containers"][0]["env"]}
    shared = stored["metadata"]["annotations"]["runai/shared-gpu-configmap"]
    assert set(env) == {"NVIDIA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS", "GPU_PORTION"}, env
    assert set(env.values()) == {f"{shared}-0"}, env
    # KAI's binder: bound on a shared GPU of the node, its ConfigMaps written.
    assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"], pod["status"]
    assert pod["metadata"]["annotations"]["received-resource-type"] == "Fraction", pod["metadata"]
    assert "runai-gpu-group" in pod["metadata"]["labels"], pod["metadata"]
    bound = [e["message"] for e in await events_of(cluster, project, "half") if e["reason"] == "Bound"]
    assert bound == [f"Pod bound successfully to node {pod['spec']['nodeName']}"], bound
    configmaps = {c["metadata"]["name"] for c in await cluster.list("configmaps", project)}
    assert {f"{shared}-0", f"{shared}-0-evar"} <= configmaps, configmaps


async def test_gpu_sharing_requests_both_validators_refuse(cluster: Cluster, kai: Kai) -> None:
    """Item 4: a whole `gpu-fraction` and a `gpu-memory` that is not a number of MiB, refused by ours
    in a project and by KAI's real validator where ours does not reach (a namespace labelled for
    Run:ai that is not a project)."""
    project = await bound_project(cluster, kai, "kai-frac3")
    outside = await cluster.plain_namespace("kai-frac-outside")
    await cluster.ok("label", "namespace", outside, f"{QUEUE_LABEL}={project}")
    expected = {
        "whole": ({"gpu-fraction": "1"}, "annotation gpu-fraction must be more than 0 and less than 1, got 1",
                  "gpu-fraction annotation value must be a positive number smaller than 1.0"),
        "memory": ({"gpu-memory": "12Gi"},
                   "annotation gpu-memory must be a whole number of MiB above 0 (digits only), got '12Gi'",
                   "gpu-memory annotation value must be a positive integer greater than 0"),
    }  # fmt: skip
    for case, (bad, ours_says, kai_says) in expected.items():
        ours = await create_pod(cluster, fraction_notebook(f"bad-{case}", project, **bad))
        assert ours.rc != 0, str(ours)
        assert ours.stderr.strip().endswith(
            f'admission webhook "mutate-pods.scheduling.hopsworks.ai" denied the request: GPU request: {ours_says}'
        ), ours.stderr
        theirs = await cluster.kubectl(
            "apply", "-f", "-", stdin=json.dumps(fraction_notebook(f"bad-{case}", outside, **bad))
        )
        assert theirs.rc != 0, str(theirs)
        assert theirs.stderr.strip() == (
            'Error from server (Forbidden): error when creating "STDIN": admission webhook '
            f'"admission.kai-scheduler.svc" denied the request: {kai_says}'
        ), theirs.stderr


async def test_a_department_with_less_quota_than_its_projects(cluster: Cluster, kai: Kai) -> None:
    """Item 5. A department Queue with 1 deserved GPU over a project Queue with 2: KAI checks a
    non-preemptible pod against the department too, and so do we. With the department's GPU held,
    our refusal names the GPUs left (the department's: 0), and the same notebook where our check
    does not reach stays Pending in KAI, held to the department's queue. The GPU views show what
    the Queues hold and offer what KAI would still place."""
    local = cluster.needs_local("the Run:ai stand-in")
    await turn_runai_on(cluster)
    await ensure_department(cluster, local, "kai-dept")
    in_standin(local, lambda: set_department_quota(local.runai, "kai-dept", 1))
    await cluster.settings(run_ai_project_gpu_quota="2", run_ai_directory_refresh_s="1")
    project = await cluster.project("kai-dep", **{DEPARTMENT_LABEL: "kai-dept"})
    await wait_bound(cluster, project)
    await cluster.eventually(lambda: (kai.queue(project) or {}).get("spec", {}).get("parentQueue") == "kai-dept",
                             "the project's Queue under kai-dept", 30)  # fmt: skip
    department_queue = kai.queue("kai-dept")
    assert department_queue is not None and department_queue["spec"]["resources"]["gpu"]["quota"] == 1
    assert (await create_pod(cluster, gpu_notebook("nb1", project))).rc == 0
    await running(cluster, project, "nb1")
    # Ours refuses the next one: the project has 1 of its 2 deserved GPUs left, its department none.
    second = await create_pod(cluster, gpu_notebook("nb2", project))
    assert second.rc != 0 and second.stderr.startswith("Error from server (GpuQuotaExceeded)"), str(second)
    assert (
        f"department kai-dept has 0 of 1 deserved GPUs left for its projects' non-preemptible workloads "
        f"(project {project} has 1 of 2); this notebook asks for 1"
    ) in second.stderr, second.stderr

    # The counterfactual, as in item 2: the same notebook where our quota check does not reach (a
    # namespace that is not a project, its pod in the project's queue) waits in KAI, held to the
    # department's queue.
    outside = await cluster.plain_namespace("kai-dept-outside")
    await cluster.ok("label", "namespace", outside, f"{QUEUE_LABEL}={project}")
    notebook = gpu_notebook("nb2", outside)
    notebook["metadata"]["labels"].update({QUEUE_LABEL: project, PREEMPTIBILITY: "non-preemptible"})
    await cluster.apply(notebook)
    assert (await pod_json(cluster, outside, "nb2"))["spec"]["schedulerName"] == SCHEDULER_NAME

    async def kais_reasons() -> list[Obj]:
        group = kai.pod_group_of(outside, "nb2")
        return unschedulable(group) if group else []

    reasons = await cluster.eventually(kais_reasons, "KAI's reason on nb2's PodGroup", 60)
    assert [r["reason"] for r in reasons] == ["NonPreemptibleOverQuota"], reasons
    assert reasons[0]["message"] == (
        "Non-preemptible workload is over quota. Workload requested 1 GPUs, but kai-dept quota is 1 GPUs, while 1 "
        "GPUs are already allocated for non-preemptible pods. Use a preemptible workload to go over quota."
    ), reasons[0]
    assert reasons[0]["details"]["queueDetails"]["name"] == "kai-dept", reasons[0]
    await asyncio.sleep(3)  # several scheduling cycles (1 s each): still not placed
    pod = await pod_json(cluster, outside, "nb2")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName"), pod["status"]
    await cluster.ok("delete", "pod", "nb2", "-n", outside, "--wait=false")

    # The GPU views show what the Queues hold (read back through the stand-in).
    token = await admin_token(cluster)
    queues = {n: gpus_of(queue_usage(kai.queue(n) or {})) for n in (project, "kai-dept")}
    assert queues[project]["allocatedNonPreemptible"] == queues["kai-dept"]["allocatedNonPreemptible"] == 1, queues

    async def views() -> tuple[Obj, Obj] | None:
        _, view = await call_server(local, "GET", f"/api/v1/projects/{project}/gpu", token)
        _, admin = await call_server(local, "GET", "/api/v1/admin/runai", token)
        shown = view.get("project") or {}
        return (view, admin) if shown.get("allocated_non_preemptible") == 1 else None

    view, admin = await cluster.eventually(views, "the views with the Queues' figures", 30)
    assert (view["project"]["quota"], view["project"]["allocated"]) == (2, queues[project]["allocated"]), view
    department = view["department"]
    assert (department["name"], department["quota"], department["allocated_non_preemptible"]) == ("kai-dept", 1, 1)
    listed = next(d for d in admin["departments"] if d["name"] == "kai-dept")
    assert (listed["quota"], listed["allocated_non_preemptible"]) == (1, 1), listed
    # What KAI would still place: nothing, though the project has 1 of its 2 deserved GPUs left.
    assert view["available_non_preemptible"] == 0, view

    # A department move (the Run:ai project deleted and created again in the other department).
    await ensure_department(cluster, local, "kai-dept2")
    await delete_pods(cluster, project)
    moved = await move(local, token, project, "kai-dept2")
    assert moved["outcome"] == "moved", moved

    def moved() -> Obj | None:
        q = kai.queue(project)
        return q if q and q["spec"].get("parentQueue") == "kai-dept2" else None

    q = await cluster.eventually(moved, "the project's Queue under kai-dept2", 30)
    assert q["spec"]["resources"]["gpu"]["quota"] == 0, q["spec"]


async def test_kais_real_validator_refuses_what_our_gpu_sharing_table_refuses(cluster: Cluster, kai: Kai) -> None:
    """Every row of our GPU-sharing table (tests/test_gpu_sharing.py, written from KAI's own tests)
    through KAI's real admission: a pod naming `runai-scheduler` in a namespace labelled for Run:ai
    that is not a project (ours does not see it), created with `--dry-run=server` so that KAI's
    mutating and validating webhooks both judge it. KAI refuses exactly the rows we refuse, but one."""
    project = await bound_project(cluster, kai, "kai-grammar")
    outside = await cluster.plain_namespace("kai-grammar-outside")
    await cluster.ok("label", "namespace", outside, f"{QUEUE_LABEL}={project}")
    verdicts: dict[str, tuple[bool, bool, str]] = {}
    for i, (case, spec, refused) in enumerate(GPU_SHARING_CASES):
        obj: Obj = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"grammar-{i}", "namespace": outside,
                         "annotations": dict(spec["metadata"]["annotations"])},
            "spec": {"schedulerName": SCHEDULER_NAME,
                     "containers": [{**c, "image": "registry.example/nb:1"} for c in spec["spec"]["containers"]]},
        }  # fmt: skip
        if "initContainers" in spec["spec"]:
            init = [{**c, "image": "registry.example/nb:1"} for c in spec["spec"]["initContainers"]]
            obj["spec"]["initContainers"] = init
        result = await cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(obj))
        verdicts[case] = (refused is not None, result.rc != 0, result.stderr.strip()[-200:])
    disagreements = {case for case, (ours, theirs, _) in verdicts.items() if ours != theirs}
    # The one row where we part from KAI on purpose: a value longer than MAX_ANNOTATION_CHARS is
    # refused unparsed (bounded work on hostile input); KAI parses any length and admits it.
    assert disagreements == {"a long hostile fraction"}, {c: verdicts[c] for c in disagreements}
    assert verdicts["a long hostile fraction"][:2] == (True, False)
    assert MAX_ANNOTATION_CHARS < 5002
