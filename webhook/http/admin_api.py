"""Admin actions over HTTPS: move a project to another department, delete a department (R5 in
docs/RULES.md).

    POST   /api/v1/admin/projects/{namespace}/move   {"department": "<name>" | null}
    DELETE /api/v1/admin/departments/{name}

Every request needs a bearer token that the `authorize` callable accepts as an administrator.
Answers are JSON. Errors: 400 bad department name or body, 401 no/invalid token, 403 not an
admin, 404 unknown namespace, 409 busy (pods running or waiting, a move in progress, a move
rolled back because Run:ai refused the create), 503 Run:ai or the Kubernetes API unavailable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from webhook.http import auth
from webhook.kube.api import KubeError
from webhook.logsafe import log_safe
from webhook.runai.client import RunaiError
from webhook.runai.departments import DepartmentDeleteResult, MoveError, MoveResult, ProjectBusy
from webhook.snapshot import DEPARTMENT_LABEL

log = logging.getLogger(__name__)

MOVE_PATH = "/api/v1/admin/projects/{namespace}/move"
DELETE_DEPARTMENT_PATH = "/api/v1/admin/departments/{name}"


class Authorize(Protocol):
    """Checks the request's bearer token; returns the caller's identity (a username or an object with
    `.username`), or raises: an exception with `status` 401 or 403 (aiohttp's HTTPUnauthorized /
    HTTPForbidden qualify), or AdminAuthError."""

    def __call__(self, request: web.Request) -> Awaitable[Any]: ...


class AdminAuthError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Mover(Protocol):
    """What the routes need of `DepartmentMover`."""

    async def move_project(
        self, namespace: str, department: str | None, *, requested_by: str = "", dry_run: bool = False
    ) -> MoveResult: ...

    async def delete_department(
        self, name: str, *, requested_by: str = "", dry_run: bool = False
    ) -> DepartmentDeleteResult: ...


def _error(status: int, code: str, message: str, **extra: Any) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="scheduling-webhook"'} if status == 401 else None
    return web.json_response({"error": message, "code": code, **extra}, status=status, headers=headers)


def _identity_name(identity: Any) -> str:
    if isinstance(identity, str):
        return identity
    for attr in ("username", "name"):
        value = getattr(identity, attr, None)
        if isinstance(value, str):
            return value
    username = identity.get("username") if isinstance(identity, dict) else None
    if isinstance(username, str):
        return username
    return str(identity)


def bearer_token(request: web.Request) -> str | None:
    return auth.bearer_token(request.headers.get("Authorization"))


# Who may call the admin API: a move rewrites namespaces and Run:ai projects, so a write it is.
ADMIN_API_CHECK = auth.AccessCheck("update", "namespaces")
ADMIN_API_ACTION = "move projects or delete departments"


class AdminChecker(Protocol):
    """`webhook.http.auth.KubeAuthorizer` has this shape: token -> principal, or raises (status 401/403/503)."""

    def authorize_admin(self, token: str | None, *, client: str = "") -> Awaitable[Any]: ...


def authorize_with(checker: AdminChecker) -> Authorize:
    """An `Authorize` from an object checking bearer tokens, e.g. a KubeAuthorizer whose admin check
    is a write (`AccessCheck("update", "namespaces")`): a move rewrites namespaces and Run:ai projects."""

    async def authorize(request: web.Request) -> Any:
        return await checker.authorize_admin(bearer_token(request), client=request.remote or "")

    return authorize


def _auth_message(exc: Exception) -> str:
    if isinstance(exc, web.HTTPException):
        return exc.text or exc.reason
    for attr in ("reason", "message"):
        value = getattr(exc, attr, None)
        if isinstance(value, str) and value:
            return value
    return str(exc)


async def _authorize(request: web.Request, authorize: Authorize) -> str | web.Response:
    if bearer_token(request) is None:
        return _error(401, "Unauthorized", "a bearer token is required: send 'Authorization: Bearer <token>'")
    try:
        return _identity_name(await authorize(request))
    except Exception as exc:
        status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
        message = _auth_message(exc)
        if status in (401, 403):
            return _error(status, "Unauthorized" if status == 401 else "Forbidden", message)
        if status == 503 or isinstance(exc, KubeError | OSError | TimeoutError):
            # The caller is not authenticated: the reason stays in the log.
            log.warning("admin API: cannot check the caller: %s", log_safe(message))
            return _error(503, "Unavailable", "cannot check the caller's token now; retry shortly")
        raise


def _move_error(exc: MoveError) -> dict[str, Any]:
    body: dict[str, Any] = {"error": exc.message, "code": exc.code}
    if exc.namespace:
        body["namespace"] = exc.namespace
    if isinstance(exc, ProjectBusy):
        body["pods"] = exc.pods
    if exc.result is not None:
        body["result"] = exc.result.to_json()
        body["reminder"] = exc.result.reminder
    return body


Answer = tuple[int, dict[str, Any]]  # HTTP status and JSON body, as the admin API sends them


async def _answer(work: Callable[[], Awaitable[Answer]]) -> Answer:
    try:
        return await work()
    except MoveError as exc:
        return exc.status, _move_error(exc)
    except (RunaiError, KubeError) as exc:
        # Wrapped by the mover wherever it matters; anything left is still a dependency failing.
        return 503, {"error": str(exc), "code": "Unavailable"}


async def move_project_answer(
    mover: Mover, namespace: str, department: str | None, who: str, *, dry_run: bool = False
) -> Answer:
    """What `POST /api/v1/admin/projects/{namespace}/move` answers, for a caller already authorized
    as an admin (the console and the aggregated API ask the same)."""

    async def move() -> Answer:
        # Path and body are the caller's: escaped, so that %0A cannot start a forged log line.
        log.info(
            "admin %s %s %s to department %s",
            log_safe(who),
            "dry-runs a move of" if dry_run else "moves",
            log_safe(namespace),
            log_safe(department),
        )
        result: MoveResult = await _run_to_completion(
            mover.move_project(namespace, department or None, requested_by=who, dry_run=dry_run)
        )
        return 200, result.to_json()

    return await _answer(move)


async def delete_department_answer(mover: Mover, name: str, who: str, *, dry_run: bool = False) -> Answer:
    """What `DELETE /api/v1/admin/departments/{name}` answers, for a caller already authorized."""

    async def delete() -> Answer:
        log.info("admin %s %s department %s", log_safe(who), "dry-runs a delete of" if dry_run else "deletes",
                 log_safe(name))  # fmt: skip
        result: DepartmentDeleteResult = await _run_to_completion(
            mover.delete_department(name, requested_by=who, dry_run=dry_run)
        )
        if result.complete and not result.moved:
            # A department is the label its projects carry: with none, there is nothing of that name.
            return 404, {
                "error": f"department {name} not found: no project namespace is labelled {DEPARTMENT_LABEL}={name}",
                "code": "DepartmentNotFound",
                "department": name,
            }
        return result.status, result.to_json()

    return await _answer(delete)


async def _run_to_completion(work: Awaitable[Any]) -> Any:
    # A client that hangs up must not cancel a move half-way: the move runs to its end regardless.
    task = asyncio.ensure_future(work)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return await asyncio.shield(task)


def dry_run_of(request: web.Request) -> bool | web.Response:
    """`?dryRun=All`, as the Kubernetes API takes it (kubectl's `--dry-run=server` sends it): True;
    absent: False; any other value: a 400, as the apiserver answers one."""
    values = request.query.getall("dryRun", [])
    if not values:
        return False
    if values == ["All"]:
        return True
    return _error(400, "BadRequest", "dryRun: the only value is All")


async def move_answer(mover: Mover, request: web.Request, namespace: str, who: str) -> web.Response:
    """A move of `namespace` by `who`, its body and `dryRun` read from `request`: the answer of both
    the /api/v1 route and the aggregated API's."""
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "BadRequest", 'the body must be JSON: {"department": "<name>"}')
    if not isinstance(body, dict) or "department" not in body:
        return _error(400, "BadRequest", 'the body must be a JSON object: {"department": "<name>"}')
    department = body["department"]
    if department is not None and not isinstance(department, str):
        return _error(400, "InvalidDepartment", "department must be a string (or null for the default)")
    dry_run = dry_run_of(request)
    if isinstance(dry_run, web.Response):
        return dry_run
    status, answer = await move_project_answer(mover, namespace, department, who, dry_run=dry_run)
    return web.json_response(answer, status=status)


async def delete_answer(mover: Mover, request: web.Request, name: str, who: str) -> web.Response:
    """The deletion of department `name` by `who`, `dryRun` read from `request`."""
    dry_run = dry_run_of(request)
    if isinstance(dry_run, web.Response):
        return dry_run
    status, answer = await delete_department_answer(mover, name, who, dry_run=dry_run)
    return web.json_response(answer, status=status)


def admin_routes(mover: Mover, authorize: Authorize) -> list[web.RouteDef]:
    """Routes for `create_app(routes=...)`."""

    async def guarded(request: web.Request, action: Callable[[str], Awaitable[web.Response]]) -> web.Response:
        who = await _authorize(request, authorize)
        if isinstance(who, web.Response):
            return who
        return await action(who)

    async def move(request: web.Request) -> web.Response:
        return await guarded(request, lambda who: move_answer(mover, request, request.match_info["namespace"], who))

    async def delete_department(request: web.Request) -> web.Response:
        return await guarded(request, lambda who: delete_answer(mover, request, request.match_info["name"], who))

    return [
        web.post(MOVE_PATH, move),
        web.delete(DELETE_DEPARTMENT_PATH, delete_department),
    ]
