"""How the product's cost grows with the cluster, through the real apiserver with kwok.

    python -m bench.scale_cluster [--nodes 100] [--namespaces 200] [--pods 1000,2000]
                                  [--gpu-share 0.1] [--rate 50] [--seconds 60]

(`make bench-scale-cluster BENCH_ARGS=...`; kept out of `make test` and `make bench`: heavy.)

Starts the test control plane (tests/support/control_plane; the release KUBE_VERSION selects) with
--nodes kwok nodes (8 GPUs each) and the install's two replicas, then makes --namespaces project
namespaces. For each total of --pods in turn it fills the cluster up to that many pods (a share
--gpu-share of them 1-GPU notebooks), with the webhook configurations set aside so that filling is
quick (the replicas still see every pod through their watches), spread over the namespaces by 16
concurrent clients; then, with the configurations back, it reports:

- each replica's RSS (VmRSS of its container's process, on the real nodes);
- a restarted replica's time to ready: from SIGKILL of its container until its kubelet has
  started it again and its readiness probe passes, so it includes the lists and watches of what
  it caches and the probe's period; taken apart: until the new process started, and how long its
  lists took (`webhook_cache_list_seconds`);
- the apiserver's part of the pod list: every page of all pods, as a replica asks for them, read
  by the bench and not parsed, in the replica's pod pages and in its pages of other kinds;
- `create pod` latency at --rate creations per second for --seconds (open loop: counted from
  when each was due), 1-GPU notebooks in a project namespace (webhook pods: the compiled policies
  decide every other notebook without a call, from 1.36), with the product and then with its
  webhook configurations set aside (the apiserver's own cost), and the apiserver's
  `apiserver_admission_webhook_admission_duration_seconds` for our pod webhooks over the same
  window (p50 and p99 from its histogram buckets).

Prints one row per total and the growth per 10,000 pods between the first and the last.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.real_cluster import _drop_all, admin_session, bench_settings, gpu_notebook, pod
from tests.support.control_plane.cluster import KUBE_VERSION, ControlPlane, FakeNode, control_plane
from tests.support.control_plane.install import PROBE_PORT, Install, installed
from tests.support.control_plane.nodes import DEFAULT_REAL_NODES
from webhook.kube.watch import WatchTiming

Obj = dict[str, Any]
CLIENTS = 16
# The replica's pod page (webhook.kube.watch.WatchTiming.pod_page_size) and the general one beside it.
PAGE_SIZES = (WatchTiming().pod_page_size, WatchTiming().page_size)
ADMISSION_HISTOGRAM = "apiserver_admission_webhook_admission_duration_seconds"


def nodes(count: int) -> list[FakeNode]:
    zones = ("eu-1a", "eu-1b", "eu-1c")
    return [FakeNode(f"kwok-{i:04d}", zones[i % 3], "eu-1", gpus=8, gpu_product="A100") for i in range(count)]


async def post(session: aiohttp.ClientSession, url: str, body: Obj) -> None:
    # A namespace made a moment ago may not have its default ServiceAccount yet (the controller
    # manager makes it): the apiserver refuses its pods until then.
    deadline = time.monotonic() + 60
    while True:
        async with session.post(url, json=body) as resp:
            if resp.status in (201, 409):
                return
            text = await resp.text()
        if resp.status != 403 or "serviceaccount" not in text or time.monotonic() > deadline:
            raise RuntimeError(f"POST {url}: {resp.status} {text}")
        await asyncio.sleep(0.5)


async def make_namespaces(cp: ControlPlane, count: int) -> list[str]:
    names = [f"scale-{i:05d}" for i in range(count)]
    bodies = [{"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": n, "labels": {"hopsworks.ai/project": n}}} for n in names]  # fmt: skip
    await fan_out(cp, f"{cp.url}/api/v1/namespaces", [(None, b) for b in bodies])
    return names


async def fan_out(cp: ControlPlane, url: str, bodies: list[tuple[str | None, Obj]]) -> None:
    """POST every body, CLIENTS at a time; a body with a namespace goes to that namespace's pods."""
    queue = list(reversed(bodies))
    async with admin_session(cp, CLIENTS) as session:

        async def client() -> None:
            while queue:
                namespace, body = queue.pop()
                target = url if namespace is None else f"{cp.url}/api/v1/namespaces/{namespace}/pods"
                await post(session, target, body)

        await asyncio.gather(*(client() for _ in range(CLIENTS)))


async def fill(cp: ControlPlane, namespaces: list[str], count: int, gpu_share: float, start: int) -> None:
    bodies: list[tuple[str | None, Obj]] = []
    for i in range(start, start + count):
        ns = namespaces[i % len(namespaces)]
        make = gpu_notebook if random.random() < gpu_share else pod
        bodies.append((ns, make(ns, f"fill-{i:06d}")))
    await fan_out(cp, "", bodies)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def replica_rss(inst: Install) -> list[float]:
    return [rss_mb(inst.container_pid(p)) for p in inst.running()]


