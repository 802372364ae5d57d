"""The Run:ai client against the control-plane stand-in; every exchange is checked against runai-openapi.json."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from tests.support.fixtures import metric, remote_calls
from tests.support.openapi_check import validate_request, validate_response
from tests.support.runai_standin import RunaiStandin
from webhook.metrics import REGISTRY
from webhook.runai import (
    ClientOptions,
    Department,
    RunaiAuthError,
    RunaiClient,
    RunaiConflict,
    RunaiError,
    RunaiNotFound,
    RunaiUnreachable,
    SecretFile,
)

SECRET = 'Sup3r-"secret"\\value'  # quotes and a backslash: also its JSON-escaped form must not leak
FAST = ClientOptions(timeout_s=1.0, connect_timeout_s=0.5, retries=2, backoff_s=0.02, backoff_max_s=0.1, deadline_s=5.0)


def _conforms(standin: RunaiStandin) -> None:
    assert not standin.violations, "\n\n".join(str(v) for v in standin.violations)


@pytest.fixture
async def runai() -> AsyncIterator[RunaiStandin]:
    async with RunaiStandin(client_secret=SECRET) as standin:
        yield standin
        _conforms(standin)


@pytest.fixture
def secret_dir(tmp_path: Path) -> Path:
    # As the kubelet mounts a Secret: one file per key, here with a trailing newline.
    directory = tmp_path / "runai-hopsworks"
    directory.mkdir()
    (directory / "clientSecret").write_text(SECRET + "\n")
    return directory


@pytest.fixture
async def client(runai: RunaiStandin, secret_dir: Path) -> AsyncIterator[RunaiClient]:
    async with RunaiClient(runai.url, runai.client_id, SecretFile(secret_dir, "clientSecret"), options=FAST) as c:
        yield c


# ---- the spec checker itself -------------------------------------------------------------------


def test_spec_checker_catches_what_the_spec_forbids() -> None:
    auth = {"Authorization": "Bearer x"}
    assert validate_request("GET", "/api/v1/org-unit/departments?filterBy=name==a", auth) == []
    assert validate_request("GET", "/api/v1/org-unit/departments?filterBy=title==a", auth)  # unknown field
    assert validate_request("GET", "/api/v1/clusters", {})  # no bearer token
    body = b'{"grantType": "client_credentials", "clientId": "a", "clientSecret": "b"}'
    assert validate_request("POST", "/api/v1/token", {"Content-Type": "application/json"}, body) == []
    bad = b'{"grantType": "secret", "clientID": "a"}'
    assert validate_request("POST", "/api/v1/token", {"Content-Type": "application/json"}, bad)
    project = b'{"name": "p", "clusterId": "not-a-uuid", "resources": []}'
    assert validate_request("POST", "/api/v1/org-unit/projects", {**auth, "Content-Type": "application/json"}, project)
    ctype = {"Content-Type": "application/json"}
    assert validate_response("GET", "/api/v1/org-unit/projects/1", 404, ctype, b'{"code": 404, "message": "x"}') == []
    assert validate_response("GET", "/api/v1/org-unit/projects/1", 404, ctype, b'{"message": "x"}')  # code required
    assert validate_response("DELETE", "/api/v1/org-unit/projects/1", 202) == []
    assert validate_response("DELETE", "/api/v1/org-unit/projects/1", 200)  # not documented


# ---- token -------------------------------------------------------------------------------------


async def test_token_by_client_credentials_is_cached(runai: RunaiStandin, client: RunaiClient) -> None:
    await client.list_clusters()
    await client.list_clusters()
    (token_call,) = runai.calls("POST", "/api/v1/token")
    # Field names and casing as the spec's TokenRequest; the mounted file's trailing newline is not sent.
    assert token_call.body == {"grantType": "client_credentials", "clientID": runai.client_id, "clientSecret": SECRET}
    assert runai.tokens_issued == 1
    assert all(r.authorized for r in runai.calls("GET"))


async def test_token_refreshed_before_it_expires(secret_dir: Path) -> None:
    async with RunaiStandin(client_secret=SECRET, token_lifetime_s=2) as runai:
        secret = SecretFile(secret_dir, "clientSecret")
        async with RunaiClient(runai.url, runai.client_id, secret, options=FAST) as client:
            await client.list_clusters()
            await asyncio.sleep(1.6)  # a quarter of a 2 s lifetime is the margin: due for refresh
            await client.list_clusters()
        assert runai.tokens_issued == 2
        assert [r.status for r in runai.requests if r.path != "/api/v1/token"] == [200, 200]  # never a 401
        _conforms(runai)


async def test_401_refreshes_the_token_once_and_retries(runai: RunaiStandin, client: RunaiClient) -> None:
    await client.list_clusters()
    runai.expire_tokens()  # e.g. revoked, or the clocks disagree
    clusters = await client.list_clusters()
    assert [c.uuid for c in clusters] == [runai.cluster_id]
    assert [(r.method, r.path, r.status) for r in runai.requests] == [
        ("POST", "/api/v1/token", 200),
        ("GET", "/api/v1/clusters", 200),
        ("GET", "/api/v1/clusters", 401),
        ("POST", "/api/v1/token", 200),
        ("GET", "/api/v1/clusters", 200),
    ]


async def test_a_second_401_is_an_auth_error_not_a_loop(secret_dir: Path) -> None:
    async with RunaiStandin(client_secret=SECRET, token_lifetime_s=0) as runai:  # every token born expired
        secret = SecretFile(secret_dir, "clientSecret")
        async with RunaiClient(runai.url, runai.client_id, secret, options=FAST) as client:
            with pytest.raises(RunaiAuthError) as caught:
                await client.list_clusters()
        assert caught.value.status == 401
        assert runai.tokens_issued == 2
        assert len(runai.calls("GET", "/api/v1/clusters")) == 2
        _conforms(runai)


async def test_wrong_credentials_are_an_auth_error_without_retries(runai: RunaiStandin, secret_dir: Path) -> None:
    (secret_dir / "clientSecret").write_text("not-the-secret")
    async with RunaiClient(runai.url, runai.client_id, SecretFile(secret_dir, "clientSecret"), options=FAST) as client:
        with pytest.raises(RunaiAuthError, match="run_ai_client_id"):
            await client.list_clusters()
    assert len(runai.calls("POST", "/api/v1/token")) == 1
    assert not runai.calls("GET")


async def test_rotated_secret_file_is_picked_up(runai: RunaiStandin, client: RunaiClient, secret_dir: Path) -> None:
    await client.list_clusters()
    runai.client_secret = "rotated-secret"
    (secret_dir / "clientSecret").write_text("rotated-secret")
    runai.expire_tokens()
    await client.list_clusters()
    assert runai.calls("POST", "/api/v1/token")[-1].body["clientSecret"] == "rotated-secret"


async def test_missing_secret_file_names_the_file(runai: RunaiStandin, tmp_path: Path) -> None:
    secret = SecretFile(tmp_path / "absent", "clientSecret")
    async with RunaiClient(runai.url, "id", secret, options=FAST) as client:
        with pytest.raises(RunaiAuthError, match="absent/clientSecret"):
            await client.list_clusters()
    assert not runai.requests


# ---- clusters, departments ---------------------------------------------------------------------


async def test_clusters_uuid_is_the_cluster_id(runai: RunaiStandin, client: RunaiClient) -> None:
    cluster = await client.get_cluster()
    assert cluster.uuid == runai.cluster_id
    assert cluster.name == "hopsworks"
    other = runai.add_cluster("other")
    with pytest.raises(RunaiError, match="exactly one"):
        await client.get_cluster()
    assert (await client.get_cluster("other")).uuid == other
    with pytest.raises(RunaiNotFound):
        await client.get_cluster("absent")


async def find_department(client: RunaiClient, name: str, cluster_id: str) -> Department | None:
    """The one department of that name, as a caller of the client's public API finds it."""
    found = await client.list_departments(cluster_id=cluster_id, name=name)
    return found[0] if found else None


