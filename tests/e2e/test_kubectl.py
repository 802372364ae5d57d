"""A cluster user's view, through the real kubectl: what gets stored, and what kubectl prints.

Each of the install's webhooks has a case where its selector sends the request to the server and
one where it keeps it away; `test_a_broken_install_fails_the_routing_checks` applies renders with
the routing broken and expects the same checks to fail.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import Cluster, Obj, Result, broken_install
from tests.support.cluster import SCHEDULER
from tests.support.control_plane.install import INSTALL_NS, SETTINGS
from tests.support.runai_webhook import RUNAI_SCHEDULER
from webhook.snapshot import ADMISSION_POLICIES_LABEL

pytestmark = pytest.mark.slow  # the real control plane: started once per session (~15 s), kubectl calls

MUTATE = "mutate-pods.scheduling.hopsworks.ai"
VALIDATE_PODS = "validate-pods.scheduling.hopsworks.ai"
IMAGE = "registry.example/notebook:1.0"


async def offer_scheduling(cluster: Cluster) -> None:
    """The cluster offers classes and node labels; every project gets a subset (tests/support/cluster.py).
    The classes batch, normal and urgent are the control plane's (tests/e2e/conftest.py)."""
    await cluster.settings(scheduler=yaml.safe_dump(SCHEDULER))


def pod(name: str, namespace: str, *, annotations: dict[str, str] | None = None, **spec: object) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"hopsworks.ai/workload-type": "notebook"},
                     "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "image": IMAGE}], **spec},
    }  # fmt: skip


def required_node_terms(stored: Obj) -> list[Obj]:
    affinity = stored["spec"].get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or [])


def expressions(stored: Obj) -> list[tuple[str, str, tuple[str, ...]]]:
    return sorted(
        (e["key"], e["operator"], tuple(e.get("values") or ()))
        for term in required_node_terms(stored)
        for e in term.get("matchExpressions") or ()
    )


