"""Check Run:ai requests and responses against NVIDIA's OpenAPI spec (`runai-openapi.json`) with openapi-core.

The spec is loaded once per process. What is loaded is a copy trimmed to the paths this system
calls (and the components they reach), with two adjustments made in memory, never in the file:

* `POST /api/v1/token` inherits the document-wide `bearerAuth` requirement, yet it is the call
  that obtains the bearer token; the copy gives that operation `security: []`.
* Requests are matched against the spec's own server (`https://app.run.ai`): the host of the
  checked URL is replaced by it, so a stand-in on 127.0.0.1 is checked by path.

Everything else is checked as written: formats (uuid, date-time), filterBy patterns, required
fields, enums, and that the status code is one the operation documents.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from openapi_core import OpenAPI
from openapi_core.testing import MockRequest, MockResponse
from yarl import URL

from tests.support.shared import SHARED_ENV, missing, shared_dir

SPEC_ENV = "RUNAI_OPENAPI_SPEC"

# The Run:ai paths this system calls; the stand-in serves exactly these.
USED_PATHS = (
    "/api/v1/token",
    "/api/v1/clusters",
    "/api/v1/org-unit/departments",
    "/api/v1/org-unit/projects",
    "/api/v1/org-unit/projects/{projectId}",
    "/api/v1/node-pools",
    "/api/v1/clusters/{clusterUuid}/nodepools/{nodepoolName}/metrics",
)


def spec_path() -> Path:
    """`$RUNAI_OPENAPI_SPEC`, else `runai/runai-openapi.json` in the shared folder (`$SCHEDULING_WEBHOOK_SHARED`)."""
    override = os.environ.get(SPEC_ENV)
    if override:
        return Path(override)
    return shared_dir() / "runai" / "runai-openapi.json"


def _refs(node: Any) -> Iterable[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def trimmed_spec(full: Mapping[str, Any], paths: Iterable[str] = USED_PATHS) -> dict[str, Any]:
    """A copy of `full` with only `paths` and the components they reach (transitively)."""
    spec = copy.deepcopy(dict(full))
    spec["paths"] = {p: spec["paths"][p] for p in paths}
    components = full.get("components", {})
    keep: dict[str, set[str]] = {}
    pending = list(_refs(spec["paths"]))
    while pending:
        ref = pending.pop()
        if not ref.startswith("#/components/"):
            continue
        section, name = ref[len("#/components/") :].split("/", 1)
        if name in keep.setdefault(section, set()):
            continue
        keep[section].add(name)
        pending.extend(_refs(components[section][name]))
    spec["components"] = {
        section: {n: v for n, v in entries.items() if n in keep.get(section, ())}
        for section, entries in components.items()
        if section in keep
    }
    # Reached by name from `security`, not by $ref; without them every request would pass unchecked.
    spec["components"]["securitySchemes"] = copy.deepcopy(components.get("securitySchemes", {}))
    token_op = spec["paths"].get("/api/v1/token", {}).get("post")
    if token_op is not None:
        token_op["security"] = []
    return spec


@functools.cache
def _loaded() -> tuple[OpenAPI, str]:
    path = spec_path()
    if not path.is_file():
        missing(path, f"the Run:ai OpenAPI spec: set {SPEC_ENV} or {SHARED_ENV}")
    full = json.loads(path.read_text(encoding="utf-8"))
    spec = trimmed_spec(full)
    server = (spec.get("servers") or [{"url": "https://app.run.ai"}])[0]["url"].rstrip("/")
    return OpenAPI.from_dict(spec), server


def checked_spec() -> OpenAPI:
    """The trimmed spec, loaded once per process."""
    return _loaded()[0]


def _describe(exc: BaseException) -> list[str]:
    messages = [str(exc)]
    seen: set[int] = {id(exc)}
    cause = exc.__cause__ or exc.__context__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        errors = getattr(cause, "schema_errors", None)
        if errors:
            messages.extend(f"  {getattr(e, 'json_path', '')}: {getattr(e, 'message', e)}" for e in errors)
        else:
            messages.append(f"  {type(cause).__name__}: {cause}")
        cause = cause.__cause__ or cause.__context__
    return messages


def _mock_request(method: str, url: str, headers: Mapping[str, str] | None, body: bytes | None) -> MockRequest:
    server = _loaded()[1]
    parsed = URL(url)
    headers = dict(headers or {})
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "application/json")
    return MockRequest(
        server,
        method.lower(),
        parsed.path,
        args=list(parsed.query.items()),  # type: ignore[arg-type]  # werkzeug takes pairs too
        headers=headers,
        data=body or None,
        content_type=content_type.split(";")[0].strip(),
    )


def validate_request(
    method: str, url: str, headers: Mapping[str, str] | None = None, body: bytes | None = None
) -> list[str]:
    """What is wrong with this request per the spec; empty when it conforms."""
    try:
        checked_spec().validate_request(_mock_request(method, url, headers, body))
    except Exception as exc:  # openapi-core raises one of many types; all mean "does not conform"
        return _describe(exc)
    return []


def validate_response(
    method: str,
    url: str,
    status: int,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    request_headers: Mapping[str, str] | None = None,
) -> list[str]:
    """What is wrong with this response to `method url` per the spec; empty when it conforms."""
    headers = dict(headers or {})
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), None)
    response = MockResponse(
        body or b"",
        status_code=status,
        headers=headers,
        content_type=content_type.split(";")[0].strip() if content_type else None,  # type: ignore[arg-type]
    )
    try:
        checked_spec().validate_response(_mock_request(method, url, request_headers, None), response)
    except Exception as exc:
        return _describe(exc)
    return []


@dataclass
class Violation:
    kind: str  # "request" or "response"
    method: str
    url: str
    status: int | None
    errors: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        where = f"{self.kind} {self.method} {self.url}" + (f" -> {self.status}" if self.status else "")
        return where + "\n" + "\n".join(self.errors)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def spec_middleware(violations: list[Violation]) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """An aiohttp middleware that checks every request received and every response sent.

    Violations are appended to `violations`; the exchange itself is not changed, so a test sees
    both what the client did and what the spec says about it.
    """
    # Loaded here, in the test's setup, so a missing spec skips the test rather than becoming a
    # 500 inside the stand-in's handler.
    checked_spec()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        body = await request.read()
        url = str(request.rel_url)
        headers = dict(request.headers)
        errors = validate_request(request.method, url, headers, body)
        if errors:
            violations.append(Violation("request", request.method, url, None, errors))
        response = await handler(request)
        if isinstance(response, web.Response):
            payload = response.body if isinstance(response.body, bytes) else None
            errors = validate_response(
                request.method, url, response.status, dict(response.headers), payload, request_headers=headers
            )
            if errors:
                violations.append(Violation("response", request.method, url, response.status, errors))
        return response

    return check
