"""What the benchmarks send and serve: certificates, cluster-state folders and AdmissionReviews.

Everything is generated (no network, no shared fixtures needed) and deterministic, so two runs
measure the same bytes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from webhook.tls.issuing import make_ca, make_serving_cert, write_serving_files

SERVICE = "scheduling-webhook"
NAMESPACE = "hopsworks"
SERVICE_HOST = f"{SERVICE}.{NAMESPACE}.svc"  # the name the apiserver dials and verifies
LOOPBACK = "127.0.0.1"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "cluster"

KUEUE_PROJECT = "fraud-detection"  # (b): affinity, priority and queue all injected
RUNAI_PROJECT = "vision"  # (c): bound to Run:ai, GPU quota checked
RUNAI_DESERVED_GPUS = 8.0


def make_certs(out: Path) -> Path:
    """A CA and a serving certificate for the Service name and 127.0.0.1 into `out`."""
    ca = make_ca(days=2)
    serving = make_serving_cert(ca, SERVICE, NAMESPACE, dns_names=["localhost"], ips=[LOOPBACK], days=2)
    write_serving_files(out, ca, serving, write_ca=True)
    return out


def _settings_doc(**flat: str) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / "20-settings.yaml").read_text())
    doc["data"].update(flat)
    return doc


def kueue_state(out: Path) -> Path:
    """examples/cluster with Kueue on and a LocalQueue in the project that (b) targets."""
    shutil.copytree(EXAMPLES, out)
    (out / "20-settings.yaml").write_text(yaml.safe_dump(_settings_doc(kueue_installed="true", run_ai_enable="false")))
    queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "LocalQueue",
        "metadata": {"name": "default", "namespace": KUEUE_PROJECT},
        "spec": {"clusterQueue": "cluster-queue"},
    }
    (out / "31-bench-localqueue.yaml").write_text(yaml.safe_dump(queue))
    # The ReplicaSet the bench pod names as its controller, as the cache holds it: without it the
    # pod, which chose a topology unit, is refused (503, group size unknown) and (b) measures a
    # refusal. One replica, as a notebook's Deployment has: no pod group.
    replica_set = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": "jupyter-meb10000-7c9f8d6b5",
            "namespace": KUEUE_PROJECT,
            "uid": "4f1e1b6e-5d2a-4c1b-9a55-2f3b8e2c9d10",
            "annotations": {"deployment.kubernetes.io/desired-replicas": "1"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": "jupyter-meb10000",
                    "uid": "d-1",
                    "controller": True,
                }
            ],
        },
        "spec": {"replicas": 1},
    }
    (out / "32-bench-replicaset.yaml").write_text(yaml.safe_dump(replica_set))
    return out


def runai_state(out: Path, running_gpu_pods: int = 4) -> Path:
    """examples/cluster with Run:ai on, a bound project, and a few GPU notebooks already running
    (so the quota sum walks real records)."""
    shutil.copytree(EXAMPLES, out)
    (out / "20-settings.yaml").write_text(
        yaml.safe_dump(_settings_doc(run_ai_enable="true", kueue_installed="false", run_ai_project_gpu_quota="8"))
    )
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": RUNAI_PROJECT,
                "labels": {"hopsworks.ai/project": RUNAI_PROJECT, "runai/queue": RUNAI_PROJECT},
            },
        }
    ]
    for i in range(running_gpu_pods):
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"notebook-{i}",
                    "namespace": RUNAI_PROJECT,
                    "uid": f"00000000-0000-0000-0000-{i:012d}",
                    "labels": {"hopsworks.ai/workload-type": "notebook"},
                },
                "spec": {
                    "containers": [{"name": "nb", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
                },
                "status": {"phase": "Running"},
            }
        )
    (out / "40-bench-runai.yaml").write_text(yaml.safe_dump_all(docs))
    return out


def _container(name: str, image: str, index: int, gpus: int = 0) -> dict[str, Any]:
    resources: dict[str, Any] = {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"cpu": "2", "memory": "4Gi"},
    }
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    return {
        "name": name,
        "image": image,
        "command": ["/bin/sh", "-c"],
        "args": [f"exec /srv/{name}/entrypoint.sh --port {8000 + index} --log-format json"],
        "ports": [{"name": f"http-{index}", "containerPort": 8000 + index, "protocol": "TCP"}],
        "env": [
            {"name": "HOPSWORKS_PROJECT", "value": "fraud-detection"},
            {"name": "HADOOP_USER_NAME", "value": "fraud_detection__meb10000"},
            {"name": "MATERIAL_DIRECTORY", "value": "/srv/hops/secrets"},
            {"name": "PYTHONPATH", "value": "/srv/hops/python/lib:/srv/hops/app"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
        ],
        "resources": resources,
        "volumeMounts": [
            {"name": "secrets", "mountPath": "/srv/hops/secrets", "readOnly": True},
            {"name": "config", "mountPath": "/srv/hops/config"},
            {
                "name": "kube-api-access-x7k2p",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            },
        ],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": 8000 + index, "scheme": "HTTP"},
            "periodSeconds": 10,
        },
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "allowPrivilegeEscalation": False},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }


def realistic_pod(namespace: str, *, kind_label: dict[str, str], gpus: int = 0) -> dict[str, Any]:
    """A ReplicaSet-made platform pod: an init container, a main container and three sidecars,
    env, probes, volumes and tolerations; about 8 KB of JSON."""
    containers = [_container("jupyter", "docker.hops.works/base:4.1.0", 0, gpus)] + [
        _container(name, f"docker.hops.works/{name}:4.1.0", i + 1)
        for i, name in enumerate(("filebeat", "kafka-proxy", "model-metrics"))
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "jupyter-meb10000-7c9f8d6b5-",
            "namespace": namespace,
            "labels": {
                "app": "jupyter",
                "project": namespace,
                "pod-template-hash": "7c9f8d6b5",
                **kind_label,
            },
            "annotations": {
                "scheduling.hopsworks.ai/topology": "zone",
                "kubectl.kubernetes.io/default-container": "jupyter",
                "prometheus.io/scrape": "true",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "jupyter-meb10000-7c9f8d6b5",
                    "uid": "4f1e1b6e-5d2a-4c1b-9a55-2f3b8e2c9d10",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "initContainers": [_container("init-certs", "docker.hops.works/init:4.1.0", 9)],
            "containers": containers,
            "volumes": [
                {"name": "secrets", "secret": {"secretName": "meb10000-certs", "defaultMode": 420}},
                {"name": "config", "configMap": {"name": "jupyter-config", "defaultMode": 420}},
                {
                    "name": "kube-api-access-x7k2p",
                    "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]},
                },
            ],
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "jupyter",
            "securityContext": {"fsGroup": 1000},
            "schedulerName": "default-scheduler",
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0,
        },
    }


def admission_review(pod: dict[str, Any], uid: str = "bench-0000") -> dict[str, Any]:
    """A pod CREATE review as a v1 kube-apiserver sends it."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "c301929c-9d37-11e9-a3f2-42010a3e0104",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def mutate_body() -> bytes:
    pod = realistic_pod(KUEUE_PROJECT, kind_label={"hopsworks.ai/workload-type": "notebook"})
    return json.dumps(admission_review(pod)).encode()


def validate_body() -> bytes:
    pod = realistic_pod(RUNAI_PROJECT, kind_label={"hopsworks.ai/workload-type": "notebook"}, gpus=2)
    pod["metadata"]["annotations"].pop("scheduling.hopsworks.ai/topology")
    pod["metadata"]["labels"]["runai/queue"] = RUNAI_PROJECT  # as /mutate/pods left it (S5)
    return json.dumps(admission_review(pod)).encode()
