"""The install on real nodes: its two pods run from the image `make image` built, by a real kubelet
and containerd (tests/support/control_plane/nodes.py), and admission goes through them.

A control plane of its own for this module, with two real nodes beside the kwok nodes, although
the session's has real nodes too: these tests drain and cordon a node, kill a replica, fill one's
connection slots (with a cap of 16), roll and roll back the release and rewrite its certificate,
which the session's other tests must not see.
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from tests.e2e.conftest import apply_priority_classes
from tests.support import chart
from tests.support.cluster import SCHEDULER
from tests.support.control_plane.background import BackgroundLoop
from tests.support.control_plane.cluster import ControlPlane, control_plane
from tests.support.control_plane.install import (
    INSTALL_NS,
    RUNAI_CLIENT_SECRET,
    RUNAI_SECRET_NAME,
    SERVICE,
    SETTINGS,
    TLS_SECRET,
    helm,
    helm_install,
    secret,
)
from tests.support.control_plane.nodes import DEFAULT_REAL_NODES, REAL_NODE_LABEL, REAL_NODE_TAINT, image_archive
from tests.support.reviews import pod_review
from webhook.tls.issuing import CertKey, make_serving_cert

pytestmark = pytest.mark.slow

Obj = dict[str, Any]
UID = 10001
ADMISSION_PORT = 9443
PROBE_PORT = 8444
ADMISSION_CAP = 16


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    dir = Path(tempfile.mkdtemp(prefix="swh-real-nodes-"))
    try:
        with control_plane(dir, real_nodes=DEFAULT_REAL_NODES) as plane:
            print("control plane with real nodes ready:", ", ".join(f"{k} {v:.1f} s" for k, v in plane.timings.items()))
            apply_priority_classes(plane)
            yield plane
    finally:
        shutil.rmtree(dir, ignore_errors=True)


def _pods(cp: ControlPlane) -> list[Obj]:
    items = cp.get_json("pods", "-n", INSTALL_NS, "-l", "app.kubernetes.io/name=scheduling-webhook")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _ready(pod: Obj) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def wait_for(predicate: Any, within: float, what: str, cp: ControlPlane) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {within:.0f} s\n{_diagnosis(cp)}")
        time.sleep(0.5)


def _diagnosis(cp: ControlPlane) -> str:
    """The replicas' own logs (through the apiserver and the kubelet), then the nodes'."""
    out = []
    for pod in _pods(cp):
        for previous in ("--previous", ""):
            logs = cp.kubectl("logs", "-n", INSTALL_NS, pod["metadata"]["name"], "--tail=20",
                              *([previous] if previous else []), check=False)  # fmt: skip
            out.append(f"--- {pod['metadata']['name']} {previous}\n{logs.stdout}{logs.stderr}")
    for proc in cp.real.processes() if cp.real else []:
        out.append(f"--- {proc.name}\n{proc.tail(10)}")
    return "\n".join(out)


def _wait_two_ready_on_real_nodes(cp: ControlPlane, within: float = 150) -> None:
    real = {n.name for n in DEFAULT_REAL_NODES}

    def two() -> bool:
        pods = _pods(cp)
        return len(pods) == 2 and all(_ready(p) and p["spec"].get("nodeName") in real for p in pods)

    wait_for(two, within, "two Ready replicas on the real nodes", cp)


@pytest.fixture(scope="module")
def install(cp: ControlPlane) -> Obj:
    """The chart installed with the image's tag, pulled never (it is imported), and placed on the
    real nodes by its nodeSelector and tolerations values: a label the kwok nodes lack, and their taint."""
    _archive, tag = image_archive()
    repository, version = tag.rsplit(":", 1)
    assert cp.webhook_client is not None
    values: Obj = {
        "image": {"repository": repository, "tag": version, "pullPolicy": "Never"},
        "admission": {"clientCA": cp.webhook_client.ca_pem.decode(), "clientNames": [cp.webhook_client.name]},
        # Placed by the chart's own scheduling values, as an operator places it.
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "tolerations": [{**REAL_NODE_TAINT, "operator": "Equal"}],
        # A connection cap one test thread can fill (the default is 1,024): the readiness test
        # holds every slot of one replica's admission port busy. The apiserver needs a few.
        "extraEnv": [{"name": "WEBHOOK_MAX_CONNECTIONS", "value": str(ADMISSION_CAP)}],
    }
    cp.kubectl("create", "namespace", INSTALL_NS)
    cp.apply([secret(RUNAI_SECRET_NAME, INSTALL_NS, {"clientSecret": RUNAI_CLIENT_SECRET.encode()})])
    helm_install(cp, values)

    _wait_two_ready_on_real_nodes(cp)
    return values


def _container_pid(cp: ControlPlane, pod: Obj) -> int:
    assert cp.real is not None
    node = pod["spec"]["nodeName"]
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    for line in cp.real.ctr(node, "tasks", "list").splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == cid:
            return int(pid)
    raise AssertionError(f"no task {cid} on {node}")


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in lines)}


def test_the_install_runs_from_the_image_as_the_chart_describes(cp: ControlPlane, install: Obj) -> None:
    pods = _pods(cp)
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(n.name for n in DEFAULT_REAL_NODES)
    _archive, tag = image_archive()
    for pod in pods:
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["restartCount"] == 0, status
        assert status["image"].endswith(tag) or tag in status["image"], status
        pid = _container_pid(cp, pod)
        proc = _status(pid)
        assert proc["Uid"].split()[:2] == [str(UID)] * 2 and proc["Gid"].split()[:2] == [str(UID)] * 2, proc
        assert proc["CapEff"] == proc["CapPrm"] == proc["CapBnd"] == "0000000000000000", proc
        assert proc["NoNewPrivs"] == "1" and proc["Seccomp"] == "2", proc
        root = next(line.split() for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                    if line.split()[4] == "/")  # fmt: skip
        assert "ro" in root[5].split(","), root
        # The pod's own address, in the namespace of the run: no address of the machine.
        assert pod["status"]["podIP"].startswith("10.200."), pod["status"]
    # Ready came from the kubelet's probes: the pods' conditions say so, and the Endpoints list them.
    slices = cp.get_json("endpointslices", "-n", INSTALL_NS, "-l", f"kubernetes.io/service-name={SERVICE}")["items"]
    ready = {e["addresses"][0] for s in slices for e in s.get("endpoints") or [] if e["conditions"].get("ready")}
    assert ready == {p["status"]["podIP"] for p in pods}


def test_admission_goes_through_the_pods_on_real_nodes(cp: ControlPlane, install: Obj) -> None:
    cp.kubectl("patch", "configmap", SETTINGS, "-n", INSTALL_NS, "--type=merge",
               "-p", json.dumps({"data": {"scheduler": yaml.safe_dump(SCHEDULER)}}))  # fmt: skip
    project = "real-nodes-project"
    cp.kubectl("create", "namespace", project)
    cp.kubectl("label", "namespace", project, f"hopsworks.ai/project={project}")
    pod: Obj = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "nb", "namespace": project, "labels": {"hopsworks.ai/workload-type": "notebook"}},
           "spec": {"containers": [{"name": "main", "image": "registry.example/notebook:1.0"}]}}  # fmt: skip

    def stored() -> bool:
        return cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod), check=False).returncode == 0

    wait_for(stored, 30, "the pod admitted (the replicas read the new settings)", cp)
    got = cp.get_json("pod", "nb", "-n", project)
    assert (got["spec"]["priorityClassName"], got["spec"]["priority"]) == ("normal", 10000)
    urgent: Obj = json.loads(json.dumps(pod))
    urgent["metadata"]["name"], urgent["spec"]["priorityClassName"] = "urgent", "urgent"
    refused = cp.kubectl("apply", "-f", "-", check=False, input=yaml.safe_dump(urgent))
    assert refused.returncode != 0 and "urgent not available in project" in refused.stderr, refused.stderr


class CreationLoop:
    """Pods created one after another in a project namespace, on a thread, until stopped: every
    refusal kept with its message."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp, self.namespace = cp, namespace
        self.created = 0
        self.successes: list[float] = []  # time.monotonic() of each creation
        self.refused: list[str] = []
        self.refused_at: list[float] = []  # time.monotonic() of each refusal
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"generateName": "loop-", "namespace": self.namespace,
                            "labels": {"hopsworks.ai/workload-type": "notebook"}},
               "spec": {"containers": [{"name": "main", "image": "registry.example/notebook:1.0"}]}}  # fmt: skip
        text = yaml.safe_dump(pod)
        while not self._stop.is_set():
            result = self.cp.kubectl("create", "-f", "-", input=text, check=False)
            if result.returncode == 0:
                self.created += 1
                self.successes.append(time.monotonic())
            else:
                self.refused.append(result.stderr.strip())
                self.refused_at.append(time.monotonic())

    def __enter__(self) -> CreationLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def _project(cp: ControlPlane, name: str) -> str:
    cp.kubectl("create", "namespace", name)
    cp.kubectl("label", "namespace", name, f"hopsworks.ai/project={name}")
    return name