async def test_department_by_name(runai: RunaiStandin, client: RunaiClient) -> None:
    research = runai.add_department("research", gpu_quota=6)
    runai.add_department("research-2")
    found = await find_department(client, "research", runai.cluster_id)
    assert found is not None
    assert (found.id, found.name, found.gpu_quota, found.cluster_id) == (
        research["id"],
        "research",
        6,
        runai.cluster_id,
    )
    assert found.quota_on("default") is not None and found.quota_on("default").deserved == 6
    assert await find_department(client, "absent", runai.cluster_id) is None
    query = runai.calls("GET", "/api/v1/org-unit/departments")[0].query
    assert query["filterBy"] == f"name==research,clusterId=={runai.cluster_id}"
    assert query["verbosity"] == "verbose"  # status (allocated GPUs) only comes with it
    default = await find_department(client, "default", runai.cluster_id)
    assert default is not None


async def test_department_allocation_sums_its_projects(runai: RunaiStandin, client: RunaiClient) -> None:
    runai.add_department("research", gpu_quota=8)
    runai.add_project("a", department="research", namespace="a", gpu_quota=2)
    runai.add_project("b", department="research", namespace="b", gpu_quota=3)
    runai.set_project_usage("a", allocated=2, allocated_non_preemptible=1, requested=2)
    runai.set_project_usage("b", allocated=1.5, requested=4)
    department = await find_department(client, "research", runai.cluster_id)
    assert department is not None
    assert (department.usage.allocated, department.usage.allocated_non_preemptible, department.usage.requested) == (
        3.5,
        1,
        6,
    )