def process_started_at(pid: int) -> float:
    """The wall-clock time the process started (its /proc stat start time, in clock ticks since boot)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def restart_seconds(inst: Install, within: float = 300) -> Obj:
    """SIGKILL of one replica's container until it is ready again, taken apart: until its kubelet
    had started the new process, how long that process's lists took (its own
    `webhook_cache_list_seconds`, the longest cache), and the total."""
    # The replica restarted least: the kubelet delays a container's second restart by 10 s, its
    # third by 20 s (CrashLoopBackOff), which is the kubelet's time, not the replica's.
    victim = min(inst.running(), key=lambda p: p["status"]["containerStatuses"][0]["restartCount"])
    name = victim["metadata"]["name"]
    restarts = victim["status"]["containerStatuses"][0]["restartCount"]
    start = time.monotonic()
    killed_at = time.time()
    inst.kill(name)

    def again() -> Obj | None:
        pod = next((p for p in inst.serving() if p["metadata"]["name"] == name), None)
        if pod is not None and pod["status"]["containerStatuses"][0]["restartCount"] > restarts:
            return pod
        return None

    while (pod := again()) is None:
        if time.monotonic() - start > within:
            raise RuntimeError(f"replica not ready again within {within:.0f} s")
        time.sleep(0.1)
    ready_s = time.monotonic() - start
    lists = {
        family_sample.labels["kind"]: family_sample.value
        for family in text_string_to_metric_families(inst.pod_get(pod, PROBE_PORT, "/metrics"))
        for family_sample in family.samples
        if family_sample.name == "webhook_cache_list_seconds"
    }
    return {
        "ready_s": ready_s,
        "process_start_s": process_started_at(inst.container_pid(pod)) - killed_at,
        "pod_list_s": lists.get("Pod", float("nan")),
        "longest_list_s": max(lists.values(), default=float("nan")),
    }


async def apiserver_list_seconds(cp: ControlPlane, page_size: int) -> float:
    """The apiserver's part of a replica's pod list: every page of all pods, as the replica asks
    for them (`limit`, `continue`, no resourceVersion: a consistent list), bodies read, not parsed."""
    start = time.perf_counter()
    async with admin_session(cp, 1) as session:
        cont = ""
        while True:
            query = f"limit={page_size}" + (f"&continue={cont}" if cont else "")
            async with session.get(f"{cp.url}/api/v1/pods?{query}") as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"list pods: {resp.status} {body[:300]!r}")
            # The continue token sits in the list's metadata, before the items.
            head = body[:2048]
            marker = head.find(b'"continue":"')
            if marker < 0:
                break
            end = head.index(b'"', marker + 12)
            cont = head[marker + 12 : end].decode()
    return time.perf_counter() - start


async def paced(cp: ControlPlane, namespace: str, rate: float, seconds: float) -> list[float]:
    """Open loop: a creation due every 1/rate s; latency counted from when it was due."""
    latencies: list[float] = []
    async with admin_session(cp, 64) as session:
        url = f"{cp.url}/api/v1/namespaces/{namespace}/pods"

        async def one(due: float) -> None:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            await post(session, url, gpu_notebook(namespace, f"paced-{uuid.uuid4().hex[:10]}"))
            latencies.append(time.perf_counter() - due)

        start = time.perf_counter()
        await asyncio.gather(*(one(start + i / rate) for i in range(int(rate * seconds))))
    return sorted(latencies)


def quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))]


def admission_buckets(cp: ControlPlane) -> dict[float, float]:
    """Cumulative counts per bucket bound of the apiserver's webhook latency for our pod webhooks."""
    text = cp.kubectl("get", "--raw", "/metrics").stdout
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(ADMISSION_HISTOGRAM + "_bucket{") or 'name="' not in line:
            continue
        if "pods.scheduling.hopsworks.ai" not in line or 'operation="CREATE"' not in line:
            continue
        le = line.split('le="')[1].split('"')[0]
        bound = float("inf") if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The upper bound of the bucket holding quantile q of the observations between two scrapes
    (both pod webhooks' calls together)."""
    diff = sorted((b, after[b] - before.get(b, 0.0)) for b in after)
    if not diff or diff[-1][1] == 0:
        return float("nan")
    total = diff[-1][1]
    return next(b for b, c in diff if c >= q * total)


def level(cp: ControlPlane, inst: Install, total: int, rate: float, seconds: float) -> Obj:
    time.sleep(5)  # the replicas' watches catch up with the fill
    row: Obj = {"pods": total, "rss_mb": replica_rss(inst)}
    for page_size in PAGE_SIZES:
        row[f"apiserver_list_s_{page_size}"] = asyncio.run(apiserver_list_seconds(cp, page_size))
    row.update(restart_seconds(inst))
    row["rss_after_restart_mb"] = replica_rss(inst)
    for mode in ("product", "none"):
        inst.apply_webhook_configurations(None if mode == "product" else _drop_all)
        ns = f"paced-{mode}-{uuid.uuid4().hex[:6]}"
        cp.kubectl("create", "namespace", ns)
        cp.kubectl("label", "namespace", ns, f"hopsworks.ai/project={ns}")
        before = admission_buckets(cp)
        got = asyncio.run(paced(cp, ns, rate, seconds))
        after = admission_buckets(cp)
        row[f"{mode}_p50_ms"] = 1000 * quantile(got, 0.5)
        row[f"{mode}_p99_ms"] = 1000 * quantile(got, 0.99)
        if mode == "product":
            row["webhook_p50_ms_le"] = 1000 * bucket_quantile(before, after, 0.5)
            row["webhook_p99_ms_le"] = 1000 * bucket_quantile(before, after, 0.99)
        cp.kubectl("delete", "namespace", ns, "--wait=false")
    inst.apply_webhook_configurations(None)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--namespaces", type=int, default=200)
    parser.add_argument("--pods", default="1000,2000", help="totals, comma-separated, increasing")
    parser.add_argument("--gpu-share", type=float, default=0.1)
    parser.add_argument("--rate", type=float, default=50.0, help="creations per second while timing")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    totals = [int(t) for t in args.pods.split(",")]
    random.seed(1)
    dir = Path(tempfile.mkdtemp(prefix="swh-bench-scale-"))
    rows: list[Obj] = []
    try:
        with (
            control_plane(dir, nodes=nodes(args.nodes), real_nodes=DEFAULT_REAL_NODES) as cp,
            installed(cp, dir / "install") as inst,
        ):
            print(f"Kubernetes {KUBE_VERSION}: control plane with {args.nodes} kwok nodes ready in "
                  f"{cp.timings['total']:.1f} s; install serving", flush=True)  # fmt: skip
            bench_settings(cp)
            started = time.monotonic()
            namespaces = asyncio.run(make_namespaces(cp, args.namespaces))
            print(f"{len(namespaces)} namespaces in {time.monotonic() - started:.1f} s", flush=True)
            made = 0
            for total in totals:
                inst.apply_webhook_configurations(_drop_all)
                started = time.monotonic()
                asyncio.run(fill(cp, namespaces, total - made, args.gpu_share, made))
                print(f"filled to {total} pods in {time.monotonic() - started:.1f} s", flush=True)
                made = total
                inst.apply_webhook_configurations(None)
                row = level(cp, inst, total, args.rate, args.seconds)
                row["load"] = os.getloadavg()[0]
                print(row, flush=True)
                rows.append(row)
    finally:
        shutil.rmtree(dir, ignore_errors=True)
    print(f"\nKubernetes {KUBE_VERSION}, {args.nodes} kwok nodes, {args.namespaces} project namespaces, "
          f"{args.gpu_share:.0%} GPU pods; {args.rate:g} creations/s for {args.seconds:g} s")  # fmt: skip
    print("| pods | RSS MB per replica | restarted replica ready s | of which until its process started s | "
          "its pod list s | longest list s | apiserver pod list s, pages of " + " / ".join(map(str, PAGE_SIZES)) + " | "
          "create p50/p99 ms, product | create p50/p99 ms, none | our webhooks p50/p99 ms (bucket bound) | "
          "load |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        apiserver = " / ".join(f"{r[f'apiserver_list_s_{n}']:.2f}" for n in PAGE_SIZES)
        print(f"| {r['pods']} | {' / '.join(f'{m:.0f}' for m in r['rss_mb'])} | {r['ready_s']:.1f} | "
              f"{r['process_start_s']:.1f} | {r['pod_list_s']:.2f} | {r['longest_list_s']:.2f} | {apiserver} | "
              f"{r['product_p50_ms']:.1f} / {r['product_p99_ms']:.1f} | {r['none_p50_ms']:.1f} / "
              f"{r['none_p99_ms']:.1f} | {r['webhook_p50_ms_le']:g} / {r['webhook_p99_ms_le']:g} | "
              f"{r['load']:.1f} |")  # fmt: skip
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        per = 10_000 / (last["pods"] - first["pods"])
        rss = (statistics.mean(last["rss_mb"]) - statistics.mean(first["rss_mb"])) * per
        ready = (last["ready_s"] - last["process_start_s"] - first["ready_s"] + first["process_start_s"]) * per
        listed = (last["pod_list_s"] - first["pod_list_s"]) * per
        served = (last[f"apiserver_list_s_{PAGE_SIZES[0]}"] - first[f"apiserver_list_s_{PAGE_SIZES[0]}"]) * per
        print(f"growth per 10,000 pods: RSS {rss:+.1f} MB per replica, time to ready after its process "
              f"started {ready:+.2f} s (its pod list {listed:+.2f} s, the apiserver's part "
              f"{served:+.2f} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