def test_a_killed_container_is_restarted_by_the_kubelet_while_the_other_replica_serves(
    cp: ControlPlane, install: Obj
) -> None:
    """The other replica admits pods while the killed one is down, and the kubelet restarts it.

    What this cannot promise is no refusal. The readiness probe plays no part: the kubelet marks the
    pod not Ready as soon as it sees the container gone (about a second), then the EndpointSlice
    and kube-proxy follow. Until then kube-proxy still sends some new connections to the dead
    address, where nothing listens, and the apiserver does not retry a webhook call whose
    connection failed: a creation in that window can fail calling the webhook (never a denial).
    The test counts them and times the window."""
    _wait_two_ready_on_real_nodes(cp)
    project = _project(cp, "real-nodes-kill")
    victim, other = _pods(cp)
    name = victim["metadata"]["name"]
    pid = _container_pid(cp, victim)

    def pod() -> Obj:
        return dict(cp.get_json("pod", name, "-n", INSTALL_NS))

    ip = victim["status"]["podIP"]
    with CreationLoop(cp, project) as loop:
        time.sleep(2)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not _ready(pod()), 60, "the killed replica not Ready", cp)
        down = time.monotonic()
        wait_for(lambda: not _routed(cp, ip), 30, "kube-proxy no longer routing to the killed replica", cp)
        unrouted = time.monotonic()
        wait_for(lambda: pod()["status"]["containerStatuses"][0]["restartCount"] == 1 and _ready(pod()), 120,
                 "the killed container restarted by the kubelet and Ready", cp)  # fmt: skip
        up = time.monotonic()
        time.sleep(2)
    served = [t for t in loop.successes if down <= t <= up]
    window = [t - killed for t in loop.refused_at]
    tried = len([t for t in loop.successes if killed <= t <= unrouted]) + len(window)
    print(
        f"kill -9 of {name}: not Ready {down - killed:.1f} s after the kill, unrouted by kube-proxy after "
        f"{unrouted - killed:.1f} s, Ready again after {up - killed:.1f} s; {loop.created} pods created "
        f"({len(served)} while it was not Ready), {len(loop.refused)} failed calling the webhook "
        f"(of {tried} tried before it was unrouted), at [{', '.join(f'{t:.1f}' for t in window)}] s after the kill"
    )
    assert served, "no pod was admitted while the killed replica was down"
    assert all("failed calling webhook" in r and "denied" not in r for r in loop.refused), loop.refused[:3]
    assert pod()["status"]["containerStatuses"][0]["restartCount"] == 1
    assert (
        cp.get_json("pod", other["metadata"]["name"], "-n", INSTALL_NS)["status"]["containerStatuses"][0][
            "restartCount"
        ]
        == 0
    )


