"""The product installed on the test control plane as an operator installs it, and really running.

The chart (manifests/chart) is installed with the real helm, `helm install`, then `helm upgrade`
with the same values once it serves. Its certificates are the chart's own (certs.mode helm). Its
Deployment's two pods run from the image `make image` built, on the control plane's real nodes
(nodes.py: kubelet, containerd, runc), placed there by the chart's own nodeSelector and tolerations
values; the apiserver reaches them through the install's Service, as in any cluster.

Beside it, the Run:ai parts the product talks to: the REST stand-in (checked against NVIDIA's
spec) and a Run:ai-like mutating webhook registered like Run:ai's own (configuration `runai-*`,
namespaces labelled `runai/queue`, failurePolicy Fail) that sets `schedulerName: runai-scheduler`.
Both are processes of the test run on the machine's loopback (their state is what the tests
assert on); each is reached from the cluster through a Service whose EndpointSlice names a relay
in the nodes' namespace (`ControlPlane.machine_endpoint`). The test process reaches the install's
Service at `service_ip`, a loopback address whose ports are relayed into the namespace.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import os
import random
import signal
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.support import chart
from tests.support.control_plane.background import BackgroundLoop
from tests.support.control_plane.cluster import ControlPlane
from tests.support.control_plane.nodes import REAL_NODE_LABEL, REAL_NODE_TAINT, image_archive
from tests.support.runai_standin import RunaiStandin
from tests.support.runai_webhook import NAMESPACE as RUNAI_NAMESPACE
from tests.support.runai_webhook import SERVICE as RUNAI_SERVICE
from tests.support.runai_webhook import RunaiAdmissionStandin
from webhook.tls.issuing import CertKey, make_ca, make_serving_cert

Obj = dict[str, Any]
INSTALL_NS = "hopsworks"
SERVICE = "scheduling-webhook"
SERVICE_ACCOUNT = "scheduling-webhook"
SERVICE_ACCOUNT_USER = f"system:serviceaccount:{INSTALL_NS}:{SERVICE_ACCOUNT}"  # who the replicas are
SETTINGS = "hopsworks-cluster-settings"
TLS_SECRET = "scheduling-webhook-tls"
RUNAI_SECRET_NAME = "runai-hopsworks"
RUNAI_CLIENT_SECRET = "e2e-runai-secret"
LEASE = "scheduling-webhook-leader"
ADMISSION_PORT = 9443  # the Service's port `admission`, which the webhook configurations call
PROBE_PORT = 8444  # each pod's probes and /metrics
SERVICE_PORTS = (443, ADMISSION_PORT, PROBE_PORT, 8445)  # https, admission, metrics, aggregated
RUNAI_STANDIN_SERVICE = "runai-control-plane"  # the Run:ai REST stand-in, as the pods reach it
# The server's pods, and the chart's uninstall Job: both really run.
APP_SELECTOR = "app.kubernetes.io/name in (scheduling-webhook,scheduling-webhook-uninstall)"


def render(values: Obj, dir: Path, namespace: str = INSTALL_NS) -> str:
    """The install as `helm template` renders the chart for these values (kept in `dir`)."""
    dir.mkdir(parents=True, exist_ok=True)
    (dir / "values.yaml").write_text(yaml.safe_dump(values))
    return chart.template(values, namespace)


def secret(name: str, namespace: str, data: dict[str, bytes], type: str = "Opaque") -> Obj:
    import base64

    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace}, "type": type,
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}  # fmt: skip


def _server_ssl(cert: CertKey, dir: Path) -> ssl.SSLContext:
    dir.mkdir(parents=True, exist_ok=True)
    (dir / "tls.crt").write_bytes(cert.cert_pem)
    (dir / "tls.key").write_bytes(cert.key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(dir / "tls.crt", dir / "tls.key")
    return ctx


@dataclass
class Install:
    cp: ControlPlane
    dir: Path
    ca_pem: bytes  # the chart's CA: it signed the serving certificate and is every webhook's caBundle
    values: Obj  # the chart's values
    rendered: str  # the release's manifest (`helm get manifest`)
    applied: list[str]  # helm's output of the install and of the upgrade
    # Where the test process reaches the install's Service: a loopback address whose ports
    # (SERVICE_PORTS) are relayed to the Service's ClusterIP inside the nodes' namespace.
    service_ip: str
    background: BackgroundLoop
    runai: RunaiStandin
    runai_admission: RunaiAdmissionStandin
    runai_url: str = ""  # the Run:ai stand-in as the pods reach it (a Service's ClusterIP)
    settings_data: dict[str, str] = field(default_factory=dict)  # the ConfigMap's data as installed
    _runai_site: web.AppRunner | None = None

    @property
    def objects(self) -> list[Obj]:
        return [o for o in yaml.safe_load_all(self.rendered) if o]

    def pods(self) -> list[Obj]:
        """The server's pods as stored, those being deleted included."""
        return list(
            self.cp.get_json("pods", "-n", INSTALL_NS, "-l", "app.kubernetes.io/name=scheduling-webhook")["items"]
        )

    def serving(self) -> list[Obj]:
        """The pods that are Ready and not being deleted."""
        return [p for p in self.pods() if not p["metadata"].get("deletionTimestamp") and pod_ready(p)]

    def wait_ready(self, replicas: int = 2, within: float = 150) -> None:
        wait_until(lambda: len(self.serving()) >= replicas, within, f"{replicas} Ready replicas")

    def reset_settings(self) -> None:
        """Back to the settings of the install, as an installer would write them."""
        current = self.cp.get_json("configmap", SETTINGS, "-n", INSTALL_NS)
        if current.get("data") != self.settings_data:
            body = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": SETTINGS, "namespace": INSTALL_NS,
                                 "resourceVersion": current["metadata"]["resourceVersion"]},
                    "data": self.settings_data}  # fmt: skip
            self.cp.kubectl("replace", "-f", "-", input=yaml.safe_dump(body))

    def scale(self, replicas: int, within: float = 90) -> None:
        """`kubectl scale` of the install's Deployment, until that many replicas serve (or none)."""
        self.cp.kubectl("scale", "deployment", SERVICE, "-n", INSTALL_NS, f"--replicas={replicas}")
        if replicas:
            self.wait_ready(replicas, within)
            wait_until(lambda: len(self.pods()) == replicas, within, f"{replicas} replicas")
        else:
            wait_until(lambda: not self.pods(), within, "no replica left")

    def ensure_running(self) -> None:
        """Two replicas Ready and no other pod of the server, whatever the last test did to them."""
        if len(self.serving()) != 2 or len(self.pods()) != 2:
            self.scale(2)

    def running(self) -> list[Obj]:
        """The pods whose container runs (Ready or not), not being deleted."""

        def runs(pod: Obj) -> bool:
            statuses = pod.get("status", {}).get("containerStatuses") or []
            return any("running" in (c.get("state") or {}) for c in statuses)

        return [p for p in self.pods() if not p["metadata"].get("deletionTimestamp") and runs(p)]

    def pod_get(self, pod: Obj, port: int, path: str) -> str:
        """GET `path` from the pod's own address (TLS, no client certificate), the connection
        opened inside the nodes' namespace as a pod of the cluster would open it."""
        assert self.cp.real is not None
        ctx = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        ctx.check_hostname = False  # the certificate names the Service, not the pod's address
        sock = self.cp.real.ns.socket()
        sock.settimeout(5)
        sock.connect((pod["status"]["podIP"], port))
        with ctx.wrap_socket(sock) as tls:
            tls.sendall(f"GET {path} HTTP/1.0\r\nHost: {SERVICE}.{INSTALL_NS}.svc\r\n\r\n".encode())
            chunks = []
            while chunk := tls.recv(65536):
                chunks.append(chunk)
        head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
        assert head.split(b" ", 2)[1] == b"200", head
        return body.decode()

    def metric(self, name: str, **labels: str) -> list[float]:
        """The sample of `name` with these labels from each running replica's /metrics (its probe port)."""
        values = []
        for pod in self.running():
            text = self.pod_get(pod, PROBE_PORT, "/metrics")
            for family in text_string_to_metric_families(text):
                values += [s.value for s in family.samples if s.name == name and s.labels == labels]
        return values

    def container_pid(self, pod: Obj) -> int:
        """The process of the pod's container, as its node's containerd runs it."""
        assert self.cp.real is not None
        node = pod["spec"]["nodeName"]
        cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        for line in self.cp.real.ctr(node, "tasks", "list").splitlines()[1:]:
            task, pid, *_ = line.split()
            if task == cid:
                return int(pid)
        raise AssertionError(f"no task {cid} on {node}")

    def kill(self, pod_name: str) -> None:
        """`kill -9` of the pod's container: its kubelet starts it again."""
        pod = next(p for p in self.pods() if p["metadata"]["name"] == pod_name)
        os.kill(self.container_pid(pod), signal.SIGKILL)

    def admission_ssl(self, *, as_apiserver: bool = True) -> ssl.SSLContext:
        """A client context for the admission port: trusting the chart's CA, and presenting the
        client certificate the control plane gives its apiserver for webhooks, or none."""
        ctx = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        ctx.check_hostname = False  # the certificate names the Service, not its address
        client = self.cp.webhook_client
        if as_apiserver and client is not None:
            ctx.load_cert_chain(client.cert.cert_file, client.cert.key_file)
        return ctx

    def apply_webhook_configurations(self, mutation: Callable[[list[Obj]], None] | None) -> None:
        """Re-apply the render's webhook configurations, changed by `mutation` (None: as rendered);
        configurations the change renamed away are deleted, and put back afterwards."""
        kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        wanted = [copy.deepcopy(o) for o in self.objects if o["kind"] in kinds]
        if mutation is not None:
            mutation(wanted)
        names = {(o["kind"], o["metadata"]["name"]) for o in wanted}
        for obj in wanted:
            # Replaced whole: an apply would leave the fields helm manages (a dropped selector) as they are.
            exists = self.cp.kubectl("get", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found").stdout
            self.cp.kubectl("replace" if exists.strip() else "create", "-f", "-", input=yaml.safe_dump(obj))
        for kind in kinds:
            listed = self.cp.get_json(kind.lower(), "-l", "app.kubernetes.io/name=scheduling-webhook")["items"]
            for obj in listed:
                if (kind, obj["metadata"]["name"]) not in names:
                    self.cp.kubectl("delete", kind.lower(), obj["metadata"]["name"])
        time.sleep(1.5)  # the apiserver's webhook informers pick the change up within a moment

    def hold_leadership_elsewhere(self) -> None:
        """Another holder takes the Lease for an hour: the replicas step down and no reconcile pass
        runs until `release_leadership`."""
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": LEASE, "namespace": INSTALL_NS},
                 "spec": {"holderIdentity": "elsewhere", "leaseDurationSeconds": 3600, "acquireTime": now,
                          "renewTime": now}}  # fmt: skip
        self.cp.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=test", "-f", "-",
                        input=yaml.safe_dump(lease))  # fmt: skip
        time.sleep(3)  # a leader notices at its next renewal (every 2 s) and stops leading

    def service_account_kubeconfig(self) -> Path:
        """A kubeconfig with a TokenRequest token of the replicas' own ServiceAccount: the test
        acts exactly as the server does (same user, same RBAC, same admission policies)."""
        token = self.cp.token(INSTALL_NS, SERVICE_ACCOUNT, "1h")
        return self.cp.token_kubeconfig(self.dir / "service-account.kubeconfig", token)

    def release_leadership(self) -> None:
        self.cp.kubectl("delete", "lease", LEASE, "-n", INSTALL_NS, "--ignore-not-found")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            if self._runai_site is not None:
                self.background.run(self._runai_site.cleanup())
            self.background.run(self.runai.stop())
        self.background.close()


