"""`scheduling-webhook uninstall-cleanup`: what the chart's uninstall Job runs once the chart's
objects are gone. It waits for the server's pods to end (so that no reconcile pass writes
again), then takes this system's finalizer, label and annotations off every namespace carrying
them, a project or one whose project label an installer removed since (a namespace deleted
later would otherwise wait for a finalizer nobody removes), and deletes the
GPU reservation ConfigMaps, the console's sign-outs and the leader Lease, and the compiled
admission policies with their bindings and parameters (the label that lets the bindings select a
namespace goes first, with the other keys). The Run:ai projects,
the runai/queue labels Run:ai schedules by, and the record of Run:ai projects left
(runai-projects-left) stay, as manifests/README.md says."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiClient, Configuration

from webhook.console.signouts import SIGNOUTS_CONFIGMAP
from webhook.core.admission_policies import PARAMS_NAME
from webhook.core.uninstall import namespace_cleanup_patch
from webhook.kube.api import KubeApi, KubeConflict, KubeError, KubeNotFound, raw_call
from webhook.quota.reservations import RESERVATIONS_LABEL
from webhook.runai.binding import BINDING_ANNOTATION, FINALIZER
from webhook.snapshot import ADMISSION_POLICIES_LABEL, RUNAI_MOVE_ANNOTATION, RUNAI_PROJECT_ID_LABEL

SERVER_PODS = "app.kubernetes.io/name=scheduling-webhook"
LEASE = "scheduling-webhook-leader"
CONFLICT_RETRIES = 5
GUARD_WAIT_S = 60.0
# Written only in a dry run, which the guard policy must refuse: no namespace ever carries it.
GUARD_PROBE_LABEL = "scheduling.hopsworks.ai/uninstall-guard-probe"


def uninstall_cleanup_command(args: Any) -> int:
    namespace = args.namespace or os.environ.get("POD_NAMESPACE")
    if not namespace:
        print("uninstall-cleanup: name the install namespace (--namespace or $POD_NAMESPACE)", file=sys.stderr)
        return 2
    return asyncio.run(_cleanup(namespace, float(args.wait_s), str(args.guard_policy or "")))


async def _api_client() -> ApiClient:
    configuration = Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        await config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    return ApiClient(configuration)


def say(line: str) -> None:
    print(f"uninstall-cleanup: {line}", flush=True)


async def _cleanup(namespace: str, wait_s: float, guard_policy: str = "") -> int:
    async with await _api_client() as api_client:
        kube = KubeApi(api_client, namespace, component="scheduling-webhook-uninstall")
        core = client.CoreV1Api(api_client)
        if guard_policy and not await _wait_for_guard(kube, namespace, guard_policy, GUARD_WAIT_S):
            say(
                f"the ValidatingAdmissionPolicy {guard_policy} does not refuse other namespace edits after "
                f"{GUARD_WAIT_S:.0f} s; no namespace patched (the Job is retried)"
            )
            return 1
        if not await _wait_for_no_server(core, namespace, wait_s):
            say(f"the server's pods are still there after {wait_s:.0f} s; cleaning up anyway")
        # Every namespace, not only the labelled ones: no label selector finds a finalizer, and
        # the label may be gone while the finalizer stays. The patch is None for the others.
        for ns in await kube.list_namespaces():
            await _clean_namespace(kube, ns)
        await _delete_policy_params(kube)
        listed = await raw_call(core.list_namespaced_config_map, namespace, call_path="background",
                                label_selector=RESERVATIONS_LABEL)  # fmt: skip
        names = [o["metadata"]["name"] for o in listed.get("items") or ()] + [SIGNOUTS_CONFIGMAP]
        for name in names:
            await kube.delete_configmap(name)
            say(f"configmap {namespace}/{name} deleted (or already gone)")
        coordination = client.CoordinationV1Api(api_client)
        try:
            await raw_call(coordination.delete_namespaced_lease, LEASE, namespace, call_path="background")
            say(f"lease {namespace}/{LEASE} deleted")
        except KubeNotFound:
            say(f"lease {namespace}/{LEASE} already gone")
    return 0


async def _delete_policy_params(kube: KubeApi) -> None:
    """The compiled policies' parameters in every namespace; helm deleted the policies and
    bindings with the release (templates/14-admission-policies.yaml)."""
    for obj in await kube.list_configmaps_named(PARAMS_NAME):
        where = obj["metadata"]["namespace"]
        await kube.delete_object("ConfigMap", PARAMS_NAME, where)
        say(f"configmap {where}/{PARAMS_NAME} deleted")


async def _wait_for_guard(kube: KubeApi, namespace: str, policy: str, wait_s: float) -> bool:
    """Until `policy` refuses an edit outside the cleanup's own keys. RBAC lets this identity patch
    every namespace (their names are not known in advance); the policy, created by the same
    uninstall, is what narrows that, and the apiserver takes a moment to start enforcing a new
    one. The probe is a dry run: nothing is written, whether refused or not."""
    probe = {"metadata": {"labels": {GUARD_PROBE_LABEL: "probe"}}}
    deadline = time.monotonic() + wait_s
    while True:
        try:
            await raw_call(kube.core.patch_namespace, namespace, probe, call_path="background", dry_run="All",
                           _content_type="application/merge-patch+json")  # fmt: skip
        except KubeError as exc:
            if f"'{policy}'" in str(exc):
                say(f"the ValidatingAdmissionPolicy {policy} is in force")
                return True
            if exc.status not in (403, 422):
                raise
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.5)


async def _wait_for_no_server(core: client.CoreV1Api, namespace: str, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        pods = await raw_call(core.list_namespaced_pod, namespace, call_path="background", label_selector=SERVER_PODS)
        if not pods.get("items"):
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(1)


async def _clean_namespace(kube: KubeApi, ns: dict[str, Any]) -> None:
    name = ns["metadata"]["name"]
    for _ in range(CONFLICT_RETRIES):
        patch = namespace_cleanup_patch(
            ns, finalizers={FINALIZER}, labels={RUNAI_PROJECT_ID_LABEL, ADMISSION_POLICIES_LABEL},
            annotations={BINDING_ANNOTATION, RUNAI_MOVE_ANNOTATION},
        )  # fmt: skip
        if patch is None:
            return
        try:
            await kube.patch_namespace(name, patch, resource_version=ns["metadata"]["resourceVersion"])
            say(f"namespace {name}: removed {sorted(_keys(patch))}")
            return
        except KubeConflict:
            ns = await kube.get_namespace(name)
        except KubeNotFound:
            return
    raise SystemExit(f"uninstall-cleanup: namespace {name} kept changing; run the Job again")


def _keys(patch: dict[str, Any]) -> list[str]:
    meta = patch["metadata"]
    return [*(f"finalizer {f}" for f in ([] if "finalizers" not in meta else [FINALIZER])),
            *meta.get("labels", {}), *meta.get("annotations", {})]  # fmt: skip
