"""Cluster snapshots for decision tests, built through the real state store."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from webhook.snapshot import ClusterSnapshot
from webhook.state.store import ClusterState

SCHEDULER = {
    "available": {
        "affinity": ["nvidia.com/gpu.product=A100", "topology.kubernetes.io/zone=eu-1a", "disk=ssd"],
        "antiAffinity": ["maintenance=true"],
        "priorityClasses": ["batch", "normal", "urgent"],
    },
    "project": {
        "affinity": ["topology.kubernetes.io/zone=eu-1a", "disk=ssd"],
        "antiAffinity": ["maintenance=true"],
        "priorityClasses": ["batch", "normal"],
    },
    "defaults": {"priorityClass": "normal", "antiAffinity": ["maintenance=true"]},
}

PRIORITY_CLASSES = [("batch", 1000, "Never", False), ("normal", 10000, None, False), ("urgent", 100000, None, False)]


def namespace(
    name: str,
    *,
    project: bool = True,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    all_labels = {"kubernetes.io/metadata.name": name, **({"hopsworks.ai/project": name} if project else {})}
    all_labels.update(labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": all_labels, "annotations": dict(annotations or {})},
    }


def priority_class(name: str, value: int, policy: str | None = None, global_default: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "globalDefault": global_default,
    }
    if policy:
        obj["preemptionPolicy"] = policy
    return obj


def settings_configmap(install_namespace: str = "hopsworks", **flat: Any) -> dict[str, Any]:
    scheduler = flat.pop("scheduler", SCHEDULER)
    data = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in flat.items()}
    data["scheduler"] = yaml.safe_dump(scheduler)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "hopsworks-cluster-settings", "namespace": install_namespace},
        "data": data,
    }


def runai_settings_configmap(runai: Any, install_namespace: str = "hopsworks", **flat: Any) -> dict[str, Any]:
    """The settings with Run:ai on and pointed at a stand-in (its URL and client id; the secret read
    from the `runai-hopsworks` Secret's `clientSecret`, as the README's install names them)."""
    connection = {
        "run_ai_enable": True,
        "run_ai_url": runai.url,
        "run_ai_client_id": runai.client_id,
        "run_ai_client_secret_name": "runai-hopsworks",
        "run_ai_client_secret_key": "clientSecret",
    }
    return settings_configmap(install_namespace, **{**connection, **flat})


KUEUE_API = "kueue.x-k8s.io/v1beta2"
# The node labels of the cluster's built-in topology units (host, zone, region), coarsest first as a
# Kueue Topology lists its levels.
TOPOLOGY_LEVELS = ("topology.kubernetes.io/region", "topology.kubernetes.io/zone", "kubernetes.io/hostname")


def local_queue(namespace_name: str, name: str, cluster_queue: str = "cq", **status: int) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace_name},
        "spec": {"clusterQueue": cluster_queue},
    }
    if status:
        obj["status"] = status
    return obj


def topology(name: str = "default", levels: Iterable[str] = TOPOLOGY_LEVELS) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": label} for label in levels]},
    }


def resource_flavor(name: str = "default", topology_name: str | None = "default") -> dict[str, Any]:
    spec: dict[str, Any] = {} if topology_name is None else {"topologyName": topology_name}
    return {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}


def cluster_queue(
    name: str = "cq",
    flavors: Iterable[str] = ("default",),
    *,
    cohort: str | None = None,
    quota: Mapping[str, str] | None = None,
    usage: Mapping[str, Mapping[str, str]] | None = None,
    pending: int = 0,
) -> dict[str, Any]:
    """A ClusterQueue with one resource group: every flavor gets `quota` (CPU, memory, GPUs by
    default); `usage` is its status.flavorsUsage (flavor -> resource -> total)."""
    quota = dict(quota or {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "8"})
    spec: dict[str, Any] = {
        "resourceGroups": [
            {
                "coveredResources": list(quota),
                "flavors": [
                    {"name": f, "resources": [{"name": r, "nominalQuota": q} for r, q in quota.items()]}
                    for f in flavors
                ],
            }
        ]
    }
    if cohort:
        spec["cohortName"] = cohort
    status: dict[str, Any] = {
        "pendingWorkloads": pending,
        "admittedWorkloads": 0,
        "reservingWorkloads": 0,
        "flavorsUsage": [
            {"name": f, "resources": [{"name": r, "total": t} for r, t in used.items()]}
            for f, used in (usage or {}).items()
        ],
        "conditions": [{"type": "Active", "status": "True", "reason": "Ready"}],
    }
    return {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec, "status": status}


def kueue_setup() -> list[dict[str, Any]]:
    """Kueue as the tests' clusters have it: one Topology over the built-in units, a flavor placed
    by it, and ClusterQueue `cq` over that flavor."""
    return [topology(), resource_flavor(), cluster_queue()]


def cluster_state(
    *,
    namespaces: Iterable[dict[str, Any]] = (),
    extra: Iterable[dict[str, Any]] = (),
    scheduler: Mapping[str, Any] | None = None,
    priority_classes: Iterable[tuple[str, int, str | None, bool]] = PRIORITY_CLASSES,
    **flat: Any,
) -> ClusterState:
    state = ClusterState("hopsworks")
    state.apply(settings_configmap(scheduler=copy.deepcopy(dict(scheduler or SCHEDULER)), **flat))
    for obj in [namespace("hopsworks", project=False), *namespaces]:
        state.apply(obj)
    for name, value, policy, global_default in priority_classes:
        state.apply(priority_class(name, value, policy, global_default))
    for obj in extra:
        state.apply(obj)
    return state


def snapshot(**kwargs: Any) -> ClusterSnapshot:
    return cluster_state(**kwargs).snapshot()


def runai_admission_objects() -> list[dict[str, Any]]:
    """Run:ai's namespace and its two admission Deployments, available, as Run:ai's install leaves
    them: a runtime watching them reports nothing while they are up."""
    objects: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "runai"}}]
    for name in ("runai-admission-controller", "admission"):
        objects.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": "runai"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "c", "image": "i"}]},
                    },
                },
                "status": {"availableReplicas": 1, "conditions": [{"type": "Available", "status": "True"}]},
            }
        )
    return objects