def test_a_drain_of_one_real_node_keeps_a_replica_and_refuses_no_pod(cp: ControlPlane, install: Obj) -> None:
    _wait_two_ready_on_real_nodes(cp)
    project = _project(cp, "real-nodes-drain")
    node = DEFAULT_REAL_NODES[0].name
    drained = next(p for p in _pods(cp) if p["spec"]["nodeName"] == node)
    try:
        with CreationLoop(cp, project) as loop:
            time.sleep(2)
            # The real eviction API against the chart's PodDisruptionBudget (minAvailable 1).
            result = cp.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s",
                                timeout=150)  # fmt: skip
            assert f"pod/{drained['metadata']['name']} evicted" in result.stdout, result.stdout
            remaining = [p for p in _pods(cp) if _ready(p)]
            assert len(remaining) >= 1, "the budget let every replica go"
            time.sleep(8)  # the drained replica's preStop (5 s) and shutdown, with reviews still coming
        print(f"drain of {node}: {loop.created} pods created, {len(loop.refused)} refused")
        assert loop.created > 0 and loop.refused == [], (loop.created, loop.refused[:3])
    finally:
        cp.kubectl("uncordon", node)
    _wait_two_ready_on_real_nodes(cp)


def test_a_rolling_helm_upgrade_and_a_rollback_refuse_no_pod(cp: ControlPlane, install: Obj) -> None:
    _wait_two_ready_on_real_nodes(cp)
    project = _project(cp, "real-nodes-upgrade")
    before = {p["metadata"]["name"] for p in _pods(cp)}
    with CreationLoop(cp, project) as loop:
        time.sleep(2)
        # A new pod template: the Deployment rolls both replicas (maxUnavailable 0, maxSurge 1).
        helm_install(cp, {**install, "podAnnotations": {"test.scheduling-webhook/rolled": "1"}}, command="upgrade")
        wait_for(lambda: not before & {p["metadata"]["name"] for p in _pods(cp)}, 240, "both replicas rolled", cp)
        _wait_two_ready_on_real_nodes(cp, 240)
        upgraded = {p["metadata"]["name"] for p in _pods(cp)}
        helm(cp, "rollback", chart.RELEASE, "--namespace", INSTALL_NS)
        wait_for(
            lambda: not upgraded & {p["metadata"]["name"] for p in _pods(cp)}, 240, "both replicas rolled back", cp
        )
        _wait_two_ready_on_real_nodes(cp, 240)
        time.sleep(2)
    print(f"helm upgrade and rollback: {loop.created} pods created, {len(loop.refused)} refused")
    assert loop.created > 0 and loop.refused == [], (loop.created, loop.refused[:3])


