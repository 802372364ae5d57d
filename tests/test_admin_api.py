"""The admin API over real HTTPS and the `admin` CLI against a running app (R5).

Callers are authenticated and authorized the way the server does it in a cluster: a TokenReview
and a SubjectAccessReview answered by the Kubernetes emulator's user and rule tables.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.support.apps import cache_app
from tests.support.emulated_departments import Env, environment
from tests.support.https import HttpsServer, StartHttpsServer
from webhook.cli import main as cli_main
from webhook.http.admin_api import AdminAuthError, admin_routes, bearer_token
from webhook.kube.api import KubeApi
from webhook.runai.departments import MOVE_ANNOTATION
from webhook.snapshot import DEPARTMENT_LABEL
from webhook.tls.issuing import make_ca

ADMIN_TOKEN = "token-of-alice"
USER_TOKEN = "token-of-bob"


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with environment(tmp_path) as e:
        yield e


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


async def _serve(env: Env, https_server: StartHttpsServer, **mover: Any) -> HttpsServer:
    env.kube.add_user(ADMIN_TOKEN, "alice", groups=["platform-admins"])
    env.kube.add_user(USER_TOKEN, "bob", groups=["project-members"])
    env.kube.allow("group:platform-admins", verb="update", resource="namespaces")
    env.kube.allow("group:project-members", verb="get", resource="pods")
    app = cache_app(env.state, routes=admin_routes(env.mover(**mover), ReviewedAdmin(env.kapi)))
    return await https_server(app)


async def _call(
    srv: HttpsServer, method: str, path: str, token: str | None = ADMIN_TOKEN, body: Any = None, raw: str | None = None
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


async def test_admin_api_needs_a_token_of_an_admin(env: Env, https_server: StartHttpsServer) -> None:
    env.project_ns("p1")
    srv = await _serve(env, https_server)
    async with srv.session.post(srv.url(_move("p1")), json={"department": "ml"}) as resp:
        assert resp.status == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await resp.json())["code"] == "Unauthorized"
    assert (await _call(srv, "POST", _move("p1"), token="stolen", body={"department": "ml"}))[0] == 401
    status, answer = await _call(srv, "POST", _move("p1"), token=USER_TOKEN, body={"department": "ml"})
    assert status == 403 and "bob" in answer["error"]
    status, _ = await _call(srv, "DELETE", "/api/v1/admin/departments/ml", token=USER_TOKEN)
    assert status == 403
    assert env.runai.requests == [] and DEPARTMENT_LABEL not in env.labels("p1")


async def test_admin_api_moves_a_project_and_reminds_to_readd_quota_and_access_rules(
    env: Env, https_server: StartHttpsServer
) -> None:
    env.project_ns("p1")
    srv = await _serve(env, https_server)
    status, answer = await _call(srv, "POST", _move("p1"), body={"department": "ml"})
    assert status == 200, answer
    assert answer["outcome"] == "moved" and answer["to_department"] == "ml"
    assert "Re-add GPU quota and access rules" in answer["reminder"]
    assert env.labels("p1")[DEPARTMENT_LABEL] == "ml"
    event = env.events("RunaiProjectMoved")[0]
    assert "alice" in json.dumps(env.kube.calls("PATCH", "/api/v1/namespaces/p1")[0].body)  # who, in the intent
    assert "Re-add GPU quota" in event["message"]


async def test_admin_api_answers_each_failure_with_its_status(env: Env, https_server: StartHttpsServer) -> None:
    env.project_ns("busy")
    env.pod("busy", "notebook-0", "Running")
    env.project_ns("locked")
    env.project_ns("p1")
    srv = await _serve(env, https_server)

    status, answer = await _call(srv, "POST", _move("p1"), body={"department": "Bad_Name"})
    assert status == 400 and answer["code"] == "InvalidDepartment"
    status, answer = await _call(srv, "POST", _move("p1"), raw="not json")
    assert status == 400
    status, answer = await _call(srv, "POST", _move("ghost"), body={"department": "ml"})
    assert status == 404 and "ghost" in answer["error"]
    status, answer = await _call(srv, "POST", _move("busy"), body={"department": "ml"})
    assert status == 409 and answer["code"] == "ProjectBusy" and answer["pods"] == ["notebook-0"]

    obj = env.ns("locked")
    obj["metadata"].setdefault("annotations", {})[MOVE_ANNOTATION] = json.dumps(
        {
            "v": 1,
            "id": "x",
            "from": None,
            "to": "research",
            "runaiFrom": {"id": "1", "name": "default"},
            "runaiTo": {"id": "2", "name": "research"},
            "clusterId": env.runai.cluster_id,
            "project": {"id": "1", "name": "locked"},
            "phase": "deleted",
            "started": "2030-01-01T00:00:00Z",
            "heartbeat": "2030-01-01T00:00:00Z",
            "holder": "replica-9",
            "by": "carol",
        }
    )
    env.kube.put_object(obj)
    status, answer = await _call(srv, "POST", _move("locked"), body={"department": "ml"})
    assert status == 409 and answer["code"] == "MoveInProgress" and "carol" in answer["error"]

    await env.runai.stop_listening()
    status, answer = await _call(srv, "POST", _move("p1"), body={"department": "ml"})
    assert status == 503 and "nothing changed" in answer["error"]
    await env.runai.resume()

    env.runai.fail_project_create_in("ml", status=400)
    status, answer = await _call(srv, "POST", _move("p1"), body={"department": "ml"})
    assert status == 409 and answer["code"] == "MoveRolledBack"
    assert "not restored" in answer["reminder"] and answer["result"]["outcome"] == "rolled-back"


async def test_admin_api_department_delete_reports_moved_failed_and_remaining(
    env: Env, https_server: StartHttpsServer
) -> None:
    for name in ("a1", "b2"):
        env.project_ns(name, department="ml", runai_department="ml")
    env.pod("a1", "job-1", "Pending")
    srv = await _serve(env, https_server)

    status, answer = await _call(srv, "DELETE", "/api/v1/admin/departments/ml")
    assert status == 409 and answer["complete"] is False
    assert answer["moved"] == [] and answer["remaining"] == ["a1", "b2"]
    assert answer["failed"]["namespace"] == "a1" and answer["failed"]["pods"] == ["job-1"]

    env.state.delete({"kind": "Pod", "metadata": {"namespace": "a1", "name": "job-1", "uid": "uid-a1-job-1"}})
    status, answer = await _call(srv, "DELETE", "/api/v1/admin/departments/ml")
    assert status == 200 and answer["complete"] is True
    assert [m["namespace"] for m in answer["moved"]] == ["a1", "b2"] and answer["remaining"] == []
    assert "Re-add GPU quota" in answer["reminder"]
    status, answer = await _call(srv, "DELETE", "/api/v1/admin/departments/NOPE")
    assert status == 400


async def test_deleting_a_department_no_project_is_in_is_404(env: Env, https_server: StartHttpsServer) -> None:
    # A 404, not a 200 saying "department nosuch: 0 project(s) moved": a typo must not look done.
    env.project_ns("a1", department="ml", runai_department="ml")
    srv = await _serve(env, https_server)
    status, answer = await _call(srv, "DELETE", "/api/v1/admin/departments/nosuch")
    assert (status, answer["code"]) == (404, "DepartmentNotFound"), answer
    assert "nosuch" in answer["error"] and DEPARTMENT_LABEL in answer["error"]
    assert env.kube.get_object("Namespace", "a1")["metadata"]["labels"][DEPARTMENT_LABEL] == "ml"


# -- the CLI --------------------------------------------------------------------------------------


async def _cli(srv: HttpsServer, *argv: str, token: str | None = ADMIN_TOKEN) -> int:
    args = ["admin", *argv, "--server", f"https://127.0.0.1:{srv.port}", "--ca", str(srv.certs.ca_file)]
    if token:
        args += ["--token", token]
    # The CLI runs its own event loop, as from a shell; the server keeps serving on this one.
    return await asyncio.to_thread(cli_main, args)


async def test_cli_moves_a_project_and_exits_by_outcome(
    env: Env, https_server: StartHttpsServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    env.project_ns("p1")
    env.project_ns("busy")
    env.pod("busy", "notebook-0", "Running")
    srv = await _serve(env, https_server)

    assert await _cli(srv, "move-project", "p1", "ml") == 0
    out = capsys.readouterr().out
    assert "moved p1" in out and "REMINDER: Re-add GPU quota and access rules" in out
    assert env.labels("p1")[DEPARTMENT_LABEL] == "ml"

    assert await _cli(srv, "move-project", "busy", "ml") == 1
    assert "notebook-0" in capsys.readouterr().err
    assert await _cli(srv, "move-project", "p1", "research", token=USER_TOKEN) == 1
    assert "403" in capsys.readouterr().err

    monkeypatch.delenv("KUBE_TOKEN", raising=False)
    assert await _cli(srv, "move-project", "p1", "research", token=None) == 2
    monkeypatch.setenv("KUBE_TOKEN", ADMIN_TOKEN)
    assert await _cli(srv, "delete-department", "ml", token=None) == 0
    out = capsys.readouterr().out
    assert "moved: p1" in out and DEPARTMENT_LABEL not in env.labels("p1")


async def test_cli_exits_2_when_the_server_cannot_be_reached_or_verified(
    env: Env, https_server: StartHttpsServer, tmp_path: Path
) -> None:
    srv = await _serve(env, https_server)
    other_ca = tmp_path / "other-ca.crt"
    other_ca.write_bytes(make_ca(days=1).cert_pem)
    args = ["admin", "move-project", "p1", "ml", "--token", ADMIN_TOKEN, "--server", f"https://127.0.0.1:{srv.port}"]
    assert await asyncio.to_thread(cli_main, [*args, "--ca", str(other_ca)]) == 2  # untrusted certificate
    closed = ["admin", "move-project", "p1", "ml", "--token", ADMIN_TOKEN, "--ca", str(srv.certs.ca_file)]
    assert await asyncio.to_thread(cli_main, [*closed, "--server", "https://127.0.0.1:1"]) == 2


async def test_admin_log_lines_cannot_be_forged_through_the_path(
    env: Env, https_server: StartHttpsServer, caplog: pytest.LogCaptureFixture
) -> None:
    srv = await _serve(env, https_server)
    forged = "%0A2026-01-01 INFO webhook.http.admin_api admin root moves everything"
    with caplog.at_level(logging.INFO, logger="webhook.http.admin_api"):
        await _call(srv, "POST", _move(f"p1{forged}"), body={"department": "ml\nforged"})
        await _call(srv, "DELETE", f"/api/v1/admin/departments/ml{forged}")
    lines = [r.getMessage() for r in caplog.records if r.name == "webhook.http.admin_api"]
    assert len(lines) == 2, lines
    for line in lines:
        assert "\n" not in line and "\r" not in line, line
        assert "\\n2026-01-01" in line, line  # still there, visibly escaped
