"""Scale of the watch-fed caches (`python -m bench.scale`, also run by `make bench`).

Fills a ClusterState the way the watches do (one `apply` per object) with 10,000 namespaces and
100,000 pods, and reports:
  - resident memory added (RSS delta, after a full collection) and per pod;
  - the cost of one watch event (µs per `apply`, namespaces and pods separately);
  - the per-request decision time (mutate_pod + validate_pod, the pure calls a request makes)
    against a small state and against the full one: it must not grow with the cluster.
Limit: the caches must stay under 300 MB.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.workload import admission_review, realistic_pod
from webhook.core.quota import validate_pod
from webhook.core.scheduling import mutate_pod
from webhook.settings import SETTINGS_CONFIGMAP
from webhook.snapshot import RunaiProjectInfo
from webhook.state.store import ClusterState

MEMORY_LIMIT_MB = 300.0
TARGET = "project-00042"  # the namespace the measured requests go to
KINDS = ("notebook", "job", "deployment", "app", "terminal")
PHASES = ("Running", "Running", "Running", "Pending", "Succeeded")


def rss_bytes() -> int:
    """Resident set size now (VmRSS), 0 where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def settings_object() -> dict[str, Any]:
    scheduler = {
        "available": {
            "affinity": ["nvidia.com/gpu.product=A100", "topology.kubernetes.io/zone=eu-1a"],
            "antiAffinity": ["maintenance=true"],
            "priorityClasses": ["low", "normal", "high"],
        },
        "project": {
            "affinity": ["topology.kubernetes.io/zone=eu-1a"],
            "antiAffinity": ["maintenance=true"],
            "priorityClasses": ["low", "normal"],
        },
        "defaults": {"priorityClass": "normal", "antiAffinity": ["maintenance=true"]},
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": SETTINGS_CONFIGMAP, "namespace": "hopsworks"},
        "data": {"run_ai_enable": "true", "kueue_installed": "false", "scheduler": json.dumps(scheduler)},
    }


def namespace_object(i: int) -> dict[str, Any]:
    name = f"project-{i:05d}"
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": f"ns-{i:032d}",
            "resourceVersion": str(1000 + i),
            "labels": {
                "kubernetes.io/metadata.name": name,
                "hopsworks.ai/project": name,
                "hopsworks.ai/department": f"dept-{i % 50}",
                "runai/queue": name,
            },
            "annotations": {
                "scheduling.hopsworks.ai/defaults": '{"affinity": ["topology.kubernetes.io/zone=eu-1a"]}',
            },
        },
        "status": {"phase": "Active"},
    }


def pod_object(i: int, namespaces: int) -> dict[str, Any]:
    """A pod as a watch delivers it: metadata, a spec with resources, a status (trimmed to what
    the shape needs; the store keeps only a slim record anyway)."""
    ns = f"project-{i % namespaces:05d}"
    kind = KINDS[i % len(KINDS)]
    limits: dict[str, str] = {"cpu": "2", "memory": "4Gi"}
    if i % 4 == 0:
        limits["nvidia.com/gpu"] = "1"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{kind}-{i:06d}-7c9f8d6b5-x2k4q",
            "namespace": ns,
            "uid": f"{i:08d}-5d2a-4c1b-9a55-2f3b8e2c9d10",
            "resourceVersion": str(50_000 + i),
            "labels": {"hopsworks.ai/workload-type": kind, "app": kind, "pod-template-hash": "7c9f8d6b5"},
            "annotations": {"kubectl.kubernetes.io/default-container": "main"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{kind}-{i:06d}"}],
        },
        "spec": {
            "containers": [
                {"name": "main", "image": "docker.hops.works/base:4.1.0", "resources": {"limits": limits}},
                {"name": "filebeat", "image": "docker.hops.works/filebeat:4.1.0", "resources": {}},
            ],
            "nodeName": f"node-{i % 300}",
            "priorityClassName": "normal",
        },
        "status": {"phase": PHASES[i % len(PHASES)], "podIP": f"10.{i % 250}.{i % 200}.{i % 100}"},
    }


def fill(state: ClusterState, namespaces: int, pods: int, batch: int = 1000) -> dict[str, float]:
    """Apply every object as one watch event; time only the applies (objects are made per batch)."""
    timings = {"namespace": 0.0, "pod": 0.0}
    for start in range(0, namespaces, batch):
        objects = [namespace_object(i) for i in range(start, min(start + batch, namespaces))]
        began = time.perf_counter()
        for obj in objects:
            state.apply(obj)
        timings["namespace"] += time.perf_counter() - began
    for start in range(0, pods, batch):
        objects = [pod_object(i, namespaces) for i in range(start, min(start + batch, pods))]
        began = time.perf_counter()
        for obj in objects:
            state.apply(obj)
        timings["pod"] += time.perf_counter() - began
    return {
        "namespace_us_per_event": timings["namespace"] / max(namespaces, 1) * 1e6,
        "pod_us_per_event": timings["pod"] / max(pods, 1) * 1e6,
    }


