"""The pod cache keeps a slim record per pod, whatever the pod's size (no timings here: those are
in `python -m bench.scale`)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from bench.scale import new_state, pod_object
from webhook.state.store import ClusterState

PODS = 5_000
NAMESPACES = 500
# A slim record (six fields, the uid and name strings) plus its dict entry: a few hundred bytes.
MAX_BYTES_PER_POD = 1024


def fat(pod: dict[str, Any], kib: int) -> dict[str, Any]:
    """The same pod carrying `kib` KiB more: big annotations and many containers, as real pods do."""
    pod["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "x" * (kib * 1024)
    pod["spec"]["containers"] = pod["spec"]["containers"] * 20
    return pod


def traced_bytes_per_pod(state: ClusterState, kib: int) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(PODS):
            pod = pod_object(i, NAMESPACES)
            state.apply(fat(pod, kib) if kib else pod)
        del pod
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return (after - before) / PODS


def in_a_fresh_process(expression: str) -> Any:
    """`expression` (over this module as `t`) evaluated in a new interpreter: what other tests left
    in this process (module-level memos, metric children, a collector an in-process server tuned or
    froze) moved the counts by up to 10% from one suite order to another."""
    code = f"import json, tests.test_scale as t; print(json.dumps({expression}))"
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_memory_per_pod_is_bounded_and_does_not_grow_with_the_pod() -> None:
    slim, big = in_a_fresh_process(
        "[t.traced_bytes_per_pod(t.new_state(), kib=0), t.traced_bytes_per_pod(t.new_state(), kib=8)]"
    )
    assert slim <= MAX_BYTES_PER_POD, f"{slim:.0f} B per pod record"
    # An 8 KiB pod must not cost more than a small one: the cache never keeps the object.
    assert big <= MAX_BYTES_PER_POD, f"{big:.0f} B per 8 KiB pod"
    assert abs(big - slim) <= 0.1 * slim, (slim, big)


def bytes_left_after_deleting() -> tuple[int, bool]:
    """What a store holds after every pod and namespace it was given is deleted, and whether it
    lists no pod."""
    state = new_state()
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(PODS):
            state.apply(pod_object(i, NAMESPACES))
        for i in range(0, PODS, 2):
            state.delete(pod_object(i, NAMESPACES))
        for n in range(NAMESPACES):
            state.delete({"kind": "Namespace", "metadata": {"name": f"project-{n:05d}"}})
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before, state.pods == {}


def test_deleting_pods_and_namespaces_gives_the_memory_back() -> None:
    left, empty = in_a_fresh_process("t.bytes_left_after_deleting()")
    assert empty
    assert left / PODS < 64, f"{left} B left behind"
