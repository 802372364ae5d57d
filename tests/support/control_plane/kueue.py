"""Kueue v0.17.0 on the test control plane: its own manager, CRDs and webhook configurations.

- The manager is the binary `make peers` builds from Kueue's Go module (hack/peers/kueue), run as
  a process on this machine, not a pod (no image of Kueue can be pulled or built here), with a
  Configuration file: integrations `pod`, `batch/job` and `deployment`; Topology-Aware Scheduling
  is on by default in this release; the visibility server off (it needs an aggregated API).
- Its CRDs are the module's own bases (`$PEERS_DIR/share/kueue/crds`, v1beta2 stored).
- Its webhook configurations and Service are Kueue's webhook component rendered by the real
  kubectl's kustomize with the `kueue-` prefix and namespace `kueue-system` of Kueue's default
  install, so they carry the names, rules, paths and namespaceSelectors a real install has:
  `kueue-mutating-webhook-configuration` sorts after ours.
- Certificates: Kueue's internal cert management waits for a kubelet to mount its Secret, so it is
  off; the harness issues a serving certificate for `kueue-webhook-service.kueue-system.svc` into
  the manager's `webhook.certDir` and puts its CA into every `caBundle`.
- Routing: the apiserver dials the Service's ClusterIP on its port 443. The Service has no
  selector; where the manager listens (`webhook.host`/`port`) is `machine_endpoint`'s answer
  (cluster.py): that ClusterIP itself when it is a loopback address, else a loopback port that a
  relay in the real nodes' namespace, named by the Service's EndpointSlice, leads to.
- The manager talks to the apiserver as the admin (a client certificate in `system:masters`):
  Kueue's RBAC is not what these tests are about.
"""

from __future__ import annotations

import base64
import contextlib
import shutil
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support import peers
from tests.support.control_plane.cluster import ControlPlane
from tests.support.control_plane.processes import LOOPBACK, Process, free_port
from webhook.tls.issuing import CertKey, make_ca, make_serving_cert, write_file_atomic

Obj = dict[str, Any]
NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
FRAMEWORKS = ("pod", "batch/job", "deployment")
API = "kueue.x-k8s.io/v1beta2"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


@dataclass
class Kueue:
    cp: ControlPlane
    process: Process
    configurations: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) of its webhooks

    def stop(self) -> None:
        # Its webhooks fail closed: without the manager no pod could be created anywhere after it.
        for kind, name in self.configurations:
            with contextlib.suppress(Exception):
                self.cp.kubectl("delete", kind.lower(), name, "--ignore-not-found")
        self.process.stop()

    def logs(self, lines: int = 60) -> str:
        return self.process.tail(lines)


def webhook_component(cp: ControlPlane, dir: Path) -> list[Obj]:
    """Kueue's webhook component as its default install renders it (namePrefix `kueue-`, namespace
    `kueue-system`), by kubectl's own kustomize."""
    source = peers.share("kueue/webhook")
    dir.mkdir(parents=True, exist_ok=True)
    # kustomize takes a folder resource only by a relative path: a copy beside the kustomization.
    shutil.copytree(source, dir / "webhook", dirs_exist_ok=True)
    (dir / "kustomization.yaml").write_text(
        yaml.safe_dump({"namespace": NAMESPACE, "namePrefix": "kueue-", "resources": ["webhook"]})
    )
    out = cp.kubectl("kustomize", str(dir)).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def configuration(host: str, port: int, cert_dir: Path, health_port: int) -> Obj:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": host, "port": port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": list(FRAMEWORKS)},
    }


def _established(cp: ControlPlane, names: list[str]) -> bool:
    for name in names:
        conditions = cp.get_json("crd", name).get("status", {}).get("conditions") or []
        if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return False
    return True