def helm(cp: ControlPlane, *args: str, values: Obj | None = None, timeout: float = 300) -> str:
    """The real helm against this control plane, as its admin (group system:masters)."""
    return chart.helm(*args, kubeconfig=cp.admin_kubeconfig, values=values, timeout=timeout)


def helm_install(cp: ControlPlane, values: Obj, *extra: str, command: str = "install") -> str:
    """`helm install` (or `upgrade`) of the chart as release scheduling-webhook in the install namespace.

    Helm 4 applies server-side: a setting a test changed with `kubectl patch` belongs to kubectl's
    field manager then, and an upgrade stops on the conflict. `--force-conflicts` takes the chart's
    values back, as Helm 3's three-way merge did (manifests/README.md, "Upgrade and rollback")."""
    if command == "upgrade" and chart.helm_major() >= 4:
        extra = ("--force-conflicts", *extra)
    if cp.real is not None:  # the pods can only run there: every upgrade keeps them on the real nodes
        values = on_real_nodes(values)
    return helm(cp, command, chart.RELEASE, str(chart.CHART), "--namespace", INSTALL_NS, *extra, values=values)


def on_real_nodes(values: Obj) -> Obj:
    """The values that run the install from the image on the real nodes: its tag, never pulled
    (the nodes imported it), placed by the chart's nodeSelector and tolerations values (a label
    the kwok nodes lack, and the real nodes' taint)."""
    _archive, tag = image_archive()
    repository, version = tag.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": version, "pullPolicy": "Never"},
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "tolerations": [{**REAL_NODE_TAINT, "operator": "Equal"}],
        **values,
    }