def _served_serial(cp: ControlPlane, pod_ip: str, ca_pem: bytes) -> int:
    """The serial of the certificate a replica's admission port presents, dialled from inside the
    nodes' network namespace with the apiserver's webhook client certificate."""
    assert cp.real is not None and cp.webhook_client is not None
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    ctx.check_hostname = False  # dialled by address; the chain is still verified
    ctx.load_cert_chain(cp.webhook_client.cert.cert_file, cp.webhook_client.cert.key_file)
    sock = cp.real.ns.socket()
    sock.settimeout(5)
    sock.connect((pod_ip, 9443))
    with ctx.wrap_socket(sock) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def test_a_renewed_certificate_reaches_both_replicas_through_the_secret_volume(cp: ControlPlane, install: Obj) -> None:
    """A cert-manager-style renewal: the TLS Secret rewritten with a new serving certificate from
    the same CA. The kubelet swaps the Secret volume's files; both replicas serve the new one
    without a restart, and no pod creation is refused meanwhile."""
    _wait_two_ready_on_real_nodes(cp)
    project = _project(cp, "real-nodes-renewal")
    ca_secret = cp.get_json("secret", f"{TLS_SECRET}-ca", "-n", INSTALL_NS)["data"]
    ca = CertKey.from_pem(base64.b64decode(ca_secret["tls.crt"]), base64.b64decode(ca_secret["tls.key"]))
    renewed = make_serving_cert(ca, SERVICE, INSTALL_NS)
    pods = _pods(cp)
    restarts = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"] for p in pods}
    ips = [p["status"]["podIP"] for p in pods]
    assert all(_served_serial(cp, ip, ca.cert_pem) != renewed.cert.serial_number for ip in ips)
    patch = {"data": {"tls.crt": base64.b64encode(renewed.cert_pem).decode(),
                      "tls.key": base64.b64encode(renewed.key_pem).decode()}}  # fmt: skip
    with CreationLoop(cp, project) as loop:
        time.sleep(2)
        cp.kubectl("patch", "secret", TLS_SECRET, "-n", INSTALL_NS, "--type=merge", "-p", json.dumps(patch))
        wait_for(lambda: all(_served_serial(cp, ip, ca.cert_pem) == renewed.cert.serial_number for ip in ips), 120,
                 "both replicas serving the renewed certificate", cp)  # fmt: skip
        time.sleep(3)
    print(f"certificate renewal: {loop.created} pods created, {len(loop.refused)} refused")
    assert loop.created > 0 and loop.refused == [], (loop.created, loop.refused[:3])
    after = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"] for p in _pods(cp)}
    assert after == restarts, "a replica was restarted or replaced"


