"""What a cluster pays for the product: pod creation through the real apiserver, with and without
our webhook configurations, measured side by side in one run.

    python -m bench.real_cluster [--pods 150] [--seconds 8] [--rounds 3] [--gopeer PATH]

Starts the test control plane (tests/support/control_plane: etcd, kube-apiserver, controllers,
scheduler, kwok; built by `make peers`; the release KUBE_VERSION selects) with the install and its
two replicas, then takes turns, round after round, each in a fresh project namespace:

- `none`: no webhook configuration and no admission policy of ours;
- `policy`: the minimal MutatingAdmissionPolicy (MINIMAL_POLICY: the runai/queue label and two
  required node-affinity expressions on a plain project pod), run by the apiserver itself;
- `gopeer`: the Go peer (bench/gopeer, `make bench-gopeer`), one mutating call making the change
  the product makes to the same pod;
- `product`: the product as installed, with notebooks choosing a node label (the affinity
  annotation): two webhook calls before 1.36; from 1.36 the compiled policies read the choice, so
  once the leader has labelled the project there is no call;
- `product_gpu`: the same, with 1-GPU notebooks (two calls everywhere: the quota);
- `product_plain` (before 1.36): plain notebooks, one call (the mutation). The issue's bar: at
  least the Go peer's one call;
- `product_compiled`: the product as installed, with plain notebooks (no annotation of ours) in a
  project the leader has labelled for the compiled admission policies: they make no webhook call,
  and the apiserver applies the project's defaults itself. The issue's bar: at least 0.95x the
  creations per second of `policy`, measured in the same run.
- `product_compiled_runai`: the same with Run:ai on (the stand-in), in a project the leader has
  bound and labelled: the policy also writes the queue and the notebook's preemptibility. Run:ai's
  own admission webhook (the install's stand-in) is set aside for the turn: any cluster with Run:ai
  pays for it, with or without the product.

Each turn creates pods one at a time (latency of `create pod`: p50, p99) and then with 8 concurrent
clients for --seconds (creations per second). The pods are plain notebooks in a project that gets
affinity, anti-affinity and a priority class. Reports medians over rounds and the ratios to `none`.

Also the first pod of an unbound project with Run:ai on: from `kubectl apply` of a one-replica
Deployment to its pod stored (the first attempt is refused while the binding settles; the real
ReplicaSet controller retries). And, with KAI-Scheduler running (tests/support/control_plane/
kai.py), a 1-GPU notebook of a bound project from `kubectl apply` to Running: our webhooks, Run:ai's
admission stand-in and KAI's, KAI's podgrouper, scheduler and binder, kwok (--kai-rounds, median).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.support.cluster import SCHEDULER
from tests.support.control_plane.cluster import KUBE_VERSION, ControlPlane, admission_policy_args, control_plane
from tests.support.control_plane.install import INSTALL_NS, Install, installed
from tests.support.control_plane.kai import QueueSync, kai_running, set_department_quota
from tests.support.control_plane.nodes import DEFAULT_REAL_NODES
from tests.support.runai_webhook import CONFIGURATION as RUNAI_CONFIGURATION
from webhook.snapshot import ADMISSION_POLICIES_LABEL
from webhook.tls.issuing import make_ca, make_serving_cert, write_serving_files

Obj = dict[str, Any]
IMAGE = "registry.example/notebook:1.0"


def plain_notebook(namespace: str, name: str) -> Obj:
    """A notebook that names nothing of ours: in a project the compiled policies decide, it meets
    no webhook (the chart's matchConditions)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"hopsworks.ai/workload-type": "notebook"}},
        "spec": {"containers": [{"name": "main", "image": IMAGE}]},
    }  # fmt: skip


def pod(namespace: str, name: str) -> Obj:
    """The bench's notebook: it chooses an affinity label, so the webhooks decide it everywhere."""
    obj = plain_notebook(namespace, name)
    obj["metadata"]["annotations"] = {"scheduling.hopsworks.ai/affinity": "disk=ssd"}
    return obj


def admin_session(cp: ControlPlane, connections: int) -> aiohttp.ClientSession:
    ctx = ssl.create_default_context(cafile=str(cp.pki.ca_file))
    ctx.load_cert_chain(str(cp.dir / "pki/admin.crt"), str(cp.dir / "pki/admin.key"))
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=connections))


