"""Which kinds feed the admission caches from the Kubernetes API, and how a ReplicaSet and a
Deployment are slimmed for them (a pod: `webhook.state.slim_pods`). The list-then-watch machinery
itself is `webhook.kube.watch`."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, AppsV1Api, CoreV1Api, CustomObjectsApi, SchedulingV1Api

from webhook.kube.api import Obj
from webhook.kube.watch import KubeWatcher, ListFn, ResourceWatch, Sink, WatchTiming
from webhook.settings import SETTINGS_CONFIGMAP
from webhook.snapshot import GROUP_REPLICAS_ANNOTATION, RUNAI_NAMESPACE
from webhook.state.slim_pods import decode_pod_list, slim_pod

KUEUE_GROUP = "kueue.x-k8s.io"
# Kueue serves v1beta2 (its storage version) since v0.15 and still v1beta1, deprecated; before v0.15
# only v1beta1. The first version served is read; the records take either's field names.
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
# Kind -> plural of the Kueue objects the caches keep: a queue's ClusterQueue, its flavors' Topology.
KUEUE_KINDS = {
    "LocalQueue": "localqueues",
    "ClusterQueue": "clusterqueues",
    "ResourceFlavor": "resourceflavors",
    "Topology": "topologies",
}


def kueue_list(custom: CustomObjectsApi, plural: str) -> ListFn:
    """List (or watch) a Kueue kind at the newest version the apiserver serves: a 404 for one
    version tries the next; the last one's 404 is the watch's "CRD not installed"."""

    async def list_fn(**kwargs: Any) -> Any:
        for version in KUEUE_VERSIONS:
            response: aiohttp.ClientResponse = await custom.list_cluster_custom_object(
                KUEUE_GROUP, version, plural, **kwargs
            )
            if response.status != 404 or version == KUEUE_VERSIONS[-1]:
                return response
            response.release()
        raise AssertionError("unreachable")

    return list_fn


def slim_replica_set(rs: Obj) -> Obj:
    """A ReplicaSet's identity, owner, desired-replicas annotation and replicas; of its template
    only the pod-group annotation."""
    meta = rs.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    slim_meta = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "ownerReferences") if k in meta}
    if isinstance(annotations, Mapping):
        slim_meta["annotations"] = {k: v for k, v in annotations.items() if k.startswith("deployment.kubernetes.io/")}
    spec = rs.get("spec") or {}
    out: Obj = {"metadata": slim_meta, "spec": {"replicas": spec.get("replicas")}}
    template_annotations = ((spec.get("template") or {}).get("metadata") or {}).get("annotations") or {}
    if isinstance(template_annotations, Mapping) and GROUP_REPLICAS_ANNOTATION in template_annotations:
        # The one template field kept: whose pods are one Kueue pod group (`core.pod_groups`).
        group = {GROUP_REPLICAS_ANNOTATION: template_annotations[GROUP_REPLICAS_ANNOTATION]}
        out["spec"]["template"] = {"metadata": {"annotations": group}}
    for key in ("kind", "apiVersion"):
        if key in rs:
            out[key] = rs[key]
    return out


def slim_deployment(deployment: Obj) -> Obj:
    """Name, replicas and availability: all the Run:ai admission check reads."""
    meta = deployment.get("metadata") or {}
    status = deployment.get("status") or {}
    out: Obj = {
        "metadata": {k: meta.get(k) for k in ("name", "namespace", "resourceVersion", "uid") if k in meta},
        "spec": {"replicas": (deployment.get("spec") or {}).get("replicas")},
        "status": {k: status.get(k) for k in ("availableReplicas", "conditions") if k in status},
    }
    for key in ("kind", "apiVersion"):
        if key in deployment:
            out[key] = deployment[key]
    return out


def default_watches(
    api: ApiClient,
    namespace: str,
    *,
    pods: bool = True,
    kueue: bool = True,
    timing: WatchTiming | None = None,
) -> list[ResourceWatch]:
    """The caches the rules read: namespaces, PriorityClasses, the settings ConfigMap, Kueue's
    LocalQueues, ClusterQueues, ResourceFlavors and Topologies (optional: absent while Kueue's CRDs
    are), ReplicaSets (Deployment pods' group), pods, and Run:ai's admission Deployments."""
    timing = timing or WatchTiming()
    core = CoreV1Api(api)
    watches = [
        ResourceWatch("Namespace", core.list_namespace, timing=timing),
        ResourceWatch("PriorityClass", SchedulingV1Api(api).list_priority_class, timing=timing),
        ResourceWatch(
            "ConfigMap",
            partial(core.list_namespaced_config_map, namespace),
            field_selector=f"metadata.name={SETTINGS_CONFIGMAP}",
            timing=timing,
        ),
    ]
    # Run:ai's admission Deployments, for their availability (read-only Role in namespace runai;
    # without it, or without Run:ai, the list is empty and nothing waits on it).
    watches.append(
        ResourceWatch(
            "Deployment",
            partial(AppsV1Api(api).list_namespaced_deployment, RUNAI_NAMESPACE),
            optional=True,
            forbidden_ok=True,
            slim=slim_deployment,
            timing=timing,
        )
    )
    if kueue:
        custom = CustomObjectsApi(api)
        watches.extend(
            ResourceWatch(kind, kueue_list(custom, plural), optional=True, timing=timing)
            for kind, plural in KUEUE_KINDS.items()
        )
    if pods:
        watches.append(
            ResourceWatch(
                "ReplicaSet", AppsV1Api(api).list_replica_set_for_all_namespaces, slim=slim_replica_set, timing=timing
            )
        )
        watches.append(
            ResourceWatch(
                "Pod",
                core.list_pod_for_all_namespaces,
                slim=slim_pod,
                decode_page=decode_pod_list,
                timing=timing,
                page_size=timing.pod_page_size,
            )
        )
    return watches


def cache_watcher(
    state: Sink,
    api: ApiClient,
    namespace: str,
    *,
    pods: bool = True,
    kueue: bool = True,
    timing: WatchTiming | None = None,
) -> KubeWatcher:
    """The watches that feed the admission caches, ready to start."""
    return KubeWatcher(state, default_watches(api, namespace, pods=pods, kueue=kueue, timing=timing))