def _ca_pem(cp: ControlPlane) -> bytes:
    return base64.b64decode(cp.get_json("secret", f"{TLS_SECRET}-ca", "-n", INSTALL_NS)["data"]["tls.crt"])


def _tls_context(cp: ControlPlane, ca_pem: bytes) -> ssl.SSLContext:
    """The apiserver's view: the chart's CA trusted, the webhook client certificate presented."""
    assert cp.webhook_client is not None
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    ctx.load_cert_chain(cp.webhook_client.cert.cert_file, cp.webhook_client.cert.key_file)
    return ctx


def _get(cp: ControlPlane, ip: str, port: int, path: str, ctx: ssl.SSLContext) -> tuple[int, str]:
    """One GET from inside the nodes' network namespace, on a connection of its own."""
    assert cp.real is not None
    sock = cp.real.ns.socket()
    sock.settimeout(5)
    sock.connect((ip, port))
    with ctx.wrap_socket(sock, server_hostname=f"{SERVICE}.{INSTALL_NS}.svc") as tls:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode()


def _admission_connections(cp: ControlPlane, ip: str, ctx: ssl.SSLContext) -> int:
    _status, text = _get(cp, ip, PROBE_PORT, "/metrics", ctx)
    line = next(line for line in text.splitlines() if line.startswith('webhook_connections_open{listener="admission"}'))
    return int(float(line.split()[-1]))


def _routed(cp: ControlPlane, ip: str) -> bool:
    """Whether kube-proxy sends the admission port of the Service to `ip` (its DNAT rules in the
    nodes' namespace): the data path the apiserver's connections take."""
    assert cp.real is not None
    rules = subprocess.run(cp.real.ns.argv(["iptables-save", "-t", "nat"]), capture_output=True, text=True,
                           check=True).stdout  # fmt: skip
    return f"--to-destination {ip}:{ADMISSION_PORT}" in rules


def _in_endpoint_slice(cp: ControlPlane, ip: str) -> bool:
    slices = cp.get_json("endpointslices", "-n", INSTALL_NS, "-l", f"kubernetes.io/service-name={SERVICE}")["items"]
    return any(e["conditions"].get("ready") and ip in e["addresses"] for s in slices for e in s.get("endpoints") or [])