def pod_ready(pod: Obj) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def _machine_address() -> str:
    # Below 127.100.0.0, where control planes pick their loopback Service CIDRs, and off 127.0.0.0/16.
    return f"127.{random.randint(2, 99)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


def install(cp: ControlPlane, dir: Path, values: Obj | None = None) -> Install:
    """Values without `admission` get the control plane's webhook client CA and name: the
    admission port then admits the apiserver alone, as an operator who configures it installs.
    The control plane must have real nodes (`control_plane(..., real_nodes=...)`)."""
    assert cp.real is not None, "the install runs on real nodes: control_plane(..., real_nodes=DEFAULT_REAL_NODES)"
    dir.mkdir(parents=True, exist_ok=True)
    values = on_real_nodes(dict(values or {}))
    if "admission" not in values and cp.webhook_client is not None:
        values["admission"] = {"clientCA": cp.webhook_client.ca_pem.decode(), "clientNames": [cp.webhook_client.name]}
    # As the install guide says: the namespace and the Run:ai client's Secret, then the chart.
    cp.kubectl("create", "namespace", INSTALL_NS)
    # Run:ai is installed first on a Run:ai cluster: with run_ai_enable the chart grants read
    # access in its namespace (templates/03-runai-admission-reader.yaml).
    cp.kubectl("create", "namespace", RUNAI_NAMESPACE)
    cp.apply([secret(RUNAI_SECRET_NAME, INSTALL_NS, {"clientSecret": RUNAI_CLIENT_SECRET.encode()})])
    # Without --wait: the stand-ins the pods call start meanwhile.
    applied = [helm_install(cp, values)]
    service_ip = _machine_address()
    cluster_ip = cp.service_ip(INSTALL_NS, SERVICE)
    for port in SERVICE_PORTS:
        cp.real.relays.from_machine(service_ip, port, cluster_ip, port)
    # Tests turn Run:ai on by editing the settings as an installer; what an install with Run:ai on
    # adds (read access to Run:ai's Deployments in its namespace) is applied from such a render.
    runai_values = {**values, "variables": {**values.get("variables", {}), "run_ai_enable": True,
                                            "run_ai_client_id": "hopsworks", "kueue_installed": False}}  # fmt: skip
    runai_on = render(runai_values, dir / "runai")
    in_runai = [o for o in yaml.safe_load_all(runai_on) if o and o["metadata"].get("namespace") == RUNAI_NAMESPACE]
    for obj in in_runai:  # marked as the release's, so that a `helm upgrade` with Run:ai on adopts them
        obj["metadata"].setdefault("labels", {})["app.kubernetes.io/managed-by"] = "Helm"
        obj["metadata"].setdefault("annotations", {}).update(
            {"meta.helm.sh/release-name": chart.RELEASE, "meta.helm.sh/release-namespace": INSTALL_NS}
        )
    if in_runai:
        cp.apply(in_runai, "--server-side")
    ca_pem = _chart_ca(cp)
    (dir / "ca.crt").write_bytes(ca_pem)
    background = BackgroundLoop()
    runai = RunaiStandin(client_secret=RUNAI_CLIENT_SECRET)
    background.run(runai.start())
    admission = RunaiAdmissionStandin()
    rendered = helm(cp, "get", "manifest", chart.RELEASE, "--namespace", INSTALL_NS)
    inst = Install(cp, dir, ca_pem, values, rendered, applied, service_ip, background, runai, admission)
    try:
        inst.runai_url = _expose_runai(cp, runai)
        inst.settings_data = dict(cp.get_json("configmap", SETTINGS, "-n", INSTALL_NS).get("data") or {})
        _start_runai_admission(inst)
        inst.wait_ready()
        # Upgraded once it serves, with the same values: the settings ConfigMap's webhook fails
        # closed, so while no replica answers, a write to the settings is refused (as on any cluster).
        applied.append(helm_install(cp, values, command="upgrade"))
        inst.rendered = helm(cp, "get", "manifest", chart.RELEASE, "--namespace", INSTALL_NS)
    except BaseException:
        inst.stop()
        raise
    return inst


