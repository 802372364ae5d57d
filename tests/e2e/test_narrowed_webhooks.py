"""Plain pods of a project the compiled admission policies decide make no webhook call, on the real
apiserver with the chart installed (1.36 and newer: the leader writes the policies and labels the
project): the policies mutate them, and only a pod needing outside state (here a GPU) reaches the
pod webhooks of the configurations for decided namespaces. With the server down, both sides fail
closed: a plain pod of a labelled project whose parameters are missing is refused naming them, a
GPU pod of one with its parameters because no replica answers. Where the policies do not decide, a
plain pod makes one call, the mutation: validate-pods is narrowed to the pods it can refuse.

The module has a control plane and an install of its own: it scales the replicas to 0 and deletes
a project's parameters, and in the session's shared install, after the whole e2e suite before it,
the leader once labelled no new project within 60 s (a cause not found; the test passes after
every module that precedes it, run in smaller groups)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import Cluster, own_control_plane
from tests.e2e.test_kubectl import as_a_controller, offer_scheduling, pod, turn_runai_on
from tests.support import peers
from tests.support.control_plane.install import Install, installed
from webhook.core.admission_policies import PARAMS_NAME
from webhook.metrics import ADMISSION_OUTCOMES
from webhook.settings import KAI_PREEMPTIBILITY_LABEL, NON_PREEMPTIBLE
from webhook.snapshot import ADMISSION_POLICIES_LABEL, RUNAI_QUEUE_LABEL

pytestmark = pytest.mark.slow

LABEL = ADMISSION_POLICIES_LABEL


@pytest.fixture(scope="module")
def release() -> Iterator[Install]:
    with (
        own_control_plane("narrowed", "this test scales the install and needs a control plane of its own") as cp,
        installed(cp, cp.dir / "install") as inst,
    ):
        yield inst


@pytest.fixture
async def cluster(release: Install, tmp_path: Path) -> AsyncIterator[Cluster]:
    home = tmp_path / "home"
    home.mkdir()
    yield Cluster(release.cp.admin_kubeconfig, home, str(peers.binary("kubectl")), release)


def reviews(local: Install, endpoint: str) -> float:
    """Reviews of `endpoint` answered by every serving replica so far."""
    return sum(
        sum(local.metric("webhook_admission_requests_total", endpoint=endpoint, outcome=o)) for o in ADMISSION_OUTCOMES
    )


def gpu_pod(name: str, namespace: str) -> dict[str, object]:
    obj = pod(name, namespace)
    obj["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}  # type: ignore[index]
    return obj


async def test_plain_pods_of_a_decided_project_make_no_webhook_call_and_fail_closed(cluster: Cluster) -> None:
    local = cluster.needs_local("reads the replicas' metrics and scales them")
    served = await cluster.kubectl("get", "--raw", "/apis/admissionregistration.k8s.io/v1")
    if '"MutatingAdmissionPolicy"' not in served.stdout:
        pytest.skip("the apiserver serves no admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (before 1.36)")
    await offer_scheduling(cluster)  # the default class: normal
    project = await cluster.project("decided")

    other = await cluster.project("decided-too")

    async def labelled() -> bool:
        for ns in (project, other):
            if (await cluster.get("namespace", ns))["metadata"]["labels"].get(LABEL) != "on":
                return False
        return True

    await cluster.eventually(labelled, f"{project} and {other} labelled by the leader", within_s=60)
    # The apiserver's webhook and policy informers follow the label and the parameters: retry the
    # first pod until the policies have mutated it.
    before = reviews(local, "mutate_pods")

    last: list[object] = []

    async def plain_mutated() -> bool:
        name = f"plain-{asyncio.get_running_loop().time() * 1000:.0f}"
        result = await cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(pod(name, project)))
        if result.rc != 0:
            last[:] = [result.stderr]
            return False
        spec = (await cluster.get("pod", name, project))["spec"]
        last[:] = [spec.get("priorityClassName"), reviews(local, "mutate_pods") - before]
        return bool(spec.get("priorityClassName") == "normal")

    try:
        await cluster.eventually(plain_mutated, "a plain pod mutated by the policies", within_s=30)
    except AssertionError:
        raise AssertionError(f"the last plain pod: {last}") from None
    mark = reviews(local, "mutate_pods")
    for i in range(5):
        await cluster.ok("apply", "-f", "-", stdin=yaml.safe_dump(pod(f"nb{i}", project)))
        stored = await cluster.get("pod", f"nb{i}", project)
        assert stored["spec"]["priorityClassName"] == "normal", stored["spec"]
    assert reviews(local, "mutate_pods") == mark, "a plain pod reached the webhook"
    # A workload's own choice of node labels is read by the policies too: no call, and a label
    # outside the project's list refused in the webhook's words.
    chosen = pod("chosen", project, annotations={"scheduling.hopsworks.ai/affinity": "disk=ssd"})
    await cluster.ok("apply", "-f", "-", stdin=yaml.safe_dump(chosen))
    terms = (await cluster.get("pod", "chosen", project))["spec"]["affinity"]["nodeAffinity"]
    assert {"key": "disk", "operator": "In", "values": ["ssd"]} in terms[
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]  # fmt: skip
    outside = pod("outside", project, annotations={"scheduling.hopsworks.ai/affinity": "disk=hdd"})
    stderr = await cluster.refused("apply", "-f", "-", stdin=yaml.safe_dump(outside))
    assert f"affinity disk=hdd not available in project {project}; allowed:" in stderr, stderr
    assert reviews(local, "mutate_pods") == mark, "a pod choosing node labels reached the webhook"
    await cluster.ok("apply", "-f", "-", stdin=yaml.safe_dump(gpu_pod("gpu", project)))
    assert reviews(local, "mutate_pods") > mark, "the GPU pod did not reach the webhook"
    assert before <= mark

    # Fail closed, with the server down and the parameters gone.
    try:
        await asyncio.to_thread(local.scale, 0)
        as_server = ["--kubeconfig", str(local.service_account_kubeconfig())]
        await cluster.ok("delete", "configmap", PARAMS_NAME, "-n", project, *as_server)

        async def refused_for_parameters() -> str | None:
            result = await cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(pod("closed", project)))
            return result.stderr if result.rc != 0 and "no params found" in result.stderr else None

        message = await cluster.eventually(refused_for_parameters, "a plain pod refused without parameters")
        assert "scheduling-webhook-pods" in message, message
        # A GPU pod of a decided project with its parameters: the narrowed webhook is called, and fails.
        stderr = await cluster.refused("apply", "-f", "-", stdin=yaml.safe_dump(gpu_pod("gpu-closed", other)))
        assert 'failed calling webhook "mutate-pods.scheduling.hopsworks.ai"' in stderr, stderr
    finally:
        await asyncio.to_thread(local.scale, 2)


async def test_a_plain_pod_the_policies_do_not_decide_makes_one_call(cluster: Cluster) -> None:
    """Priority classes in warn mode: the webhook warns, so the leader leaves the project to the
    webhooks. With Run:ai and Kueue off, validate-pods would allow any pod without a GPU and without
    a label or annotation of these systems: the apiserver does not call it for one."""
    local = cluster.needs_local("reads the replicas' metrics")
    await offer_scheduling(cluster)
    await cluster.settings(priority_class_enforcement="warn")
    try:
        project = await cluster.project("undecided")

        async def mutated_by_the_webhook() -> bool:
            name = f"plain-{asyncio.get_running_loop().time() * 1000:.0f}"
            await cluster.ok("apply", "-f", "-", stdin=yaml.safe_dump(pod(name, project)))
            stored = await cluster.get("pod", name, project)
            return LABEL not in (await cluster.get("namespace", project))["metadata"].get("labels", {}) and bool(
                stored["spec"].get("priorityClassName") == "normal"
            )

        await cluster.eventually(mutated_by_the_webhook, "a plain pod of a project the webhooks decide", within_s=60)
        mutations, validations = reviews(local, "mutate_pods"), reviews(local, "validate_pods")
        for i in range(3):
            await cluster.ok("apply", "-f", "-", stdin=yaml.safe_dump(pod(f"one-call-{i}", project)))
        assert reviews(local, "mutate_pods") == mutations + 3
        assert reviews(local, "validate_pods") == validations, "a plain pod reached validate-pods"
        await cluster.ok("apply", "-f", "-", stdin=yaml.safe_dump(gpu_pod("gpu-two-calls", project)))
        assert reviews(local, "mutate_pods") == mutations + 4
        assert reviews(local, "validate_pods") == validations + 1, "the GPU pod did not reach validate-pods"
    finally:
        local.reset_settings()


async def test_plain_pods_of_a_project_bound_to_runai_make_no_webhook_call(cluster: Cluster) -> None:
    """Run:ai on: once the leader has bound a project and labelled it, the policy writes the queue and
    the workload kind's preemptibility itself, and a plain pod makes no webhook call. A GPU pod
    still reaches both pod webhooks (the quota)."""
    local = cluster.needs_local("reads the replicas' metrics and needs the Run:ai stand-ins")
    served = await cluster.kubectl("get", "--raw", "/apis/admissionregistration.k8s.io/v1")
    if '"MutatingAdmissionPolicy"' not in served.stdout:
        pytest.skip("the apiserver serves no admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (before 1.36)")
    await offer_scheduling(cluster)
    await turn_runai_on(cluster)
    try:
        project = await cluster.project("bound")

        async def bound_and_labelled() -> str | None:
            labels = (await cluster.get("namespace", project))["metadata"].get("labels", {})
            return labels.get(RUNAI_QUEUE_LABEL) if labels.get(LABEL) == "on" else None

        queue = await cluster.eventually(bound_and_labelled, f"{project} bound and labelled by the leader", within_s=60)

        async def labelled_by_the_policy() -> bool:
            name = f"plain-{asyncio.get_running_loop().time() * 1000:.0f}"
            result = await cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(pod(name, project)))
            if result.rc != 0:
                return False
            return bool((await cluster.get("pod", name, project))["metadata"].get("labels", {}).get(RUNAI_QUEUE_LABEL))

        await cluster.eventually(labelled_by_the_policy, "a plain pod labelled by the policy", within_s=30)
        mutations, validations = reviews(local, "mutate_pods"), reviews(local, "validate_pods")
        for i in range(3):
            await cluster.ok("apply", "-f", "-", stdin=yaml.safe_dump(pod(f"bound-{i}", project)))
            stored = await cluster.get("pod", f"bound-{i}", project)
            assert stored["metadata"]["labels"][RUNAI_QUEUE_LABEL] == queue
            assert stored["metadata"]["labels"][KAI_PREEMPTIBILITY_LABEL] == NON_PREEMPTIBLE
            assert stored["spec"]["priorityClassName"] == "normal"
        assert (reviews(local, "mutate_pods"), reviews(local, "validate_pods")) == (mutations, validations), (
            "a plain pod of a bound project reached a pod webhook"
        )
        result, _ = await as_a_controller(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(gpu_pod("gpu", project)))
        assert result.rc == 0, result.stderr
        assert reviews(local, "mutate_pods") > mutations and reviews(local, "validate_pods") > validations
    finally:
        local.reset_settings()