def start_kueue(cp: ControlPlane, dir: Path) -> Kueue:
    binary = peers.binary("kueue")
    crds = peers.share("kueue/crds")
    dir.mkdir(parents=True, exist_ok=True)
    cp.kubectl("create", "namespace", NAMESPACE)
    cp.kubectl("apply", "--server-side", "-f", str(crds))
    names = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in sorted(crds.glob("*.yaml"))]
    _poll(lambda: _established(cp, names), 60, "Kueue's CRDs established")

    component = webhook_component(cp, dir / "kustomize")
    service = next(o for o in component if o["kind"] == "Service")
    assert service["metadata"]["name"] == SERVICE, service["metadata"]
    service["spec"].pop("selector", None)  # no pod of Kueue's: the manager runs on this machine
    cp.apply([service])
    ca = make_ca("Kueue webhook test CA", days=30)
    cert = make_serving_cert(ca, SERVICE, NAMESPACE)
    cert_dir = dir / "certs"
    cert_dir.mkdir(exist_ok=True)
    (cert_dir / "tls.crt").write_bytes(cert.cert_pem)
    (cert_dir / "tls.key").write_bytes(cert.key_pem)
    _metrics_certificate(ca)
    health_port = free_port()
    service_port = service["spec"]["ports"][0]
    port_name = str(service_port.get("name", ""))
    host, port = cp.machine_endpoint(NAMESPACE, SERVICE, int(service_port["port"]), port_name=port_name)
    config = dir / "config.yaml"
    config.write_text(yaml.safe_dump(configuration(host, port, cert_dir, health_port)))
    process = Process("kueue", [
        str(binary), f"--config={config}", f"--kubeconfig={cp.admin_kubeconfig}",
        "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=3",
    ], cp.dir / "logs")  # fmt: skip
    cp.processes["kueue"] = process
    kueue = Kueue(cp, process.start())
    try:
        process.wait_for(lambda: _http_ok(f"http://{LOOPBACK}:{health_port}/readyz"), within=90, what="ready Kueue")
        configurations = [o for o in component if o["kind"] in WEBHOOK_KINDS]
        bundle = base64.b64encode(ca.cert_pem).decode()
        for obj in configurations:
            for hook in obj["webhooks"]:
                hook["clientConfig"]["caBundle"] = bundle
        cp.apply(configurations, "--server-side")
        kueue.configurations = [(o["kind"], o["metadata"]["name"]) for o in configurations]
        time.sleep(1.5)  # the apiserver's webhook informers pick them up within a moment
    except BaseException:
        kueue.stop()
        cp.processes.pop("kueue", None)
        raise
    return kueue


# Kueue v0.17.0 reads a metrics certificate from this fixed path whenever internal cert management
# is off, metrics on or not (cmd/kueue/main.go), and exits without it. No flag moves it.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


def _metrics_certificate(ca: CertKey) -> None:
    """A certificate where Kueue insists on one; one already there (another run's) is kept."""
    if (METRICS_CERT_DIR / "tls.crt").exists() and (METRICS_CERT_DIR / "tls.key").exists():
        return
    METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
    cert = make_serving_cert(ca, "kueue-controller-manager-metrics-service", NAMESPACE, days=3650)
    write_file_atomic(METRICS_CERT_DIR / "tls.key", cert.key_pem, 0o600)
    write_file_atomic(METRICS_CERT_DIR / "tls.crt", cert.cert_pem, 0o644)


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)


def _poll(ready: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} after {within:.0f} s")
        time.sleep(0.3)


# -- the objects a platform's Kueue has --------------------------------------------------------

TOPOLOGY_LEVELS = ("topology.kubernetes.io/region", "topology.kubernetes.io/zone", "kubernetes.io/hostname")


def topology(name: str = "default", levels: tuple[str, ...] = TOPOLOGY_LEVELS) -> Obj:
    return {"apiVersion": API, "kind": "Topology", "metadata": {"name": name},
            "spec": {"levels": [{"nodeLabel": label} for label in levels]}}  # fmt: skip


def resource_flavor(name: str, topology_name: str | None, node_labels: dict[str, str] | None = None) -> Obj:
    spec: Obj = {"nodeLabels": dict(node_labels or {"type": "kwok"})}
    if topology_name:
        spec["topologyName"] = topology_name
    return {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}


def cluster_queue(name: str, flavor: str, cpu: str = "64", memory: str = "512Gi", gpus: str = "8") -> Obj:
    quota = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus}
    resources = [{"name": r, "nominalQuota": q} for r, q in quota.items()]
    group = {"coveredResources": list(quota), "flavors": [{"name": flavor, "resources": resources}]}
    spec = {"namespaceSelector": {}, "resourceGroups": [group]}
    return {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def local_queue(namespace: str, name: str, cluster_queue_name: str) -> Obj:
    return {"apiVersion": API, "kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue_name}}  # fmt: skip


@contextlib.contextmanager
def kueue_running(cp: ControlPlane, dir: Path) -> Iterator[Kueue]:
    kueue = start_kueue(cp, dir)
    try:
        yield kueue
    finally:
        kueue.stop()
        cp.processes.pop("kueue", None)
