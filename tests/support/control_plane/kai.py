"""KAI-Scheduler v0.17.0 (the open core of Run:ai's scheduler) on the test control plane.

Its commands are built by `make peers` from the KAI source tarball (hack/peers/kai), each run as
its own process the way KAI's operator deploys them (`pkg/operator/operands/*/resources.go`)
(processes on this machine, not pods: no image of KAI can be pulled or built here),
configured as Run:ai configures KAI: scheduler name `runai-scheduler`, queue label `runai/queue`.

- CRDs: KAI's own (`deployments/kai-scheduler/crds`, copied to `$PEERS_DIR/share/kai/crds`):
  Queue and PodGroup (`scheduling.run.ai`), BindRequest, and the `kai.scheduler` kinds.
- `kai-podgrouper` makes a PodGroup for every pod of the scheduler name (queue from the pod's
  `runai/queue` label, preemptibility from `kai.scheduler/preemptibility` or the priority class);
  `kai-scheduler` allocates PodGroups within their Queues and writes a BindRequest;
  `kai-binder` binds the pod to the node; `kai-podgroupcontroller` writes each PodGroup's status
  (resources allocated); `kai-queuecontroller` sums those into each Queue's status
  (`allocated`, `allocatedNonPreemptible`, `requested`).
- `kai-admission` serves KAI's pod webhooks, registered as the operator registers them:
  configurations `mutating-kai-admission`/`validating-kai-admission`, webhook
  `admission.kai-scheduler.svc`, namespaces other than kube-system and KAI's own, the match
  condition `object.spec.schedulerName == 'runai-scheduler'`, failurePolicy Fail, the mutating
  one reinvoked if needed (Run:ai's own admission sets the scheduler name after it).
  GPU sharing on (`--gpu-sharing-enabled`), without a RuntimeClass (kwok runs no containers) and
  with `--fake-gpu-nodes` (kwok nodes have no device plugin to report GPU memory or indexes).
- Routing and certificates: KAI's webhook server binds its port on every address (its only flag
  is a port); the Service `admission` in `kai-scheduler` (no selector) has that port, and the
  apiserver dials its ClusterIP: a loopback address without real nodes, and with them an address
  of the nodes' namespace whose EndpointSlice names a relay to this machine (`machine_endpoint`,
  cluster.py). The certificate, for
  `admission.kai-scheduler.svc`, is where controller-runtime reads it by default:
  `$TMPDIR/k8s-webhook-server/serving-certs`, TMPDIR being this harness's folder.
- Each command talks to the apiserver as the admin (`KUBECONFIG`): KAI's RBAC is not what these
  tests are about. The pod grouper is the exception: it runs as KAI's install runs it,
  ServiceAccount `pod-grouper` of `kai-scheduler` (bound to cluster-admin), the identity our chart
  lets name a pod's PodGroup after creation (`podGroupers`); as the admin its patch is refused.
  Metrics and probes listen on 127.0.0.1 (the scheduler's plugin server, like the webhook server,
  takes only a port), except the pod-group controller's metrics: v0.17.0 parses
  `--metrics-bind-address` but never uses it, so it always binds :8080. Two KAI harnesses on one
  machine at once (two clones' test runs) would collide on that port, so `kai_running` holds a
  machine-wide lock (PORT_8080_LOCK) from start to stop and a second run waits its turn. The
  queue and pod-group controllers' own webhooks (Queue and PodGroup validation) are off: no test
  writes a bad Queue or PodGroup.
- kwok runs no container, so the container of KAI's GPU reservation pods (it writes the GPU it was
  given on its pod, which the binder waits for) is played by the tests that need it
  (tests/e2e/test_kai.py, `with_reservations_played`).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support import peers
from tests.support.control_plane.background import BackgroundLoop
from tests.support.control_plane.cluster import GPU, ControlPlane
from tests.support.control_plane.processes import LOOPBACK, Process, free_port
from tests.support.runai_standin import RunaiStandin
from webhook.tls.issuing import make_ca, make_serving_cert

Obj = dict[str, Any]
NAMESPACE = "kai-scheduler"
SCHEDULER_NAME = "runai-scheduler"
QUEUE_LABEL = "runai/queue"
SERVICE = "admission"
WEBHOOK = f"{SERVICE}.{NAMESPACE}.svc"
MUTATING = "mutating-kai-admission"
VALIDATING = "validating-kai-admission"
RESERVATION_NAMESPACE = "kai-resource-reservation"
POD_GROUPER_SA = "pod-grouper"  # KAI's operator's name for it
QUEUE_API = "scheduling.run.ai/v2"
PODGROUP_API = "scheduling.run.ai/v2alpha2"
COMMANDS = ("podgrouper", "scheduler", "binder", "podgroupcontroller", "queuecontroller", "admission")
UNLIMITED = -1  # KAI's quota value for "no quota" (commonconstants.UnlimitedResourceQuantity)


@dataclass
class Kai:
    cp: ControlPlane
    processes: dict[str, Process] = field(default_factory=dict)
    configurations: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) of its webhooks
    timings: dict[str, float] = field(default_factory=dict)  # seconds from start to ready, per step

    def stop(self) -> None:
        # Its webhooks fail closed: without the admission process no pod of the scheduler could be made.
        for kind, name in self.configurations:
            with contextlib.suppress(Exception):
                self.cp.kubectl("delete", kind.lower(), name, "--ignore-not-found")
        for name, proc in reversed(list(self.processes.items())):
            proc.stop()
            self.cp.processes.pop(f"kai-{name}", None)

    def logs(self, lines: int = 40) -> str:
        return "\n".join(f"--- kai-{name}\n{proc.tail(lines)}" for name, proc in self.processes.items())

    def queue(self, name: str) -> Obj | None:
        found = self.cp.kubectl("get", "queues.scheduling.run.ai", name, "-o", "json", check=False)
        return json.loads(found.stdout) if found.returncode == 0 else None

    def queues(self) -> dict[str, Obj]:
        return _queues(self.cp)

    def pod_groups(self, namespace: str) -> list[Obj]:
        return list(self.cp.get_json("podgroups.scheduling.run.ai", "-n", namespace)["items"])

    def pod_group_of(self, namespace: str, pod: str) -> Obj | None:
        """The PodGroup the podgrouper made for the pod (named in the pod's `pod-group-name` annotation)."""
        obj = self.cp.get_json("pod", pod, "-n", namespace)
        name = (obj["metadata"].get("annotations") or {}).get("pod-group-name")
        if not name:
            return None
        found = self.cp.kubectl("get", "podgroups.scheduling.run.ai", name, "-n", namespace, "-o", "json", check=False)
        return json.loads(found.stdout) if found.returncode == 0 else None


def queue(name: str, gpus: float, parent: str | None = None) -> Obj:
    """A KAI Queue as Run:ai's cluster side writes one for a department (no parent) or a project:
    deserved GPUs = the quota, no limit; CPU and memory unlimited (Run:ai's quotas here are GPUs)."""
    unlimited = {"quota": UNLIMITED, "limit": UNLIMITED, "overQuotaWeight": 1}
    spec: Obj = {
        "displayName": name,
        "resources": {"gpu": {"quota": gpus, "limit": UNLIMITED, "overQuotaWeight": 1},
                      "cpu": dict(unlimited), "memory": dict(unlimited)},
    }  # fmt: skip
    if parent is not None:
        spec["parentQueue"] = parent
    return {"apiVersion": QUEUE_API, "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def webhook_configurations(ca_pem: bytes, port: int) -> list[Obj]:
    """KAI's pod webhooks as its operator writes them (admission/resources.go) for this config."""
    bundle = base64.b64encode(ca_pem).decode()

    def client(path: str) -> Obj:
        return {"caBundle": bundle, "service": {"name": SERVICE, "namespace": NAMESPACE, "path": path, "port": port}}

    namespaces = {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}]}  # fmt: skip
    conditions = [{"name": "scheduler-name-match", "expression": f"object.spec.schedulerName == '{SCHEDULER_NAME}'"}]

    def pods(*operations: str) -> list[Obj]:
        return [{"apiGroups": [""], "apiVersions": ["v1"], "operations": list(operations), "resources": ["pods"],
                 "scope": "Namespaced"}]  # fmt: skip

    common = {"admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail"}
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": MUTATING, "labels": {"app": SERVICE}},
        "webhooks": [{"name": WEBHOOK, **common, "namespaceSelector": namespaces, "matchConditions": conditions,
                      "clientConfig": client("/mutate--v1-pod"), "rules": pods("CREATE"),
                      "reinvocationPolicy": "IfNeeded"}],
    }  # fmt: skip
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": VALIDATING, "labels": {"app": SERVICE}},
        "webhooks": [
            {"name": WEBHOOK, **common, "namespaceSelector": namespaces, "matchConditions": conditions,
             "clientConfig": client("/validate--v1-pod"), "rules": pods("CREATE", "UPDATE")},
            {"name": f"topology.{WEBHOOK}", **common,
             "clientConfig": client("/validate-kai-scheduler-v1alpha1-topology"),
             "rules": [{"apiGroups": ["kai.scheduler"], "apiVersions": ["v1alpha1"],
                        "operations": ["CREATE", "UPDATE"], "resources": ["topologies"], "scope": "Cluster"}]},
        ],
    }  # fmt: skip
    return [mutating, validating]


