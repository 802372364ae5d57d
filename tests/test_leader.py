"""Leader election on a coordination.k8s.io/v1 Lease, against the Kubernetes API emulator over HTTP:
what the real apiserver cannot be made to do (renewals refused with 500) and the elector's own
bookkeeping. One leader of two, the hand-over on a graceful stop, the take-over after a crash and
stepping down for another holder are proven with the install's replicas and the real Lease in
tests/e2e/test_two_replicas.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from tests.support.fixtures import Obj, remote_calls
from tests.support.https import wait_until
from tests.support.kube_emulator import KubeEmulator
from webhook.kube.leader import LeaderElector, LeaseTiming

NS = "hopsworks"
LEASE = "scheduling-webhook-leader"
TIMING = LeaseTiming(lease_duration_s=1.0, renew_deadline_s=0.5, retry_period_s=0.1, request_timeout_s=1.0)


@pytest.fixture
def kube_objects() -> list[Obj]:
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}]


class Candidate:
    """One process campaigning: its own API client, an elector, and work that records its life."""

    def __init__(self, kube: KubeEmulator, identity: str) -> None:
        self.api: ApiClient = kube.api_client()
        self.working = False
        self.work_started = 0
        self.work_cancelled = 0
        self.elector = LeaderElector(
            self.api, NS, LEASE, identity=identity, timing=TIMING, on_started_leading=self.work
        )

    async def work(self) -> None:
        self.working = True
        self.work_started += 1
        try:
            await asyncio.Event().wait()
        finally:
            self.working = False
            self.work_cancelled += 1

    async def start(self) -> Candidate:
        await self.elector.start()
        return self

    async def stop(self, release: bool = True) -> None:
        await self.elector.stop(release=release)
        await self.api.close()


@pytest.fixture
async def candidates(kube: KubeEmulator) -> AsyncIterator[list[Candidate]]:
    made: list[Candidate] = []
    yield made
    for c in made:
        await c.stop()


def lease(kube: KubeEmulator) -> dict[str, Any]:
    obj = kube.get_object("Lease", LEASE, NS)
    assert obj is not None
    return obj["spec"]


async def test_lease_calls_are_counted_as_background(kube: KubeEmulator, candidates: list[Candidate]) -> None:
    before = remote_calls("kubernetes", "background")
    a = await Candidate(kube, "a").start()
    candidates.append(a)
    await wait_until(lambda: a.elector.is_leader, within=3, what="leader")
    after = remote_calls("kubernetes", "background")
    assert after - before >= 2  # a read and a create at least
    assert kube.calls("GET", "/apis/coordination.k8s.io/v1/namespaces/hopsworks/leases/")


async def test_losing_the_lease_stops_the_work_at_once(kube: KubeEmulator, candidates: list[Candidate]) -> None:
    a = await Candidate(kube, "a").start()
    candidates.append(a)
    await wait_until(lambda: a.elector.is_leader and a.working, within=3, what="a leads")
    # The API server stops accepting lease updates: a cannot renew.
    kube.fail_next(10_000, 500, path_prefix="/apis/coordination.k8s.io", method="PUT")
    failed_at = time.monotonic()
    await wait_until(lambda: not a.working, within=3, what="work cancelled")
    assert time.monotonic() - failed_at < TIMING.renew_deadline_s + TIMING.retry_period_s * 3
    assert not a.elector.is_leader and a.work_cancelled == 1
    # Renewals possible again: a (still campaigning) leads again.
    kube.clear_faults()
    await wait_until(lambda: a.elector.is_leader and a.working, within=4, what="a leads again")
    assert a.work_started == 2


def test_timing_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="retry_period_s < renew_deadline_s < lease_duration_s"):
        LeaseTiming(lease_duration_s=1, renew_deadline_s=2, retry_period_s=0.1)


async def test_the_successor_names_the_holders_it_took_the_lease_over_from(
    kube: KubeEmulator, candidates: list[Candidate]
) -> None:
    # What lets a new leader resume a dead leader's department move at once (issue 21, item 6).
    a = await Candidate(kube, "a").start()
    await wait_until(lambda: a.elector.is_leader, within=3, what="a leads")
    b = await Candidate(kube, "b").start()
    candidates.append(b)
    await asyncio.sleep(0.3)
    assert b.elector.predecessors == ()
    await a.stop(release=False)  # killed: the Lease lapses
    await wait_until(lambda: b.elector.is_leader, within=4, what="b takes over")
    assert b.elector.predecessors == ("a",)

    c = await Candidate(kube, "c").start()
    candidates.append(c)
    await asyncio.sleep(0.3)  # c has seen b hold it
    await b.stop(release=True)  # a graceful stop releases it: c knows b held it
    candidates.remove(b)
    await wait_until(lambda: c.elector.is_leader, within=3, what="c takes over")
    assert c.elector.predecessors == ("b",)
    assert a.elector.predecessors == ()  # the first leader took it over from nobody