def _expose_runai(cp: ControlPlane, runai: RunaiStandin) -> str:
    """The Run:ai REST stand-in behind a Service of port 80 in `runai`: the URL the pods call."""
    cp.apply([{"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": RUNAI_STANDIN_SERVICE, "namespace": RUNAI_NAMESPACE},
               "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}}])  # fmt: skip
    port = int(runai.url.rsplit(":", 1)[1])
    cp.machine_endpoint(RUNAI_NAMESPACE, RUNAI_STANDIN_SERVICE, 80, machine_port=port)
    return f"http://{cp.service_ip(RUNAI_NAMESPACE, RUNAI_STANDIN_SERVICE)}"


def _chart_ca(cp: ControlPlane) -> bytes:
    """The CA the chart issued (certs.mode helm), as the TLS Secret's ca.crt holds it."""
    import base64

    data = cp.get_json("secret", TLS_SECRET, "-n", INSTALL_NS).get("data") or {}
    return base64.b64decode(data["ca.crt"])


def _start_runai_admission(inst: Install) -> None:
    """Run:ai's own admission webhook (not part of our install): a Service in `runai`, served on its
    ClusterIP, registered in the apiserver the way Run:ai registers its webhooks."""
    cp = inst.cp
    meta = {"name": RUNAI_SERVICE, "namespace": RUNAI_NAMESPACE}
    spec = {"ports": [{"port": 443, "protocol": "TCP"}]}
    cp.apply([{"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}])
    host, port = cp.machine_endpoint(RUNAI_NAMESPACE, RUNAI_SERVICE, 443)
    ca = make_ca("Run:ai admission test CA", days=30)
    ctx = _server_ssl(make_serving_cert(ca, RUNAI_SERVICE, RUNAI_NAMESPACE), inst.dir / "runai-admission")

    async def serve() -> web.AppRunner:
        runner = web.AppRunner(inst.runai_admission.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port, ssl_context=ctx).start()
        return runner

    inst._runai_site = inst.background.run(serve())
    cp.apply([RunaiAdmissionStandin.configuration(ca.cert_pem)])


def wait_until(predicate: Callable[[], bool], within: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {within:.0f} s")
        time.sleep(interval)


@contextlib.contextmanager
def installed(cp: ControlPlane, dir: Path, values: Obj | None = None) -> Iterator[Install]:
    inst = install(cp, dir, values)
    try:
        yield inst
    finally:
        inst.stop()
