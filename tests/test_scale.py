"""The pod cache keeps a slim record per pod, whatever the pod's size (no timings here: those are
in `python -m bench.scale`)."""

from __future__ import annotations

import gc
import tracemalloc
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


@pytest.mark.slow
def test_memory_per_pod_is_bounded_and_does_not_grow_with_the_pod() -> None:
    slim = traced_bytes_per_pod(new_state(), kib=0)
    big = traced_bytes_per_pod(new_state(), kib=8)
    assert slim <= MAX_BYTES_PER_POD, f"{slim:.0f} B per pod record"
    # An 8 KiB pod must not cost more than a small one: the cache never keeps the object.
    assert big <= MAX_BYTES_PER_POD, f"{big:.0f} B per 8 KiB pod"
    assert abs(big - slim) <= 0.1 * slim, (slim, big)


def _cache_everything_once(pods: int) -> None:
    """Module-level tables made on first use (memos, metric children, interned names) are no
    per-pod cost: another store makes them before the measured one starts, whatever ran before."""
    warm = new_state()
    for i in range(pods):
        warm.apply(pod_object(i, NAMESPACES))
    for i in range(pods):
        warm.delete(pod_object(i, NAMESPACES))
    for n in range(NAMESPACES):
        warm.delete({"kind": "Namespace", "metadata": {"name": f"project-{n:05d}"}})


def test_deleting_pods_and_namespaces_gives_the_memory_back() -> None:
    _cache_everything_once(200)
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
    assert state.pods == {}
    assert (after - before) / PODS < 64, f"{after - before} B left behind"
