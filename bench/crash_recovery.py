"""How soon a department move cut short by `kill -9` is finished, on the real control plane.

`python -m bench.crash_recovery [--rounds 3]` (needs `make peers`; PEERS_DIR)

Starts the test control plane (etcd, kube-apiserver, the controllers, kwok) with the install and its
two replicas run as real processes, and the Run:ai stand-in (tests/support/control_plane/). Each
round moves a project the leader bound to another department through the admin API over HTTPS and
kills (SIGKILL) the replica carrying the move while Run:ai deletes the old project
(tests/support/control_plane/crashed_move.py); its kubelet starts it again.
Rounds alternate between killing the Lease holder (a replica resumes the move once it has taken
the Lease over: the Lease's 15 s) and killing the other replica (the leader resumes it once the
dead holder's heartbeat is 20 s old). Prints, per kind of kill, the time from the kill to the move
finished (the namespace relabelled, its intent gone).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from tests.support.control_plane.cluster import control_plane
from tests.support.control_plane.crashed_move import CrashedMoves, CrashRun, Kill
from tests.support.control_plane.install import Install, installed
from tests.support.control_plane.nodes import DEFAULT_REAL_NODES

KINDS: tuple[Kill, ...] = ("leader", "follower")


async def measure(inst: Install, rounds: int) -> dict[Kill, list[CrashRun]]:
    runs: dict[Kill, list[CrashRun]] = {kind: [] for kind in KINDS}
    moves = CrashedMoves(inst)
    try:
        await moves.prepare()
        for index in range(rounds * len(KINDS)):
            kind = KINDS[index % len(KINDS)]
            run = await moves.crash_a_move(kind)
            assert (run.outcome, run.projects_named) == ("moved", 1), run
            runs[kind].append(run)
            print(f"round {index + 1}: killed the {kind}: move finished {run.seconds:.1f} s after the kill", flush=True)
    finally:
        await moves.restore()
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.crash_recovery", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per kind of kill")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    dir = Path(tempfile.mkdtemp(prefix="swh-bench-crash-"))
    try:
        with control_plane(dir, real_nodes=DEFAULT_REAL_NODES) as cp, installed(cp, dir / "install") as inst:
            runs = asyncio.run(measure(inst, args.rounds))
    finally:
        shutil.rmtree(dir, ignore_errors=True)
    for kind, done in runs.items():
        seconds = [r.seconds for r in done]
        print(
            f"killed the {kind}, {len(seconds)} rounds: kill -> move finished "
            f"median {statistics.median(seconds):.1f} s (min {min(seconds):.1f}, max {max(seconds):.1f})"
        )
    print(f"load average at the start: {load:.1f}, at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
