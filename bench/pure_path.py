"""`python -m bench.pure_path`: instructions per review of each stage of the pure path, in-process.

`bench.instructions` counts a whole server (TLS, HTTP, the event loop); this counts what the
review costs without them, stage by stage, so a change to the decode, the object check, the
decision or the answer shows in its own row. Each stage is run cumulatively (a stage includes the
ones above it) N times under callgrind, which dumps its counters whenever the process calls
`getppid()`: that call marks the end of each stage, so one valgrind run gives every row.

  decode    the review's JSON into dicts (orjson), a minimal answer (what the bare server does)
  envelope  + the AdmissionReview envelope's checks (`admission.parse_review`)
  object    + the object's field checks (`admission.object_errors`, when the rules read it)
  pod       what the pod endpoints do instead of the three above: the review decoded against the
            pod schema (`admission.parse_pod_review`; a checkout without it repeats `object`).
            It stands alone: its own figure is the whole row
  target    + what the rules read of the pod (`scheduling.pod_target`), on the served path (`pod`)
  decision  + the rest of the decision (`mutate_pod` for b, `validate_pod` for c; its pod_target
            is the row above)
  answer    + the AdmissionReview answer, patch and all (`build_response`, serialised)

b and c are the scenarios of `bench.instructions`: the bench's pod on /mutate/pods in a Kueue
project, a GPU notebook on /validate/pods in a Run:ai-bound project. c_view is c as a replica
against an apiserver decides it, with the Run:ai directory's record of the project in the
snapshot (as `bench.run`'s c_view): c in folder mode has no such record and stops before the
quota sum. Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.workload import kueue_state, mutate_body, runai_state, validate_body

SCENARIOS = ("b", "c", "c_view")
STAGES = ("decode", "envelope", "object", "pod", "target", "decision", "answer")
STANDS_ALONE = STAGES.index("pod")
TOTALS = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.M)
WARMUP = 30


def stage_functions(scenario: str, work: Path) -> list[Callable[[], bytes]]:
    """The cumulative stages for scenario b, c or c_view, over a cluster-state folder made in `work`."""
    from webhook.admission import build_response, dumps, loads, object_errors, parse_review
    from webhook.core.decision import Decision
    from webhook.core.quota import validate_pod
    from webhook.core.scheduling import mutate_pod, pod_target
    from webhook.http.app import rules_read
    from webhook.state.folder import load_into
    from webhook.state.store import ClusterState

    state = ClusterState()
    if scenario == "b":
        load_into(state, kueue_state(work / "state"))
        body = mutate_body()

        def decide(review: dict[str, object]) -> Decision:
            return mutate_pod(review, state.snapshot())
    else:
        load_into(state, runai_state(work / "state"))
        body = validate_body()
        if scenario == "c_view":
            # Cluster mode: the Run:ai directory's record of the project is in the snapshot, so the
            # review reaches the quota sum (folder mode has none and stops before it).
            from bench.workload import RUNAI_DESERVED_GPUS, RUNAI_PROJECT
            from webhook.snapshot import RunaiProjectInfo

            snapshot = state.snapshot()
            snapshot.runai_reachable = True
            snapshot.runai_projects = {
                RUNAI_PROJECT: RunaiProjectInfo(
                    id="1", name=RUNAI_PROJECT, namespace=RUNAI_PROJECT, deserved_gpus=RUNAI_DESERVED_GPUS
                )
            }

        def decide(review: dict[str, object]) -> Decision:
            return validate_pod(review, state.snapshot(), time.time())

    reads = rules_read(state)

    def minimal(version: str, uid: str) -> bytes:
        return dumps({"apiVersion": version, "kind": "AdmissionReview", "response": {"uid": uid, "allowed": True}})

    def decode() -> bytes:
        raw = loads(body)
        return minimal(raw.get("apiVersion"), raw["request"]["uid"])

    def envelope() -> bytes:
        version, review = parse_review(body)
        return minimal(version, review["uid"])

    def checked() -> tuple[str, dict[str, object]]:
        version, review = parse_review(body)
        if reads(review) and object_errors(review) is not None:
            raise SystemExit("the bench review fails the object check")
        return version, review

    def object_() -> bytes:
        version, review = checked()
        return minimal(version, str(review["uid"]))

    try:
        from webhook.admission import parse_pod_review
    except ImportError:  # a baseline from before the pod schema
        served = checked
    else:

        def served() -> tuple[str, dict[str, object]]:
            typed = parse_pod_review(body)
            if typed is None:
                raise SystemExit("the pod schema does not take the bench review")
            return typed

    def pod() -> bytes:
        version, review = served()
        return minimal(version, str(review["uid"]))

    def target() -> bytes:
        version, review = served()
        pod_target(review, state.snapshot())
        return minimal(version, str(review["uid"]))

    def decision() -> bytes:
        version, review = served()
        decide(review)
        return minimal(version, str(review["uid"]))

    def answer() -> bytes:
        version, review = served()
        return dumps(build_response(version, str(review["uid"]), decide(review)))

    return [decode, envelope, object_, pod, target, decision, answer]


def run_stages(scenario: str, calls: int) -> None:
    """Inside valgrind: warm every stage up, then run each `calls` times, marking the ends."""
    with tempfile.TemporaryDirectory(prefix="bench-pure-") as tmp:
        stages = stage_functions(scenario, Path(tmp))
        for stage in stages:
            for _ in range(WARMUP):
                stage()
        os.getppid()
        for stage in stages:
            for _ in range(calls):
                stage()
            os.getppid()


def count(scenario: str, calls: int, root: Path) -> list[int]:
    """Instructions per call of each stage, counted by callgrind in a child process."""
    with tempfile.TemporaryDirectory(prefix="bench-pure-cg-") as tmp:
        out = Path(tmp) / "cg.out"
        command = ["valgrind", "--tool=callgrind", "--dump-before=getppid", f"--callgrind-out-file={out}"]
        # This file, run against `root`'s packages: a baseline checkout need not have it.
        command += [sys.executable, __file__, "--inside", scenario, "--calls", str(calls)]
        env = {**os.environ, "PYTHONPATH": str(root)}
        subprocess.run(command, cwd=root, env=env, check=True, capture_output=True)
        dumps = sorted(Path(tmp).glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
        totals = [int(m.group(1)) for p in dumps if (m := TOTALS.search(p.read_bytes()))]
    if len(totals) < len(STAGES) + 1:
        raise RuntimeError(f"callgrind wrote {len(totals)} dumps, expected {len(STAGES) + 1}")
    return [total // calls for total in totals[1 : len(STAGES) + 1]]  # the first is start-up and warm-up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pure_path", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="b,c,c_view", help="scenarios: b, c, c_view, comma-separated")
    parser.add_argument("--calls", type=int, default=300, help="calls per stage")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout: count it too, side by side")
    parser.add_argument("--inside", choices=SCENARIOS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:
        run_stages(args.inside, args.calls)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: apt-get install valgrind", file=sys.stderr)
        return 2
    roots = {"this": Path(__file__).resolve().parents[1]}
    if args.baseline is not None:
        roots["baseline"] = args.baseline.resolve()
    for scenario in filter(None, args.only.split(",")):
        counted = {name: count(scenario, args.calls, root) for name, root in roots.items()}
        print(f"{scenario}: instructions per review, cumulative (and the stage's own)")
        for i, stage in enumerate(STAGES):
            cells = []
            for per_stage in counted.values():
                own = per_stage[i] - (per_stage[i - 1] if i and i != STANDS_ALONE else 0)
                cells.append(f"{per_stage[i]:>10,} ({own:>+9,})")
            print(f"  {stage:9s}" + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
