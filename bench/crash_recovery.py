"""How soon a department move cut short by `kill -9` is finished by the other replica.

`python -m bench.crash_recovery [--rounds 3]`

Two real `scheduling-webhook serve` processes against the Kubernetes API emulator and the Run:ai
stand-in (`tests/support/crashed_move.py`). Each round asks one replica to move a bound project to
another department and kills that replica (SIGKILL) while Run:ai deletes the old project; the
killed one is started again before the next round. Rounds alternate between killing the Lease
holder (the survivor resumes the move once it has taken the Lease over: the Lease's 15 s) and
killing the other replica (the leader resumes it once the dead holder's heartbeat is 20 s old).
Prints, per kind of kill, the time from the kill to the move finished (the namespace relabelled,
its intent gone).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from pathlib import Path
from typing import Literal

from tests.support.crashed_move import CrashedMoveCluster, CrashRun


async def measure(rounds: int) -> dict[str, list[CrashRun]]:
    runs: dict[str, list[CrashRun]] = {"leader": [], "follower": []}
    kinds: tuple[Literal["leader", "follower"], ...] = ("leader", "follower")
    with tempfile.TemporaryDirectory(prefix="bench-crash-") as tmp:
        async with CrashedMoveCluster(Path(tmp)) as cluster:
            for index in range(rounds * 2):
                kind = kinds[index % 2]
                run = await cluster.crash_a_move(kind)
                assert (run.outcome, run.projects_named) == ("moved", 1), run
                runs[kind].append(run)
                print(f"round {index + 1}: killed the {kind}: move finished {run.seconds:.1f} s after the kill")
                dead = next(r for r in cluster.replicas if r.proc.poll() is not None)
                await cluster.replace(dead)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per kind of kill")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    runs = asyncio.run(measure(args.rounds))
    for kind, done in runs.items():
        seconds = [r.seconds for r in done]
        print(
            f"killed the {kind}, {len(seconds)} rounds: kill -> move finished "
            f"median {statistics.median(seconds):.1f} s (min {min(seconds):.1f}, max {max(seconds):.1f})"
        )
    print(f"load average at the start: {load:.1f}, at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
