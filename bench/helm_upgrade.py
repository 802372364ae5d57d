"""The admission gap of a `helm upgrade` that rolls the replicas, against the same loop with nothing
rolling, side by side in one run.

    python -m bench.helm_upgrade [--rounds 3] [--steady-s 10] [--interval-s 0.2]

Starts the test control plane with the chart installed by the real helm (tests/support/control_plane),
then per round: pods created one after another in a project namespace (every `interval` seconds,
both pod webhooks on their path) for `steady` seconds with nothing happening, then through a
`helm upgrade --wait` that changes the pod template (the Deployment rolls: surge 1, none
unavailable, each old replica drained by its preStop sleep) until the old replicas are gone. Reports
per round the creations refused, the longest time between two successful creations while steady
and while rolling, and their ratio; medians over rounds.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from tests.support.control_plane.cluster import ControlPlane, control_plane
from tests.support.control_plane.install import INSTALL_NS, helm_install, installed
from tests.support.control_plane.nodes import DEFAULT_REAL_NODES
from tests.support.control_plane.rest import Rest
from tests.support.pod_creations import Creations

SERVER_PODS = "app.kubernetes.io/name=scheduling-webhook"


def server_pods(cp: ControlPlane) -> set[str]:
    items = cp.get_json("pods", "-n", INSTALL_NS, "-l", SERVER_PODS)["items"]
    return {p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp")}


def one_round(cp: ControlPlane, rest: Rest, n: int, steady_s: float, interval_s: float) -> dict[str, float]:
    project = f"gap-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", project)
    cp.kubectl("label", "namespace", project, f"hopsworks.ai/project={project}")
    before = server_pods(cp)
    loop = Creations(rest, project, interval_s=interval_s).start()
    try:
        time.sleep(steady_s)
        started = time.monotonic()
        helm_install(cp, {"podAnnotations": {"bench-round": str(n)}}, "--wait", "--timeout", "5m", command="upgrade")
        upgraded_s = time.monotonic() - started
        deadline = time.monotonic() + 180
        while server_pods(cp) & before or len(server_pods(cp)) != 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the old replicas did not go within 180 s")
            time.sleep(0.2)
        rolled_s = time.monotonic() - started
        time.sleep(1)
    finally:
        loop.stop()
    cp.kubectl("delete", "namespace", project, "--wait=false")
    for start, _, status, message in loop.results:
        if status != 201:
            when = "rolling" if start >= started else "steady"
            print(f"round {n}: refused while {when}, {start - started:+.1f} s from the upgrade: {message}", flush=True)
    steady, rolling = loop.longest_gap_s(before=started), loop.longest_gap_s(after=started)
    return {"creations": len(loop.results), "refused": len(loop.refusals()), "steady_gap_ms": steady * 1000,
            "rolling_gap_ms": rolling * 1000, "ratio": rolling / max(steady, 1e-3), "upgrade_s": upgraded_s,
            "rolled_s": rolled_s}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.helm_upgrade", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steady-s", type=float, default=10.0, help="creations with nothing rolling, per round")
    parser.add_argument("--interval-s", type=float, default=0.2, help="one creation every this many seconds")
    args = parser.parse_args(argv)
    dir = Path(tempfile.mkdtemp(prefix="swh-bench-helm-"))
    rounds = []
    try:
        with control_plane(dir, real_nodes=DEFAULT_REAL_NODES) as cp, installed(cp, dir / "install"):
            rest = Rest(cp.url, cp.pki.ca_file, cp.dir / "pki/admin.crt", cp.dir / "pki/admin.key")
            for n in range(1, args.rounds + 1):
                got = one_round(cp, rest, n, args.steady_s, args.interval_s)
                rounds.append(got)
                print(f"round {n}: " + "  ".join(f"{k} {v:.1f}" for k, v in got.items()), flush=True)
    finally:
        shutil.rmtree(dir, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print("\n| | creations | refused | longest gap steady ms | longest gap rolling ms | rolling/steady |"
          "\n|---|---|---|---|---|---|")  # fmt: skip
    refused = sum(r["refused"] for r in rounds)
    print(f"| median of {len(rounds)} | {med['creations']:.0f} | {refused:.0f} (all rounds) | "
          f"{med['steady_gap_ms']:.0f} | {med['rolling_gap_ms']:.0f} | {med['ratio']:.2f} |")  # fmt: skip
    print(f"\nhelm upgrade --wait {med['upgrade_s']:.1f} s, old replicas gone after {med['rolled_s']:.1f} s (medians)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