class Flood:
    """`connections` TLS connections to one replica's admission port, each keeping `depth` reviews
    sent ahead of their answers (within the server's pipelining bound) until stopped: each
    connection then always has a request in flight, as under more reviews than the replica can
    answer. A connection the replica refuses or closes is dialled again."""

    def __init__(self, cp: ControlPlane, ip: str, ctx: ssl.SSLContext, connections: int, depth: int = 3) -> None:
        self.cp, self.ip, self.ctx, self.connections, self.depth = cp, ip, ctx, connections, depth
        body = json.dumps(pod_review("flood-not-a-project", dry_run=True)).encode()
        self.request = (
            f"POST /validate/pods HTTP/1.1\r\nHost: {SERVICE}.{INSTALL_NS}.svc\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.answered = 0
        self.refused = 0  # connections refused or closed by the replica
        self.statuses: set[int] = set()
        self._stop = asyncio.Event()
        self._loop = BackgroundLoop()
        self._tasks: list[asyncio.Task[None]] = []

    async def _start(self) -> None:
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self.connections)]

    async def _worker(self) -> None:
        while not self._stop.is_set():
            try:
                await self._one_connection()
            except (OSError, TimeoutError, asyncio.IncompleteReadError):
                self.refused += 1
                await asyncio.sleep(0.05)

    async def _one_connection(self) -> None:
        assert self.cp.real is not None
        sock = self.cp.real.ns.socket()
        sock.setblocking(False)
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (self.ip, ADMISSION_PORT)), 5)
        except BaseException:
            sock.close()
            raise
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(sock=sock, ssl=self.ctx, server_hostname=f"{SERVICE}.{INSTALL_NS}.svc"), 5
        )
        try:
            writer.write(self.request * self.depth)
            while not self._stop.is_set():
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                lines = head.decode("latin-1").split("\r\n")
                length = next((int(h.split(":", 1)[1]) for h in lines if h.lower().startswith("content-length:")), None)
                if length is None:
                    raise ConnectionError(f"an answer without Content-Length: {lines[0]}")
                await reader.readexactly(length)
                self.statuses.add(int(lines[0].split(" ", 2)[1]))
                self.answered += 1
                writer.write(self.request)
        finally:
            writer.close()

    async def _end(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def __enter__(self) -> Flood:
        self._loop.run(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._loop.run(self._end())
        finally:
            self._loop.close()


def test_a_replica_whose_admission_port_is_full_goes_unready_and_leaves_the_service(
    cp: ControlPlane, install: Obj
) -> None:
    """Every connection slot of one replica's admission port holds a request in flight: its
    /readyz says so, the kubelet's real readiness probe marks the pod not Ready, the EndpointSlice
    and kube-proxy drop its address, and the pods created meanwhile are admitted by the other
    replica. When the load ends it is Ready and routed again, never restarted.

    The replica loaded is one the apiserver holds no keep-alive connection to: the apiserver
    reuses its connections, so its reviews keep going to the other replica. A connection it
    dialled to the full replica before the probe failed would be refused at accept (the server
    sheds newcomers it has no room for), and that review would fail: readiness bounds that
    window, it cannot close it."""
    _wait_two_ready_on_real_nodes(cp)
    project = _project(cp, "real-nodes-full")
    ctx = _tls_context(cp, _ca_pem(cp))
    with CreationLoop(cp, project) as loop:
        time.sleep(3)
        pods = _pods(cp)
        held = {p["metadata"]["name"]: _admission_connections(cp, p["status"]["podIP"], ctx) for p in pods}
        victim = min(pods, key=lambda p: held[p["metadata"]["name"]])
        name, ip = victim["metadata"]["name"], victim["status"]["podIP"]
        restarts = victim["status"]["containerStatuses"][0]["restartCount"]

        def pod() -> Obj:
            return dict(cp.get_json("pod", name, "-n", INSTALL_NS))

        def says_full() -> bool:
            status, body = _get(cp, ip, PROBE_PORT, "/readyz", ctx)
            return status == 503 and "have a request in flight" in body

        wait_for(lambda: _in_endpoint_slice(cp, ip) and _routed(cp, ip), 30, f"{name} routed", cp)
        start = time.monotonic()
        with Flood(cp, ip, ctx, ADMISSION_CAP) as flood:
            wait_for(says_full, 30, f"{name}'s /readyz reporting its admission port full", cp)
            full = time.monotonic()
            wait_for(lambda: not _ready(pod()), 60, f"{name} not Ready by its readiness probe", cp)
            unready = time.monotonic()
            wait_for(lambda: not _in_endpoint_slice(cp, ip), 30, f"{name} out of the EndpointSlice", cp)
            dropped = time.monotonic()
            wait_for(lambda: not _routed(cp, ip), 30, f"kube-proxy no longer routing to {name}", cp)
            unrouted = time.monotonic()
            assert says_full(), "the load ended before the replica left the Service"
            time.sleep(3)  # pods still being created, by the other replica alone
        ended = time.monotonic()
        answered = flood.answered
        wait_for(lambda: _ready(pod()), 60, f"{name} Ready again", cp)
        ready = time.monotonic()
        wait_for(lambda: _in_endpoint_slice(cp, ip) and _routed(cp, ip), 30, f"{name} routed again", cp)
        time.sleep(2)
    served = [t for t in loop.successes if unready <= t <= ready]
    print(
        f"admission port of {name} full ({held} apiserver connections before): /readyz false after "
        f"{full - start:.1f} s, pod not Ready after {unready - start:.1f} s, out of the EndpointSlice after "
        f"{dropped - start:.1f} s, unrouted after {unrouted - start:.1f} s, Ready again {ready - ended:.1f} s "
        f"after the load ended; {answered} flood reviews answered "
        f"({sorted(flood.statuses)}), {flood.refused} flood connections refused or closed; "
        f"{loop.created} pods created ({len(served)} while it was not Ready), {len(loop.refused)} refused"
    )
    assert served, "no pod was admitted while the replica was not Ready"
    assert loop.created > 0 and loop.refused == [], (loop.created, loop.refused[:3])
    assert pod()["status"]["containerStatuses"][0]["restartCount"] == restarts, "the liveness probe restarted it"


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from the machine: {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_on_the_machines_loopback_is_reached_through_a_service(cp: ControlPlane) -> None:
    """What the install calls outside the cluster (the Run:ai stand-in, Kueue's and KAI's webhooks) is
    a process of the test run on the machine's loopback, which the nodes' namespace cannot reach: a
    Service without a selector, whose EndpointSlice names a relay in the namespace, carries a pod's
    connection (through kube-proxy) and one opened inside the namespace (the apiserver's egress) there."""
    assert cp.real is not None
    namespace = "machine-side"
    cp.kubectl("create", "namespace", namespace)
    cp.apply([{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hello", "namespace": namespace},
               "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}])  # fmt: skip
    host, port = cp.machine_endpoint(namespace, "hello", 80, port_name="http")
    # A process outside a container: it stands in for the servers of the run that live on loopback.
    server = http.server.ThreadingHTTPServer((host, port), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ip = cp.service_ip(namespace, "hello")
        assert not ip.startswith("127."), ip

        def from_the_namespace() -> bool:
            sock = cp.real.ns.socket() if cp.real else None
            assert sock is not None
            sock.settimeout(5)
            try:
                sock.connect((ip, 80))
                sock.sendall(b"GET /egress HTTP/1.0\r\n\r\n")
                return b"hello from the machine: /egress" in sock.recv(4096)
            except OSError:
                return False  # kube-proxy has not written the Service's rules yet
            finally:
                sock.close()

        wait_for(from_the_namespace, 60, "the Service answering inside the namespace", cp)
        _archive, tag = image_archive()
        url = f"http://{ip}:80/pod"
        fetch = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
        cp.apply([{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "caller", "namespace": namespace},
                   "spec": {"restartPolicy": "Never", "nodeSelector": {REAL_NODE_LABEL: "true"},
                            "tolerations": [{**REAL_NODE_TAINT, "operator": "Equal"}],
                            "containers": [{"name": "caller", "image": tag, "imagePullPolicy": "Never",
                                            "command": ["python3", "-c", fetch]}]}}])  # fmt: skip

        def phase() -> str:
            return str(cp.get_json("pod", "caller", "-n", namespace).get("status", {}).get("phase"))

        wait_for(lambda: phase() in ("Succeeded", "Failed"), 120, "the calling pod finished", cp)
        logs = cp.kubectl("logs", "caller", "-n", namespace, check=False)
        status = cp.get_json("pod", "caller", "-n", namespace)["status"]
        assert phase() == "Succeeded" and "hello from the machine: /pod" in logs.stdout, f"{logs}\n{json.dumps(status)}"
    finally:
        server.shutdown()
        server.server_close()
        cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