# ---- projects ----------------------------------------------------------------------------------


async def test_create_project_201(runai: RunaiStandin, client: RunaiClient) -> None:
    research = runai.add_department("research")
    project = await client.create_project(
        "proj1", cluster_id=runai.cluster_id, department_id=research["id"], namespace="proj1", gpu_quota=2
    )
    (post,) = runai.calls("POST", "/api/v1/org-unit/projects")
    assert post.status == 201
    pool = runai.default_node_pool()
    assert post.body == {
        "name": "proj1",
        "clusterId": runai.cluster_id,
        "parentId": research["id"],
        "requestedNamespace": "proj1",
        "resources": [{"gpu": {"deserved": 2}, "nodePool": {"id": pool["id"], "name": "default"}}],
    }
    assert project.name == "proj1"
    assert project.parent_id == research["id"]
    assert project.requested_namespace == "proj1"
    assert project.gpu_quota == 2
    assert project.quota_on("default") is not None and project.quota_on("default").deserved == 2
    assert project.phase == "Creating"
    assert (await client.get_project(project.id)).phase == "Ready"


async def test_create_name_clash_409(runai: RunaiStandin, client: RunaiClient) -> None:
    existing = runai.add_project("proj1", namespace="someone-elses")
    default = runai.department("default")
    assert default is not None
    with pytest.raises(RunaiConflict) as caught:
        await client.create_project(
            "proj1", cluster_id=runai.cluster_id, department_id=default["id"], namespace="proj1"
        )
    assert caught.value.status == 409
    assert not caught.value.retried
    assert caught.value.existing is not None and caught.value.existing.id == existing["id"]
    assert len(runai.projects) == 1


async def test_create_whose_answer_was_lost_resolves_the_409(runai: RunaiStandin, client: RunaiClient) -> None:
    default = runai.department("default")
    assert default is not None
    runai.lose_next_answer(1, method="POST", path="/api/v1/org-unit/projects")
    project = await client.create_project(
        "proj1", cluster_id=runai.cluster_id, department_id=default["id"], namespace="proj1"
    )
    assert [r.status for r in runai.calls("POST", "/api/v1/org-unit/projects")] == [None, 409]
    assert list(runai.projects) == [project.id]  # created once, found again, no duplicate


async def test_create_retried_after_503_creates_once(runai: RunaiStandin, client: RunaiClient) -> None:
    default = runai.department("default")
    assert default is not None
    runai.fail_next(1, 503, method="POST", path="/api/v1/org-unit/projects")
    await client.create_project("proj1", cluster_id=runai.cluster_id, department_id=default["id"], namespace="proj1")
    assert [r.status for r in runai.calls("POST", "/api/v1/org-unit/projects")] == [503, 201]
    assert len(runai.projects) == 1


