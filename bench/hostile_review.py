"""`python -m bench.hostile_review`: what a hostile review costs next to an ordinary one, in-process.

A pod whose required node affinity has 10,000 terms is refused on its count of terms, before any
term is compared with another. The tests check that it is refused and why; how long that takes is
a figure of this machine, so it is measured here, as a ratio against the bench's ordinary pod on
`/mutate/pods` (`bench.workload`'s b) in the same run: parse, object check, decision and answer,
as the server does them, CPU time of this process only.

  ordinary  the bench's 9 KB pod in a Kueue project, admitted with a patch
  hostile   the same pod with 10,000 required node-selector terms (about 700 KB), refused
  hostile/ordinary  the ratio; `--budget` (default BUDGET) is the largest allowed: exit 1 above
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.workload import KUEUE_PROJECT, kueue_state, mutate_body

# A refusal on the count of terms reads each term once, in the JSON parse: about 700 ordinary
# reviews here (an 800 KB body against a 9 KB one). Comparing the terms pairwise before counting
# them took 2.4 s of CPU, some 100,000 ordinary reviews: the budget sits far from both.
BUDGET = 2_000.0
TERMS = 10_000
AFFINITY = "scheduling.hopsworks.ai/affinity"


def hostile_body() -> bytes:
    review: dict[str, Any] = json.loads(mutate_body())
    pod = review["request"]["object"]
    terms = [{"matchExpressions": [{"key": f"k{i}", "operator": "In", "values": [f"v{i}"]}]} for i in range(TERMS)]
    pod["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    }
    pod["metadata"].setdefault("annotations", {})[AFFINITY] = "topology.kubernetes.io/zone=eu-1a"
    return json.dumps(review).encode()


def reviewer(work: Path) -> Callable[[bytes], dict[str, Any]]:
    """The pod endpoints' path of `/mutate/pods` in folder mode, from body to answer."""
    from webhook.admission import build_response, object_errors, parse_pod_review, parse_review
    from webhook.core.decision import Decision
    from webhook.core.scheduling import mutate_pod
    from webhook.state.folder import load_into
    from webhook.state.store import ClusterState

    state = ClusterState()
    load_into(state, kueue_state(work / "state"))

    def review(body: bytes) -> dict[str, Any]:
        parsed = parse_pod_review(body)
        if parsed is None:
            version, request = parse_review(body)
            error = object_errors(request)
            if error is not None:
                return build_response(version, request["uid"], Decision.deny(error, code=400))
        else:
            version, request = parsed
        return build_response(version, request["uid"], mutate_pod(request, state.snapshot()))

    return review


def cpu_per_review(review: Callable[[bytes], dict[str, Any]], body: bytes, seconds: float) -> tuple[float, int]:
    """CPU seconds per review over at least `seconds` of CPU, and how many reviews that was."""
    review(body)  # warm up
    count, started = 0, time.process_time()
    while (spent := time.process_time() - started) < seconds or count < 3:
        review(body)
        count += 1
    return spent / count, count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="CPU seconds measured per review kind")
    parser.add_argument("--budget", type=float, default=BUDGET, help="largest hostile/ordinary allowed (exit 1 above)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        review = reviewer(Path(tmp))
        ordinary, hostile = mutate_body(), hostile_body()
        answer = review(hostile)["response"]
        if answer["allowed"] or f"{TERMS} terms" not in answer["status"]["message"]:
            print(f"the hostile review was not refused on its terms: {answer}", file=sys.stderr)
            return 2
        if not review(ordinary)["response"]["allowed"]:
            print(f"the ordinary review of {KUEUE_PROJECT} was not admitted", file=sys.stderr)
            return 2
        a, a_count = cpu_per_review(review, ordinary, args.seconds)
        b, b_count = cpu_per_review(review, hostile, args.seconds)
    ratio = b / a
    print(f"ordinary  {a * 1e6:10.0f} µs CPU/review ({a_count} reviews, {len(ordinary):,} bytes)")
    print(f"hostile   {b * 1e6:10.0f} µs CPU/review ({b_count} reviews, {len(hostile):,} bytes)")
    verdict = "ok" if ratio <= args.budget else "OVER"
    print(f"hostile/ordinary: {ratio:.1f}  (budget {args.budget:g}: {verdict})")
    return 0 if ratio <= args.budget else 1


if __name__ == "__main__":
    raise SystemExit(main())
