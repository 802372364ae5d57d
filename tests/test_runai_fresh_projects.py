"""Two replicas right after a project is bound, a Run:ai project deleted behind our back, and a
project namespace deleted while Run:ai is off.

Everything runs as in production: two real Runtimes (`serve` against an apiserver), each with its
own caches, Lease candidate and Run:ai integration, against the shared real control plane (read
as the webhook's ServiceAccount) and one spec-checked Run:ai stand-in, driven over HTTPS with
keep-alive as the apiserver does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import namespace
from tests.support.fixtures import remote_calls
from tests.support.https import wait_until
from tests.support.kube_scope import KubeScope, eventually
from tests.support.reviews import pod_review
from tests.support.runai_standin import RunaiStandin
from tests.support.runtime import ServedRuntime, apiserver_session, start_runtime
from webhook.runai.binding import FINALIZER

SECRET = "fresh-projects-secret"
ROUNDS = 20


@dataclass
class Env:
    scope: KubeScope
    runai: RunaiStandin
    tmp_path: Path
    servers: list[ServedRuntime]

    async def start(self, name: str) -> ServedRuntime:
        secret_dir = self.tmp_path / "runai-secret"
        secret_dir.mkdir(exist_ok=True)
        (secret_dir / "clientSecret").write_text(SECRET)
        home = self.tmp_path / name
        home.mkdir()
        runtime, options, certs = await start_runtime(home, self.scope, runai_secret_dir=secret_dir)
        server = ServedRuntime(runtime, options, apiserver_session(certs))
        self.servers.append(server)
        return server

    async def settings(self, **overrides: Any) -> None:
        flat: dict[str, Any] = {
            "run_ai_enable": True,
            "run_ai_url": self.runai.url,
            "run_ai_client_id": self.runai.client_id,
            "run_ai_client_secret_name": "runai-hopsworks",
            "run_ai_client_secret_key": "clientSecret",
            "run_ai_project_gpu_quota": 1,
            "run_ai_reconcile_interval_s": 300,
            # Long on purpose: the replicas learn of new Run:ai projects only by binding them or by
            # looking them up, never by a refresh that happens to land inside a round.
            "run_ai_directory_refresh_s": 600,
            **overrides,
        }
        await self.scope.settings(**flat)

    async def reader_token(self, ns: str) -> str:
        """A token of a caller who may read `ns`'s pods (a project member, for the GPU view)."""
        user, token = await self.scope.user_token("alice")
        await self.scope.allow(user, "get", "pods", ns)
        return token

    async def gone(self, name: str) -> bool:
        return await self.scope.get("v1", "Namespace", name) is None


@pytest.fixture
async def env(tmp_path: Path, kube_scope: KubeScope) -> AsyncIterator[Env]:
    async with RunaiStandin(client_secret=SECRET) as runai:
        environment = Env(kube_scope, runai, tmp_path, [])
        await environment.settings()
        try:
            yield environment
        finally:
            for server in environment.servers:
                await server.session.close()
                await server.runtime.shutdown()
        assert runai.violations == [], runai.violations


def notebook(ns: str, uid: str, gpus: float = 1) -> dict[str, Any]:
    return pod_review(ns, labels={"jupyter": "true", "runai/queue": ns}, gpus=gpus, uid=uid)


# ---- no over-admission right after binding -------------------------------------------------


async def test_two_replicas_racing_for_a_fresh_projects_last_gpu_never_both_admit(env: Env) -> None:
    a = await env.start("a")
    b = await env.start("b")
    over_admissions = 0
    unchecked: list[str] = []
    calls_before = remote_calls("runai", "request")
    for i in range(ROUNDS):
        ns = await env.scope.namespace(f"fresh-{i}")
        # The leader binds it at once (a namespace event); both replicas see the label.
        await wait_until(
            lambda ns=ns: all(
                s.runtime.state.namespaces.get(ns) and s.runtime.state.namespaces[ns].runai_queue for s in (a, b)
            ),
            within=15,
            what=f"{ns} bound and seen by both replicas",
        )
        answers = await asyncio.gather(
            a.review("/validate/pods", notebook(ns, f"{ns}-a")), b.review("/validate/pods", notebook(ns, f"{ns}-b"))
        )
        admitted = [r for r in answers if r["allowed"]]
        if len(admitted) > 1:
            over_admissions += 1
        unchecked += [w for r in answers for w in r.get("warnings") or () if "not checked" in w]
        refused = [r for r in answers if not r["allowed"]]
        for answer in refused:
            assert "unreachable" not in answer["status"]["message"], answer["status"]["message"]
    print(f"over-admissions: {over_admissions} of {ROUNDS} rounds")
    assert over_admissions == 0, f"{over_admissions} of {ROUNDS} rounds admitted two 1-GPU notebooks on 1 GPU"
    assert unchecked == []  # Run:ai answered all along: never "not checked", never "unreachable"
    # The replica that did not bind looked the project up: one counted call per round at most
    # (two concurrent lookups of one project on one replica share one call).
    calls = remote_calls("runai", "request") - calls_before
    assert 1 <= calls <= 2 * ROUNDS, calls


