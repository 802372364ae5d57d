"""The apiserver's part of a restarted replica's pod list, by the number of pods and the page size.

    python -m bench.list_pages [--nodes 1000] [--namespaces 2000] [--pods 25000,50000]
                               [--pages 500,1000,2000,5000] [--rounds 3]

Starts the test control plane (tests/support/control_plane; the release KUBE_VERSION selects) with
--nodes kwok nodes and no install, makes --namespaces namespaces, and for each total of --pods in
turn fills the cluster up to that many pods (bench.scale_cluster's fill, kwok runs them), then
lists every pod as a replica does (`limit`, `continue`, a consistent list) once per page size and
round, alternating the sizes, bodies read, not parsed. Prints the median per total and page size,
and the time per 10,000 pods: a size whose time per pod grows with the pods makes the list
superlinear (what `webhook.kube.watch.WatchTiming` chooses its pod pages by).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.scale_cluster import apiserver_list_seconds, fill, make_namespaces, nodes
from tests.support.control_plane.cluster import KUBE_VERSION, control_plane


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.list_pages", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--namespaces", type=int, default=2000)
    parser.add_argument("--pods", default="25000,50000", help="totals, comma-separated, increasing")
    parser.add_argument("--pages", default="500,1000,2000,5000", help="page sizes, comma-separated")
    parser.add_argument("--gpu-share", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    totals = [int(t) for t in args.pods.split(",")]
    pages = [int(p) for p in args.pages.split(",")]
    random.seed(1)
    dir = Path(tempfile.mkdtemp(prefix="swh-bench-pages-"))
    medians: dict[tuple[int, int], float] = {}
    try:
        with control_plane(dir, nodes=nodes(args.nodes)) as cp:
            print(f"Kubernetes {KUBE_VERSION}: control plane with {args.nodes} kwok nodes ready", flush=True)
            namespaces = asyncio.run(make_namespaces(cp, args.namespaces))
            made = 0
            for total in totals:
                started = time.monotonic()
                asyncio.run(fill(cp, namespaces, total - made, args.gpu_share, made))
                made = total
                print(f"filled to {total} pods in {time.monotonic() - started:.1f} s", flush=True)
                time.sleep(5)  # kwok's status writes settle
                seen: dict[int, list[float]] = {p: [] for p in pages}
                for _ in range(args.rounds):
                    for page in pages:
                        seen[page].append(asyncio.run(apiserver_list_seconds(cp, page)))
                for page in pages:
                    medians[(total, page)] = statistics.median(seen[page])
                    print(f"{total} pods, pages of {page}: {[round(s, 2) for s in seen[page]]}", flush=True)
    finally:
        shutil.rmtree(dir, ignore_errors=True)
    print(f"\nKubernetes {KUBE_VERSION}: every pod listed, medians of {args.rounds} rounds (s; per 10,000 pods)")
    print("| pods | " + " | ".join(f"pages of {p}" for p in pages) + " |")
    print("|---" * (len(pages) + 1) + "|")
    for total in totals:
        cells = [f"{medians[(total, p)]:.2f} ({medians[(total, p)] * 10_000 / total:.2f})" for p in pages]
        print(f"| {total} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
