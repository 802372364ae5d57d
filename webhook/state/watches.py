"""Which kinds feed the admission caches from the Kubernetes API (DESIGN §1), and how a pod is
slimmed for them. The list-then-watch machinery itself is `webhook.kube.watch`."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi, SchedulingV1Api

from webhook.kube.api import Obj
from webhook.kube.watch import KubeWatcher, ResourceWatch, Sink, WatchTiming
from webhook.settings import SETTINGS_CONFIGMAP

KUEUE_GROUP, KUEUE_VERSION, LOCAL_QUEUES = "kueue.x-k8s.io", "v1beta1", "localqueues"


_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def slim_pod(pod: Obj) -> Obj:
    """What the pod cache and its listeners need: identity, labels and annotations, GPU resources,
    scheduling fields and phase. managedFields and the rest of the spec can be kilobytes per pod."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    slim_meta = {k: v for k, v in meta.items() if k != "managedFields"}
    annotations = meta.get("annotations")
    if annotations and _LAST_APPLIED in annotations:
        slim_meta["annotations"] = {k: v for k, v in annotations.items() if k != _LAST_APPLIED}

    def containers(key: str) -> list[Obj]:
        return [
            {"name": c.get("name"), "resources": c.get("resources") or {}}
            for c in spec.get(key) or ()
            if isinstance(c, Mapping)
        ]

    slim_spec: Obj = {"containers": containers("containers")}
    if spec.get("initContainers"):
        slim_spec["initContainers"] = containers("initContainers")
    for key in ("nodeName", "priorityClassName", "priority", "preemptionPolicy", "schedulerName"):
        if key in spec:
            slim_spec[key] = spec[key]
    out: Obj = {"metadata": slim_meta, "spec": slim_spec, "status": {"phase": (pod.get("status") or {}).get("phase")}}
    if "kind" in pod:
        out["kind"] = pod["kind"]
    if "apiVersion" in pod:
        out["apiVersion"] = pod["apiVersion"]
    return out


def default_watches(
    api: ApiClient,
    namespace: str,
    *,
    pods: bool = True,
    local_queues: bool = True,
    timing: WatchTiming | None = None,
) -> list[ResourceWatch]:
    """The caches of DESIGN §1: namespaces, PriorityClasses, the settings ConfigMap, LocalQueues, pods."""
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
    if local_queues:
        custom = CustomObjectsApi(api)
        watches.append(
            ResourceWatch(
                "LocalQueue",
                partial(custom.list_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION, LOCAL_QUEUES),
                optional=True,
                timing=timing,
            )
        )
    if pods:
        watches.append(ResourceWatch("Pod", core.list_pod_for_all_namespaces, slim=slim_pod, timing=timing))
    return watches


def cache_watcher(
    state: Sink,
    api: ApiClient,
    namespace: str,
    *,
    pods: bool = True,
    local_queues: bool = True,
    timing: WatchTiming | None = None,
) -> KubeWatcher:
    """The watches that feed the admission caches, ready to start."""
    return KubeWatcher(state, default_watches(api, namespace, pods=pods, local_queues=local_queues, timing=timing))