# ---- the Run:ai project was deleted in Run:ai -------------------------------------------------


async def bound_on_both(env: Env, servers: tuple[ServedRuntime, ...], prefix: str) -> tuple[str, str]:
    """A new project namespace, bound by the leader and seen by every replica: its name and its
    Run:ai project's id."""
    ns = await env.scope.namespace(prefix)
    await wait_until(
        lambda: all(s.runtime.state.namespaces.get(ns) and s.runtime.state.namespaces[ns].runai_queue for s in servers),
        within=15,
        what=f"{ns} bound and seen by every replica",
    )
    project = env.runai.project(ns)
    assert project is not None
    return ns, str(project["id"])


async def the_one_that_never_saw(a: ServedRuntime, b: ServedRuntime, ns: str) -> ServedRuntime:
    """The replica that did not bind `ns`: the binder knows its Run:ai project once it has published
    it, which may come a moment after both replicas see the namespace's label."""

    def knows(s: ServedRuntime) -> bool:
        return ns in (s.runtime.state.snapshot().runai_projects or {})

    await wait_until(lambda: knows(a) or knows(b), within=10, what=f"the binder of {ns} knows its project")
    return b if knows(a) else a


def assert_says_missing_and_what_to_do(text: str, vision: str) -> None:
    assert f"Run:ai project {vision}, which no longer exists in Run:ai" in text, text
    assert "remove the labels runai/queue and hopsworks.ai/runai-project-id" in text, text
    assert "unreachable" not in text, text


async def test_a_project_deleted_in_runai_is_refused_as_missing_not_as_unreachable(env: Env) -> None:
    await env.settings(run_ai_directory_refresh_s=1)
    a = await env.start("a")
    vision, project_id = await bound_on_both(env, (a,), "vision")
    alice_token = await env.reader_token(vision)
    del env.runai.projects[project_id]  # a Run:ai administrator deleted it
    deleted_at = len(env.runai.requests)
    # The next directory refresh sees the namespace bound and Run:ai without its project.
    await wait_until(
        lambda: any(r.path == "/api/v1/org-unit/projects" for r in env.runai.requests[deleted_at:]),
        within=20,
        what="a directory refresh after the deletion",
    )
    await asyncio.sleep(0.2)  # the refresh publishes once its last call (node pools) is answered

    answer = await a.review("/validate/pods", notebook(vision, "nb-1"))
    assert answer["allowed"] is False, answer
    assert_says_missing_and_what_to_do(answer["status"]["message"], vision)
    assert answer["status"]["code"] == 409

    status, view = await a.get(f"/api/v1/projects/{vision}/gpu", alice_token)
    assert status == 200, view
    assert view["status"] == "RUN_AI_PROJECT_MISSING", view
    assert_says_missing_and_what_to_do(view["warnings"][0]["message"], vision)


async def test_a_replica_that_never_saw_the_project_looks_it_up_and_finds_it_gone(env: Env) -> None:
    a = await env.start("a")
    b = await env.start("b")
    vision, project_id = await bound_on_both(env, (a, b), "vision")
    alice_token = await env.reader_token(vision)
    other = await the_one_that_never_saw(a, b, vision)
    del env.runai.projects[project_id]
    calls_before = remote_calls("runai", "request")

    # Three at once on the replica that never saw the project: one lookup between them.
    answers = await asyncio.gather(*(other.review("/validate/pods", notebook(vision, f"nb-{i}")) for i in range(3)))
    for answer in answers:
        assert answer["allowed"] is False, answer
        assert_says_missing_and_what_to_do(answer["status"]["message"], vision)
    # One lookup, by name, as the spec's filterBy says; the second request knows already.
    lookups = [r for r in env.runai.requests if r.path == "/api/v1/org-unit/projects" and "filterBy" in r.query]
    assert [r.query["filterBy"] for r in lookups][-1:] == [f"name=={vision},clusterId=={env.runai.cluster_id}"]
    again = await other.review("/validate/pods", notebook(vision, "nb-3"))
    assert_says_missing_and_what_to_do(again["status"]["message"], vision)
    assert remote_calls("runai", "request") - calls_before == 1

    status, view = await other.get(f"/api/v1/projects/{vision}/gpu", alice_token)
    assert status == 200 and view["status"] == "RUN_AI_PROJECT_MISSING", view
    assert_says_missing_and_what_to_do(view["warnings"][0]["message"], vision)


