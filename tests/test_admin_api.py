"""The admin API over real HTTPS and the `admin` CLI against a running app (R5).

Callers are authenticated and authorized the way the server does it in a cluster: a TokenReview
and a SubjectAccessReview on the real apiserver (a KubeScope of the shared control plane). The
callers are ServiceAccounts whose tokens the apiserver issued: alice is a cluster admin, bob has
no right. The mover and the authorizer act as the webhook's ServiceAccount, through a fault proxy
that lets a test read the apiserver's answers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.support.apps import cache_app
from tests.support.control_plane.fault_proxy import FaultProxy
from tests.support.departments import Env, environment
from tests.support.https import HttpsServer, StartHttpsServer
from tests.support.kube_scope import KubeScope, eventually
from webhook.http.admin_api import AdminAuthError, admin_routes, bearer_token
from webhook.kube.api import KubeApi
from webhook.runai.departments import MOVE_ANNOTATION
from webhook.snapshot import DEPARTMENT_LABEL

# A bound on waiting for the apiserver's RBAC caches to catch up with a new binding.
CAUGHT_UP_WITHIN_S = 15.0


@dataclass
class Admin:
    env: Env
    proxy: FaultProxy  # the mover's and the authorizer's way to the apiserver
    alice: str  # a token of a cluster admin
    bob: str  # a token of a ServiceAccount with no right

    @property
    def scope(self) -> KubeScope:
        return self.env.scope


async def _may_update_namespaces(scope: KubeScope, user: str) -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "groups": ["system:authenticated"],
                       "resourceAttributes": {"verb": "update", "resource": "namespaces"}}}  # fmt: skip
    answer = await scope.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))


@pytest.fixture
async def admin(tmp_path: Path, kube_scope: KubeScope) -> AsyncIterator[Admin]:
    alice_user, alice = await kube_scope.admin_token("alice")
    _, bob = await kube_scope.user_token("bob")
    await eventually(lambda: _may_update_namespaces(kube_scope, alice_user), within_s=CAUGHT_UP_WITHIN_S,
                     interval_s=0.05, message="RBAC never made alice a cluster admin")  # fmt: skip
    async with FaultProxy(kube_scope.cp) as proxy:
        api = await proxy.api_client_via(kube_scope.kubeconfig)
        async with environment(tmp_path, kube_scope, api) as env:
            yield Admin(env, proxy, alice, bob)


class ReviewedAdmin:
    """A small real authorizer: TokenReview, then `update namespaces` cluster-wide by SubjectAccessReview."""

    def __init__(self, kapi: KubeApi) -> None:
        self.kapi = kapi

    async def __call__(self, request: web.Request) -> str:
        review = await self.kapi.token_review(bearer_token(request) or "")
        status = review.get("status") or {}
        if not status.get("authenticated"):
            raise AdminAuthError(401, "invalid bearer token")
        user = status["user"]
        sar = await self.kapi.subject_access_review(user, {"verb": "update", "resource": "namespaces"})
        if not (sar.get("status") or {}).get("allowed"):
            raise AdminAuthError(403, f"{user['username']} may not move projects: it needs update namespaces")
        return str(user["username"])


async def _serve(admin: Admin, https_server: StartHttpsServer, **mover: Any) -> HttpsServer:
    env = admin.env
    app = cache_app(env.state, routes=admin_routes(env.mover(**mover), ReviewedAdmin(env.kapi)))
    return await https_server(app)


async def _call(
    srv: HttpsServer, method: str, path: str, token: str | None, body: Any = None, raw: str | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    kwargs: dict[str, Any] = {"data": raw, "headers": {**headers, "Content-Type": "application/json"}}
    if raw is None:
        kwargs = {"json": body, "headers": headers}
    async with srv.session.request(method, srv.url(path), **kwargs) as resp:
        assert resp.content_type == "application/json"
        return resp.status, await resp.json()


def _move(namespace: str) -> str:
    return f"/api/v1/admin/projects/{namespace}/move"


async def test_admin_api_needs_a_token_of_an_admin(admin: Admin, https_server: StartHttpsServer) -> None:
    env = admin.env
    p1 = env.name("p1")
    await env.project_ns(p1)
    srv = await _serve(admin, https_server)
    async with srv.session.post(srv.url(_move(p1)), json={"department": "ml"}) as resp:
        assert resp.status == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await resp.json())["code"] == "Unauthorized"
    assert (await _call(srv, "POST", _move(p1), token="stolen", body={"department": "ml"}))[0] == 401
    status, answer = await _call(srv, "POST", _move(p1), token=admin.bob, body={"department": "ml"})
    assert status == 403 and env.name("bob") in answer["error"]
    status, _ = await _call(srv, "DELETE", "/api/v1/admin/departments/ml", token=admin.bob)
    assert status == 403
    assert env.runai.requests == [] and DEPARTMENT_LABEL not in await env.labels(p1)


async def test_admin_api_moves_a_project_and_reminds_to_readd_quota_and_access_rules(
    admin: Admin, https_server: StartHttpsServer
) -> None:
    env = admin.env
    p1 = env.name("p1")
    await env.project_ns(p1)
    # The apiserver's answers to the mover's patches of p1: the intent it stored names who moved it.
    patched: list[str] = []

    def seen(obj: dict[str, Any]) -> dict[str, Any]:
        patched.append(json.dumps(obj))
        return obj

    admin.proxy.rewrite(seen, verb="patch", resource="namespaces", name=p1)
    srv = await _serve(admin, https_server)
    status, answer = await _call(srv, "POST", _move(p1), admin.alice, body={"department": "ml"})
    assert status == 200, answer
    assert answer["outcome"] == "moved" and answer["to_department"] == "ml"
    assert "Re-add GPU quota and access rules" in answer["reminder"]
    assert (await env.labels(p1))[DEPARTMENT_LABEL] == "ml"
    assert any(env.name("alice") in body and MOVE_ANNOTATION in body for body in patched), patched
    event = (await env.events("RunaiProjectMoved"))[0]
    assert "Re-add GPU quota" in event["message"]


async def test_a_dry_run_says_what_a_move_and_a_delete_would_do_and_changes_nothing(
    admin: Admin, https_server: StartHttpsServer
) -> None:
    env = admin.env
    p1, busy = env.name("p1"), env.name("busy")
    await env.project_ns(p1)
    await env.project_ns(busy, department="ml", runai_department="ml")
    env.pod(busy, "notebook-0", "Running")
    srv = await _serve(admin, https_server)
    status, answer = await _call(srv, "POST", _move(p1) + "?dryRun=All", admin.alice, body={"department": "ml"})
    assert status == 200, answer
    assert answer["dry_run"] is True and answer["outcome"] == "moved", answer
    assert answer["message"].startswith(f"would move {p1}"), answer
    # What a real move would refuse, a dry run refuses alike.
    status, answer = await _call(srv, "POST", _move(busy) + "?dryRun=All", admin.alice, body={"department": None})
    assert (status, answer["code"]) == (409, "ProjectBusy"), answer
    status, answer = await _call(srv, "DELETE", "/api/v1/admin/departments/ml?dryRun=All", admin.alice)
    assert status == 409 and answer["dry_run"] is True and answer["remaining"] == [busy], answer
    status, answer = await _call(srv, "POST", _move(p1) + "?dryRun=yes", admin.alice, body={"department": "ml"})
    assert status == 400 and "dryRun" in answer["error"], answer
    # Reads only: Run:ai was asked (after signing in), nothing was written anywhere.
    assert [r.path for r in env.runai.requests if r.method != "GET" and r.path != "/api/v1/token"] == []
    assert DEPARTMENT_LABEL not in await env.labels(p1) and (await env.labels(busy))[DEPARTMENT_LABEL] == "ml"
    assert admin.proxy.calls(verb="patch", resource="namespaces") == []


async def test_admin_api_answers_each_failure_with_its_status(admin: Admin, https_server: StartHttpsServer) -> None:
    env = admin.env
    busy, locked, p1, ghost = (env.name(p) for p in ("busy", "locked", "p1", "ghost"))
    await env.project_ns(busy)
    env.pod(busy, "notebook-0", "Running")
    await env.project_ns(locked)
    await env.project_ns(p1)
    srv = await _serve(admin, https_server)

    status, answer = await _call(srv, "POST", _move(p1), admin.alice, body={"department": "Bad_Name"})
    assert status == 400 and answer["code"] == "InvalidDepartment"
    status, answer = await _call(srv, "POST", _move(p1), admin.alice, raw="not json")
    assert status == 400
    status, answer = await _call(srv, "POST", _move(ghost), admin.alice, body={"department": "ml"})
    assert status == 404 and ghost in answer["error"]
    status, answer = await _call(srv, "POST", _move(busy), admin.alice, body={"department": "ml"})
    assert status == 409 and answer["code"] == "ProjectBusy" and answer["pods"] == ["notebook-0"]

    intent = {
        "v": 1,
        "id": "x",
        "from": None,
        "to": "research",
        "runaiFrom": {"id": "1", "name": "default"},
        "runaiTo": {"id": "2", "name": "research"},
        "clusterId": env.runai.cluster_id,
        "project": {"id": "1", "name": locked},
        "phase": "deleted",
        "started": "2030-01-01T00:00:00Z",
        "heartbeat": "2030-01-01T00:00:00Z",
        "holder": "replica-9",
        "by": "carol",
    }
    await env.scope.patch(
        "v1", "Namespace", locked, {"metadata": {"annotations": {MOVE_ANNOTATION: json.dumps(intent)}}}
    )
    status, answer = await _call(srv, "POST", _move(locked), admin.alice, body={"department": "ml"})
    assert status == 409 and answer["code"] == "MoveInProgress" and "carol" in answer["error"]

    await env.runai.stop_listening()
    status, answer = await _call(srv, "POST", _move(p1), admin.alice, body={"department": "ml"})
    assert status == 503 and "nothing changed" in answer["error"]
    await env.runai.resume()

    env.runai.fail_project_create_in("ml", status=400)
    status, answer = await _call(srv, "POST", _move(p1), admin.alice, body={"department": "ml"})
    assert status == 409 and answer["code"] == "MoveRolledBack"
    assert "not restored" in answer["reminder"] and answer["result"]["outcome"] == "rolled-back"


async def test_admin_api_department_delete_reports_moved_failed_and_remaining(
    admin: Admin, https_server: StartHttpsServer
) -> None:
    env = admin.env
    a1, b2 = env.name("a1"), env.name("b2")
    for name in (a1, b2):
        await env.project_ns(name, department="ml", runai_department="ml")
    env.pod(a1, "job-1", "Pending")
    srv = await _serve(admin, https_server)

    status, answer = await _call(srv, "DELETE", "/api/v1/admin/departments/ml", admin.alice)
    assert status == 409 and answer["complete"] is False
    assert answer["moved"] == [] and answer["remaining"] == [a1, b2]
    assert answer["failed"]["namespace"] == a1 and answer["failed"]["pods"] == ["job-1"]

    env.state.delete({"kind": "Pod", "metadata": {"namespace": a1, "name": "job-1", "uid": f"uid-{a1}-job-1"}})
    status, answer = await _call(srv, "DELETE", "/api/v1/admin/departments/ml", admin.alice)
    assert status == 200 and answer["complete"] is True
    assert [m["namespace"] for m in answer["moved"]] == [a1, b2] and answer["remaining"] == []
    assert "Re-add GPU quota" in answer["reminder"]
    status, answer = await _call(srv, "DELETE", "/api/v1/admin/departments/NOPE", admin.alice)
    assert status == 400


async def test_deleting_a_department_no_project_is_in_is_404(admin: Admin, https_server: StartHttpsServer) -> None:
    # A 404, not a 200 saying "department nosuch: 0 project(s) moved": a typo must not look done.
    env = admin.env
    a1 = env.name("a1")
    await env.project_ns(a1, department="ml", runai_department="ml")
    srv = await _serve(admin, https_server)
    status, answer = await _call(srv, "DELETE", "/api/v1/admin/departments/nosuch", admin.alice)
    assert (status, answer["code"]) == (404, "DepartmentNotFound"), answer
    assert "nosuch" in answer["error"] and DEPARTMENT_LABEL in answer["error"]
    assert (await env.labels(a1))[DEPARTMENT_LABEL] == "ml"


async def test_admin_log_lines_cannot_be_forged_through_the_path(
    admin: Admin, https_server: StartHttpsServer, caplog: pytest.LogCaptureFixture
) -> None:
    srv = await _serve(admin, https_server)
    forged = "%0A2026-01-01 INFO webhook.http.admin_api admin root moves everything"
    with caplog.at_level(logging.INFO, logger="webhook.http.admin_api"):
        await _call(srv, "POST", _move(f"p1{forged}"), admin.alice, body={"department": "ml\nforged"})
        await _call(srv, "DELETE", f"/api/v1/admin/departments/ml{forged}", admin.alice)
    lines = [r.getMessage() for r in caplog.records if r.name == "webhook.http.admin_api"]
    assert len(lines) == 2, lines
    for line in lines:
        assert "\n" not in line and "\r" not in line, line
        assert "\\n2026-01-01" in line, line  # still there, visibly escaped