def new_state() -> ClusterState:
    state = ClusterState("hopsworks")
    state.apply(settings_object())
    for name, value in (("low", 1000), ("normal", 10000), ("high", 100000)):
        state.apply({"kind": "PriorityClass", "metadata": {"name": name}, "value": value})
    return state


def with_runai_view(state: ClusterState, namespaces: int) -> None:
    # What the Run:ai refresh would hold: one project per namespace.
    state.snapshot().runai_projects = {
        f"project-{i:05d}": RunaiProjectInfo(id=str(i), name=f"project-{i:05d}", namespace=f"project-{i:05d}",
                                             deserved_gpus=100.0)
        for i in range(namespaces)
    }  # fmt: skip


def _request(state: ClusterState) -> dict[str, Any]:
    pod = realistic_pod(TARGET, kind_label={"hopsworks.ai/workload-type": "notebook"}, gpus=1)
    pod["metadata"]["labels"]["runai/queue"] = TARGET  # as /mutate/pods leaves it for /validate/pods (S5)
    request = admission_review(pod)["request"]
    snapshot = state.snapshot()
    if not (mutate_pod(request, snapshot).allowed and validate_pod(request, snapshot, 0.0).allowed):
        raise RuntimeError("the measured request was refused: the bench would measure the wrong path")
    return request


def decision_times(states: dict[str, ClusterState], iterations: int, rounds: int = 10) -> dict[str, dict[str, float]]:
    """mutate_pod + validate_pod on a ~9 KB GPU notebook review (the pure part of a request),
    against each state in turn, block by block, so a noisy neighbour slows them alike."""
    requests = {name: _request(state) for name, state in states.items()}
    samples: dict[str, list[float]] = {name: [] for name in states}
    perf = time.perf_counter
    for _ in range(rounds):
        for name, state in states.items():
            request, snapshot, out = requests[name], state.snapshot(), samples[name]
            for _ in range(iterations // rounds):
                began = perf()
                mutate_pod(request, snapshot)
                validate_pod(request, snapshot, 0.0)
                out.append(perf() - began)
    result = {}
    for name, values in samples.items():
        values.sort()
        result[name] = {
            "p50_us": statistics.median(values) * 1e6,
            "p99_us": values[int(0.99 * (len(values) - 1))] * 1e6,
            "mean_us": statistics.fmean(values) * 1e6,
        }
    return result


def run(namespaces: int, pods: int, iterations: int) -> dict[str, Any]:
    small = new_state()
    fill(small, 100, 1000)
    with_runai_view(small, 100)

    gc.collect()
    before = rss_bytes()
    large = new_state()
    events = fill(large, namespaces, pods)
    gc.collect()
    after_fill = rss_bytes()
    with_runai_view(large, namespaces)
    gc.collect()
    after_view = rss_bytes()
    times = decision_times({"small": small, "large": large}, iterations)
    small_times, large_times = times["small"], times["large"]
    delta = after_fill - before
    return {
        "namespaces": len(large.namespaces),
        "pods": sum(len(p) for p in large.pods.values()),
        "rss_before_mb": before / 2**20,
        "rss_delta_mb": delta / 2**20,
        "rss_delta_with_runai_view_mb": (after_view - before) / 2**20,
        "bytes_per_pod": delta / max(pods, 1),  # namespaces included: an upper bound
        "memory_limit_mb": MEMORY_LIMIT_MB,
        "memory_ok": (after_view - before) / 2**20 < MEMORY_LIMIT_MB,
        **events,
        "decision_small": small_times,
        "decision_large": large_times,
        "decision_p50_change": large_times["p50_us"] / small_times["p50_us"] - 1,
        "iterations": iterations,
        "small_state": {"namespaces": 100, "pods": 1000},
    }


def print_report(r: dict[str, Any]) -> None:
    print(f"caches: {r['namespaces']:,} namespaces, {r['pods']:,} pods")
    print(
        f"resident memory added: {r['rss_delta_mb']:.1f} MB ({r['bytes_per_pod']:.0f} B per pod, namespaces "
        f"included); with a Run:ai view of every project: {r['rss_delta_with_runai_view_mb']:.1f} MB "
        f"(limit {r['memory_limit_mb']:.0f} MB: {'ok' if r['memory_ok'] else 'OVER'})"
    )
    print(
        f"watch event cost: {r['namespace_us_per_event']:.1f} µs per namespace apply, "
        f"{r['pod_us_per_event']:.1f} µs per pod apply"
    )
    s, la = r["decision_small"], r["decision_large"]
    print(
        f"decision (mutate + validate, pure): small state p50 {s['p50_us']:.1f} µs p99 {s['p99_us']:.1f} µs; "
        f"{r['namespaces']:,} ns / {r['pods']:,} pods p50 {la['p50_us']:.1f} µs p99 {la['p99_us']:.1f} µs "
        f"({r['decision_p50_change']:+.0%} at p50)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespaces", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = parser.parse_args(argv)
    result = run(args.namespaces, args.pods, args.iterations)
    if args.json:
        json.dump(result, sys.stdout)
    else:
        print_report(result)
    return 0 if result["memory_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