def _established(cp: ControlPlane, names: list[str]) -> bool:
    for name in names:
        conditions = cp.get_json("crd", name).get("status", {}).get("conditions") or []
        if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return False
    return True


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)


def _poll(ready: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} after {within:.0f} s")
        time.sleep(0.3)


def start_kai(cp: ControlPlane, dir: Path) -> Kai:
    """Install KAI's CRDs and start its commands; returns once its admission serves."""
    binaries = {name: peers.binary(f"kai-{name}") for name in COMMANDS}
    crds = peers.share("kai/crds")
    dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    # Applied, not created: a second KAI on the same control plane (another module) finds them there.
    cp.apply([
        *({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
          for n in (NAMESPACE, RESERVATION_NAMESPACE)),
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": RESERVATION_NAMESPACE, "namespace": RESERVATION_NAMESPACE}},
    ])  # fmt: skip
    files = sorted(crds.glob("*.yaml"))
    for f in files:
        cp.kubectl("apply", "--server-side", "-f", str(f))
    names = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in files]
    _poll(lambda: _established(cp, names), 60, "KAI's CRDs established")

    port = free_port()
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
               "spec": {"ports": [{"name": "webhook", "port": port, "targetPort": port}]}}  # fmt: skip
    cp.apply([service])
    # The apiserver reaches the server on this machine through the Service (machine_endpoint).
    cp.machine_endpoint(NAMESPACE, SERVICE, port, port_name="webhook", machine_port=port)
    ca = make_ca("KAI admission test CA", days=30)
    cert = make_serving_cert(ca, SERVICE, NAMESPACE)
    tmp = dir / "admission-tmp"
    cert_dir = tmp / "k8s-webhook-server" / "serving-certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "tls.crt").write_bytes(cert.cert_pem)
    (cert_dir / "tls.key").write_bytes(cert.key_pem)

    env = {"KUBECONFIG": str(cp.admin_kubeconfig)}
    # The pod grouper as KAI's own install runs it, ServiceAccount pod-grouper: the identity our
    # chart lets write a pod's `pod-group-name` after creation (values.yaml podGroupers).
    cp.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": POD_GROUPER_SA, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{NAMESPACE}-{POD_GROUPER_SA}"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
         "subjects": [{"kind": "ServiceAccount", "name": POD_GROUPER_SA, "namespace": NAMESPACE}]},
    ])  # fmt: skip
    grouper = cp.token_kubeconfig(dir / "pod-grouper.kubeconfig", cp.token(NAMESPACE, POD_GROUPER_SA, "12h"))
    probes = {name: free_port() for name in COMMANDS}

    def local() -> str:
        return f"{LOOPBACK}:{free_port()}"

    def controller_runtime(name: str) -> list[str]:
        return [f"--metrics-bind-address={local()}", f"--health-probe-bind-address={LOOPBACK}:{probes[name]}"]

    argv: dict[str, list[str]] = {
        "podgrouper": [f"--scheduler-name={SCHEDULER_NAME}", f"--queue-label-key={QUEUE_LABEL}",
                       *controller_runtime("podgrouper")],
        "scheduler": [f"--scheduler-name={SCHEDULER_NAME}", f"--namespace={NAMESPACE}",
                      f"--queue-label-key={QUEUE_LABEL}", f"--resource-reservation-app-label={RESERVATION_NAMESPACE}",
                      f"--listen-address={local()}", f"--plugin-server-port={free_port()}"],
        "binder": [f"--scheduler-name={SCHEDULER_NAME}", f"--resource-reservation-namespace={RESERVATION_NAMESPACE}",
                   f"--resource-reservation-service-account={RESERVATION_NAMESPACE}",
                   f"--resource-reservation-app-label={RESERVATION_NAMESPACE}", "--fake-gpu-nodes",
                   *controller_runtime("binder")],
        "podgroupcontroller": [f"--scheduler-name={SCHEDULER_NAME}", "--enable-podgroup-webhook=false",
                               *controller_runtime("podgroupcontroller")],
        "queuecontroller": [f"--metrics-listen-address={local()}", "--enable-webhook=false"],
        "admission": [f"--scheduler-name={SCHEDULER_NAME}", f"--webhook-addr={port}", "--gpu-sharing-enabled=true",
                      "--gpu-fraction-runtime-class-name=", "--fake-gpu-nodes", *controller_runtime("admission")],
    }  # fmt: skip
    kai = Kai(cp)
    try:
        for name in COMMANDS:
            extra = {"TMPDIR": str(tmp)} if name == "admission" else {}
            if name == "podgrouper":
                extra = {"KUBECONFIG": str(grouper)}
            proc = Process(f"kai-{name}", [str(binaries[name]), *argv[name]], cp.dir / "logs", env={**env, **extra})
            kai.processes[name] = proc
            cp.processes[f"kai-{name}"] = proc
            proc.start()
        for name in ("podgrouper", "binder", "podgroupcontroller", "admission"):
            proc = kai.processes[name]
            if name in ("podgrouper", "binder"):
                # They register no readiness check: ready once their controllers' workers run.
                ready = lambda p=proc: "Starting workers" in p.tail(200)  # noqa: E731
            else:
                ready = lambda n=name: _http_ok(f"http://{LOOPBACK}:{probes[n]}/readyz")  # noqa: E731
            proc.wait_for(ready, within=120, what=f"ready kai-{name}")
            kai.timings[name] = time.monotonic() - t0
        configurations = webhook_configurations(ca.cert_pem, port)
        cp.apply(configurations, "--server-side")
        kai.configurations = [(o["kind"], o["metadata"]["name"]) for o in configurations]
        time.sleep(1.5)  # the apiserver's webhook informers pick them up within a moment
        kai.timings["total"] = time.monotonic() - t0
    except BaseException:
        kai.stop()
        raise
    return kai


