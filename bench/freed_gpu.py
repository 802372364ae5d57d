"""How long a freed GPU takes to become available again (R3), measured end to end.

Two real replicas over HTTPS, the real control plane (etcd, apiserver, scheduler, kwok; read as the
webhook's ServiceAccount) and the Run:ai stand-in (as in `tests/test_gpu_quota_runtime.py`). Each
round: a 1-GPU notebook is admitted by replica a, stored, placed on a fake GPU node by the
scheduler, run by kwok and counted by Run:ai (1 of 1 deserved allocated); it is deleted through
the apiserver, and replica b is asked every 5 ms for a 1-GPU terminal until it admits one.
Reported: delete -> deletion in b's pod cache, and delete -> terminal admitted.

    PEERS_DIR=/work/peers .venv/bin/python -m bench.freed_gpu [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from tests.support.cluster import runai_settings_configmap
from tests.support.https import wait_until
from tests.support.kube_scope import SharedCluster, running_cluster, scope_on
from tests.support.reviews import pod_review
from tests.support.runai_standin import RunaiStandin
from tests.support.runtime import apiserver_session, start_runtime
from tests.test_gpu_quota_runtime import (
    NOTEBOOK,
    SECRET,
    TERMINAL,
    Cluster,
    Replica,
    bound_project,
    quota_known,
    running,
    start_pod,
)


async def measure(rounds: int, tmp_path: Path, shared: SharedCluster) -> tuple[list[float], list[float]]:
    seen: list[float] = []
    admitted: list[float] = []
    async with scope_on(shared, tmp_path / "kube-scope") as scope, RunaiStandin(client_secret=SECRET) as runai:
        runai.add_department("default")
        await scope.put(runai_settings_configmap(runai, scope.install_ns))
        _, token = await scope.user_token("alice")
        cluster = Cluster(scope, runai, scope.name("vision"), token)
        vision = cluster.vision
        secret_dir = tmp_path / "runai-secret"
        secret_dir.mkdir()
        (secret_dir / "clientSecret").write_text(SECRET)
        replicas: list[Replica] = []
        try:
            for name in ("a", "b"):
                (tmp_path / name).mkdir()
                runtime, options, certs = await start_runtime(tmp_path / name, scope, runai_secret_dir=secret_dir)
                replicas.append(Replica(runtime, options, apiserver_session(certs), token))
            cluster.replicas[:] = replicas
            a, b = replicas
            await bound_project(cluster, gpus=1)
            for i in range(rounds):
                runai.set_project_usage(vision, allocated=0, allocated_non_preemptible=0)
                await quota_known(vision, a, b)
                answer = await start_pod(cluster, a, pod_review(vision, labels=NOTEBOOK, gpus=1, uid=f"nb{i}"))
                assert answer["allowed"], answer
                await running(cluster, f"nb{i}-pod")
                runai.set_project_usage(vision, allocated=1, allocated_non_preemptible=1)
                for r in (a, b):
                    await wait_until(
                        lambda r=r: any(p.phase == "Running" for p in r.runtime.state.pods.get(vision, {}).values()),
                        within=10,
                        what="running notebook cached",
                    )
                await quota_known(vision, a, b)
                start = time.perf_counter()
                await scope.delete("v1", "Pod", f"nb{i}-pod", vision)
                seen_at = None
                attempt = 0
                while True:
                    if seen_at is None and not b.runtime.state.pods.get(vision):
                        seen_at = time.perf_counter() - start
                    attempt += 1
                    review = pod_review(vision, labels=TERMINAL, gpus=1, uid=f"t{i}-{attempt}")
                    answer = await start_pod(cluster, b, review)
                    if answer["allowed"]:
                        admitted.append(time.perf_counter() - start)
                        seen.append(seen_at if seen_at is not None else admitted[-1])
                        await scope.delete("v1", "Pod", f"t{i}-{attempt}-pod", vision)
                        break
                    if time.perf_counter() - start > 30:
                        raise AssertionError(f"round {i}: no terminal admitted within 30 s")
                    await asyncio.sleep(0.005)
                for r in (a, b):
                    await wait_until(lambda r=r: not r.runtime.state.pods.get(vision), within=30, what="terminal gone")
        finally:
            for replica in replicas:
                await replica.session.close()
                await replica.runtime.shutdown()
        assert runai.violations == [], runai.violations
    return seen, admitted


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[max(0, int(len(ordered) * 0.9) - 1)]
    return (
        f"median {statistics.median(ordered) * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with running_cluster() as shared, tempfile.TemporaryDirectory() as tmp:
        seen, admitted = asyncio.run(measure(args.rounds, Path(tmp), shared))
    print(f"{args.rounds} rounds, 2 replicas")
    print(f"delete -> deletion in replica b's pod cache: {_ms(seen)}")
    print(f"delete -> 1-GPU terminal admitted by replica b: {_ms(admitted)}")


if __name__ == "__main__":
    main()
