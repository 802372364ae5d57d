"""What a restarted replica does with its first pod list, without a cluster.

    python -m bench.cold_start [--pods 50000] [--namespaces 2000] [--gpu-share 0.1]
                               [--page-size 2000] [--baseline DIR]

Writes the pod list an apiserver would answer, page by page (`limit`/`continue`), to a file: pods
as the bench-scale-cluster fill makes them (the bench's notebook, a share of them asking for a GPU,
spread over the project namespaces), stored as a v1.37 apiserver returns them once admitted and run
by a kwok node: defaulted spec, the service account's projected volume, tolerations, a status with
conditions and container statuses, and managedFields. Then, in a fresh process, a `ClusterState`
with the settings, three PriorityClasses and the namespaces already listed, and the replica's own
Pod watch (`webhook.state.watches.default_watches`) lists it through a stand-in for the apiserver's
responses that reads each page from the file: the same code from response bytes to a synced cache.

It prints, per stage, the time and the peak RSS (VmHWM, reset between stages):
  - list: the whole list, first page asked to cache synced (what /readyz waits for);
  - decode, prepare: inside it, the response bodies parsed, and each item slimmed for the store;
  - store: inside it, the cache filled (the records, page by page or at the end, and the held-GPU
    index);
  - settle: a full collection after the list, and the RSS then.
The collector is tuned as the runtime tunes it (`runtime.tune_garbage_collector`) before the list:
the runtime does it as its listeners start, a moment into its first lists.
With --baseline DIR the same runs with DIR's webhook package (another checkout), each in its own
process, alternating, and the ratios are printed (this tree / DIR).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parent.parent
IMAGE = "registry.example/notebook:1.0"
STAMP = "2026-12-05T22:41:07Z"


def _managed(manager: str, operation: str, fields: Obj, subresource: str | None = None) -> Obj:
    entry: Obj = {"manager": manager, "operation": operation, "apiVersion": "v1", "time": STAMP,
                  "fieldsType": "FieldsV1", "fieldsV1": fields}  # fmt: skip
    if subresource:
        entry["subresource"] = subresource
    return entry


def stored_pod(i: int, namespace: str, gpu: bool) -> Obj:
    """The bench's notebook (bench.real_cluster.pod or gpu_notebook) as the apiserver stores it,
    after the product's mutation and a kwok node's status."""
    name = f"fill-{i:06d}"
    node = f"kwok-{i % 1000:04d}"
    resources: Obj = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}} if gpu else {}
    uid = f"{i:08x}-5d2a-4c1b-9a55-{random.getrandbits(48):012x}"
    container_fields: Obj = {"f:image": {}, "f:imagePullPolicy": {}, "f:name": {}, "f:resources": {},
                             "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}}  # fmt: skip
    if gpu:
        container_fields["f:resources"] = {".": {}, "f:limits": {".": {}, "f:nvidia.com/gpu": {}}}
    conditions = [
        {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": STAMP}
        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": str(100_000 + i),
            "generation": 1,
            "creationTimestamp": STAMP,
            "labels": {"hopsworks.ai/workload-type": "notebook", "runai/queue": namespace},
            "annotations": {"scheduling.hopsworks.ai/affinity": "disk=ssd"},
            "managedFields": [
                _managed("Python", "Update", {
                    "f:metadata": {"f:annotations": {".": {}, "f:scheduling.hopsworks.ai/affinity": {}},
                                   "f:labels": {".": {}, "f:hopsworks.ai/workload-type": {}}},
                    "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, **container_fields}},
                               "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {},
                               "f:schedulerName": {}, "f:securityContext": {},
                               "f:terminationGracePeriodSeconds": {}},
                }),
                _managed("kwok", "Update", {
                    "f:status": {"f:conditions": {f'k:{{"type":"{c["type"]}"}}': {
                                     ".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {},
                                     "f:status": {}, "f:type": {}} for c in conditions},
                                 "f:containerStatuses": {}, "f:hostIP": {}, "f:hostIPs": {}, "f:phase": {},
                                 "f:podIP": {}, "f:podIPs": {".": {}, 'k:{"ip":"10.0.0.1"}': {".": {}, "f:ip": {}}},
                                 "f:startTime": {}},
                }, "status"),
            ],
        },
        "spec": {
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                              "fieldPath": "metadata.namespace"}}]}},
            ], "defaultMode": 420}}],
            "containers": [{
                "name": "main",
                "image": IMAGE,
                "resources": resources,
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": True,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": node,
            "securityContext": {},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]},
                                      {"key": "maintenance", "operator": "DoesNotExist"}]}]}}},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
            ],
            "priorityClassName": "normal",
            "priority": 10000,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": "10.0.0.1",
            "hostIPs": [{"ip": "10.0.0.1"}],
            "podIP": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}",
            "podIPs": [{"ip": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"}],
            "startTime": STAMP,
            "containerStatuses": [{
                "name": "main", "state": {"running": {"startedAt": STAMP}}, "lastState": {}, "ready": True,
                "restartCount": 0, "image": IMAGE, "imageID": "", "started": True,
            }],
            "qosClass": "BestEffort",
        },
    }  # fmt: skip


def write_pages(path: Path, pods: int, namespaces: int, gpu_share: float, page_size: int) -> list[tuple[int, int]]:
    """The PodList pages, one after the other in `path`; returns each page's (offset, length)."""
    random.seed(1)
    spans: list[tuple[int, int]] = []
    pages = max(1, -(-pods // page_size))
    with path.open("wb") as out:
        for page in range(pages):
            items = [
                stored_pod(i, f"scale-{i % namespaces:05d}", random.random() < gpu_share)
                for i in range(page * page_size, min(pods, (page + 1) * page_size))
            ]
            meta: Obj = {"resourceVersion": "150000"}
            if page + 1 < pages:
                meta["continue"] = f"page-{page + 1}"
                meta["remainingItemCount"] = pods - (page + 1) * page_size
            body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items},
                              separators=(",", ":")).encode()  # fmt: skip
            spans.append((out.tell(), len(body)))
            out.write(body)
    return spans