async def test_create_failing_in_one_department_only(runai: RunaiStandin, client: RunaiClient) -> None:
    research = runai.add_department("research")
    default = runai.department("default")
    assert default is not None
    runai.fail_project_create_in("research", status=400)
    with pytest.raises(RunaiError) as caught:
        await client.create_project("p", cluster_id=runai.cluster_id, department_id=research["id"], namespace="p")
    assert caught.value.status == 400 and not isinstance(caught.value, RunaiUnreachable)
    assert len(runai.calls("POST", "/api/v1/org-unit/projects")) == 1  # a 400 is not retried
    await client.create_project("p", cluster_id=runai.cluster_id, department_id=default["id"], namespace="p")


async def test_recreate_from_template_keeps_quota_and_settings(runai: RunaiStandin, client: RunaiClient) -> None:
    runai.add_department("research")
    default = runai.department("default")
    assert default is not None
    old = await client.create_project(
        "p", cluster_id=runai.cluster_id, department_id=default["id"], namespace="p", gpu_quota=3
    )
    old = await client.get_project(old.id)
    await client.delete_project(old.id)
    again = await client.create_project(
        "p", cluster_id=runai.cluster_id, department_id=default["id"], namespace="p", template=old
    )
    assert again.gpu_quota == 3
    assert runai.calls("POST", "/api/v1/org-unit/projects")[-1].body["resources"] == old.raw["resources"]


async def test_get_and_list_by_namespace(runai: RunaiStandin, client: RunaiClient) -> None:
    adopted = runai.add_project("legacy-name", namespace="ns1", gpu_quota=1)
    runai.add_project("other", namespace="ns2")
    everything = await client.list_projects(cluster_id=runai.cluster_id)
    (found,) = [p for p in everything if p.bound_to("ns1")]
    assert found.id == adopted["id"] and found.name == "legacy-name" and found.bound_to("ns1")
    assert [p for p in everything if p.bound_to("ns3")] == []
    got = await client.get_project(adopted["id"])
    assert (got.namespace, got.phase, got.gpu_quota) == ("ns1", "Ready", 1)
    with pytest.raises(RunaiNotFound):
        await client.get_project("999999")


async def test_list_projects_pages_through_everything(runai: RunaiStandin, client: RunaiClient) -> None:
    for i in range(520):
        runai.add_project(f"p{i}", namespace=f"p{i}")
    # A page of 500 projects, each checked against the OpenAPI spec by the stand-in, is no answer
    # within FAST's second on a loaded machine: this test is about the pages, not the timeout.
    patient = client.with_options(timeout_s=60.0, deadline_s=120.0)
    projects = await patient.list_projects(cluster_id=runai.cluster_id)
    assert len(projects) == 520
    assert [r.query["offset"] for r in runai.calls("GET", "/api/v1/org-unit/projects")] == ["0", "500"]


async def test_project_usage_per_node_pool(runai: RunaiStandin, client: RunaiClient) -> None:
    runai.add_project("p", namespace="p", gpu_quota=4)
    runai.set_project_usage("p", allocated=3, allocated_non_preemptible=2, requested=5)
    project = await client.find_project("p", cluster_id=runai.cluster_id)
    assert project is not None
    usage = project.usage_by_node_pool["default"]
    assert (usage.allocated, usage.allocated_non_preemptible, usage.requested) == (3, 2, 5)
    assert project.usage == usage  # one node pool: the sum is the same


async def test_delete_204(runai: RunaiStandin, client: RunaiClient) -> None:
    project = runai.add_project("p", namespace="p")
    assert await client.delete_project(project["id"]) is True
    assert runai.calls("DELETE")[0].status == 204
    assert not runai.projects
    assert await client.delete_project(project["id"]) is False  # already gone: not an error


async def test_delete_whose_answer_was_lost_is_done(runai: RunaiStandin, client: RunaiClient) -> None:
    project = runai.add_project("p", namespace="p")
    runai.lose_next_answer(1, method="DELETE")
    await client.delete_project(project["id"])  # resent on a fresh connection, finds nothing: fine
    assert [r.status for r in runai.calls("DELETE")] == [None, 404]
    assert not runai.projects


