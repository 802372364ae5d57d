"""Warn before enforce on the real control plane, family by family: with the family's setting at
`warn`, a request breaking its rule is stored, kubectl prints the would-be refusal as a warning,
the apiserver's audit log has the `would-refuse` annotation and the replicas' metric counts it;
switched to `enforce`, the next one is refused.

The requests are made as AUDITED_CREATOR, a project member whose requests the audit log keeps.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import AUDITED_CREATOR, AUDITED_CREATOR_USER, Cluster, Obj, Result
from tests.e2e.test_kubectl import expressions, gpu_deployment, offer_scheduling, pod, quota_known_project
from tests.support.control_plane.install import Install
from webhook.core.enforcement import WOULD_REFUSE_ANNOTATION

pytestmark = pytest.mark.slow


# The 503 a pod of a project bound moments ago gets while the binding settles on every replica:
# retryable, and the ReplicaSet controller or the platform tries again, as the loops below do.
SETTLING = "RunaiBindingSettling"
ADMITTED_BY = "Warning: admitted because {key} is warn; with enforce this is refused: "


def gpu_notebook(name: str, namespace: str, gpus: int) -> str:
    notebook = pod(name, namespace)
    notebook["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return yaml.safe_dump(notebook)


async def audited_creator(cluster: Cluster, local: Install, project: str) -> dict[str, str]:
    """kubectl's environment for AUDITED_CREATOR, with the `edit` role in `project`."""
    namespace, name = AUDITED_CREATOR
    await cluster.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "audited-creator", "namespace": project},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    )  # fmt: skip
    token = await asyncio.to_thread(local.cp.token, namespace, name, "1h")
    return {"KUBECONFIG": str(local.cp.token_kubeconfig(cluster.home / "audited-creator.kubeconfig", token))}


async def until_admitted(cluster: Cluster, env: dict[str, str], manifest: str, refusal: str) -> Result:
    """`kubectl apply` until admitted: each replica reads the settings from its watch, and until
    both have, the Service may send the request to one that still refuses it (`refusal`)."""
    deadline = time.monotonic() + 20
    while True:
        result = await cluster.kubectl("apply", "-f", "-", stdin=manifest, env=env)
        if result.rc == 0:
            return result
        assert (refusal in result.stderr or SETTLING in result.stderr) and time.monotonic() < deadline, str(result)
        await asyncio.sleep(0.3)


async def until_refused(cluster: Cluster, env: dict[str, str], manifest: str, kind: str, name: str, ns: str) -> Result:
    """`kubectl apply` until refused, deleting what a replica still in warn admitted."""
    deadline = time.monotonic() + 20
    while True:
        result = await cluster.kubectl("apply", "-f", "-", stdin=manifest, env=env)
        if result.rc != 0 and SETTLING not in result.stderr:
            return result
        assert time.monotonic() < deadline, "still admitted with enforce on"
        if result.rc == 0:
            await cluster.ok("delete", kind, name, "-n", ns, "--wait=false")
        await asyncio.sleep(0.3)


def created_audit(local: Install, since: int, resource: str, namespace: str) -> dict[str, str]:
    """The audit annotations of AUDITED_CREATOR's stored creates of `resource` in `namespace`, as
    the apiserver recorded them."""
    found: dict[str, str] = {}
    for event in local.cp.audit.events(since, user=AUDITED_CREATOR_USER):
        if event.verb == "create" and event.resource == resource and event.namespace == namespace and event.code == 201:
            annotations: dict[str, Any] = event.raw.get("annotations") or {}
            found.update({k: str(v) for k, v in annotations.items()})
    return found


def would_refuse_audit(local: Install, since: int, resource: str, namespace: str) -> dict[str, str]:
    """The `would-refuse` audit annotations of those creates, by webhook."""
    return {k: v for k, v in created_audit(local, since, resource, namespace).items() if k.endswith("/would-refuse")}


def counted(local: Install, rule: str, project: str) -> float:
    return sum(local.metric("webhook_would_refuse_total", rule=rule, project=project))


async def test_gpu_quota_warn_admits_and_counts_then_enforce_refuses(cluster: Cluster) -> None:
    local = cluster.needs_local("reads the replicas' metrics and the audit log, and needs the Run:ai stand-ins")
    project, _ = await quota_known_project(cluster, "warn")  # 2 deserved GPUs per new project
    creator = await audited_creator(cluster, local, project)
    try:
        await cluster.settings(gpu_quota_enforcement="warn")
        since = local.cp.audit.mark()
        warned = await until_admitted(cluster, creator, gpu_notebook("nb-warn", project, 3), "GpuQuotaExceeded")
        assert ADMITTED_BY.format(key="gpu_quota_enforcement") in warned.stderr, str(warned)
        said = f"project {project} has 2 of 2 deserved GPUs left; this notebook asks for 3"
        assert said in warned.stderr
        assert (await cluster.get("pod", "nb-warn", project))["metadata"]["labels"]["runai/queue"] == project
        assert counted(local, "gpu-quota", project) == 1
        audit = would_refuse_audit(local, since, "pods", project)
        assert said in audit.get("validate-pods.scheduling.hopsworks.ai/would-refuse", ""), audit

        await cluster.settings(gpu_quota_enforcement="enforce")
        # nb-warn holds 3 of the 2 deserved GPUs now: even one more is over the quota.
        refused = await until_refused(cluster, creator, gpu_notebook("nb-next", project, 1), "pod", "nb-next", project)
        assert refused.stderr.startswith("Error from server (GpuQuotaExceeded)"), str(refused)
        assert f"project {project} has 0 of 2 deserved GPUs left; this notebook asks for 1" in refused.stderr
    finally:
        await cluster.settings(gpu_quota_enforcement="enforce")


