"""What a cluster pays for the product: pod creation through the real apiserver, with and without
our webhook configurations, measured side by side in one run.

    python -m bench.real_cluster [--pods 200] [--seconds 10] [--rounds 3]

Starts the test control plane (tests/support/control_plane: etcd, kube-apiserver, controllers,
scheduler, kwok; built by `make peers`) with the install and its two replicas, then takes turns,
round after round: webhooks installed / webhook configurations deleted. Each turn creates pods in
a project namespace, one at a time (latency of `create pod`: p50, p99) and then with 8 concurrent
clients for --seconds (creations per second). The pods are plain notebooks in a project that gets
affinity, anti-affinity and a priority class. Reports medians over rounds and the ratios.

Also the first pod of an unbound project with Run:ai on: from `kubectl apply` of a one-replica
Deployment to its pod stored (the first attempt is refused while the binding settles; the real
ReplicaSet controller retries). And, with KAI-Scheduler running (tests/support/control_plane/
kai.py), a 1-GPU notebook of a bound project from `kubectl apply` to Running: our webhooks, Run:ai's
admission stand-in and KAI's, KAI's podgrouper, scheduler and binder, kwok (--kai-rounds, median).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import ssl
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.support.cluster import SCHEDULER
from tests.support.control_plane.cluster import ControlPlane, control_plane
from tests.support.control_plane.install import INSTALL_NS, Install, installed
from tests.support.control_plane.kai import QueueSync, kai_running, set_department_quota

Obj = dict[str, Any]
IMAGE = "registry.example/notebook:1.0"


def pod(namespace: str, name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"hopsworks.ai/workload-type": "notebook"},
                     "annotations": {"scheduling.hopsworks.ai/affinity": "disk=ssd"}},
        "spec": {"containers": [{"name": "main", "image": IMAGE}]},
    }  # fmt: skip


def admin_session(cp: ControlPlane, connections: int) -> aiohttp.ClientSession:
    ctx = ssl.create_default_context(cafile=str(cp.pki.ca_file))
    ctx.load_cert_chain(str(cp.dir / "pki/admin.crt"), str(cp.dir / "pki/admin.key"))
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=connections))


async def create(session: aiohttp.ClientSession, cp: ControlPlane, namespace: str) -> float:
    body = pod(namespace, f"p-{uuid.uuid4().hex[:10]}")
    start = time.perf_counter()
    async with session.post(f"{cp.url}/api/v1/namespaces/{namespace}/pods", json=body) as resp:
        await resp.read()
        if resp.status != 201:
            raise RuntimeError(f"create pod: {resp.status} {await resp.text()}")
    return time.perf_counter() - start


async def turn(cp: ControlPlane, namespace: str, pods: int, seconds: float) -> dict[str, float]:
    async with admin_session(cp, 8) as session:
        for _ in range(5):  # warm the connections and the apiserver's caches
            await create(session, cp, namespace)
        latencies = sorted([await create(session, cp, namespace) for _ in range(pods)])
        done = 0
        deadline = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await create(session, cp, namespace)
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
    data = {"run_ai_enable": "true", "run_ai_url": runai.url, "run_ai_client_id": runai.client_id}
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


def gpu_notebook(namespace: str, name: str) -> Obj:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"hopsworks.ai/workload-type": "notebook"}},
        "spec": {"containers": [{"name": "main", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }  # fmt: skip


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
            data = {"run_ai_enable": "true", "run_ai_url": runai.url, "run_ai_client_id": runai.client_id,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.real_cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=200, help="sequential creations per turn (latency)")
    parser.add_argument("--seconds", type=float, default=10.0, help="8 concurrent clients, per turn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--first-pod-rounds", type=int, default=3)
    parser.add_argument("--kai-rounds", type=int, default=5, help="GPU notebooks placed by KAI, one at a time")
    args = parser.parse_args(argv)
    dir = Path(tempfile.mkdtemp(prefix="swh-bench-cp-"))
    try:
        with control_plane(dir) as cp, installed(cp, dir / "install") as inst:
            print(f"control plane ready in {cp.timings['total']:.1f} s; install serving")
            cp.apply([{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "normal"},
                       "value": 10000}])  # fmt: skip
            scheduler = {**SCHEDULER, "available": {**SCHEDULER["available"], "affinity": [
                *SCHEDULER["available"]["affinity"], "disk=ssd"]}}  # fmt: skip
            data = {"scheduler": yaml.safe_dump(scheduler)}
            cp.kubectl("patch", "configmap", "hopsworks-cluster-settings", "-n", INSTALL_NS, "--type", "merge", "-p",
                       json.dumps({"data": data}))  # fmt: skip
            results: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
            for r in range(args.rounds):
                for mode in ("with", "without"):
                    inst.apply_webhook_configurations(None if mode == "with" else _drop_all)
                    ns = project(cp, f"bench-{mode}")
                    got = asyncio.run(turn(cp, ns, args.pods, args.seconds))
                    results[mode].append(got)
                    print(f"round {r + 1} {mode:7s} " + "  ".join(f"{k} {v:.1f}" for k, v in got.items()))
                    cp.kubectl("delete", "namespace", ns, "--wait=false")
            inst.apply_webhook_configurations(None)
            inst.reset_settings()
            firsts = [first_pod_seconds(cp, inst) for _ in range(args.first_pod_rounds)]
            kai = kai_notebook_seconds(cp, inst, args.kai_rounds) if args.kai_rounds else []
    finally:
        shutil.rmtree(dir, ignore_errors=True)
    med = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in results.items()}
    print("\n| | p50 ms | p99 ms | creates/s (8 clients) |\n|---|---|---|---|")
    for mode in ("without", "with"):
        m = med[mode]
        print(f"| {mode} our webhooks | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | {m['creates_per_s_8']:.0f} |")
    w, wo = med["with"], med["without"]
    print(f"| ratio with/without | {w['p50_ms'] / wo['p50_ms']:.2f} | {w['p99_ms'] / wo['p99_ms']:.2f} | "
          f"{w['creates_per_s_8'] / wo['creates_per_s_8']:.2f} |")  # fmt: skip
    print(f"\nfirst pod of an unbound project, apply to stored: {', '.join(f'{s:.2f} s' for s in firsts)} "
          f"(median {statistics.median(firsts):.2f} s)")  # fmt: skip
    if kai:
        print(f"GPU notebook through KAI, apply to Running: {', '.join(f'{s:.2f} s' for s in kai)} "
              f"(median {statistics.median(kai):.2f} s)")  # fmt: skip
    return 0


def _drop_all(objects: list[Obj]) -> None:
    objects.clear()


if __name__ == "__main__":
    raise SystemExit(main())
