"""What co-location costs with the real Kueue: a 3-replica Deployment choosing `host` (one Kueue pod
group, admitted once all 3 pods exist) against the same Deployment choosing no unit (3 Workloads of
one pod), measured side by side, round after round, in one run.

    python -m bench.kueue_colocation [--rounds 5] [--replicas 3]

Starts the test control plane with the install and Kueue v0.17.0 (tests/support/control_plane,
built by `make peers`), with the product's `kueue_installed: "true"`. Each turn applies one
Deployment in a fresh project namespace and times `kubectl apply` to all pods Running (kwok marks
them Running once the kube-scheduler binds them), and records the nodes they landed on and the
Workloads Kueue made. Reports medians and the ratio grouped / ungrouped.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster import SCHEDULER
from tests.support.control_plane.cluster import ControlPlane, control_plane
from tests.support.control_plane.install import INSTALL_NS, installed
from tests.support.control_plane.kueue import cluster_queue, kueue_running, local_queue, resource_flavor, topology
from tests.support.control_plane.nodes import DEFAULT_REAL_NODES

Obj = dict[str, Any]
IMAGE = "registry.example/model:1.0"


def deployment(namespace: str, replicas: int, unit: str | None) -> Obj:
    annotations = {"scheduling.hopsworks.ai/topology": unit} if unit else {}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "model", "namespace": namespace},
        "spec": {"replicas": replicas, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": {"app": "model"}},
                 "template": {"metadata": {"labels": {"app": "model"}, "annotations": annotations},
                              "spec": {"containers": [{"name": "main", "image": IMAGE,
                                                       "resources": {"requests": {"cpu": "1"}}}]}}},
    }  # fmt: skip


def project(cp: ControlPlane, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", name)
    cp.kubectl("label", "namespace", name, f"hopsworks.ai/project={name}")
    cp.apply([local_queue(name, "team", "cq")])
    # Both replicas know the LocalQueue once a server-side dry run of a pod passes four times.
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": name},
             "spec": {"containers": [{"name": "main", "image": IMAGE}]}}  # fmt: skip
    deadline = time.monotonic() + 60
    while not all(
        cp.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False).returncode == 0
        for _ in range(4)
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the LocalQueue of {name} never reached both replicas")
        time.sleep(0.2)
    return name


def turn(cp: ControlPlane, replicas: int, unit: str | None) -> dict[str, Any]:
    ns = project(cp, "bench-group" if unit else "bench-plain")
    start = time.monotonic()
    cp.apply([deployment(ns, replicas, unit)])
    while True:
        pods = cp.get_json("pods", "-n", ns, "-l", "app=model")["items"]
        if len(pods) == replicas and all(p.get("status", {}).get("phase") == "Running" for p in pods):
            break
        if time.monotonic() - start > 120:
            raise RuntimeError(f"not all {replicas} pods Running within 120 s in {ns}")
        time.sleep(0.05)
    elapsed = time.monotonic() - start
    workloads = cp.get_json("workloads.kueue.x-k8s.io", "-n", ns)["items"]
    cp.kubectl("delete", "namespace", ns, "--wait=false")
    return {"seconds": elapsed, "nodes": sorted({p["spec"]["nodeName"] for p in pods}), "workloads": len(workloads)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kueue_colocation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replicas", type=int, default=3)
    args = parser.parse_args(argv)
    dir = Path(tempfile.mkdtemp(prefix="swh-bench-kueue-"))
    results: dict[str, list[dict[str, Any]]] = {"host": [], "none": []}
    try:
        with (
            control_plane(dir, real_nodes=DEFAULT_REAL_NODES) as cp,
            installed(cp, dir / "install") as inst,
            kueue_running(cp, dir / "kueue"),
        ):
            cp.apply([topology(), resource_flavor("tas", "default"), cluster_queue("cq", "tas", cpu="200")])
            data = {"kueue_installed": "true", "kueue_project_default_local_queue": "team",
                    "scheduler": yaml.safe_dump(SCHEDULER)}  # fmt: skip
            cp.kubectl("patch", "configmap", "hopsworks-cluster-settings", "-n", INSTALL_NS, "--type", "merge", "-p",
                       json.dumps({"data": data}))  # fmt: skip
            inst.scale(0)  # the replicas list Kueue's kinds at start: restart them now that they are served
            inst.scale(2)
            for r in range(args.rounds):
                for mode in ("host", "none"):
                    got = turn(cp, args.replicas, mode if mode == "host" else None)
                    results[mode].append(got)
                    print(f"round {r + 1} unit {mode:4s} {got['seconds']:.2f} s to all Running, "
                          f"nodes {got['nodes']}, {got['workloads']} Workload(s)")  # fmt: skip
    finally:
        shutil.rmtree(dir, ignore_errors=True)
    med = {mode: statistics.median(t["seconds"] for t in turns) for mode, turns in results.items()}
    print(
        f"\n| {args.replicas} replicas | median s, apply to all Running | nodes used | Workloads |\n|---|---|---|---|"
    )
    for mode, label in (("none", "no unit"), ("host", "unit host (one pod group)")):
        turns = results[mode]
        nodes = sorted({len(t["nodes"]) for t in turns})
        print(f"| {label} | {med[mode]:.2f} | {'/'.join(map(str, nodes))} | {turns[0]['workloads']} |")
    print(f"| ratio host / no unit | {med['host'] / med['none']:.2f} | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