async def create(
    session: aiohttp.ClientSession, cp: ControlPlane, namespace: str, make: Callable[[str, str], Obj] = pod
) -> float:
    body = make(namespace, f"p-{uuid.uuid4().hex[:10]}")
    start = time.perf_counter()
    async with session.post(f"{cp.url}/api/v1/namespaces/{namespace}/pods", json=body) as resp:
        await resp.read()
        if resp.status != 201:
            raise RuntimeError(f"create pod: {resp.status} {await resp.text()}")
    return time.perf_counter() - start


async def turn(
    cp: ControlPlane, namespace: str, pods: int, seconds: float, make: Callable[[str, str], Obj] = pod
) -> dict[str, float]:
    async with admin_session(cp, 8) as session:
        for _ in range(5):  # warm the connections and the apiserver's caches
            await create(session, cp, namespace, make)
        latencies = sorted([await create(session, cp, namespace, make) for _ in range(pods)])
        done = 0
        deadline = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await create(session, cp, namespace, make)
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(8)))
        rate = done / (time.perf_counter() - start)
    return {
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "creates_per_s_8": rate,
    }


def project(cp: ControlPlane, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", name)
    cp.kubectl("label", "namespace", name, f"hopsworks.ai/project={name}")
    return name


def first_pod_seconds(cp: ControlPlane, inst: Install) -> float:
    runai = inst.runai
    data = {"run_ai_enable": "true", "run_ai_url": inst.runai_url, "run_ai_client_id": runai.client_id}
    cp.kubectl("patch", "configmap", "hopsworks-cluster-settings", "-n", INSTALL_NS, "--type", "merge", "-p",
               json.dumps({"data": data}))  # fmt: skip
    deadline = time.monotonic() + 30
    while inst.metric("webhook_runai_reachable") != [1.0, 1.0]:
        if time.monotonic() > deadline:
            raise RuntimeError("Run:ai not reachable")
        time.sleep(0.2)
    name = project(cp, "first")
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "nb", "namespace": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "nb"}},
                 "template": {"metadata": {"labels": {"app": "nb", "hopsworks.ai/workload-type": "notebook"}},
                              "spec": {"containers": [{"name": "main", "image": IMAGE}]}}},
    }  # fmt: skip
    start = time.monotonic()
    cp.apply([deployment])
    while not cp.get_json("pods", "-n", name)["items"]:
        if time.monotonic() - start > 60:
            raise RuntimeError("no pod within 60 s")
        time.sleep(0.05)
    elapsed = time.monotonic() - start
    inst.reset_settings()
    cp.kubectl("delete", "namespace", name, "--wait=false")
    return elapsed


def runai_on(cp: ControlPlane, inst: Install, on: bool) -> None:
    """Run:ai switched on (the stand-in, reachable from both replicas) or off, the other settings kept."""
    data = {"run_ai_enable": "false"}
    if on:
        data = {"run_ai_enable": "true", "run_ai_url": inst.runai_url, "run_ai_client_id": inst.runai.client_id}
    cp.kubectl("patch", "configmap", "hopsworks-cluster-settings", "-n", INSTALL_NS, "--type", "merge", "-p",
               json.dumps({"data": data}))  # fmt: skip
    if on:
        wait("Run:ai reachable on both replicas", lambda: inst.metric("webhook_runai_reachable") == [1.0, 1.0], 30)
    else:
        time.sleep(2)  # the replicas' settings watch


@contextlib.contextmanager
def runai_admission_set_aside(cp: ControlPlane, aside: bool) -> Iterator[None]:
    """Without Run:ai's own admission (the install's stand-in webhook, selected by the namespace's
    `runai/queue`): every cluster with Run:ai pays it, with or without the product, and the stand-in
    is a Python test server, not Run:ai's."""
    if not aside:
        yield
        return
    found = cp.get_json("mutatingwebhookconfiguration", RUNAI_CONFIGURATION)
    kept = {"apiVersion": found["apiVersion"], "kind": found["kind"], "webhooks": found["webhooks"],
            "metadata": {"name": RUNAI_CONFIGURATION, "labels": found["metadata"].get("labels", {})}}  # fmt: skip
    cp.kubectl("delete", "mutatingwebhookconfiguration", RUNAI_CONFIGURATION)
    time.sleep(1.5)  # the apiserver's admission informers
    try:
        yield
    finally:
        cp.apply([kept])