# ---- a project namespace deleted while Run:ai is off ------------------------------------------


async def all_gone(env: Env, *names: str) -> bool:
    return all([await env.gone(name) for name in names])


async def events(env: Env, reason: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in await env.scope.list("v1", "Event", "default")
        if e.get("reason") == reason and e["involvedObject"]["name"] == name
    ]


async def test_deleting_a_project_namespace_while_runai_is_off_completes_and_reports_what_is_left(env: Env) -> None:
    # Bound earlier, while Run:ai was on: this system created Run:ai project "vision" for it.
    vision, adopted = env.scope.name("vision"), env.scope.name("adopted")
    project = env.runai.add_project(vision, namespace=vision, gpu_quota=1)
    bound = namespace(vision, labels={"runai/queue": vision, "hopsworks.ai/runai-project-id": project["id"]})
    bound["metadata"]["finalizers"] = [FINALIZER]
    await env.scope.create(bound)
    taken = namespace(adopted, labels={"runai/queue": adopted})  # adopted: nothing of ours in Run:ai
    taken["metadata"]["finalizers"] = [FINALIZER]
    await env.scope.create(taken)
    await env.settings(run_ai_enable=False)
    await env.scope.runai_admission()  # up: the admin view's only warning is the project left
    _, admin_token = await env.scope.admin_token()
    a = await env.start("a")

    await env.scope.delete("v1", "Namespace", vision)
    await env.scope.delete("v1", "Namespace", adopted)
    await eventually(
        lambda: all_gone(env, vision, adopted),
        within_s=60,
        interval_s=0.1,
        message="both namespaces deleted (the leader released its finalizer with Run:ai off)",
    )
    assert env.runai.requests == []  # off: not a single Run:ai call
    assert project["id"] in env.runai.projects  # left in Run:ai, and said so:
    await eventually(lambda: events(env, "RunaiProjectLeft", vision), message="the Event")
    [event] = await events(env, "RunaiProjectLeft", vision)
    assert event["type"] == "Warning"
    assert f"Run:ai project {vision} (id {project['id']})" in event["message"], event["message"]
    assert "run_ai_enable is false" in event["message"] and "left_in_runai" in event["message"]
    assert await events(env, "RunaiProjectLeft", adopted) == []

    status, view = await a.get("/api/v1/admin/runai", admin_token)
    assert status == 200, view
    assert view["status"] == "RUN_AI_DISABLED"
    [left] = view["left_in_runai"]
    assert left["namespace"] == vision and left["runai_project"] == vision
    assert left["runai_project_id"] == project["id"] and left["namespace_deleted_at"]
    assert left["in_runai"] is None  # with Run:ai off it cannot know whether it is still there
    assert [w["code"] for w in view["warnings"]] == ["RUN_AI_PROJECTS_LEFT"]

    # Turned back on: the leader deletes what it left, and the record goes.
    await env.settings(run_ai_enable=True, run_ai_reconcile_interval_s=1)
    await wait_until(lambda: project["id"] not in env.runai.projects, within=15, what="left project deleted")

    async def record_dropped() -> bool:
        record = await env.scope.get("v1", "ConfigMap", "runai-projects-left", env.scope.install_ns)
        return not (record or {}).get("data")

    await eventually(record_dropped, message="record dropped")
    status, view = await a.get("/api/v1/admin/runai", admin_token)
    assert status == 200 and view["left_in_runai"] == [] and view["warnings"] == [], view


async def test_a_lookup_that_runai_does_not_answer_in_time_refuses_to_retry_within_the_webhook_timeout(
    env: Env,
) -> None:
    a = await env.start("a")
    b = await env.start("b")
    vision, _ = await bound_on_both(env, (a, b), "vision")
    other = await the_one_that_never_saw(a, b, vision)
    env.runai.set_latency(4.0, method="GET", path="/api/v1/org-unit/projects")
    started = asyncio.get_running_loop().time()
    answer = await other.review("/validate/pods", notebook(vision, "nb-1"))
    took = asyncio.get_running_loop().time() - started
    assert answer["allowed"] is False, answer
    assert answer["status"]["code"] == 503 and "Try again in a few seconds" in answer["status"]["message"]
    assert took < 5.0, took  # the apiserver gives the webhook 10 s; the lookup is cut at 2 s
    env.runai.clear_faults()
    # Run:ai answers again: the same pod is checked against the quota and admitted.
    answer = await other.review("/validate/pods", notebook(vision, "nb-1"))
    assert answer["allowed"] is True and not answer.get("warnings"), answer
