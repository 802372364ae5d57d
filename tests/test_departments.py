"""Department moves and deletes (R5) on the real control plane (a KubeScope of the shared cluster)
and the Run:ai stand-in, over HTTPS and HTTP.

The mover acts as the webhook's ServiceAccount with the chart's RBAC; the namespaces are the
test's own (their names carry the scope's id). Every Run:ai request and answer is checked against
runai-openapi.json by the stand-in; the fixture fails a test that caused a violation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import namespace as namespace_obj
from tests.support.control_plane.fault_proxy import FaultProxy
from tests.support.departments import Env, environment
from tests.support.kube_scope import SERVICE_ACCOUNT, KubeScope
from webhook.runai import RunaiClient
from webhook.runai.departments import (
    MOVE_ANNOTATION,
    DepartmentMover,
    InvalidDepartment,
    MoveInProgress,
    MovePending,
    MoveRolledBack,
    ProjectBusy,
    UnknownNamespace,
)
from webhook.snapshot import DEPARTMENT_LABEL, RUNAI_PROJECT_ID_LABEL, RUNAI_QUEUE_LABEL, NamespaceInfo


class Crash(Exception):
    """Stands for the process dying at a checkpoint of the move."""


@pytest.fixture
async def env(tmp_path: Path, kube_scope: KubeScope) -> AsyncIterator[Env]:
    async with environment(tmp_path, kube_scope) as e:
        yield e


# -- nothing to do in Run:ai --------------------------------------------------------------------


async def test_move_between_departments_of_the_same_runai_department_only_relabels(env: Env) -> None:
    p1 = env.name("p1")
    await env.project_ns(p1)
    # "finance" is no Run:ai department, so it maps to the default one, like the absent label.
    mover = env.mover(runai_departments=lambda: {"default", "ml", "research"})
    result = await mover.move_project(p1, "finance")
    assert result.outcome == "label-only"
    assert "both map to Run:ai department default" in result.message
    assert (await env.labels(p1))[DEPARTMENT_LABEL] == "finance"
    assert env.runai.requests == []  # not even a token


async def test_move_of_an_unbound_namespace_only_relabels(env: Env) -> None:
    p1 = env.name("p1")
    await env.project_ns(p1, bound=False)
    result = await env.mover().move_project(p1, "ml")
    assert result.outcome == "label-only" and "not bound" in result.message
    assert (await env.labels(p1))[DEPARTMENT_LABEL] == "ml"
    assert env.runai.requests == []


async def test_move_of_an_adopted_project_only_relabels_and_reports_drift(env: Env) -> None:
    p1 = env.name("p1")
    project = await env.project_ns(p1, created_here=False)
    assert project is not None
    result = await env.mover().move_project(p1, "ml")
    assert result.outcome == "label-only" and result.drift
    assert "RUN_AI_DEPARTMENT_DRIFT" in result.message
    assert (await env.labels(p1))[DEPARTMENT_LABEL] == "ml"
    assert env.runai.requests == []
    assert env.runai_department_of(env.runai.projects[project["id"]]) == "default"
    assert await env.events("RunaiDepartmentDrift")


async def test_invalid_department_name_and_unknown_namespace_are_refused(env: Env) -> None:
    p1, nope = env.name("p1"), env.name("nope")
    await env.project_ns(p1)
    with pytest.raises(InvalidDepartment) as bad:
        await env.mover().move_project(p1, "Not_A-Name-")
    assert bad.value.status == 400
    with pytest.raises(UnknownNamespace) as missing:
        await env.mover().move_project(nope, "ml")
    assert missing.value.status == 404
    assert env.runai.requests == []


# -- busy projects ------------------------------------------------------------------------------


async def test_move_is_refused_while_pods_run_or_wait_and_names_them(env: Env) -> None:
    p1 = env.name("p1")
    project = await env.project_ns(p1)
    assert project is not None
    env.pod(p1, "notebook-0", "Running")
    env.pod(p1, "job-7", "Pending")
    env.pod(p1, "old-job", "Succeeded")
    with pytest.raises(ProjectBusy) as busy:
        await env.mover().move_project(p1, "ml")
    assert busy.value.status == 409
    assert busy.value.pods == ["job-7", "notebook-0"]
    assert "notebook-0" in busy.value.message and "job-7" in busy.value.message
    assert "old-job" not in busy.value.message
    assert env.runai_writes() == []
    assert project["id"] in env.runai.projects
    assert DEPARTMENT_LABEL not in await env.labels(p1)
    assert await env.intent(p1) is None


async def test_busy_message_caps_the_pods_it_names(env: Env) -> None:
    p1 = env.name("p1")
    await env.project_ns(p1)
    for i in range(14):
        env.pod(p1, f"worker-{i:02d}", "Unknown")
    with pytest.raises(ProjectBusy) as busy:
        await env.mover().move_project(p1, "ml")
    assert "and 4 more" in busy.value.message and "worker-13" not in busy.value.message


async def test_finished_pods_do_not_block_a_move(env: Env) -> None:
    p1 = env.name("p1")
    await env.project_ns(p1)
    env.pod(p1, "done", "Succeeded")
    env.pod(p1, "crashed", "Failed")
    result = await env.mover().move_project(p1, "ml")
    assert result.outcome == "moved"


# -- the move -----------------------------------------------------------------------------------


async def test_move_recreates_the_runai_project_in_the_new_department_without_quota(env: Env) -> None:
    p1 = env.name("p1")
    old = await env.project_ns(p1, gpu_quota=3)
    assert old is not None
    seen: dict[str, Any] = {}

    async def checkpoint(phase: str) -> None:
        # What a crash at this point would leave behind.
        seen[phase] = (await env.intent(p1), old["id"] in env.runai.projects)

    result = await env.mover(checkpoint=checkpoint).move_project(p1, "ml")

    intent_at_start, old_there = seen["intent"]
    assert intent_at_start["phase"] == "started" and old_there  # recorded before Run:ai is touched
    assert intent_at_start["project"]["id"] == old["id"]
    assert intent_at_start["project"]["resources"][0]["gpu"]["deserved"] == 3
    assert intent_at_start["runaiFrom"]["name"] == "default" and intent_at_start["runaiTo"]["name"] == "ml"
    after_delete, old_there = seen["deleted"]
    assert after_delete["phase"] == "deleted" and not old_there
    assert seen["created"][0]["phase"] == "created"

    assert result.outcome == "moved"
    assert old["id"] not in env.runai.projects
    new = env.runai.project(p1)
    assert new is not None and new["id"] == result.new_project_id != old["id"]
    assert env.runai_department_of(new) == "ml"
    assert new["requestedNamespace"] == p1
    assert [r["gpu"]["deserved"] for r in new["resources"]] == [0]
    labels = await env.labels(p1)
    assert labels[DEPARTMENT_LABEL] == "ml"
    assert labels[RUNAI_PROJECT_ID_LABEL] == new["id"]
    assert labels[RUNAI_QUEUE_LABEL] == p1
    assert await env.intent(p1) is None
    assert result.reminder and "GPU quota and access rules" in result.reminder
    events = await env.events("RunaiProjectMoved")
    assert len(events) == 1 and "Re-add GPU quota and access rules" in events[0]["message"]
    assert events[0]["involvedObject"]["kind"] == "Namespace" and events[0]["involvedObject"]["name"] == p1
    assert env.runai_writes() == [
        ("DELETE", f"/api/v1/org-unit/projects/{old['id']}"),
        ("POST", "/api/v1/org-unit/projects"),
    ]


async def test_move_to_the_default_department_removes_the_label(env: Env) -> None:
    p1 = env.name("p1")
    await env.project_ns(p1, department="ml", runai_department="ml")
    result = await env.mover().move_project(p1, None)
    assert result.outcome == "moved"
    assert DEPARTMENT_LABEL not in await env.labels(p1)
    new = env.runai.project(p1)
    assert new is not None and env.runai_department_of(new) == "default"


async def test_move_waits_for_runai_to_finish_an_asynchronous_delete(env: Env) -> None:
    p1 = env.name("p1")
    env.runai.delete_status, env.runai.delete_delay_s = 202, 0.3
    await env.project_ns(p1)
    result = await env.mover().move_project(p1, "ml")
    assert result.outcome == "moved"
    new = env.runai.project(p1)
    assert new is not None and env.runai_department_of(new) == "ml"


def _with_scheduling_settings(env: Env, project: dict[str, Any]) -> None:
    """Quota on two node pools with limits, weights and priority, node-pool order, scheduling rules."""
    gpu_pool = env.runai.add_node_pool("a100", total_gpus=16)
    default_pool = env.runai.default_node_pool()
    project["resources"] = [
        {
            "nodePool": {"id": default_pool["id"], "name": "default"},
            "gpu": {"deserved": 2, "limit": 4, "overQuotaWeight": 3},
            "priority": "High",
        },
        {"nodePool": {"id": gpu_pool["id"], "name": "a100"}, "gpu": {"deserved": 1, "limit": 2, "overQuotaWeight": 1}},
    ]
    project["schedulingRules"] = {"interactiveJobTimeLimitSeconds": 3600, "trainingJobMaxIdleDurationSeconds": 600}
    project["defaultNodePools"] = ["a100", "default"]
    project["description"] = "team p1"


async def test_failed_create_rolls_back_to_the_old_department_with_old_quota_and_settings(env: Env) -> None:
    p1 = env.name("p1")
    old = await env.project_ns(p1, department="research", runai_department="research")
    assert old is not None
    _with_scheduling_settings(env, old)
    expected_resources = json.loads(json.dumps(old["resources"]))
    env.runai.fail_project_create_in("ml", status=400)

    with pytest.raises(MoveRolledBack) as failed:
        await env.mover().move_project(p1, "ml")

    assert failed.value.status == 409
    message = failed.value.message
    assert "could not be created in Run:ai department ml" in message and "HTTP 400" in message
    assert "access rules" in message and "not restored" in message
    restored = env.runai.project(p1)
    assert restored is not None and restored["id"] != old["id"]
    assert env.runai_department_of(restored) == "research"
    assert restored["requestedNamespace"] == p1
    assert restored["resources"] == expected_resources
    assert restored["schedulingRules"] == old["schedulingRules"]
    assert restored["defaultNodePools"] == ["a100", "default"]
    labels = await env.labels(p1)
    assert labels[DEPARTMENT_LABEL] == "research"
    # The re-created project has a new id: the namespace keeps owning it.
    assert labels[RUNAI_PROJECT_ID_LABEL] == restored["id"]
    assert await env.intent(p1) is None
    assert failed.value.result is not None and failed.value.result.outcome == "rolled-back"
    assert await env.events("RunaiProjectMoveFailed")
    assert not await env.events("RunaiProjectMoved")


async def test_create_failing_because_runai_is_unreachable_rolls_back_with_503(env: Env) -> None:
    p1 = env.name("p1")
    await env.project_ns(p1)
    env.runai.fail_project_create_in("ml", status=503)
    with pytest.raises(MoveRolledBack) as failed:
        await env.mover().move_project(p1, "ml")
    assert failed.value.status == 503
    restored = env.runai.project(p1)
    assert restored is not None and env.runai_department_of(restored) == "default"
    assert [r["gpu"]["deserved"] for r in restored["resources"]] == [2]


async def test_runai_unreachable_before_anything_changed_answers_503_and_changes_nothing(env: Env) -> None:
    p1 = env.name("p1")
    old = await env.project_ns(p1)
    assert old is not None
    await env.runai.stop_listening()
    with pytest.raises(Exception) as failed:
        await env.mover().move_project(p1, "ml")
    assert getattr(failed.value, "status", None) == 503
    await env.runai.resume()
    assert old["id"] in env.runai.projects
    assert DEPARTMENT_LABEL not in await env.labels(p1) and await env.intent(p1) is None


# -- the lock -----------------------------------------------------------------------------------


async def test_a_second_move_of_the_same_namespace_is_refused_while_one_runs(env: Env) -> None:
    p1 = env.name("p1")
    await env.project_ns(p1)
    reached, release = asyncio.Event(), asyncio.Event()

    async def hold(phase: str) -> None:
        if phase == "deleted":
            reached.set()
            await release.wait()

    first = asyncio.create_task(env.mover(checkpoint=hold).move_project(p1, "ml"))
    await asyncio.wait_for(reached.wait(), 5)
    with pytest.raises(MoveInProgress) as refused:
        await env.mover(instance="replica-2").move_project(p1, "research")
    assert refused.value.status == 409 and "in progress" in refused.value.message
    # A recoverer on another replica leaves a live move alone.
    assert await env.mover(instance="replica-2").recover(p1) is None
    release.set()
    result = await first
    assert result.outcome == "moved" and (await env.labels(p1))[DEPARTMENT_LABEL] == "ml"
    assert len([p for p in env.runai.projects.values() if p["name"] == p1]) == 1


async def test_concurrent_moves_from_two_replicas_let_exactly_one_through(env: Env) -> None:
    p1 = env.name("p1")
    await env.project_ns(p1)
    results = await asyncio.gather(
        env.mover(instance="replica-1").move_project(p1, "ml"),
        env.mover(instance="replica-2").move_project(p1, "research"),
        return_exceptions=True,
    )
    moved = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, MoveInProgress)]
    assert len(moved) == 1 and len(refused) == 1, results
    projects = [p for p in env.runai.projects.values() if p["name"] == p1]
    assert len(projects) == 1
    assert env.runai_department_of(projects[0]) == (await env.labels(p1))[DEPARTMENT_LABEL]


# -- crash safety -------------------------------------------------------------------------------


def _crash_at(point: str) -> Any:
    async def checkpoint(phase: str) -> None:
        if phase == point:
            raise Crash(phase)

    return checkpoint


def _later(seconds: float) -> Any:
    return lambda: time.time() + seconds


async def test_a_move_interrupted_after_the_delete_is_finished_by_recover(env: Env) -> None:
    p1 = env.name("p1")
    old = await env.project_ns(p1)
    assert old is not None
    with pytest.raises(Crash):
        await env.mover(checkpoint=_crash_at("deleted")).move_project(p1, "ml")
    assert (await env.intent(p1))["phase"] == "deleted"  # type: ignore[index]
    assert env.runai.project(p1) is None  # between delete and create: nothing in Run:ai

    # The new leader leaves the intent alone while its holder may still be alive...
    assert await env.mover(instance="leader-2").recover(p1) is None
    # ...and takes it over once the holder's heartbeat is old.
    outcomes = await env.mover(instance="leader-2", clock=_later(600)).recover_all()

    assert len(outcomes) == 1 and not isinstance(outcomes[0], Exception)
    assert outcomes[0].outcome == "moved"
    new = env.runai.project(p1)
    assert new is not None and env.runai_department_of(new) == "ml"
    assert [r["gpu"]["deserved"] for r in new["resources"]] == [0]
    labels = await env.labels(p1)
    assert labels[DEPARTMENT_LABEL] == "ml" and labels[RUNAI_PROJECT_ID_LABEL] == new["id"]
    assert await env.intent(p1) is None
    assert await env.events("RunaiProjectMoved")
    assert await env.mover(instance="leader-2", clock=_later(600)).recover_all() == []


async def test_a_move_interrupted_after_the_create_is_finished_without_a_second_project(env: Env) -> None:
    p1 = env.name("p1")
    await env.project_ns(p1)
    with pytest.raises(Crash):
        await env.mover(checkpoint=_crash_at("created")).move_project(p1, "ml")
    created = env.runai.project(p1)
    assert created is not None
    result = await env.mover(instance="leader-2", clock=_later(600)).recover(p1)
    assert result is not None and result.outcome == "moved"
    assert [p["id"] for p in env.runai.projects.values() if p["name"] == p1] == [created["id"]]
    assert (await env.labels(p1))[RUNAI_PROJECT_ID_LABEL] == created["id"]


async def test_recover_rolls_back_when_the_new_department_create_fails(env: Env) -> None:
    p1 = env.name("p1")
    old = await env.project_ns(p1, gpu_quota=5)
    assert old is not None
    with pytest.raises(Crash):
        await env.mover(checkpoint=_crash_at("deleted")).move_project(p1, "ml")
    env.runai.fail_project_create_in("ml", status=400)

    outcomes = await env.mover(instance="leader-2", clock=_later(600)).recover_all()

    assert len(outcomes) == 1 and isinstance(outcomes[0], MoveRolledBack)
    restored = env.runai.project(p1)
    assert restored is not None and env.runai_department_of(restored) == "default"
    assert [r["gpu"]["deserved"] for r in restored["resources"]] == [5]
    labels = await env.labels(p1)
    assert DEPARTMENT_LABEL not in labels and labels[RUNAI_PROJECT_ID_LABEL] == restored["id"]
    assert await env.intent(p1) is None


async def test_recover_keeps_the_intent_when_runai_cannot_take_the_project_anywhere(env: Env) -> None:
    p1 = env.name("p1")
    await env.project_ns(p1)
    with pytest.raises(Crash):
        await env.mover(checkpoint=_crash_at("deleted")).move_project(p1, "ml")
    ml, default = env.runai.fail_project_create_in("ml", 400), env.runai.fail_project_create_in("default", 400)
    outcomes = await env.mover(instance="leader-2", clock=_later(600)).recover_all()
    assert len(outcomes) == 1 and getattr(outcomes[0], "status", None) == 503
    assert await env.intent(p1) is not None  # not lost: the next pass tries again
    assert await env.events("RunaiProjectMovePending")
    ml.remaining = default.remaining = 0  # Run:ai works again
    outcomes = await env.mover(instance="leader-2", clock=_later(600)).recover_all()
    assert [getattr(o, "outcome", None) for o in outcomes] == ["moved"]
    assert await env.intent(p1) is None


async def test_a_move_interrupted_before_the_delete_is_abandoned_untouched(env: Env) -> None:
    p1 = env.name("p1")
    old = await env.project_ns(p1)
    assert old is not None
    with pytest.raises(Crash):
        await env.mover(checkpoint=_crash_at("intent")).move_project(p1, "ml")
    # The same process (its move gone) may settle its own intent at once.
    result = await env.mover().recover(p1)
    assert result is not None and result.outcome == "abandoned"
    assert env.runai.project(p1) == old and old["id"] in env.runai.projects
    assert DEPARTMENT_LABEL not in await env.labels(p1) and await env.intent(p1) is None
    assert env.runai_writes() == []


# -- department delete --------------------------------------------------------------------------


async def test_department_delete_moves_projects_one_at_a_time_and_stops_at_the_first_busy_one(env: Env) -> None:
    a1, b2, c3, other = env.name("a1"), env.name("b2"), env.name("c3"), env.name("other")
    for name in (a1, b2, c3):
        await env.project_ns(name, department="ml", runai_department="ml")
    await env.project_ns(other, department="research", runai_department="research")
    env.pod(b2, "notebook-0", "Running")

    result = await env.mover().delete_department("ml")

    assert [m.namespace for m in result.moved] == [a1]
    assert result.failed is not None and result.failed["namespace"] == b2
    assert result.failed["pods"] == ["notebook-0"] and result.status == 409
    assert result.remaining == [b2, c3]
    answer = result.to_json()
    assert answer["complete"] is False and answer["reminder"]
    assert DEPARTMENT_LABEL not in await env.labels(a1)
    moved = env.runai.project(a1)
    assert moved is not None and env.runai_department_of(moved) == "default"
    assert [r["gpu"]["deserved"] for r in moved["resources"]] == [0]
    for name in (b2, c3):
        assert (await env.labels(name))[DEPARTMENT_LABEL] == "ml"
        kept = env.runai.project(name)
        assert kept is not None and env.runai_department_of(kept) == "ml"
    assert (await env.labels(other))[DEPARTMENT_LABEL] == "research"

    # Deleted again once the notebook stopped: the rest move; the first stays where it went.
    env.state.delete(
        {"kind": "Pod", "metadata": {"namespace": b2, "name": "notebook-0", "uid": f"uid-{b2}-notebook-0"}}
    )
    again = await env.mover().delete_department("ml")
    assert again.complete and [m.namespace for m in again.moved] == [b2, c3]
    assert all(env.runai_department_of(env.runai.project(n) or {}) == "default" for n in (a1, b2, c3))


async def test_department_delete_when_the_namespace_list_is_refused_moves_nothing_and_says_so(
    tmp_path: Path, kube_scope: KubeScope
) -> None:
    token = await kube_scope.token(SERVICE_ACCOUNT, kube_scope.install_ns)
    async with FaultProxy(kube_scope.cp) as proxy, environment(tmp_path, kube_scope, proxy.api_client(token)) as env:
        a1 = env.name("a1")
        await env.project_ns(a1, department="ml", runai_department="ml")
        proxy.fail(403, n=1, verb="list", resource="namespaces")
        with pytest.raises(Exception) as failed:
            await env.mover().delete_department("ml")
        assert getattr(failed.value, "status", None) == 503, failed.value  # not "complete, 0 moved"
        assert proxy.calls(verb="list", resource="namespaces")  # the refusal was the list's
        assert (await env.labels(a1))[DEPARTMENT_LABEL] == "ml" and env.runai_writes() == []


async def test_move_publishes_projects_to_the_directory_and_uses_the_current_client(env: Env) -> None:
    p1 = env.name("p1")
    old = await env.project_ns(p1)
    assert old is not None
    notes: list[tuple[str, str]] = []

    class Notes:
        def note_project(self, namespace: str, project: Any) -> None:
            notes.append(("note", project.id))

        def forget_project(self, project_id: str) -> None:
            notes.append(("forget", project_id))

    clients: list[RunaiClient | None] = [None]
    mover = DepartmentMover(env.kapi, lambda: clients[-1], env.state, directory=Notes(), instance="r1")
    with pytest.raises(Exception) as unconfigured:
        await mover.move_project(p1, "ml")
    assert getattr(unconfigured.value, "status", None) == 503 and await env.intent(p1) is None
    clients.append(env.client)  # settings reloaded: Run:ai configured now
    result = await mover.move_project(p1, "ml")
    assert notes == [("forget", old["id"]), ("note", result.new_project_id)]


async def test_a_stalled_holder_whose_move_was_taken_over_deletes_nothing(env: Env) -> None:
    p1 = env.name("p1")
    old = await env.project_ns(p1)
    assert old is not None
    reached, release = asyncio.Event(), asyncio.Event()

    async def stall(phase: str) -> None:
        if phase == "intent":
            reached.set()
            await release.wait()

    first = asyncio.create_task(env.mover(checkpoint=stall).move_project(p1, "ml"))
    await asyncio.wait_for(reached.wait(), 5)
    # Its heartbeat looks old to another replica, which settles the move: nothing was deleted yet.
    result = await env.mover(instance="leader-2", clock=_later(600)).recover(p1)
    assert result is not None and result.outcome == "abandoned"
    release.set()
    with pytest.raises(MovePending):
        await first
    assert old["id"] in env.runai.projects and env.runai_writes() == []
    assert await env.intent(p1) is None and DEPARTMENT_LABEL not in await env.labels(p1)


async def test_the_leaders_reconcile_pass_settles_a_move_left_half_done(env: Env) -> None:
    p1 = env.name("p1")
    from webhook.runai.integration import IntegrationOptions, RunaiIntegration

    await env.project_ns(p1)
    with pytest.raises(Crash):
        await env.mover(checkpoint=_crash_at("deleted")).move_project(p1, "ml")
    env.state.apply(await env.ns(p1))
    integration = RunaiIntegration(
        env.state,
        env.api,
        env.kapi,
        lambda _: env.client,
        IntegrationOptions(install_namespace=env.scope.install_ns),
        mover=env.mover(instance="leader-2", clock=_later(600)),
    )
    report = await integration.reconciler.pass_once()
    assert not report.unavailable
    new = env.runai.project(p1)
    assert new is not None and env.runai_department_of(new) == "ml"
    assert await env.intent(p1) is None
    assert (await env.labels(p1))[RUNAI_PROJECT_ID_LABEL] == new["id"]


# -- a holder proven gone ------------------------------------------------------------------------


async def test_a_move_held_by_a_process_the_lease_was_taken_over_from_is_resumed_at_once(env: Env) -> None:
    p1 = env.name("p1")
    await env.project_ns(p1)
    with pytest.raises(Crash):
        await env.mover(checkpoint=_crash_at("deleted")).move_project(p1, "ml")
    # Its heartbeat is fresh: another process leaves it alone...
    assert await env.mover(instance="leader-2").recover(p1) is None
    # ...unless it took the Lease over from the holder, which proves the holder gone.
    successor = env.mover(instance="leader-2", holders_gone=lambda: ("replica-1",))
    outcomes = await successor.recover_all([NamespaceInfo.from_object(await env.ns(p1))])
    assert [getattr(o, "outcome", None) for o in outcomes] == ["moved"]
    new = env.runai.project(p1)
    assert new is not None and env.runai_department_of(new) == "ml" and await env.intent(p1) is None


@pytest.mark.slow
async def test_a_live_holder_keeps_its_move_by_its_heartbeat_and_loses_it_once_dead(env: Env) -> None:
    p1 = env.name("p1")
    old = await env.project_ns(p1)
    assert old is not None
    reached = asyncio.Event()

    async def stall(phase: str) -> None:
        if phase == "intent":
            reached.set()
            await asyncio.Event().wait()  # slow, but alive: only its heartbeat runs

    holder = asyncio.create_task(env.mover(checkpoint=stall, heartbeat_s=0.2).move_project(p1, "ml"))
    await asyncio.wait_for(reached.wait(), 5)
    # The heartbeat is written to the second; 2.5 s is five heartbeats plus that rounding.
    other = env.mover(instance="leader-2", stale_after_s=2.5)
    watched_until = time.monotonic() + 3.5  # longer than the lapse: only the heartbeat keeps it
    while time.monotonic() < watched_until:
        assert await other.recover(p1) is None
        assert await other.recover_all([NamespaceInfo.from_object(await env.ns(p1))]) == []
        assert other.next_check_at is not None  # when to look again
        await asyncio.sleep(0.25)
    holder.cancel()  # the holder dies: no more heartbeats
    with contextlib.suppress(asyncio.CancelledError):
        await holder
    died = time.monotonic()
    while (result := await other.recover(p1)) is None:
        assert time.monotonic() - died < 10, "never taken over"
        await asyncio.sleep(0.1)
    assert result.outcome == "abandoned"  # nothing was deleted yet: dropping the intent is the rollback
    assert old["id"] in env.runai.projects and await env.intent(p1) is None


async def test_a_cache_older_than_the_holders_heartbeat_still_says_when_to_look_again(env: Env) -> None:
    p1 = env.name("p1")
    await env.project_ns(p1)
    with pytest.raises(Crash):
        await env.mover(checkpoint=_crash_at("deleted")).move_project(p1, "ml")
    intent = await env.intent(p1)
    assert intent is not None
    stale = {**intent, "heartbeat": "2026-01-01T00:00:00Z"}  # what a lagging cache may still show
    cached = namespace_obj(p1, annotations={MOVE_ANNOTATION: json.dumps(stale)})
    other = env.mover(instance="leader-2")
    assert await other.recover_all([NamespaceInfo.from_object(cached)]) == []  # the API's is fresh
    assert other.next_check_at is not None and other.next_check_at > time.time()