async def test_subset_choices_warn_with_the_scheduling_they_chose_then_enforce_refuses(cluster: Cluster) -> None:
    """Priority class and affinity outside the project's subset (tests/support/cluster.py's: the
    project may use batch and normal, and the zone and disk labels)."""
    local = cluster.needs_local("reads the replicas' metrics and the audit log")
    await offer_scheduling(cluster)
    project = await cluster.project("warnsub")
    creator = await audited_creator(cluster, local, project)

    def notebook(name: str) -> str:
        chosen = pod(name, project, annotations={"scheduling.hopsworks.ai/affinity": "nvidia.com/gpu.product=A100"},
                     priorityClassName="urgent")  # fmt: skip
        return yaml.safe_dump(chosen)

    try:
        await cluster.settings(priority_class_enforcement="warn", affinity_enforcement="warn")
        since = local.cp.audit.mark()
        warned = await until_admitted(cluster, creator, notebook("nb-chose"), "not available in project")
        priority = f"priority class urgent not available in project {project}; allowed: batch, normal"
        affinity = f"affinity nvidia.com/gpu.product=A100 not available in project {project}"
        assert ADMITTED_BY.format(key="priority_class_enforcement") + priority in warned.stderr, str(warned)
        assert ADMITTED_BY.format(key="affinity_enforcement") + affinity in warned.stderr, str(warned)
        # The scheduling it chose, and what the rules add besides (the cluster's anti-affinity default).
        stored = await cluster.get("pod", "nb-chose", project)
        assert (stored["spec"]["priorityClassName"], stored["spec"]["priority"]) == ("urgent", 100000)
        assert expressions(stored) == [("maintenance", "NotIn", ("true",)), ("nvidia.com/gpu.product", "In", ("A100",))]
        assert (counted(local, "priority-class", project), counted(local, "affinity", project)) == (1, 1)
        audit = would_refuse_audit(local, since, "pods", project).get(
            "mutate-pods.scheduling.hopsworks.ai/would-refuse"
        )
        assert audit is not None and f"affinity: {affinity}" in audit and f"priority-class: {priority}" in audit, audit

        await cluster.settings(priority_class_enforcement="enforce")
        refused = await until_refused(cluster, creator, notebook("nb-next"), "pod", "nb-next", project)
        webhook = 'admission webhook "mutate-pods.scheduling.hopsworks.ai"'
        assert (
            f'Error from server (Forbidden): error when creating "STDIN": {webhook} denied the request: {priority}\n'
            in (refused.stderr)
        ), str(refused)
        # Affinity is still in warn: kubectl says so beside the refusal.
        alone = (
            "Warning: affinity_enforcement is warn, so this alone does not refuse the request; with enforce it does: "
        )
        assert alone + affinity in refused.stderr, str(refused)
    finally:
        await cluster.settings(priority_class_enforcement="enforce", affinity_enforcement="enforce")


async def test_a_class_chosen_only_in_the_spec_is_counted_in_warn_mode(cluster: Cluster) -> None:
    """A pod that names a class outside the subset and carries no label or annotation of ours: the
    mutation marks it with the families it admitted (WOULD_REFUSE_ANNOTATION), so validate-pods,
    which counts them, is called for it (the chart calls it only for a pod marked as ours)."""
    local = cluster.needs_local("reads the replicas' metrics")
    await offer_scheduling(cluster)
    project = await cluster.project("warnspec")
    creator = await audited_creator(cluster, local, project)
    try:
        await cluster.settings(priority_class_enforcement="warn")
        chosen = yaml.safe_dump(pod("nb-spec", project, priorityClassName="urgent"))
        warned = await until_admitted(cluster, creator, chosen, "not available in project")
        assert ADMITTED_BY.format(key="priority_class_enforcement") in warned.stderr, str(warned)
        stored = await cluster.get("pod", "nb-spec", project)
        assert stored["spec"]["priorityClassName"] == "urgent"
        assert stored["metadata"]["annotations"][WOULD_REFUSE_ANNOTATION] == "priority-class"
        assert counted(local, "priority-class", project) == 1
    finally:
        await cluster.settings(priority_class_enforcement="enforce")


async def test_an_owner_overriding_preemptibility_warns_then_enforce_refuses(cluster: Cluster) -> None:
    local = cluster.needs_local("reads the replicas' metrics and the audit log, and needs the Run:ai stand-ins")
    project, _ = await quota_known_project(cluster, "warnpre")
    creator = await audited_creator(cluster, local, project)

    def deployment(name: str) -> str:
        labelled: Obj = gpu_deployment(name, project, 1)
        labelled["metadata"]["labels"] = {"kai.scheduler/preemptibility": "preemptible"}
        return yaml.safe_dump(labelled)

    said = "label kai.scheduler/preemptibility=preemptible on this object would make Run:ai treat its pods"
    try:
        await cluster.settings(preemptibility_enforcement="warn")
        since = local.cp.audit.mark()
        warned = await until_admitted(cluster, creator, deployment("api"), said)
        assert ADMITTED_BY.format(key="preemptibility_enforcement") + "Deployment api: " + said in warned.stderr
        assert counted(local, "preemptibility", project) == 1
        audit = would_refuse_audit(local, since, "deployments.apps", project)
        assert said in audit.get("validate-workloads.scheduling.hopsworks.ai/would-refuse", ""), audit

        await cluster.settings(preemptibility_enforcement="enforce")
        refused = await until_refused(cluster, creator, deployment("api2"), "deployment", "api2", project)
        assert refused.stderr.startswith("Error from server (Forbidden)"), str(refused)
        assert said in refused.stderr
    finally:
        await cluster.settings(preemptibility_enforcement="enforce")