def set_department_quota(runai: RunaiStandin, name: str, gpus: float) -> None:
    """A Run:ai admin's edit of a department's GPU quota (on the stand-in's loop)."""
    department = runai.department(name)
    assert department is not None, f"no department {name}"
    department["resources"][0]["gpu"]["deserved"] = gpus
    department["totalResources"]["gpuQuota"] = gpus


def quantity(value: str | int | float | None) -> float:
    """A resource quantity as KAI writes GPUs in a Queue's status ("2", "500m", 1.5)."""
    if value is None:
        return 0.0
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def queue_usage(q: Obj) -> tuple[float, float, float]:
    """(allocated, allocatedNonPreemptible, requested) GPUs of a Queue, from its status."""
    status = q.get("status") or {}
    return tuple(
        quantity((status.get(k) or {}).get(GPU)) for k in ("allocated", "allocatedNonPreemptible", "requested")
    )  # type: ignore[return-value]


class QueueSync:
    """Run:ai's cluster side for the REST stand-in: keeps a KAI Queue for each of its departments
    and projects (`RunaiStandin.kai_queues`), deletes the Queues of those it no longer has, and
    gives it back what KAI allocated (`RunaiStandin.take_queue_usage`), once a second (`period_s`)
    on a thread of its own. The stand-in's state is read and written on its own loop."""

    def __init__(self, cp: ControlPlane, runai: RunaiStandin, background: BackgroundLoop,
                 period_s: float = 1.0) -> None:  # fmt: skip
        self.cp = cp
        self.runai = runai
        self.background = background
        self.period_s = period_s
        self.applied: dict[str, tuple[str | None, float]] = {}  # queue -> (parent, deserved GPUs) last applied
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kai-queue-sync", daemon=True)

    def start(self) -> QueueSync:
        self.sync()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.sync()
            except Exception as e:  # kept for the test to see; the next pass tries again
                self.errors.append(repr(e))

    def sync(self) -> None:
        async def wanted() -> list[tuple[str, str | None, float]]:
            return self.runai.kai_queues()

        desired = {name: (parent, gpus) for name, parent, gpus in self.background.run(wanted())}
        changed = [queue(name, gpus, parent) for name, (parent, gpus) in desired.items()
                   if self.applied.get(name) != (parent, gpus)]  # fmt: skip
        # Parents first: a child naming a parent KAI does not know yet waits for it.
        changed.sort(key=lambda q: "parentQueue" in q["spec"])
        if changed:
            self.cp.apply(changed)
        gone = [name for name in self.applied if name not in desired]
        for name in gone:
            self.cp.kubectl("delete", "queues.scheduling.run.ai", name, "--ignore-not-found", "--wait=false")
        self.applied = dict(desired)
        usage = {name: queue_usage(q) for name, q in _queues(self.cp).items()}

        async def give() -> None:
            self.runai.take_queue_usage(usage)

        self.background.run(give())


def _queues(cp: ControlPlane) -> dict[str, Obj]:
    return {q["metadata"]["name"]: q for q in cp.get_json("queues.scheduling.run.ai")["items"]}


PORT_8080_LOCK = Path(tempfile.gettempdir()) / "scheduling-webhook-kai-port-8080.lock"


@contextlib.contextmanager
def kai_running(cp: ControlPlane, dir: Path) -> Iterator[Kai]:
    with PORT_8080_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even if this process dies
        kai = start_kai(cp, dir)
        try:
            yield kai
        finally:
            kai.stop()
