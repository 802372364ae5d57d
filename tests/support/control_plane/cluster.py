"""A real Kubernetes control plane on loopback, started as envtest does, with the controllers too.

etcd, kube-apiserver (default admission plugins, ServiceAccount included; Node,RBAC),
kube-controller-manager (every default controller, each with its own ServiceAccount credentials),
kube-scheduler and kwok (fake nodes whose pods it marks Running), all built by `make peers`.

How the apiserver reaches webhooks: the Service CIDR is a /24 inside 127.0.0.0/8. Every address
there is loopback on Linux, so a Service's ClusterIP is an address a process on this machine can
listen on. The apiserver resolves a webhook's `clientConfig.service` to `<ClusterIP>:<port>` (as
it does in any cluster) and verifies the certificate for `<service>.<namespace>.svc`; the test
serves on that ClusterIP, playing kube-proxy's part. The install's Service stays as rendered and
each control plane gets its own /24, so parallel runs never collide (docs/admission-chain.md).

With real nodes (`real_nodes`, nodes.py) the pods run in a network namespace of the run, and the
Service CIDR is in that namespace instead: the apiserver's egress selector sends its traffic to the
cluster there, and kube-proxy serves the ClusterIPs.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import random
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support import peers
from tests.support.control_plane import nodes as real_nodes_
from tests.support.control_plane.audit import AuditLog, write_policy
from tests.support.control_plane.pki import (
    ClientCert,
    FrontProxy,
    Pki,
    WebhookClient,
    client_cert,
    front_proxy,
    make_pki,
    webhook_client,
)
from tests.support.control_plane.processes import LOOPBACK, Process, free_port

KUBE_VERSION = peers.kube_version()
GPU = "nvidia.com/gpu"
# kwok completes a Job's pod as soon as it runs; a test that needs a job running (to be preempted,
# or relabelled while it runs) puts this annotation on the Job's pod template.
KEEP_RUNNING_ANNOTATION = "test.scheduling-webhook/keep-running"


@dataclass(frozen=True)
class FakeNode:
    name: str
    zone: str
    region: str
    gpus: int = 0
    gpu_product: str | None = None
    cpu: str = "32"
    memory: str = "256Gi"

    def labels(self) -> dict[str, str]:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "topology.kubernetes.io/zone": self.zone,
            "topology.kubernetes.io/region": self.region,
            "type": "kwok",
        }
        if self.gpu_product:
            labels["nvidia.com/gpu.product"] = self.gpu_product
        return labels

    def capacity(self) -> dict[str, str]:
        capacity = {"cpu": self.cpu, "memory": self.memory, "pods": "110"}
        if self.gpus:
            capacity[GPU] = str(self.gpus)
        return capacity


# Two zones of one region and a second region; GPUs on some nodes only.
DEFAULT_NODES = (
    FakeNode("kwok-a1", "eu-1a", "eu-1", gpus=4, gpu_product="A100"),
    FakeNode("kwok-a2", "eu-1a", "eu-1", gpus=4, gpu_product="A100"),
    FakeNode("kwok-b1", "eu-1b", "eu-1"),
    FakeNode("kwok-c1", "us-1a", "us-1", gpus=2, gpu_product="T4"),
)


def _random_service_cidr() -> ipaddress.IPv4Network:
    # 127.0.0.0/16 is left alone (127.0.0.1 and friends); a /24 per control plane.
    return ipaddress.IPv4Network(f"127.{random.randint(100, 254)}.{random.randint(0, 255)}.0/24")


def kwok_stages(stage_dir: Path, out_dir: Path) -> list[Path]:
    """kwok's own pod stages, the one that completes Job pods told to leave alone those annotated
    KEEP_RUNNING_ANNOTATION. (kwok acts only on the pods of its own nodes: the real nodes' kubelets
    run theirs.)"""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for source in sorted((stage_dir / "pod/fast").glob("pod-*.yaml")):
        stage = yaml.safe_load(source.read_text())
        if source.name == "pod-complete.yaml":
            stage["spec"]["selector"].setdefault("matchExpressions", []).append(
                {"key": f'.metadata.annotations["{KEEP_RUNNING_ANNOTATION}"]', "operator": "DoesNotExist"}
            )
        target = out_dir / source.name
        target.write_text(yaml.safe_dump(stage))
        paths.append(target)
    return paths


def write_kubeconfig(path: Path, server: str, ca_file: Path, user: dict[str, str]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
                "users": [{"name": "user", "user": user}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
                "current-context": "test",
            }
        )
    )
    return path


def write_admission_config(dir: Path, client: WebhookClient) -> Path:
    """kube-apiserver's AdmissionConfiguration, as an operator who can configure the apiserver
    writes it: both webhook plugins read a kubeconfig whose user `*` (every webhook; a name such as
    `<service>.<namespace>.svc:<port>` would pick one) is the client certificate `client`. The
    apiserver presents it only to a webhook whose TLS handshake asks for one."""
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "users": [{"name": "*", "user": {"client-certificate": str(client.cert.cert_file),
                                         "client-key": str(client.cert.key_file)}}],
    }  # fmt: skip
    kubeconfig_file = dir / "webhook-clients.kubeconfig"
    kubeconfig_file.write_text(yaml.safe_dump(kubeconfig))
    webhook = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig_file),
    }
    config = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [{"name": name, "configuration": webhook}
                    for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")],
    }  # fmt: skip
    path = dir / "admission-config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class ControlPlane:
    dir: Path
    url: str
    service_cidr: ipaddress.IPv4Network
    pki: Pki
    admin_kubeconfig: Path
    kubectl_bin: Path
    nodes: tuple[FakeNode, ...]
    audit: AuditLog  # what the audited users did, as the apiserver recorded it
    processes: dict[str, Process] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # seconds to ready, per component
    # The client certificate the apiserver presents to every webhook that asks for one
    # (`write_admission_config`), and its CA: what an install's `admission.clientCA` names.
    webhook_client: WebhookClient | None = None
    # What the aggregation layer presents to an APIService's server, and the CA the apiserver
    # publishes for it in kube-system/extension-apiserver-authentication.
    front_proxy: FrontProxy | None = None
    real: real_nodes_.RealNodes | None = None  # the real nodes, when asked for

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.kubectl_bin), "--kubeconfig", str(kubeconfig or self.admin_kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={"HOME": str(self.dir / "home"), "PATH": "/usr/bin:/bin"},
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} -> {result.returncode}\n{result.stdout}\n{result.stderr}")
        return result

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, objects: Sequence[dict[str, Any]] | str, *extra: str) -> str:
        text = objects if isinstance(objects, str) else yaml.safe_dump_all(list(objects))
        return self.kubectl("apply", "-f", "-", *extra, input=text).stdout

    def token(self, namespace: str, service_account: str, duration: str = "2h") -> str:
        """A token of the ServiceAccount from the TokenRequest API, as the kubelet would mount."""
        return self.kubectl(
            "create", "token", service_account, "-n", namespace, f"--duration={duration}"
        ).stdout.strip()

    def token_kubeconfig(self, path: Path, token: str) -> Path:
        return write_kubeconfig(path, self.url, self.pki.ca_file, {"token": token})

    def service_ip(self, namespace: str, name: str) -> str:
        return str(self.get_json("service", name, "-n", namespace)["spec"]["clusterIP"])

    def machine_endpoint(
        self, namespace: str, service: str, port: int, *, port_name: str = "", machine_port: int | None = None
    ) -> tuple[str, int]:
        """Where a server of the test run listens on this machine so that `port` of the Service
        (one without a selector) reaches it, for the apiserver and for pods alike.

        Without real nodes the ClusterIP is a loopback address: the server listens on it, at the
        Service's own port. With real nodes the ClusterIP lives in the nodes' namespace: a relay
        listens there (nodes.py, `Relays.to_machine`), an EndpointSlice names it, and the server
        listens on loopback at `machine_port` (a free port if not given)."""
        if self.real is None:
            return self.service_ip(namespace, service), port
        chosen = machine_port or free_port()
        ip, relay_port = self.real.relays.to_machine(chosen)
        self.apply([{
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service}-machine-{port}", "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service,
                                    "endpointslice.kubernetes.io/managed-by": "tests.scheduling-webhook"}},
            "addressType": "IPv4",
            "ports": [{"name": port_name, "port": relay_port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
        }])  # fmt: skip
        return LOOPBACK, chosen

    def stop(self) -> None:
        if self.real is not None:
            self.real.stop()
            self.real = None
        for proc in reversed(list(self.processes.values())):
            proc.stop()
        self.processes.clear()

    def logs(self, lines: int = 40) -> str:
        return "\n".join(f"--- {name}\n{proc.tail(lines)}" for name, proc in self.processes.items())


def _https_ok(url: str, pki: Pki, admin_cert: tuple[Path, Path]) -> bool:
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    ctx.load_cert_chain(str(admin_cert[0]), str(admin_cert[1]))
    with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
        return bool(resp.status == 200)


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)


# What 1.35 needs to serve MutatingAdmissionPolicy (beta there, GA and on by default from 1.36).
ADMISSION_POLICY_BETA_ARGS = (
    "--feature-gates=MutatingAdmissionPolicy=true",
    "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
)


def admission_policy_args(version: str = KUBE_VERSION) -> tuple[str, ...]:
    """The apiserver arguments that make `version` (`v1.X.Y`) serve MutatingAdmissionPolicy."""
    minor = int(version.lstrip("v").split(".")[1])
    return ADMISSION_POLICY_BETA_ARGS if minor < 36 else ()


def start_control_plane(
    dir: Path,
    nodes: Sequence[FakeNode] = DEFAULT_NODES,
    audited_users: Sequence[str] = (),
    apiserver_args: Sequence[str] = (),
    real_nodes: Sequence[real_nodes_.RealNode] = (),
) -> ControlPlane:
    """Start everything and wait until it serves; on any failure stop what started and raise.
    The requests of `audited_users` go to the audit log (`cp.audit`); `apiserver_args` are added
    to the apiserver's (ADMISSION_POLICY_BETA_ARGS, for example). `real_nodes` join beside the
    kwok nodes (nodes.py)."""
    binaries = {name: peers.binary(name) for name in
                ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")}  # fmt: skip
    stages = peers.share("kwok/stage")
    dir.mkdir(parents=True, exist_ok=True)
    (dir / "home").mkdir(exist_ok=True)
    logs = dir / "logs"
    logs.mkdir(exist_ok=True)
    cidr = real_nodes_.SERVICE_CIDR if real_nodes else _random_service_cidr()
    first_service_ip = str(next(cidr.hosts()))
    pki = make_pki(
        dir / "pki",
        ips=[LOOPBACK, first_service_ip, *([real_nodes_.APISERVER_IP] if real_nodes else [])],
        dns_names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                   "kubernetes.default.svc.cluster.local"],
    )  # fmt: skip
    admin = client_cert(pki, "admin", "kubernetes-admin", ("system:masters",))
    port = free_port()
    url = f"https://{LOOPBACK}:{port}"

    def cert_kubeconfig(name: str, cert: ClientCert) -> Path:
        user = {"client-certificate": str(cert.cert_file), "client-key": str(cert.key_file)}
        return write_kubeconfig(dir / f"{name}.kubeconfig", url, pki.ca_file, user)

    def kubeconfig(name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        return cert_kubeconfig(name, client_cert(pki, name, user, groups))

    admin_kubeconfig = cert_kubeconfig("admin", admin)
    webhooks = webhook_client(dir / "pki")
    admission_config = write_admission_config(dir, webhooks)
    audit_policy = write_policy(dir / "audit-policy.yaml", audited_users)
    audit = AuditLog(logs / "audit.jsonl")
    cp = ControlPlane(dir, url, cidr, pki, admin_kubeconfig, binaries["kubectl"], tuple(nodes), audit)
    cp.webhook_client = webhooks
    proxy_client = front_proxy(dir / "pki")
    cp.front_proxy = proxy_client
    t0 = time.monotonic()
    real_args: list[str] = []
    if real_nodes:
        cp.real = real_nodes_.prepare(dir / "real-nodes", port)
        kubelet_client = client_cert(pki, "apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                     ("system:masters",))  # fmt: skip
        egress = real_nodes_.write_egress_config(dir / "egress-selector.yaml", cp.real.relays.egress_socket)
        real_args = [f"--advertise-address={real_nodes_.APISERVER_IP}", f"--egress-selector-config-file={egress}",
                     f"--kubelet-client-certificate={kubelet_client.cert_file}",
                     f"--kubelet-client-key={kubelet_client.key_file}",
                     # A node's name resolves nowhere: the apiserver dials its InternalIP.
                     "--kubelet-preferred-address-types=InternalIP"]  # fmt: skip

    def started(name: str, proc: Process) -> Process:
        cp.processes[name] = proc
        proc.start()
        return proc

    try:
        etcd_port, etcd_peer = free_port(), free_port()
        etcd_url = f"http://{LOOPBACK}:{etcd_port}"
        etcd = started("etcd", Process("etcd", [
            str(binaries["etcd"]), "--data-dir", str(dir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://{LOOPBACK}:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://{LOOPBACK}:{etcd_peer}",
            "--initial-cluster", f"default=http://{LOOPBACK}:{etcd_peer}",
            "--unsafe-no-fsync=true", "--log-level=warn",
        ], logs))  # fmt: skip
        etcd.wait_for(lambda: _http_ok(f"{etcd_url}/health"), within=30, what="healthy etcd")
        cp.timings["etcd"] = time.monotonic() - t0
        apiserver = started("kube-apiserver", Process("kube-apiserver", [
            str(binaries["kube-apiserver"]),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={LOOPBACK}", f"--secure-port={port}",
            f"--tls-cert-file={pki.serving_cert_file}", f"--tls-private-key-file={pki.serving_key_file}",
            f"--client-ca-file={pki.ca_file}",
            f"--service-cluster-ip-range={cidr}",
            "--allow-privileged=true",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub_file}",
            f"--service-account-signing-key-file={pki.sa_key_file}",
            "--profiling=false",
            f"--audit-policy-file={audit_policy}", f"--audit-log-path={audit.path}",
            f"--admission-control-config-file={admission_config}",
            # The aggregation layer, as kubeadm configures it: an APIService's server is reached on
            # its Service's ClusterIP (no --enable-aggregator-routing), with this client
            # certificate and the user in X-Remote-* headers.
            f"--requestheader-client-ca-file={proxy_client.ca_file}",
            f"--requestheader-allowed-names={proxy_client.name}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={proxy_client.cert.cert_file}",
            f"--proxy-client-key-file={proxy_client.cert.key_file}",
            *apiserver_args,
            *real_args,
            "--v=1",
        ], logs))  # fmt: skip
        apiserver.wait_for(lambda: _https_ok(f"{url}/readyz", pki, (admin.cert_file, admin.key_file)),
                           within=90, what="ready apiserver")  # fmt: skip
        cp.timings["kube-apiserver"] = time.monotonic() - t0
        started("kube-controller-manager", Process("kube-controller-manager", [
            str(binaries["kube-controller-manager"]),
            f"--kubeconfig={kubeconfig('controller-manager', 'system:kube-controller-manager')}",
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.sa_key_file}",
            f"--root-ca-file={pki.ca_file}",
            f"--service-cluster-ip-range={cidr}",
            "--leader-elect=false",
            f"--bind-address={LOOPBACK}", f"--secure-port={free_port()}",
            "--v=1",
        ], logs))  # fmt: skip
        started("kube-scheduler", Process("kube-scheduler", [
            str(binaries["kube-scheduler"]),
            f"--kubeconfig={kubeconfig('scheduler', 'system:kube-scheduler')}",
            "--leader-elect=false",
            f"--bind-address={LOOPBACK}", f"--secure-port={free_port()}",
            "--v=1",
        ], logs))  # fmt: skip
        stage_files = [stages / "node/fast/node-initialize.yaml",
                       stages / "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
                       *kwok_stages(stages, dir / "kwok-stages")]  # fmt: skip
        started("kwok", Process("kwok", [
            str(binaries["kwok"]),
            f"--kubeconfig={kubeconfig('kwok', 'kwok', ('system:masters',))}",
            "--manage-nodes-with-label-selector=type=kwok",
            "--node-lease-duration-seconds=40",
            "--cidr=10.244.0.0/16",
            *(f"--config={f}" for f in stage_files),
        ], logs))  # fmt: skip
        _create_nodes(cp)
        _wait(cp, lambda: _nodes_ready(cp), within=60, what="fake nodes Ready")
        _wait(cp, lambda: _default_service_account(cp), within=60, what="the default ServiceAccount")
        if cp.real is not None:
            real_nodes_.start_nodes(cp.real, dir / "real-nodes", pki, port, cp.kubectl, real_nodes)
            cp.timings.update({f"node {name}": s for name, s in cp.real.timings.items()})
        cp.timings["total"] = time.monotonic() - t0
    except BaseException:
        cp.stop()
        raise
    return cp


def _wait(cp: ControlPlane, ready: Any, *, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not ready():
        for proc in cp.processes.values():
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited while waiting for {what}:\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} after {within:.0f} s:\n{cp.logs()}")
        time.sleep(0.2)


def _create_nodes(cp: ControlPlane) -> None:
    cp.apply([{
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": n.name, "labels": n.labels(), "annotations": {"kwok.x-k8s.io/node": "fake"}},
    } for n in cp.nodes])  # fmt: skip
    for n in cp.nodes:
        status = {"status": {"capacity": n.capacity(), "allocatable": n.capacity()}}
        cp.kubectl("patch", "node", n.name, "--subresource=status", "--type=merge", "-p", json.dumps(status))


def _nodes_ready(cp: ControlPlane) -> bool:
    items = cp.get_json("nodes")["items"]
    ready = {
        n["metadata"]["name"]
        for n in items
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
        and all(
            n["status"].get("allocatable", {}).get(k) == v
            for k, v in _node(cp, n["metadata"]["name"]).capacity().items()
        )
    }
    return ready == {n.name for n in cp.nodes}


def _node(cp: ControlPlane, name: str) -> FakeNode:
    return next(n for n in cp.nodes if n.name == name)


def _default_service_account(cp: ControlPlane) -> bool:
    return cp.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0


@contextlib.contextmanager
def control_plane(
    dir: Path,
    nodes: Sequence[FakeNode] = DEFAULT_NODES,
    audited_users: Sequence[str] = (),
    apiserver_args: Sequence[str] = (),
    real_nodes: Sequence[real_nodes_.RealNode] = (),
) -> Any:
    cp = start_control_plane(dir, nodes, audited_users, apiserver_args, real_nodes)
    try:
        yield cp
    finally:
        cp.stop()
        shutil.rmtree(dir, ignore_errors=True)
