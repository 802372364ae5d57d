"""Leader election on a coordination.k8s.io/v1 Lease in the real apiserver, as the webhook's
ServiceAccount with the chart's RBAC (tests/support/kube_scope.py), through the fault proxy for
renewals refused with 500; and the elector's own bookkeeping. One leader of two, the hand-over on
a graceful stop, the take-over after a crash and stepping down for another holder are proven with
the install's replicas and the real Lease in tests/e2e/test_two_replicas.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from tests.support.control_plane.fault_proxy import FaultProxy
from tests.support.fixtures import remote_calls
from tests.support.https import wait_until
from tests.support.kube_scope import KubeScope
from webhook.kube.leader import LeaderElector, LeaseTiming
from webhook.runai.integration import keep_running

LEASE = "scheduling-webhook-leader"  # the one Lease the chart's Role lets the webhook read and renew
TIMING = LeaseTiming(lease_duration_s=1.0, renew_deadline_s=0.5, retry_period_s=0.1, request_timeout_s=1.0)


class Candidate:
    """One process campaigning as the webhook's ServiceAccount, through the test's fault proxy:
    its own API client, an elector, and work that records its life."""

    def __init__(self, api: ApiClient, namespace: str, identity: str) -> None:
        self.api = api
        self.working = False
        self.work_started = 0
        self.work_cancelled = 0
        self.elector = LeaderElector(
            self.api, namespace, LEASE, identity=identity, timing=TIMING, on_started_leading=self.work
        )

    @classmethod
    async def of(cls, proxy: FaultProxy, scope: KubeScope, identity: str) -> Candidate:
        return cls(await proxy.api_client_via(scope.kubeconfig), scope.install_ns, identity)

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
async def candidates() -> AsyncIterator[list[Candidate]]:
    made: list[Candidate] = []
    yield made
    for c in made:
        await c.stop()


async def lease(scope: KubeScope) -> dict[str, Any]:
    obj = await scope.get("coordination.k8s.io/v1", "Lease", LEASE, scope.install_ns)
    assert obj is not None
    return dict(obj["spec"])


async def test_lease_calls_are_counted_as_background(
    fault_proxy: FaultProxy, kube_scope: KubeScope, candidates: list[Candidate]
) -> None:
    before = remote_calls("kubernetes", "background")
    a = await (await Candidate.of(fault_proxy, kube_scope, "a")).start()
    candidates.append(a)
    await wait_until(lambda: a.elector.is_leader, within=10, what="leader")
    after = remote_calls("kubernetes", "background")
    assert after - before >= 2  # a read and a create at least
    assert fault_proxy.calls(verb="get", resource="leases", name=LEASE)
    assert (await lease(kube_scope))["holderIdentity"] == "a"


async def test_losing_the_lease_stops_the_work(
    fault_proxy: FaultProxy, kube_scope: KubeScope, candidates: list[Candidate]
) -> None:
    a = await (await Candidate.of(fault_proxy, kube_scope, "a")).start()
    candidates.append(a)
    await wait_until(lambda: a.elector.is_leader and a.working, within=10, what="a leads")
    # The API server stops accepting lease updates: a cannot renew, and stops working once its
    # renew deadline has passed (how soon is the elector's timing, not this test's business).
    refused = fault_proxy.fail(500, n=None, verb="update", resource="leases")
    await wait_until(lambda: not a.working, within=10, what="work cancelled")
    assert not a.elector.is_leader and a.work_cancelled == 1
    assert refused.hits >= 1
    # Renewals possible again: a (still campaigning) leads again.
    refused.remove()
    await wait_until(lambda: a.elector.is_leader and a.working, within=10, what="a leads again")
    assert a.work_started == 2


def test_timing_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="retry_period_s < renew_deadline_s < lease_duration_s"):
        LeaseTiming(lease_duration_s=1, renew_deadline_s=2, retry_period_s=0.1)


async def test_the_successor_names_the_holders_it_took_the_lease_over_from(
    fault_proxy: FaultProxy, kube_scope: KubeScope, candidates: list[Candidate]
) -> None:
    # What lets a new leader resume a dead leader's department move at once.
    a = await (await Candidate.of(fault_proxy, kube_scope, "a")).start()
    await wait_until(lambda: a.elector.is_leader, within=10, what="a leads")
    b = await (await Candidate.of(fault_proxy, kube_scope, "b")).start()
    candidates.append(b)
    await wait_until(lambda: b.elector.holder == "a", within=10, what="b has seen a hold it")
    assert not b.elector.predecessors
    await a.stop(release=False)  # killed: the Lease lapses
    await wait_until(lambda: b.elector.is_leader, within=10, what="b takes over")
    assert b.elector.predecessors == ("a",)

    c = await (await Candidate.of(fault_proxy, kube_scope, "c")).start()
    candidates.append(c)
    await wait_until(lambda: c.elector.holder == "b", within=10, what="c has seen b hold it")
    await b.stop(release=True)  # a graceful stop releases it: c knows b held it
    candidates.remove(b)
    await wait_until(lambda: c.elector.is_leader, within=10, what="c takes over")
    assert c.elector.predecessors == ("b",)
    assert a.elector.predecessors == ()  # the first leader took it over from nobody


async def test_leader_work_that_fails_starts_again_and_ends_when_it_returns() -> None:
    """A leader's work (the reconciler, the policy writer) that raises is started again after a
    backoff: otherwise the replica keeps the Lease with that work stopped until it restarts."""
    calls: list[int] = []

    async def work() -> None:
        calls.append(len(calls))
        if len(calls) < 3:
            raise ValueError("a stored object the pass cannot handle")

    await asyncio.wait_for(keep_running(work, backoff=0.01, backoff_max=0.02), timeout=5)
    assert calls == [0, 1, 2]