async def test_delete_202_finishes_later(secret_dir: Path) -> None:
    async with RunaiStandin(client_secret=SECRET, delete_status=202, delete_delay_s=0.3) as runai:
        secret = SecretFile(secret_dir, "clientSecret")
        async with RunaiClient(runai.url, runai.client_id, secret, options=FAST) as client:
            project = runai.add_project("p", namespace="p")
            await client.delete_project(project["id"])
            assert runai.calls("DELETE")[0].status == 202
            assert (await client.get_project(project["id"])).phase == "Deleting"
            await asyncio.sleep(0.4)
            with pytest.raises(RunaiNotFound):
                await client.get_project(project["id"])
        _conforms(runai)


# ---- node pools and metrics --------------------------------------------------------------------


async def test_node_pool_metrics(runai: RunaiStandin, client: RunaiClient) -> None:
    runai.set_node_pool_gpus("default", total=8)
    runai.add_project("p", namespace="p", gpu_quota=4)
    runai.set_project_usage("p", allocated=3)
    metrics = await client.node_pool_metrics(runai.cluster_id, "default")
    assert (metrics.total, metrics.allocated, metrics.unallocated) == (8, 3, 5)
    assert metrics.sampled_at is not None and not metrics.partial
    query = runai.calls("GET", "*/metrics")[0].query
    assert query["metricType"] == "TOTAL_GPU,ALLOCATED_GPU,UNALLOCATED_GPU"
    with pytest.raises(RunaiNotFound):
        await client.node_pool_metrics(runai.cluster_id, "absent")


async def test_default_node_pool(runai: RunaiStandin, client: RunaiClient) -> None:
    runai.add_node_pool("a100", total_gpus=16)
    pools = await client.list_node_pools(runai.cluster_id)
    assert sorted(p.name for p in pools) == ["a100", "default"]
    default = await client.default_node_pool(runai.cluster_id)
    assert default is not None and default.name == "default" and default.is_default


# ---- failures ----------------------------------------------------------------------------------


async def test_unreachable_fails_fast_with_runai_unreachable(runai: RunaiStandin, client: RunaiClient) -> None:
    await client.list_clusters()
    await runai.stop_listening()
    before = remote_calls("runai", "request")
    with pytest.raises(RunaiUnreachable) as caught:
        await client.list_clusters(call_path="request")
    # A refused connection is its own failure, not a wait for the timeout.
    assert "timed out" not in str(caught.value) and "Connect" in str(caught.value), caught.value
    assert caught.value.retried
    assert remote_calls("runai", "request") - before == FAST.retries + 1  # every attempt counted
    assert metric("webhook_runai_reachable") == 0
    await runai.resume()
    await client.list_clusters()
    assert metric("webhook_runai_reachable") == 1


async def test_5xx_then_success_is_retried(runai: RunaiStandin, client: RunaiClient) -> None:
    runai.fail_next(2, 503, path="/api/v1/clusters")
    clusters = await client.list_clusters()
    assert len(clusters) == 1
    assert [r.status for r in runai.calls("GET", "/api/v1/clusters")] == [503, 503, 200]


async def test_5xx_after_all_retries_is_unreachable(runai: RunaiStandin, client: RunaiClient) -> None:
    runai.fail_next(10, 503, path="/api/v1/org-unit/projects")
    with pytest.raises(RunaiUnreachable) as caught:
        await client.list_projects(cluster_id=runai.cluster_id)
    assert caught.value.status == 503
    assert len(runai.calls("GET", "/api/v1/org-unit/projects")) == FAST.retries + 1


async def test_429_is_retried_though_the_spec_does_not_list_it(runai: RunaiStandin, client: RunaiClient) -> None:
    runai.fail_next(1, 429, path="/api/v1/clusters")
    await client.list_clusters()
    assert [r.status for r in runai.calls("GET", "/api/v1/clusters")] == [429, 200]
    assert [v.status for v in runai.violations] == [429]  # the checker notices the undocumented status
    runai.violations.clear()


