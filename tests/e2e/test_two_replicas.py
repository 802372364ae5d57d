"""The install's two replicas on the real cluster: leader election through the real Lease, GPU
reservations racing through a real ConfigMap's resourceVersion, and what each replica knows
after the other moved a project to another department."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import time

import pytest

from tests.e2e.conftest import Cluster, Obj, Result, _report
from tests.e2e.runai_steps import (
    admin_token,
    create_pod,
    delete_pods,
    ensure_department,
    gpu_notebook,
    in_standin,
    move,
    namespace_meta,
    review_pod,
    wait_bound,
)
from tests.e2e.test_kubectl import turn_runai_on
from tests.support.control_plane.audit import AuditEvent
from tests.support.control_plane.install import INSTALL_NS, LEASE, SERVICE_ACCOUNT_USER, Install

pytestmark = pytest.mark.slow


async def lease(cluster: Cluster) -> Obj:
    return dict((await cluster.get("lease", LEASE, INSTALL_NS))["spec"])


def holder_pod(spec: Obj) -> str:
    """The pod of the holder: an identity is `<pod name>_<random>` (unique per process)."""
    return str(spec.get("holderIdentity") or "").rsplit("_", 1)[0]


def micro_time(value: str) -> dt.datetime:
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)


def serving_pods(local: Install) -> set[str]:
    return {p["metadata"]["name"] for p in local.serving()}


async def current_leader(cluster: Cluster, local: Install) -> Obj:
    """The Lease once a serving replica holds it and renews it."""

    async def held() -> Obj | None:
        spec = await lease(cluster)
        return spec if holder_pod(spec) in serving_pods(local) else None

    return dict(await cluster.eventually(held, "a serving replica holding the Lease", 40))


async def test_one_replica_leads_hands_over_on_shutdown_and_is_replaced_after_a_crash(cluster: Cluster) -> None:
    local = cluster.needs_local("deletes and kills the install's pods")
    first = await current_leader(cluster, local)

    # A graceful stop (the pod deleted): the leader gives the Lease up on SIGTERM, and another
    # replica (the other one, or the ReplicaSet controller's replacement) takes it without waiting
    # for it to expire.
    await cluster.ok("delete", "pod", holder_pod(first), "-n", INSTALL_NS, "--wait=false")
    last_renewal = micro_time(first["renewTime"])
    deadline = time.monotonic() + 60
    while True:
        spec = await lease(cluster)
        if spec.get("holderIdentity") == first["holderIdentity"]:
            last_renewal = micro_time(spec["renewTime"])
        elif spec.get("holderIdentity"):
            break
        assert time.monotonic() < deadline, f"the Lease not taken over after {holder_pod(first)} was deleted: {spec}"
        await asyncio.sleep(0.2)
    second = spec
    assert holder_pod(second) != holder_pod(first)
    assert (micro_time(second["acquireTime"]) - last_renewal).total_seconds() < second["leaseDurationSeconds"], (
        "taken over only once expired: the leader did not release it", first, second)  # fmt: skip
    assert second.get("leaseTransitions", 0) > first.get("leaseTransitions", 0)
    await asyncio.to_thread(local.ensure_running)  # the ReplicaSet controller's replacement serves

    # A crash (SIGKILL): nothing is released, so nobody takes over before the Lease has expired.
    crashed = await current_leader(cluster, local)
    await asyncio.to_thread(local.kill, holder_pod(crashed))
    last_renewal = micro_time((await lease(cluster))["renewTime"])

    async def taken_by_another_process() -> Obj | None:
        spec = await lease(cluster)
        return spec if spec.get("holderIdentity") not in ("", crashed["holderIdentity"]) else None

    third = dict(await cluster.eventually(taken_by_another_process, "the Lease taken after the crash", 60))
    waited = (micro_time(third["acquireTime"]) - last_renewal).total_seconds()
    # Not before the crashed holder's lease ran out (a second of slack for the two clocks' rounding).
    assert waited >= third["leaseDurationSeconds"] - 1, (crashed, third)
    assert third.get("leaseTransitions", 0) > crashed.get("leaseTransitions", 0)
    await asyncio.to_thread(local.ensure_running)


async def test_no_replica_reconciles_while_another_holds_the_lease(cluster: Cluster) -> None:
    local = cluster.needs_local("takes the install's Lease")
    await turn_runai_on(cluster)
    local.hold_leadership_elsewhere()
    try:
        project = await cluster.project("waiting")
        await asyncio.sleep(6)  # several of the leader's passes, had one of them led
        assert "runai/queue" not in (await namespace_meta(cluster, project)).get("labels", {})
        assert in_standin(local, lambda: local.runai.project(project)) is None
    finally:
        local.release_leadership()
    await wait_bound(cluster, project, 40)
    assert holder_pod(await lease(cluster)) in serving_pods(local)


async def race(cluster: Cluster, project: str, count: int) -> list[Result]:
    return list(await asyncio.gather(*(create_pod(cluster, gpu_notebook(f"nb-{i}", project)) for i in range(count))))


def reservation_writes(local: Install, since: int, project: str) -> list[AuditEvent]:
    return [e for e in local.cp.audit.events(since, user=SERVICE_ACCOUNT_USER)
            if e.name == f"gpu-reservations.{project}" and e.is_write]  # fmt: skip


async def reservations_of(cluster: Cluster, project: str) -> Obj:
    return dict((await cluster.get("configmap", f"gpu-reservations.{project}", INSTALL_NS)).get("data") or {})


async def test_two_replicas_racing_for_the_last_gpus_admit_exactly_the_quota(
    cluster: Cluster, pytestconfig: pytest.Config
) -> None:
    local = cluster.needs_local("reads the apiserver's audit log")
    await turn_runai_on(cluster)
    # As users race: eight kubectl runs for a quota of 2.
    project = await cluster.project("race")
    await wait_bound(cluster, project)
    since = local.cp.audit.mark()
    results = await race(cluster, project, 8)
    assert len([r for r in results if r.rc == 0]) == 2, [str(r) for r in results]
    for stderr in (r.stderr for r in results if r.rc != 0):
        assert re.search(rf"project {project} has 0 of 2 deserved GPUs left", stderr), stderr
    assert len(await reservations_of(cluster, project)) == 2
    conflicts = [str(e) for e in reservation_writes(local, since, project) if e.code == 409]

    # kubectl's processes start a few milliseconds apart and may never collide: reviews sent at
    # once to both replicas (each on a connection of its own) do, until the apiserver has answered
    # one of their writes 409.
    template = (await cluster.list("pods", project))[0]  # as our mutating webhook labelled it
    for attempt in range(5):
        if conflicts:
            break
        project = await cluster.project(f"race{attempt}")
        await wait_bound(cluster, project)
        await cluster.eventually(lambda p=project: _quota_known(local, template, p), f"{project}'s quota known", 30)
        since = local.cp.audit.mark()
        answers = await asyncio.gather(*(review_pod(local, "/validate/pods", _as(template, project, f"nb-{i}"),
                                                    dry_run=False) for i in range(16)))  # fmt: skip
        assert len([a for a in answers if a["allowed"]]) == 2, answers
        for answer in (a for a in answers if not a["allowed"]):
            assert f"project {project} has 0 of 2 deserved GPUs left" in answer["status"]["message"], answer
        assert len(await reservations_of(cluster, project)) == 2
        conflicts = [str(e) for e in reservation_writes(local, since, project) if e.code == 409]
    # The loser of a collision got 409 from the apiserver, read again, and refused or took a GPU left.
    assert conflicts, "no two reservation writes collided"
    _report(pytestconfig, f"\nreservation race: {len(conflicts)} writes answered 409: {conflicts}")


def _as(template: Obj, project: str, name: str) -> Obj:
    """The mutated pod (labels from our mutating webhook), renamed, in `project`."""
    meta = template["metadata"]
    labels = {**meta.get("labels", {}), "runai/queue": project}
    return {"apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
            "metadata": {"name": name, "namespace": project, "labels": labels,
                         "annotations": meta.get("annotations", {})}}  # fmt: skip


async def _quota_known(local: Install, template: Obj, project: str) -> bool:
    """Both replicas (asked over fresh connections) decide on the project's quota, not a retry."""
    answers = [await review_pod(local, "/validate/pods", _as(template, project, "probe")) for _ in range(6)]
    return all(a["allowed"] for a in answers)