async def test_the_install_applies_and_reapplies(cluster: Cluster) -> None:
    mutating = await cluster.get("mutatingwebhookconfiguration", "0-hopsworks-scheduling-webhook")
    assert [w["name"] for w in mutating["webhooks"]] == [MUTATE, "mutate-workloads.scheduling.hopsworks.ai"]
    validating = await cluster.get("validatingwebhookconfiguration", "hopsworks-scheduling-webhook")
    assert VALIDATE_PODS in [w["name"] for w in validating["webhooks"]]
    assert (await cluster.get("deploy", "scheduling-webhook", INSTALL_NS))["spec"]["replicas"] >= 2
    local = cluster.needs_local("re-applies the harness's own render")
    assert len(local.applied) == 2  # `helm install`, and `helm upgrade` once the replicas served
    for revision, out in enumerate(local.applied, start=1):
        assert "STATUS: deployed" in out and f"REVISION: {revision}" in out, out
    # A changed render re-applied server-side (taking the field over from helm): the webhook keyed
    # by name is changed in place.
    objects = [copy.deepcopy(o) for o in local.objects if o["kind"] == "ValidatingWebhookConfiguration"]
    before = [w["name"] for w in validating["webhooks"]]
    objects[0]["webhooks"][1]["timeoutSeconds"] = 7
    await cluster.ok("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump_all(objects))
    after = await cluster.get("validatingwebhookconfiguration", "hopsworks-scheduling-webhook")
    assert [w["name"] for w in after["webhooks"]] == before
    assert after["webhooks"][1]["timeoutSeconds"] == 7
    local.apply_webhook_configurations(None)


async def test_kubectl_run_stores_the_merged_scheduling(cluster: Cluster) -> None:
    await offer_scheduling(cluster)
    project = await cluster.project("vision")
    # mutate-pods selects the project: the stored pod carries the choice merged with the defaults.
    await cluster.ok("run", "nb", "-n", project, f"--image={IMAGE}", "--labels=hopsworks.ai/workload-type=notebook",
                     "--annotations=scheduling.hopsworks.ai/affinity=disk=ssd")  # fmt: skip
    stored = await cluster.get("pod", "nb", project)
    assert expressions(stored) == [("disk", "In", ("ssd",)), ("maintenance", "NotIn", ("true",))]
    assert (stored["spec"]["priorityClassName"], stored["spec"]["priority"]) == ("normal", 10000)
    # kubectl apply of a manifest with a class of the project's set and an anti-affinity choice.
    await cluster.apply(pod("job", project, annotations={"scheduling.hopsworks.ai/anti-affinity": ""},
                            priorityClassName="batch"))  # fmt: skip
    stored = await cluster.get("pod", "job", project)
    assert (stored["spec"]["priorityClassName"], stored["spec"]["priority"]) == ("batch", 1000)
    assert stored["spec"]["preemptionPolicy"] == "Never"
    # The same in a namespace that is not a project: the selector keeps it away, nothing is added.
    other = await cluster.plain_namespace("tools")
    await cluster.ok("run", "nb", "-n", other, f"--image={IMAGE}",
                     "--annotations=scheduling.hopsworks.ai/affinity=disk=ssd")  # fmt: skip
    stored = await cluster.get("pod", "nb", other)
    assert required_node_terms(stored) == [] and "priorityClassName" not in stored["spec"]


RESTRICTED = {  # what Pod Security's `restricted` level asks of every container
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


async def test_a_restricted_project_admits_the_patched_pods_and_the_scheduler_honours_them(cluster: Cluster) -> None:
    await offer_scheduling(cluster)
    project = await cluster.project("secure", **{"pod-security.kubernetes.io/enforce": "restricted"})
    # The apiserver's PodSecurity plugin is on: a pod that does not meet the level is refused.
    stderr = await cluster.refused("run", "loose", "-n", project, f"--image={IMAGE}")
    assert "violates PodSecurity" in stderr and "restricted:latest" in stderr, stderr
    notebook = pod("nb", project, annotations={"scheduling.hopsworks.ai/affinity": "topology.kubernetes.io/zone=eu-1a"})
    notebook["spec"]["containers"][0]["securityContext"] = RESTRICTED
    await cluster.apply(notebook)
    stored = await cluster.get("pod", "nb", project)
    # The chosen zone, and the project's default: never a node under maintenance.
    assert expressions(stored) == [
        ("maintenance", "NotIn", ("true",)),
        ("topology.kubernetes.io/zone", "In", ("eu-1a",)),
    ]
    # The class's priority and preemption policy, as the real PriorityClass object has them.
    klass = await cluster.get("priorityclass", stored["spec"]["priorityClassName"])
    assert stored["spec"]["priority"] == klass["value"]
    assert stored["spec"]["preemptionPolicy"] == klass.get("preemptionPolicy", "PreemptLowerPriority")

    # The real kube-scheduler placed it where the affinity allows: a kwok node of zone eu-1a.
    async def node() -> str | None:
        return (await cluster.get("pod", "nb", project))["spec"].get("nodeName")

    placed = await cluster.eventually(node, "nb scheduled")
    assert (await cluster.get("node", placed))["metadata"]["labels"]["topology.kubernetes.io/zone"] == "eu-1a"


async def test_a_class_outside_the_project_set_is_refused_in_kubectl_stderr(cluster: Cluster) -> None:
    await offer_scheduling(cluster)
    project = await cluster.project("nlp")
    stderr = await cluster.refused("apply", "-f", "-",
                                   stdin=yaml.safe_dump(pod("nb", project, priorityClassName="urgent")))  # fmt: skip
    assert stderr.startswith("Error from server (Forbidden): error when creating"), stderr
    # Where the compiled admission policies decide the project (1.36 and newer), their
    # ValidatingAdmissionPolicy refuses it with the webhook's words; elsewhere the webhook does.
    by_policy = "ValidatingAdmissionPolicy 'scheduling-webhook-pods'" in stderr and "denied request:" in stderr
    assert by_policy or ("admission webhook" in stderr and "denied the request:" in stderr), stderr
    assert f"urgent not available in project {project}; allowed: batch, normal" in stderr, stderr
    # Not a project: the validating and mutating selectors exclude it, the class is stored as asked.
    other = await cluster.plain_namespace("tools")
    await cluster.apply(pod("nb", other, priorityClassName="urgent"))
    assert (await cluster.get("pod", "nb", other))["spec"]["priority"] == 100000


async def test_a_project_offer_annotation_is_validated_on_project_namespaces_only(cluster: Cluster) -> None:
    project = await cluster.project("offer")
    stderr = await cluster.refused("annotate", "namespace", project, "scheduling.hopsworks.ai/available=not json")
    assert 'admission webhook "validate-namespaces.scheduling.hopsworks.ai" denied the request' in stderr, stderr
    ops = [{"op": "add", "path": "/metadata/annotations", "value": {"scheduling.hopsworks.ai/available": "[1"}}]
    stderr = await cluster.refused("patch", "namespace", project, "--type", "json", "-p", json.dumps(ops))
    assert 'admission webhook "validate-namespaces.scheduling.hopsworks.ai" denied the request' in stderr, stderr
    other = await cluster.plain_namespace("tools")  # the objectSelector leaves it out
    await cluster.ok("annotate", "namespace", other, "scheduling.hopsworks.ai/available=not json")


async def check_routing_with_the_servers_down(cluster: Cluster) -> None:
    """With no server answering, the webhooks' failurePolicy refuses what they select, and only that."""
    local = cluster.needs_local("scales the install down")
    project = await cluster.project("down")
    await asyncio.to_thread(local.scale, 0)
    # A GPU pod: the webhook's everywhere, also where the compiled admission policies decide the
    # project's other pods (those are admitted by the policies with no server up).
    gpu = pod("nb", project)
    gpu["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    stderr = await cluster.refused("apply", "-f", "-", stdin=yaml.safe_dump(gpu))
    assert f'failed calling webhook "{MUTATE}"' in stderr, stderr
    # Pod owners too: Run:ai reads their labels before their pods'.
    stderr = await cluster.refused("create", "cronjob", "nightly", "-n", project, f"--image={IMAGE}",
                                   "--schedule=0 0 1 1 *")  # fmt: skip
    assert 'failed calling webhook "validate-workloads.scheduling.hopsworks.ai"' in stderr, stderr
    name = f"probe-{project}"  # unique: the system namespaces outlive the test
    for namespace in ("kube-system", INSTALL_NS):
        await cluster.ok("run", name, "-n", namespace, f"--image={IMAGE}")
        await cluster.ok("delete", "pod", name, "-n", namespace, "--wait=false")


async def test_with_the_servers_down_only_project_pods_are_refused(cluster: Cluster) -> None:
    await check_routing_with_the_servers_down(cluster)


async def turn_runai_on(cluster: Cluster) -> None:
    local = cluster.needs_local("needs the Run:ai stand-ins")
    runai = local.runai
    await cluster.settings(run_ai_enable="true", run_ai_url=local.runai_url, run_ai_client_id=runai.client_id,
                           run_ai_project_gpu_quota="2")  # fmt: skip
    await wait_for(lambda: local.metric("webhook_runai_reachable") == [1.0, 1.0], "Run:ai reachable on both replicas")


async def wait_for(condition: Callable[[], object], what: str, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {within_s}s: {what}"
        await asyncio.sleep(0.05)


async def as_a_controller(cluster: Cluster, *args: str, stdin: str | None = None, within_s: float = 10.0
                          ) -> tuple[Result, list[str]]:  # fmt: skip
    """kubectl again after a retryable refusal (a binding settling), as the platform does. Returns
    the last answer and the refusals before it."""
    refusals: list[str] = []
    deadline = time.monotonic() + within_s
    while True:
        result = await cluster.kubectl(*args, stdin=stdin)
        if "Error from server (RunaiBindingSettling)" not in result.stderr:  # 503, retryable
            return result, refusals
        refusals.append(result.stderr)
        assert time.monotonic() < deadline, refusals
        await asyncio.sleep(0.3)


async def check_runai_sees_the_queue(cluster: Cluster) -> None:
    """Run:ai on: a new project's first pod binds it and is refused with a retryable message; the
    retry goes through Run:ai's webhook, which sees the pod with its queue (our webhook ran first)."""
    await turn_runai_on(cluster)
    local = cluster.needs_local("needs the Run:ai stand-ins")
    project = await cluster.project("fresh")
    result, refusals = await as_a_controller(cluster, "run", "nb", "-n", project, f"--image={IMAGE}",
                                             "--labels=hopsworks.ai/workload-type=notebook")  # fmt: skip
    assert result.rc == 0, str(result)
    # Bound by this first pod ("has just been bound") or, a moment earlier, by the leader's pass
    # ("moments ago"): either way the webhook refuses the pod until the apiserver's cache has the
    # binding. Unless the leader had also labelled the project for the compiled policies (1.36 and
    # newer): it does so only after it saw the binding, and the apiserver's namespace informer,
    # which Run:ai's webhook selector reads too, delivers the two in that order.
    labels = (await cluster.get("namespace", project))["metadata"]["labels"]
    decided = labels.get(ADMISSION_POLICIES_LABEL) == "on"
    assert refusals or decided, "a pod was admitted in the moment its project was bound"
    for refusal in refusals:
        assert f"project namespace {project} " in refusal and "again" in refusal, refusal
    assert (await cluster.get("namespace", project))["metadata"]["labels"]["runai/queue"] == project
    stored = await cluster.get("pod", "nb", project)
    assert stored["metadata"]["labels"]["runai/queue"] == project
    assert stored["spec"]["schedulerName"] == RUNAI_SCHEDULER, "Run:ai's webhook did not see the pod"
    seen = local.runai_admission.pods_seen(project)
    assert [p["metadata"]["labels"].get("runai/queue") for p in seen] == [project], seen


async def test_runai_binds_a_new_project_and_its_pod_goes_through_runai(cluster: Cluster) -> None:
    await check_runai_sees_the_queue(cluster)


async def check_runai_sees_the_queue_from_the_webhooks(cluster: Cluster) -> None:
    """The same where only the webhooks decide: the compiled admission policies, whose mutation runs
    before every webhook, would give the pod its queue whatever order the webhooks are in. With the
    priority class subset in warn mode the leader leaves every project to the webhooks."""
    await cluster.settings(priority_class_enforcement="warn")
    await check_runai_sees_the_queue(cluster)


async def test_kueue_cannot_be_turned_on_while_runai_is_on(cluster: Cluster, tmp_path: Path) -> None:
    await turn_runai_on(cluster)
    stderr = await cluster.refused("patch", "configmap", SETTINGS, "-n", INSTALL_NS, "--type", "merge",
                                   "-p", '{"data":{"kueue_installed":"true"}}')  # fmt: skip
    assert 'admission webhook "validate-settings.scheduling.hopsworks.ai" denied the request' in stderr, stderr
    assert "kueue_installed and run_ai_enable cannot both be true" in stderr, stderr
    stderr = await cluster.refused("patch", "configmap", SETTINGS, "-n", INSTALL_NS, "--type", "strategic",
                                   "-p", '{"data":{"kueue_installed":"true"}}')  # fmt: skip
    assert "kueue_installed and run_ai_enable cannot both be true" in stderr, stderr
    # The same through `kubectl edit`, with an editor that flips the flag.
    editor = tmp_path / "editor.sh"
    editor.write_text('#!/bin/sh\nsed -i \'s/kueue_installed: "false"/kueue_installed: "true"/\' "$1"\n')
    editor.chmod(0o755)
    result = await cluster.kubectl("edit", "configmap", SETTINGS, "-n", INSTALL_NS, "-o", "yaml",
                                   env={"KUBE_EDITOR": str(editor)})  # fmt: skip
    # G1 is a policy refusal (403): `kubectl edit` prints the rule's message. For a 422 it would say
    # only that the object "is invalid" (the apiserver passes a webhook's message but no causes on).
    assert result.rc != 0 and "kueue_installed and run_ai_enable cannot both be true" in result.stderr, str(result)
    assert (await cluster.get("configmap", SETTINGS, INSTALL_NS))["data"]["kueue_installed"] == "false"
    # The namespaceSelector names the install namespace only: the same ConfigMap elsewhere is stored.
    other = await cluster.plain_namespace("copy")
    await cluster.ok("create", "configmap", SETTINGS, "-n", other, "--from-literal=kueue_installed=true",
                     "--from-literal=run_ai_enable=true")  # fmt: skip


def drop_namespace_selectors(objects: list[Obj]) -> None:
    for obj in objects:
        for webhook in obj.get("webhooks") or ():
            webhook.pop("namespaceSelector", None)


def sort_after_runai(objects: list[Obj]) -> None:
    for obj in objects:
        if obj["kind"] == "MutatingWebhookConfiguration":
            obj["metadata"]["name"] = "zz-" + obj["metadata"]["name"]


@pytest.mark.parametrize(
    ("mutation", "check", "failure"),
    [
        # mutate-pods then calls the (stopped) server for kube-system pods too
        (drop_namespace_selectors, check_routing_with_the_servers_down, "-n kube-system --image="),
        # Run:ai's webhook sees the pod before ours gave it the queue
        (sort_after_runai, check_runai_sees_the_queue_from_the_webhooks, "== ['fresh-"),
    ],
    ids=["namespaceSelector-dropped", "mutating-configuration-sorts-after-runai"],
)
async def test_a_broken_install_fails_the_routing_checks(
    cluster: Cluster, mutation: Callable[[list[Obj]], None], check: Callable[[Cluster], Awaitable[None]], failure: str
) -> None:
    local = cluster.needs_local("applies a deliberately broken render")
    with broken_install(local, mutation), pytest.raises(AssertionError) as failed:
        await check(cluster)
    assert failure in str(failed.value), str(failed.value)


def gpu_deployment(name: str, namespace: str, replicas: int) -> Obj:
    labels = {"app": name, "hopsworks.ai/workload-type": "deployment"}
    container = {"name": "main", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}},
    }  # fmt: skip


async def quota_known_project(cluster: Cluster, prefix: str) -> tuple[str, str]:
    """A new project, bound to Run:ai by the leader's pass and known to every replica's Run:ai
    directory; and a Deployment of 3 x 1 GPU (as YAML) that its quota of 2 refuses."""
    await turn_runai_on(cluster)
    project = await cluster.project(prefix)

    async def bound() -> bool:
        return "runai/queue" in (await cluster.get("namespace", project))["metadata"]["labels"]

    deadline = time.monotonic() + 10
    while not await bound():  # the leader's pass binds a new project
        assert time.monotonic() < deadline, f"{project} not bound to Run:ai"
        await asyncio.sleep(0.2)
    # Until every replica's Run:ai directory has the new project, a Deployment is admitted with a
    # warning that its quota was not checked yet (its pods are, when they start): wait that out.
    model = yaml.safe_dump(gpu_deployment("model", project, 3))

    async def checked() -> bool:
        result = await cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=model)
        return result.rc != 0 and "not checked yet" not in result.stderr

    await cluster.eventually(checked, f"{project}'s quota known to the replicas", within_s=40)
    return project, model


async def test_gpu_workloads_over_the_quota_are_refused_in_projects_only(cluster: Cluster) -> None:
    project, model = await quota_known_project(cluster, "serving")
    stderr = await cluster.refused("apply", "-f", "-", stdin=model)
    assert 'admission webhook "validate-workloads.scheduling.hopsworks.ai" denied the request' in stderr, stderr
    assert "Deployment model" in stderr and "Lower its replicas" in stderr, stderr
    await cluster.apply(gpu_deployment("small", project, 1))  # within the quota of 2
    # The real ReplicaSet controller creates its pod (admitted: 1 GPU of 2) and kwok runs it.
    await cluster.eventually(lambda: cluster.list("pods", project, "-l", "app=small"), "the pod of Deployment small")
    # A notebook asking for more GPUs than the project has left, while the cluster has GPUs.
    notebook = pod("nb", project)
    notebook["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "3"}}
    result, _ = await as_a_controller(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(notebook))
    assert result.rc != 0 and result.stderr.startswith("Error from server (GpuQuotaExceeded)"), str(result)
    assert 'admission webhook "validate-pods.scheduling.hopsworks.ai" denied the request' in result.stderr
    assert f"project {project} has 1 of 2 deserved GPUs left; this notebook asks for 3" in result.stderr
    other = await cluster.plain_namespace("tools")  # not a project: the namespaceSelectors exclude it
    await cluster.apply(gpu_deployment("model", other, 3))
    await cluster.apply(notebook | {"metadata": {**notebook["metadata"], "namespace": other}})


async def test_a_deployments_pods_carry_the_merged_scheduling(cluster: Cluster) -> None:
    await offer_scheduling(cluster)
    project = await cluster.project("web")
    deployment = gpu_deployment("web", project, 1)
    template = deployment["spec"]["template"]
    template["spec"]["containers"][0].pop("resources")
    template["metadata"]["annotations"] = {"scheduling.hopsworks.ai/affinity": "disk=ssd"}
    await cluster.apply(deployment)
    deadline = time.monotonic() + 60
    while True:  # the ReplicaSet controller creates the pod through admission
        pods = json.loads(await cluster.ok("get", "pods", "-n", project, "-l", "app=web", "-o", "json"))["items"]
        if pods:
            break
        assert time.monotonic() < deadline, f"no pod of Deployment web in {project}"
        await asyncio.sleep(1)
    assert expressions(pods[0]) == [("disk", "In", ("ssd",)), ("maintenance", "NotIn", ("true",))]
    assert pods[0]["spec"]["priorityClassName"] == "normal"


def gpu_cronjob(name: str, namespace: str, *, labels: dict[str, str] | None = None,
                job_labels: dict[str, str] | None = None) -> Obj:  # fmt: skip
    container = {"name": "main", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    job_template: Obj = {"spec": {"template": {"spec": {"containers": [container], "restartPolicy": "Never"}}}}
    if job_labels:
        job_template["metadata"] = {"labels": job_labels}
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"schedule": "0 0 1 1 *", "suspend": True, "jobTemplate": job_template},
    }


def replica_set(name: str, namespace: str, labels: dict[str, str]) -> Obj:
    pod_labels = {"app": name, "hopsworks.ai/workload-type": "notebook"}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": pod_labels},
                              "spec": {"containers": [{"name": "main", "image": IMAGE}]}}},
    }  # fmt: skip