# -- the child: one code tree, one list ---------------------------------------------------------------
def rss_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak() -> None:
    """Start VmHWM afresh from the current RSS (Linux: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


class Timers:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        """Time every call of `owner.attribute` (a function or method) as stage `name`, if it exists."""
        original = getattr(owner, attribute, None) if owner is not None else None
        if original is None:
            return
        timers = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            with timers.stage(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)


class PageResponse:
    """Stands in for the aiohttp response of one list page: the attributes the watch reads."""

    status = 200

    def __init__(self, body: bytes, timers: Timers) -> None:
        self._body = body
        self._timers = timers

    async def read(self) -> bytes:
        return self._body

    async def json(self, *, loads: Callable[[str], Any] = json.loads, content_type: str | None = None) -> Any:
        with self._timers.stage("decode"):
            return loads(self._body.decode())

    async def text(self, errors: str = "strict") -> str:
        return self._body.decode(errors=errors)

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass

    async def __aenter__(self) -> PageResponse:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


def child(pages_file: Path, spans: list[tuple[int, int]], namespaces: int) -> Obj:
    from kubernetes_asyncio.client import ApiClient, Configuration

    from tests.support.cluster import SCHEDULER
    from webhook.kube import watch as watch_module
    from webhook.runtime import tune_garbage_collector
    from webhook.settings import SETTINGS_CONFIGMAP
    from webhook.state import store as store_module
    from webhook.state.store import ClusterState
    from webhook.state.watches import default_watches

    timers = Timers()
    state = ClusterState("hopsworks")
    # What bench.real_cluster.bench_settings gives the cluster the fill runs in.
    available: dict[str, Any] = dict(SCHEDULER["available"])  # type: ignore[call-overload]
    scheduler = {**SCHEDULER, "available": {**available, "affinity": [*available["affinity"], "disk=ssd"]}}
    state.apply({"kind": "ConfigMap", "metadata": {"name": SETTINGS_CONFIGMAP, "namespace": "hopsworks"},
                 "data": {"scheduler": json.dumps(scheduler)}})  # fmt: skip
    state.replace_all("PriorityClass", [{"kind": "PriorityClass", "metadata": {"name": "normal"}, "value": 10000}])
    names = [f"scale-{i:05d}" for i in range(namespaces)]
    state.replace_all("Namespace", [{"metadata": {"name": n, "labels": {"hopsworks.ai/project": n, "runai/queue": n}}}
                                    for n in names])  # fmt: skip
    # What each tree calls on the way; a name a tree does not have is left out of its figures.
    timers.wrap(watch_module.ResourceWatch, "_prepared_items", "prepare")
    timers.wrap(watch_module.ResourceWatch, "_decode_page", "decode")
    timers.wrap(store_module.ClusterState, "replace_all", "store")
    timers.wrap(store_module.ClusterState, "replace_pods", "store")
    timers.wrap(getattr(store_module, "_PodListing", None), "add", "store")

    async def listed(source: Any) -> float:
        async def list_fn(**kwargs: Any) -> PageResponse:
            token = kwargs.get("_continue")
            offset, length = spans[int(token.split("-")[1]) if token else 0]
            source.seek(offset)
            return PageResponse(source.read(length), timers)

        async with ApiClient(Configuration()) as api:
            watch = next(w for w in default_watches(api, "hopsworks") if w.kind == "Pod")
        watch = replace(watch, list_fn=list_fn)
        # The runtime tunes the collector once its listeners are up, a moment into the first lists.
        tune_garbage_collector()
        before = rss_mb()
        reset_peak()
        with timers.stage("list"):
            await watch._list(state)
        return before

    with pages_file.open("rb") as source:
        before = asyncio.run(listed(source))
        peak = rss_mb("VmHWM")
    assert state.synced["Pod"], "the pod cache did not sync"
    cached = sum(len(p) for p in state.pods.values())
    with timers.stage("settle"):
        gc.collect()
    settled = rss_mb()
    # Every field of every record, so that two trees can be shown to cache the same pods alike.
    cached_records = [r for p in state.pods.values() for r in p.values()]
    records = sorted(repr(tuple(getattr(r, f.name) for f in fields(r))) for r in cached_records)
    digest = hashlib.sha256("\n".join(records).encode()).hexdigest()[:16]
    return {"seconds": timers.seconds, "rss_before_mb": before, "peak_mb": peak, "settled_mb": settled,
            "cached": cached, "held_gpus": round(sum(state.held_gpus.get(n) for n in names)),
            "records": digest}  # fmt: skip


def run_child(tree: Path, pages_file: Path, spans_file: Path, namespaces: int) -> Obj:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "bench.cold_start", "--child", str(pages_file), str(spans_file), str(namespaces)],
        cwd=tree, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"the run with {tree} failed:\n{done.stderr}")
    result: Obj = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def summary(runs: list[Obj]) -> Obj:
    """Medians over rounds: stage seconds, peak and settled MB (peak and settled as grown over the
    state before the list)."""
    stages = sorted({s for r in runs for s in r["seconds"]})
    return {
        "seconds": {s: statistics.median(r["seconds"].get(s, 0.0) for r in runs) for s in stages},
        "peak_mb": statistics.median(r["peak_mb"] - r["rss_before_mb"] for r in runs),
        "settled_mb": statistics.median(r["settled_mb"] - r["rss_before_mb"] for r in runs),
        "rss_before_mb": statistics.median(r["rss_before_mb"] for r in runs),
        "cached": runs[-1]["cached"],
        "held_gpus": runs[-1]["held_gpus"],
        "records": runs[-1]["records"],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        spans = [(offset, length) for offset, length in json.loads(Path(argv[2]).read_text())]
        print(json.dumps(child(Path(argv[1]), spans, int(argv[3]))))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.cold_start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=50_000)
    parser.add_argument("--namespaces", type=int, default=2_000)
    parser.add_argument("--gpu-share", type=float, default=0.1)
    parser.add_argument(
        "--page-size",
        type=int,
        default=2000,
        help="items per list page, as the pod watch asks (WatchTiming.pod_page_size)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout: also run its webhook package")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="swh-cold-start-") as tmp:
        pages_file, spans_file = Path(tmp) / "pages.json", Path(tmp) / "spans.json"
        began = time.monotonic()
        spans = write_pages(pages_file, args.pods, args.namespaces, args.gpu_share, args.page_size)
        spans_file.write_text(json.dumps(spans))
        size = pages_file.stat().st_size
        print(f"{args.pods} pods in {len(spans)} pages of {args.page_size}, {size / 1e6:.0f} MB of JSON "
              f"({size / max(args.pods, 1) / 1000:.1f} KB a pod), "
              f"written in {time.monotonic() - began:.0f} s")  # fmt: skip
        trees = {"this tree": ROOT}
        if args.baseline is not None:
            trees["baseline"] = args.baseline.resolve()
        runs: dict[str, list[Obj]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():  # alternating, so a busy neighbour slows both alike
                runs[name].append(run_child(tree, pages_file, spans_file, args.namespaces))
    results = {name: summary(r) for name, r in runs.items()}
    for name, tree in trees.items():
        r = results[name]
        print(f"{name} ({tree}): {r['cached']} pods cached, {r['held_gpus']} GPUs held, records {r['records']}; "
              f"RSS before the list {r['rss_before_mb']:.0f} MB")  # fmt: skip
    stages = ["list", "decode", "prepare", "store", "settle"]
    names = list(trees)
    print(f"\nmedians of {args.rounds} rounds, each in a fresh process")
    print("| stage | " + " | ".join(names) + (" | ratio |" if len(names) > 1 else " |"))
    print("|---|" + "---|" * (len(names) + (len(names) > 1)))

    def row(label: str, values: list[float], unit: str) -> None:
        cells = [f"{v:.2f} {unit}" if unit == "s" else f"{v:.0f} {unit}" for v in values]
        ratio = ""
        if len(values) > 1:
            ratio = f" | {values[0] / values[1]:.2f}x" if values[1] else " | -"
        print(f"| {label} | " + " | ".join(cells) + ratio + " |")

    for stage in stages:
        row(stage + " s", [results[n]["seconds"].get(stage, 0.0) for n in names], "s")
    row("peak RSS during the list, over before", [results[n]["peak_mb"] for n in names], "MB")
    row("RSS settled, over before", [results[n]["settled_mb"] for n in names], "MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