async def test_after_a_move_neither_replica_admits_on_the_replaced_projects_quota(cluster: Cluster) -> None:
    """The move deletes the Run:ai project and creates one in the new department, without quota.
    The replica that did not carry it out must not go on counting against the old project."""
    local = cluster.needs_local("needs the Run:ai stand-in and the admin API")
    await turn_runai_on(cluster)
    await ensure_department(cluster, local, "moved-dept")
    # The directory would otherwise catch up within 15 s and hide a replica still on the old project.
    await cluster.settings(run_ai_directory_refresh_s="600")
    await asyncio.sleep(1.5)  # the last 1 s refresh wait is over (setup)
    token = await admin_token(cluster)
    project = await cluster.project("mover")
    await wait_bound(cluster, project)
    first = await create_pod(cluster, gpu_notebook("before", project))
    assert first.rc == 0, str(first)
    stored = await cluster.get("pod", "before", project)  # as our mutating webhook labelled it
    await delete_pods(cluster, project)
    answer = await move(local, token, project, "moved-dept")
    assert answer["outcome"] == "moved", answer
    new = in_standin(local, lambda: local.runai.project(project))
    assert new is not None and [r["gpu"]["deserved"] for r in new["resources"]] == [0]

    # Through the apiserver, as users create pods: never admitted.
    results = await asyncio.gather(*(
        create_pod(cluster, gpu_notebook(f"after-{i}", project), "--dry-run=server") for i in range(8)
    ))  # fmt: skip
    for r in results:
        assert r.rc != 0 and f"project {project} has 0 of 0 deserved GPUs left" in r.stderr, str(r)
    # The apiserver keeps its connections, so it may have asked one replica only: ask both, each
    # review on a connection of its own, until each replica has refused some.
    mutated = {"apiVersion": "v1", "kind": "Pod", "metadata": {k: v for k, v in stored["metadata"].items()
               if k in ("name", "namespace", "labels", "annotations")}, "spec": stored["spec"]}  # fmt: skip

    def denied() -> list[float]:
        return local.metric("webhook_admission_requests_total", endpoint="validate_pods", outcome="denied")

    before = denied()
    for _ in range(40):
        answer = await review_pod(local, "/validate/pods", mutated)
        assert not answer["allowed"], f"admitted on the old project's quota: {answer}"
        assert f"project {project} has 0 of 0 deserved GPUs left" in answer["status"]["message"], answer
        if all(b >= a + 3 for a, b in zip(before, denied(), strict=True)):
            break
    assert all(b >= a + 3 for a, b in zip(before, denied(), strict=True)), (before, denied())