async def test_owners_labelled_against_their_pods_are_refused_by_kubectl_apply(cluster: Cluster) -> None:
    """Run:ai reads the preemptibility and queue from a pod's owners before the pod: CronJobs and
    ReplicaSets (and a CronJob's job template, which its Jobs carry) labelled otherwise than the
    platform makes their pods are refused at apply, and so is a pod whose first owner is a
    ConfigMap; owners labelled as their pods pass."""
    await turn_runai_on(cluster)
    project = await cluster.project("owners")

    async def bound() -> bool:
        return "runai/queue" in (await cluster.get("namespace", project))["metadata"]["labels"]

    await cluster.eventually(bound, f"{project} bound to Run:ai")
    workloads = 'admission webhook "validate-workloads.scheduling.hopsworks.ai" denied the request'
    refusals = {
        "CronJob night": gpu_cronjob("night", project, labels={"kai.scheduler/preemptibility": "non-preemptible"}),
        "CronJob nightly: its job template's label": gpu_cronjob(
            "nightly", project, job_labels={"kai.scheduler/preemptibility": "non-preemptible"}
        ),
        "ReplicaSet nb": replica_set("nb", project, {"kai.scheduler/preemptibility": "preemptible"}),
        "ReplicaSet nb2: label runai/queue=elsewhere": replica_set("nb2", project, {"runai/queue": "elsewhere"}),
    }
    for said, obj in refusals.items():
        stderr = await cluster.refused("apply", "-f", "-", stdin=yaml.safe_dump(obj))
        assert workloads in stderr and said in stderr, stderr
    # Labelled as the platform makes their pods, they pass.
    await cluster.apply(gpu_cronjob("fine", project, labels={"kai.scheduler/preemptibility": "preemptible"}))
    await cluster.apply(replica_set("fine", project, {"kai.scheduler/preemptibility": "non-preemptible"}))

    # A pod whose first ownerReference is a ConfigMap labelled non-preemptible, its Job second.
    await cluster.ok("create", "configmap", "cm", "-n", project)
    await cluster.ok("label", "configmap", "cm", "-n", project, "kai.scheduler/preemptibility=non-preemptible")
    uid = (await cluster.get("configmap", "cm", project))["metadata"]["uid"]
    notebook = pod("owned", project)
    notebook["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": uid}]
    notebook["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
    result, _ = await as_a_controller(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(notebook))
    assert result.rc != 0, str(result)
    assert f'admission webhook "{MUTATE}" denied the request' in result.stderr, result.stderr
    assert "first ownerReference is ConfigMap cm" in result.stderr, result.stderr