def bind_by_a_first_pod(cp: ControlPlane, namespace: str) -> None:
    """A first pod through the webhook binds the project (R2); it is created again while the
    binding settles, as a controller would."""
    text = yaml.safe_dump(plain_notebook(namespace, "first"))
    wait("a first pod", lambda: cp.kubectl("apply", "-f", "-", input=text, check=False).returncode == 0, 30)


def gpu_notebook(namespace: str, name: str) -> Obj:
    obj = plain_notebook(namespace, name)
    obj["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return obj


def wait(what: str, check: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {within:.0f} s")
        time.sleep(0.05)


def kai_notebook_seconds(cp: ControlPlane, inst: Install, rounds: int) -> list[float]:
    """Apply to Running of a 1-GPU notebook in a bound project, placed by KAI, one at a time."""
    runai = inst.runai

    async def department() -> None:
        set_department_quota(runai, "default", 10)

    inst.background.run(department())
    with kai_running(cp, cp.dir / "kai") as kai:
        print(f"KAI serving in {kai.timings['total']:.1f} s")
        sync = QueueSync(cp, runai, inst.background).start()
        try:
            data = {"run_ai_enable": "true", "run_ai_url": inst.runai_url, "run_ai_client_id": runai.client_id,
                    "run_ai_project_gpu_quota": "2"}  # fmt: skip
            cp.kubectl("patch", "configmap", "hopsworks-cluster-settings", "-n", INSTALL_NS, "--type", "merge",
                       "-p", json.dumps({"data": data}))  # fmt: skip
            name = project(cp, "kai")
            wait("binding", lambda: "runai/queue" in cp.get_json("namespace", name)["metadata"]["labels"], 60)
            wait("KAI Queue", lambda: kai.queue(name) is not None, 30)
            times = []
            for i in range(rounds):
                body = yaml.safe_dump(gpu_notebook(name, f"nb-{i}"))
                start = time.monotonic()
                # Refused while the binding settles (retryable), as a controller would retry.
                while cp.kubectl("apply", "-f", "-", input=body, check=False).returncode != 0:
                    if time.monotonic() - start > 30:
                        raise RuntimeError("notebook refused for 30 s")
                    time.sleep(0.1)
                wait("notebook Running", lambda i=i: cp.get_json("pod", f"nb-{i}", "-n", name)["status"].get("phase")
                     == "Running", 120)  # fmt: skip
                times.append(time.monotonic() - start)
                cp.kubectl("delete", "pod", f"nb-{i}", "-n", name, "--wait=true")
            cp.kubectl("delete", "namespace", name, "--wait=false")
            inst.reset_settings()
            return times
        finally:
            sync.stop()


def bench_settings(cp: ControlPlane) -> None:
    """The priority class and the settings under which the bench's pods are admitted as asked."""
    cp.apply([{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "normal"},
               "value": 10000}])  # fmt: skip
    scheduler = {**SCHEDULER, "available": {**SCHEDULER["available"], "affinity": [
        *SCHEDULER["available"]["affinity"], "disk=ssd"]}}  # fmt: skip
    data = {"scheduler": yaml.safe_dump(scheduler)}
    cp.kubectl("patch", "configmap", "hopsworks-cluster-settings", "-n", INSTALL_NS, "--type", "merge", "-p",
               json.dumps({"data": data}))  # fmt: skip
    time.sleep(2)  # the replicas' settings watch


def kube_minor(version: str = KUBE_VERSION) -> int:
    return int(version.lstrip("v").split(".")[1])


def policy_api_version() -> str:
    """MutatingAdmissionPolicy is beta (behind its feature gate) before 1.36, GA from 1.36."""
    return "admissionregistration.k8s.io/" + ("v1beta1" if kube_minor() < 36 else "v1")


PROJECT_SELECTOR = {"matchExpressions": [{"key": "hopsworks.ai/project", "operator": "Exists"}]}

# The minimal policy: what the apiserver costs doing the plain pod's work itself. The
# affinity goes in as a JSONPatch whose value CEL builds, because an ApplyConfiguration may not
# touch nodeAffinity's atomic term list (dyn: CEL's map literals are of one value type); the two
# expressions are the ones the product adds to the bench's pod; a pod with affinity of its own is
# left to the webhooks.
MINIMAL_POLICY_PATCH = """[
  JSONPatch{op: 'add', path: '/metadata/labels/runai~1queue', value: namespaceObject.metadata.name},
  JSONPatch{op: 'add', path: '/spec/affinity', value: {'nodeAffinity': {
    'requiredDuringSchedulingIgnoredDuringExecution': {'nodeSelectorTerms': [{'matchExpressions': [
      {'key': dyn('maintenance'), 'operator': dyn('NotIn'), 'values': dyn(['true'])},
      {'key': dyn('disk'), 'operator': dyn('In'), 'values': dyn(['ssd'])}]}]}}}}
]"""


def minimal_policy() -> list[Obj]:
    version = policy_api_version()
    name = "bench-minimal-policy"
    return [
        {"apiVersion": version, "kind": "MutatingAdmissionPolicy", "metadata": {"name": name},
         "spec": {"failurePolicy": "Fail", "reinvocationPolicy": "Never",
                  "matchConstraints": {"namespaceSelector": PROJECT_SELECTOR, "resourceRules": [
                      {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
                  "matchConditions": [
                      {"name": "labelled", "expression": "has(object.metadata.labels)"},
                      {"name": "no-own-affinity", "expression": "!has(object.spec.affinity)"}],
                  "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": MINIMAL_POLICY_PATCH}}]}},
        {"apiVersion": version, "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": name},
         "spec": {"policyName": name}},
    ]  # fmt: skip