async def test_slow_beyond_the_timeout_is_unreachable(runai: RunaiStandin, client: RunaiClient) -> None:
    await client.list_clusters()
    runai.set_latency(3.0, path="/api/v1/clusters")
    quick = client.with_options(timeout_s=0.2, retries=1)
    calls = len(runai.calls("GET", "/api/v1/clusters"))
    with pytest.raises(RunaiUnreachable, match=r"timed out after 0\.2s \(after 2 attempts\)"):
        await quick.list_clusters()
    assert len(runai.calls("GET", "/api/v1/clusters")) - calls == 2  # each attempt cut at 0.2 s, not 3 s
    runai.clear_faults()
    assert len(await quick.list_clusters()) == 1


async def test_dropped_connection_is_retried(runai: RunaiStandin, client: RunaiClient) -> None:
    runai.drop_next(1, path="/api/v1/clusters")
    assert len(await client.list_clusters()) == 1
    assert [r.status for r in runai.calls("GET", "/api/v1/clusters")] == [None, 200]


async def test_flapping_control_plane(runai: RunaiStandin, client: RunaiClient) -> None:
    patient = client.with_options(retries=8, backoff_s=0.05, backoff_max_s=0.1)

    async def flap() -> None:
        for _ in range(4):
            await runai.stop_listening()
            await asyncio.sleep(0.15)
            await runai.resume()
            await asyncio.sleep(0.05)

    flapper = asyncio.create_task(flap())
    outcomes: list[str] = []
    while not flapper.done():
        try:
            await patient.list_clusters()
            outcomes.append("ok")
        except RunaiUnreachable:
            outcomes.append("unreachable")
        await asyncio.sleep(0.02)
    await flapper
    # Retries ride out each short outage; nothing but RunaiUnreachable ever escapes.
    assert "ok" in outcomes
    assert set(outcomes) <= {"ok", "unreachable"}
    assert len(await client.list_clusters()) == 1  # pooled connections from before the outages are not reused
    assert runai.tokens_issued == 1


async def test_request_path_calls_are_labelled(runai: RunaiStandin, client: RunaiClient) -> None:
    before_request, before_background = remote_calls("runai", "request"), remote_calls("runai", "background")
    await client.list_clusters(call_path="request")  # token + clusters
    assert remote_calls("runai", "request") - before_request == 2
    assert remote_calls("runai", "background") == before_background


# ---- the client secret never leaks -------------------------------------------------------------


async def test_client_secret_never_leaks(secret_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    async with RunaiStandin(client_secret="something-else", echo_errors=True) as runai:
        secret = SecretFile(secret_dir, "clientSecret")
        async with RunaiClient(runai.url, runai.client_id, secret, options=FAST) as client:
            seen += [repr(client), str(client.__dict__), repr(secret)]
            # Refused credentials: the stand-in echoes the request body (with the secret) back.
            with pytest.raises(RunaiAuthError) as refused:
                await client.list_clusters()
            seen += [str(refused.value), repr(refused.value), repr(refused.value.args)]
            # Token endpoint failing, with retries logged.
            runai.fail_next(10, 503, path="/api/v1/token")
            with pytest.raises(RunaiUnreachable) as down:
                await client.list_clusters()
            seen += [str(down.value), repr(down.value)]
            # Unreachable while fetching a token.
            runai.clear_faults()
            await runai.stop_listening()
            with pytest.raises(RunaiUnreachable) as refused_conn:
                await client.list_clusters()
            seen += [str(refused_conn.value), repr(refused_conn.value)]
            await runai.resume()
            # Working, then a 401 and a refresh: the access token must not be logged either.
            runai.client_secret = SECRET
            await client.list_clusters()
            runai.expire_tokens()
            await client.list_clusters()
        seen += [r.getMessage() for r in caplog.records]
        seen += [str(r.exc_info) for r in caplog.records if r.exc_info]
        seen.append(generate_latest(REGISTRY).decode())
        tokens = list(runai.tokens)
    assert any("invalid client credentials" in s for s in seen)  # the server's message does come through
    escaped = SECRET.replace("\\", "\\\\").replace('"', '\\"')
    for text in seen:
        assert SECRET not in text
        assert escaped not in text
        for token in tokens:
            assert token not in text
