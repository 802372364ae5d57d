"""The product installed on the test control plane as an operator installs it, and really running.

The chart (manifests/chart) is installed with the real helm, `helm install`, then `helm upgrade`
with the same values once it serves. Its certificates are the chart's own (certs.mode helm). Its
Deployment's two pods are run by a PodRunner (the kubelet's part): `scheduling-webhook serve` with
the pod's own args and env, its ServiceAccount's token, listening on the ClusterIP of the
install's Service, where the apiserver dials the webhooks' `clientConfig.service`.

Beside it, the Run:ai parts the product talks to: the REST stand-in (checked against NVIDIA's
spec) and a Run:ai-like mutating webhook registered like Run:ai's own (configuration `runai-*`,
namespaces labelled `runai/queue`, failurePolicy Fail) that sets `schedulerName: runai-scheduler`.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import ssl
import sys
import time
import urllib.request
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
from tests.support.control_plane.pod_runner import PodRunner
from tests.support.control_plane.processes import free_port
from tests.support.control_plane.rest import Rest
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
    service_ip: str
    runner: PodRunner
    background: BackgroundLoop
    runai: RunaiStandin
    runai_admission: RunaiAdmissionStandin
    settings_data: dict[str, str] = field(default_factory=dict)  # the ConfigMap's data as installed
    _runai_site: web.AppRunner | None = None

    @property
    def objects(self) -> list[Obj]:
        return [o for o in yaml.safe_load_all(self.rendered) if o]

    def wait_ready(self, replicas: int = 2, within: float = 90) -> None:
        self.runner.wait_ready(replicas, within)

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
            self.runner.wait_ready(replicas, within)
            wait_until(lambda: len(self.runner.running()) == replicas, within, f"{replicas} replicas")
        else:
            wait_until(lambda: not self.runner.containers, within, "no replica left")

    def ensure_running(self) -> None:
        """Two replicas Ready, whatever the last test did to them."""
        if len([c for c in self.runner.running() if c.ready]) != 2 or len(self.runner.containers) != 2:
            self.scale(2)

    def metric(self, name: str, **labels: str) -> list[float]:
        """The sample of `name` with these labels from each serving replica's /metrics (its probe port)."""
        values = []
        for c in self.runner.running():
            url = f"https://{self.service_ip}:{c.probe_port}/metrics"
            ctx = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
            ctx.check_hostname = False  # the certificate names the Service, not its address
            with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
                text = resp.read().decode()
            for family in text_string_to_metric_families(text):
                values += [s.value for s in family.samples if s.name == name and s.labels == labels]
        return values

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
        self.runner.stop()
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
    return helm(cp, command, chart.RELEASE, str(chart.CHART), "--namespace", INSTALL_NS, *extra, values=values)


def install(cp: ControlPlane, dir: Path, values: Obj | None = None) -> Install:
    """Values without `admission` get the control plane's webhook client CA and name: the
    admission port then admits the apiserver alone, as an operator who configures it installs."""
    dir.mkdir(parents=True, exist_ok=True)
    values = dict(values or {})
    if "admission" not in values and cp.webhook_client is not None:
        values["admission"] = {"clientCA": cp.webhook_client.ca_pem.decode(), "clientNames": [cp.webhook_client.name]}
    rest = Rest(cp.url, cp.pki.ca_file, cp.dir / "pki/admin.crt", cp.dir / "pki/admin.key")
    # As the install guide says: the namespace and the Run:ai client's Secret, then the chart.
    cp.kubectl("create", "namespace", INSTALL_NS)
    # Run:ai is installed first on a Run:ai cluster: with run_ai_enable the chart grants read
    # access in its namespace (templates/03-runai-admission-reader.yaml).
    cp.kubectl("create", "namespace", RUNAI_NAMESPACE)
    cp.apply([secret(RUNAI_SECRET_NAME, INSTALL_NS, {"clientSecret": RUNAI_CLIENT_SECRET.encode()})])
    # Without --wait: the pods run once the runner (the kubelet's part) is up, on the Service's IP.
    applied = [helm_install(cp, values)]
    service_ip = cp.service_ip(INSTALL_NS, SERVICE)
    runner = PodRunner(
        rest, INSTALL_NS, APP_SELECTOR,
        programs={"scheduling-webhook": [str(Path(sys.executable).parent / "scheduling-webhook")]},
        network_args=lambda pod, probe_port: _network_args(pod, service_ip, probe_port),
        probe_host=service_ip, free_port=lambda: free_port(service_ip), dir=dir / "pods",
        apiserver_url=cp.url, ca_file=cp.pki.ca_file,
    ).start()  # fmt: skip
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
    inst = Install(cp, dir, ca_pem, values, rendered, applied, service_ip, runner, background, runai, admission)
    try:
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


def _network_args(pod: Obj, service_ip: str, probe_port: int) -> list[str]:
    """Where a server pod listens (the Service's ClusterIP); other commands (the uninstall Job) get nothing."""
    args = pod["spec"]["containers"][0].get("args") or []
    if args[:1] != ["serve"]:
        return []
    return ["--host", service_ip, "--port", "443", "--probe-port", str(probe_port), "--reuse-port"]


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
    spec = {"ports": [{"port": 443, "targetPort": 8443}], "selector": {"app": RUNAI_SERVICE}}
    cp.apply([{"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}])
    ip = cp.service_ip(RUNAI_NAMESPACE, RUNAI_SERVICE)
    ca = make_ca("Run:ai admission test CA", days=30)
    ctx = _server_ssl(make_serving_cert(ca, RUNAI_SERVICE, RUNAI_NAMESPACE), inst.dir / "runai-admission")

    async def serve() -> web.AppRunner:
        runner = web.AppRunner(inst.runai_admission.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, ip, 443, ssl_context=ctx).start()
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