def peer_mutation(stored: Obj, sent: Obj) -> Obj:
    """What the Go peer must add so that it makes the product's change to `sent`, read from the pod
    the product stored (bench/gopeer/main.go's Mutation)."""
    spec, meta = stored["spec"], stored["metadata"]
    affinity = spec.get("affinity", {})
    node = affinity.get("nodeAffinity", {})
    terms = node.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    anti = affinity.get("podAntiAffinity", {})
    added = {k: v for k, v in meta.get("labels", {}).items() if k not in sent["metadata"].get("labels", {})}
    return {
        "nodeExpressions": terms[0].get("matchExpressions", []) if terms else [],
        "preferredNode": node.get("preferredDuringSchedulingIgnoredDuringExecution", []),
        "antiAffinity": anti.get("preferredDuringSchedulingIgnoredDuringExecution", []),
        "requiredAntiAffinity": anti.get("requiredDuringSchedulingIgnoredDuringExecution", []),
        "priorityClassName": spec.get("priorityClassName", ""),
        "priority": spec.get("priority"),
        "preemptionPolicy": spec.get("preemptionPolicy"),
        "labels": added,
        "queueLabel": "runai/queue",
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GoPeer:
    """The Go peer running on loopback with a certificate of the bench's own CA."""

    def __init__(self, binary: Path, dir: Path, mutation: Obj) -> None:
        ca = make_ca("bench-gopeer-ca")
        write_serving_files(dir, ca, make_serving_cert(ca, "gopeer", "bench", ips=["127.0.0.1"]), write_ca=True)
        (dir / "mutation.json").write_text(json.dumps(mutation))
        self.ca_pem = ca.cert_pem
        self.port = free_port()
        self.log = open(dir / "gopeer.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [str(binary), f"--port={self.port}", f"--cert-dir={dir}", f"--mutation={dir / 'mutation.json'}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gopeer did not serve: {(dir / 'gopeer.log').read_text()}")
            time.sleep(0.1)

    def configuration(self, product: list[Obj]) -> Obj:
        """Registered like the product's pod mutation (same rules and namespace selector), one call."""
        ours = next(w for o in product if o["kind"] == "MutatingWebhookConfiguration" for w in o["webhooks"]
                    if w["clientConfig"].get("service", {}).get("path") == "/mutate/pods")  # fmt: skip
        hook = {k: v for k, v in ours.items() if k not in ("clientConfig", "name")}
        # Every project namespace, as the product's mutation was before the compiled policies took
        # the ones they decide (the product's main configuration leaves those to its second one).
        selector = hook.get("namespaceSelector") or {}
        hook["namespaceSelector"] = {
            **selector,
            "matchExpressions": [
                e for e in selector.get("matchExpressions") or () if e.get("key") != ADMISSION_POLICIES_LABEL
            ],
        }
        hook |= {"name": "mutate-pods.gopeer.bench", "sideEffects": "None",
                 "clientConfig": {"url": f"https://127.0.0.1:{self.port}/mutate/pods",
                                  "caBundle": base64.b64encode(self.ca_pem).decode()}}  # fmt: skip
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "bench-gopeer"}, "webhooks": [hook]}  # fmt: skip

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# From 1.36 the chart installs the compiled policies, which decide plain notebooks and a notebook
# choosing a node label without a webhook call. Before, it renders none (v1 is not served): the
# product is its webhooks, one call for a plain notebook (`product_plain`), two for one choosing a
# label (in warn mode validate-pods counts the choice's would-be refusals).
POLICIES = kube_minor() >= 36
COMPILED_MODES = ("product_compiled", "product_compiled_runai") if POLICIES else ("product_plain",)
MODES = ("none", "policy", "gopeer", "product", "product_gpu", *COMPILED_MODES)
MAKERS: dict[str, Callable[[str, str], Obj]] = {
    "product_gpu": gpu_notebook,
    "product_compiled": plain_notebook,
    "product_compiled_runai": plain_notebook,
    "product_plain": plain_notebook,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.real_cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=150, help="sequential creations per turn (latency)")
    parser.add_argument("--seconds", type=float, default=8.0, help="8 concurrent clients, per turn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gopeer", type=Path, default=Path(os.environ.get("GOPEER", "bench/build/gopeer")),
                        help="the Go peer's binary (make bench-gopeer)")  # fmt: skip
    parser.add_argument("--first-pod-rounds", type=int, default=3)
    parser.add_argument("--kai-rounds", type=int, default=5, help="GPU notebooks placed by KAI, one at a time")
    args = parser.parse_args(argv)
    if not args.gopeer.is_file():
        parser.error(f"no Go peer at {args.gopeer}: make bench-gopeer")
    dir = Path(tempfile.mkdtemp(prefix="swh-bench-cp-"))
    apiserver_args = admission_policy_args()
    firsts: list[float] = []
    kai: list[float] = []
    try:
        with (
            control_plane(dir, apiserver_args=apiserver_args, real_nodes=DEFAULT_REAL_NODES) as cp,
            installed(cp, dir / "install") as inst,
        ):
            print(f"Kubernetes {KUBE_VERSION}: control plane ready in {cp.timings['total']:.1f} s; install serving")
            bench_settings(cp)
            # The Go peer makes the change the product makes: read it from a pod the product stored.
            probe = project(cp, "bench-probe")
            sent = pod(probe, "probe")
            cp.apply([sent])
            mutation = peer_mutation(cp.get_json("pod", "probe", "-n", probe), sent)
            cp.kubectl("delete", "namespace", probe, "--wait=false")
            print("Go peer's mutation, from the product's:", json.dumps(mutation))
            (dir / "gopeer").mkdir()
            peer = GoPeer(args.gopeer, dir / "gopeer", mutation)
            try:
                results = measure(cp, inst, peer, args.rounds, args.pods, args.seconds)
            finally:
                peer.stop()
            inst.apply_webhook_configurations(None)
            inst.reset_settings()
            if args.first_pod_rounds:
                firsts = [first_pod_seconds(cp, inst) for _ in range(args.first_pod_rounds)]
            kai = kai_notebook_seconds(cp, inst, args.kai_rounds) if args.kai_rounds else []
    finally:
        shutil.rmtree(dir, ignore_errors=True)
    med = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in results.items()}
    labels = {"none": "no webhook", "policy": "minimal MutatingAdmissionPolicy", "gopeer": "Go peer, one call",
              "product": "this product, notebooks choosing a node label" + (
                  ": compiled policies, no call" if POLICIES else " (two calls)"),
              "product_gpu": "this product, 1-GPU notebooks (two calls)",
              "product_plain": "this product, plain notebooks (one call)",
              "product_compiled": "this product, plain notebooks: compiled policies, no call",
              "product_compiled_runai": "the same, Run:ai on, a bound project"}  # fmt: skip
    base = med["none"]["creates_per_s_8"]
    print(f"\nKubernetes {KUBE_VERSION}, medians of {args.rounds} rounds, {args.pods} sequential creations, "
          f"8 clients for {args.seconds:g} s; load average {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    print("| | p50 ms | p99 ms | creates/s (8 clients) | vs none |\n|---|---|---|---|---|")
    for mode in MODES:
        m = med[mode]
        print(f"| {labels[mode]} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | {m['creates_per_s_8']:.0f} | "
              f"{m['creates_per_s_8'] / base:.2f} |")  # fmt: skip
    bars = (("product_compiled", "policy", "0.95x"), ("product_compiled_runai", "policy", "0.95x"),
            ("product_plain", "gopeer", "1x, before 1.36"))  # fmt: skip
    print()
    for mode, against, bar in bars:
        if mode not in med:
            continue
        ratio = med[mode]["creates_per_s_8"] / med[against]["creates_per_s_8"]
        pairs = zip(results[mode], results[against], strict=True)
        rounds = ", ".join(f"{c['creates_per_s_8'] / a['creates_per_s_8']:.2f}" for c, a in pairs)
        print(f"{labels[mode]} against {labels[against]}, creations per second: {ratio:.2f}x (bar: {bar}); "
              f"round by round {rounds}")  # fmt: skip
    if firsts:
        print(f"\nfirst pod of an unbound project, apply to stored: {', '.join(f'{s:.2f} s' for s in firsts)} "
              f"(median {statistics.median(firsts):.2f} s)")  # fmt: skip
    if kai:
        print(f"GPU notebook through KAI, apply to Running: {', '.join(f'{s:.2f} s' for s in kai)} "
              f"(median {statistics.median(kai):.2f} s)")  # fmt: skip
    return 0


def measure(
    cp: ControlPlane, inst: Install, peer: GoPeer, rounds: int, pods: int, seconds: float
) -> dict[str, list[dict[str, float]]]:
    """The modes in turn, round after round, each in a fresh project namespace."""
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    gopeer_config = peer.configuration(inst.objects)
    for r in range(rounds):
        for mode in MODES:
            inst.apply_webhook_configurations(None if mode.startswith("product") else _drop_all)
            extra = minimal_policy() if mode == "policy" else [gopeer_config] if mode == "gopeer" else []
            if extra:
                cp.apply(extra)
                time.sleep(1.5)  # the apiserver's admission informers
            if mode == "product_compiled_runai":
                runai_on(cp, inst, True)
            ns = project(cp, f"bench-{mode.replace('_', '-')}")
            if mode == "product_compiled_runai":
                bind_by_a_first_pod(cp, ns)
            if mode.startswith("product_compiled"):
                wait("the leader's label for the compiled policies", lambda ns=ns: _labelled(cp, ns), 60)
            with runai_admission_set_aside(cp, mode == "product_compiled_runai"):
                got = asyncio.run(turn(cp, ns, pods, seconds, MAKERS.get(mode, pod)))
            if mode == "product_compiled_runai":
                runai_on(cp, inst, False)
            results[mode].append(got)
            print(f"round {r + 1} {mode:11s} " + "  ".join(f"{k} {v:.1f}" for k, v in got.items()), flush=True)
            for obj in extra:
                cp.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"])
            cp.kubectl("delete", "namespace", ns, "--wait=false")
    return results


def _labelled(cp: ControlPlane, namespace: str) -> bool:
    labels = cp.get_json("namespace", namespace)["metadata"].get("labels", {})
    return str(labels.get(ADMISSION_POLICIES_LABEL)) == "on"


def _drop_all(objects: list[Obj]) -> None:
    objects.clear()


if __name__ == "__main__":
    raise SystemExit(main())
