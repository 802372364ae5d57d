"""The HTTP shell: aiohttp routes around the admission handlers, probes and metrics. The process
entry point (`serve`) is `webhook.runtime`."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from webhook.admission import BadReview, build_response, dumps, object_errors, parse_pod_review, parse_review
from webhook.core.decision import AdmissionHandler, Decision, Reason
from webhook.core.scheduling import request_namespace
from webhook.logsafe import log_safe
from webhook.metrics import REGISTRY, admission_counts
from webhook.state.store import ClusterState

log = logging.getLogger(__name__)

# The apiserver caps a stored object near 1.5 MiB and a review carries object and oldObject.
MAX_BODY_BYTES = 4 * 1024 * 1024
# Kubelet probes and one metrics scraper, a few connections each; the rest is shed.
PROBE_MAX_CONNECTIONS = 64
# How much of a caller-chosen uid a log line shows.
LOGGED_UID_CHARS = 64

ReadinessCheck = Callable[[], str | None]  # None when ready, else what is missing


@dataclass(slots=True)
class ServerStatus:
    draining: bool = False
    readiness: list[ReadinessCheck] = field(default_factory=list)
    # Problems that do not stop serving (settings refused, the last good ones serve): shown in
    # /readyz either way, so a probe's detail tells an operator what to fix.
    problems: list[ReadinessCheck] = field(default_factory=list)

    def not_ready(self) -> list[str]:
        missing = ["shutting down"] if self.draining else []
        missing.extend(r for check in self.readiness if (r := check()) is not None)
        return missing

    def current_problems(self) -> list[str]:
        return [p for check in self.problems if (p := check()) is not None]


# Every answer: JSON that echoes a caller's text must never be sniffed into HTML or script.
NOSNIFF = ("X-Content-Type-Options", "nosniff")
# Error answers: nothing in between keeps them (a 401 or 503 is about this moment and this caller).
NO_STORE = ("Cache-Control", "no-store")
_ERROR_HEADERS = dict([NOSNIFF, NO_STORE])


STATE_KEY: web.AppKey[ClusterState] = web.AppKey("state", ClusterState)
SERVER_KEY: web.AppKey[ServerStatus] = web.AppKey("server_status", ServerStatus)


def _json_error(status: int, reason: str) -> web.Response:
    # The headers here too: an Expect handler's refusal does not pass through the middleware.
    return web.json_response({"error": reason}, status=status, headers=_ERROR_HEADERS)


def rules_read(state: ClusterState) -> Callable[[Mapping[str, Any]], bool]:
    """Whether the rules read this request's object: anything in a project namespace, and the
    namespaces and ConfigMaps the settings guard judges. Only then is an odd field refused; other
    objects pass as the rules would pass them (S6), odd or not."""

    def check(review: Mapping[str, Any]) -> bool:
        kind = review.get("kind")
        if isinstance(kind, dict) and kind.get("kind") in ("Namespace", "ConfigMap"):
            return True
        namespace = state.namespaces.get(request_namespace(review))
        return namespace is not None and namespace.is_project

    return check


# An admission review's answer headers, built once (each answer copies them).
_REVIEW_ANSWER_HEADERS: CIMultiDict[str] = CIMultiDict([("Content-Type", "application/json"), NOSNIFF])

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]
# The admission routes by path, for the listener to call without the router (`request_handler`).
DIRECT_ROUTES: web.AppKey[dict[str, tuple[Handler, ExpectHandler]]] = web.AppKey("direct_routes", dict)


# The endpoints whose reviews are of pods: decoded against the pod schema first (`parse_pod_review`).
POD_REVIEW_PATHS = frozenset({"/mutate/pods", "/validate/pods"})


def admission_route(
    path: str,
    handler: AdmissionHandler,
    reads_object: Callable[[Mapping[str, Any]], bool] = lambda _: True,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Handler:
    """One admission endpoint, as one coroutine per review. No middleware around it (see
    answering_as_json): its own answers are JSON and say nosniff, its errors no-store too, and
    nothing it raises escapes as a traceback."""
    endpoint = path.strip("/").replace("/", "_")
    counts = admission_counts(endpoint)  # exported from here on, every series at zero
    too_large = f"body larger than {max_body_bytes} bytes"
    of_pods = path in POD_REVIEW_PATHS

    async def route(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            refused = _refuse_early(request, max_body_bytes)
            if refused is not None:
                counts.bad_request += 1
                return refused
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                counts.bad_request += 1
                return _json_error(413, too_large)
            typed = parse_pod_review(body) if of_pods else None
            if typed is not None:
                version, review = typed
            else:
                try:
                    version, review = parse_review(body)
                except BadReview as exc:
                    counts.bad_request += 1
                    return _json_error(exc.status, exc.reason)
            try:
                # The pod schema takes only objects that pass object_errors: no second walk for those.
                problem = object_errors(review) if typed is None and reads_object(review) else None
                if problem is not None:
                    decision = Decision.deny(f"cannot read the object: {problem}", 400, Reason.BAD_REQUEST)
                else:
                    decision = await handler(review)
            except Exception:
                # A bug must not turn into a traceback for the apiserver; refuse this one and keep serving.
                counts.internal_errors += 1
                log.exception(
                    "admission handler %s failed for uid %s", endpoint, log_safe(review.get("uid"), LOGGED_UID_CHARS)
                )
                decision = Decision.deny(
                    "internal error in scheduling-webhook; see its logs", 500, Reason.INTERNAL_ERROR
                )
            if not decision.allowed:
                counts.denied += 1
            elif decision.patch:
                counts.patched += 1
            else:
                counts.allowed += 1
            payload = dumps(build_response(version, review["uid"], decision))
            counts.observe(time.perf_counter() - started)
            return web.Response(body=payload, headers=_REVIEW_ANSWER_HEADERS)
        except ConnectionError as exc:
            # The client hung up (or a deadline closed it) before its body was read.
            log.debug("POST %s: the client closed the connection before its body was read (%s)",
                      path, type(exc).__name__)  # fmt: skip
            return _json_error(400, "connection closed before the body was read")
        except web.HTTPException as exc:
            return _json_error(exc.status, exc.reason)
        except Exception:
            log.exception("unhandled error on POST %s", path)
            return _json_error(500, "internal error; see the server log")

    return route


def _refuse_early(request: web.Request, max_body_bytes: int) -> web.Response | None:
    """A 415 or 413 decided from the headers alone, before the body is read (or, with
    `Expect: 100-continue`, before the client is told to send it)."""
    headers = request.headers
    # The header as the apiserver writes it needs no parsing; any other spelling is parsed.
    if headers.get("Content-Type") != "application/json" and request.content_type != "application/json":
        return _json_error(415, f"Content-Type must be application/json, got {log_safe(request.content_type)!r}")
    length = request.content_length  # the parser has checked it is digits
    if length is not None and length > max_body_bytes:
        response = _json_error(413, f"body larger than {max_body_bytes} bytes")
        response.force_close()  # rather than read megabytes only to keep the connection
        return response
    return None


def expecting_continue(max_body_bytes: int) -> ExpectHandler:
    """`Expect: 100-continue`: answer 413/415 instead of "100 Continue" when the headers already
    say the body will be refused, so a client does not upload megabytes to be refused."""

    async def expect_continue(request: web.Request) -> web.StreamResponse | None:
        expect = request.headers.get("Expect", "")
        if expect.lower() != "100-continue":
            return _json_error(417, f"unknown expectation {log_safe(expect)!r}")
        refused = _refuse_early(request, max_body_bytes)
        if refused is not None:
            refused.force_close()  # the client may send the body anyway, or not: start afresh
            return refused
        if request.version >= (1, 1):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return None

    return expect_continue


def request_handler(app: web.Application) -> Handler:
    """What a listener calls for each request of `app`: a POST to an admission path (the query
    aside: the apiserver adds `?timeout=10s`) goes straight to its route, everything else through
    aiohttp's router, which would have chosen the same route (`Application._handle`, the JSON
    404/405); the router resolved every review's path against the table first."""
    handle: Handler = app._handle
    direct = app.get(DIRECT_ROUTES)
    if not direct:
        return handle

    def dispatch(request: web.Request) -> Awaitable[web.StreamResponse]:
        if request.method == "POST":
            found = direct.get(request.raw_path.partition("?")[0])
            if found is not None:
                route, expect = found
                if request.headers.get("Expect"):
                    return _expecting(request, route, expect)
                return route(request)
        return handle(request)

    return dispatch


async def _expecting(request: web.Request, route: Handler, expect: ExpectHandler) -> web.StreamResponse:
    # As Application._handle does it: the expect handler's refusal is the answer.
    refused = await expect(request)
    await request.writer.drain()
    if refused is not None:
        return refused
    return await route(request)


async def _answer_as_json(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every error answer is JSON with a reason and `no-store`; unexpected ones never show a
    traceback. Every answer says `nosniff`."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _json_error(exc.status, exc.reason)
    except ConnectionError as exc:
        # The client hung up (or a deadline closed it) before its body was read: nobody to answer.
        if log.isEnabledFor(logging.DEBUG):  # escaping the path only for a line that is written
            log.debug("%s %s: the client closed the connection before its body was read (%s)",
                      log_safe(request.method, 20), log_safe(request.path, 200), type(exc).__name__)  # fmt: skip
        response = _json_error(400, "connection closed before the body was read")
    except Exception:
        # The path is the caller's (decoded: %0A is a newline), so escaped: no forged log lines.
        log.exception("unhandled error on %s %s", log_safe(request.method, 20), log_safe(request.path, 200))
        response = _json_error(500, "internal error; see the server log")
    if not response.prepared:
        headers = response.headers
        headers.setdefault(*NOSNIFF)
        if response.status >= 400 and "no-store" not in headers.get(NO_STORE[0], ""):
            headers[NO_STORE[0]] = NO_STORE[1]
    return response


@web.middleware
async def errors_as_json(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """`_answer_as_json` for every route of an app (the probe listener's)."""
    return await _answer_as_json(request, handler)


def answering_as_json(handler: Handler) -> Handler:
    """`_answer_as_json` around one route's handler. The main app has no app-wide middleware:
    aiohttp's middleware layer cost every admission review a few percent, and the admission
    routes make their own answers JSON (`admission_route`)."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        return await _answer_as_json(request, handler)

    return wrapped


def _as_json_routes(routes: Iterable[web.AbstractRouteDef]) -> list[web.AbstractRouteDef]:
    wrapped: list[web.AbstractRouteDef] = []
    for route in routes:
        if not isinstance(route, web.RouteDef):
            raise TypeError(f"create_app serves RouteDefs only, got {route!r}")
        wrapped.append(web.RouteDef(route.method, route.path, answering_as_json(route.handler), route.kwargs))
    return wrapped


async def _not_found(request: web.Request) -> web.StreamResponse:
    """The last route: what no other route serves is a JSON 404, or a 405 when another route
    has the path but not the method (aiohttp would answer both in plain text)."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource is not request.match_info.route.resource:
            _, methods = await resource.resolve(request)
            allowed.update(methods)
    if allowed:
        response = _json_error(405, f"method {request.method} not allowed; allowed: {', '.join(sorted(allowed))}")
        response.headers["Allow"] = ",".join(sorted(allowed))
        return response
    return _json_error(404, "Not Found")


async def healthz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    status = request.app[SERVER_KEY]
    missing = status.not_ready()
    body: dict[str, Any] = {"ready": not missing}
    if missing:
        body["waiting_for"] = missing
    if problems := status.current_problems():
        body["problems"] = problems
    return web.json_response(body, status=503 if missing else 200)


async def metrics(_: web.Request) -> web.Response:
    return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_app(
    state: ClusterState,
    handlers: Mapping[str, AdmissionHandler],
    routes: Iterable[web.AbstractRouteDef] = (),
    readiness: Iterable[ReadinessCheck] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
) -> web.Application:
    """The application: `handlers` maps admission paths to handlers (`webhook.http.handlers`
    builds them), `routes` are the APIs beside them."""
    app = web.Application(client_max_size=max_body_bytes)
    app[STATE_KEY] = state
    server_status = ServerStatus(readiness=[_caches_ready(state), *readiness], problems=[_settings_problem(state)])
    app[SERVER_KEY] = server_status
    _add_admission_routes(app, state, handlers, max_body_bytes)
    app.router.add_routes(_as_json_routes(_probe_routes()))
    app.router.add_routes(_as_json_routes(routes))
    _add_not_found(app)
    return app


def create_admission_app(
    main: web.Application, handlers: Mapping[str, AdmissionHandler], max_body_bytes: int = MAX_BODY_BYTES
) -> web.Application:
    """The admission routes alone, for a listener of their own (`serve --admission-port`): the port
    the apiserver calls can then require its client certificate and be fenced to the control plane
    while the console and the APIs, on `main`, stay reachable by their users. It shares `main`'s
    readiness and draining; `main` is then built without admission handlers."""
    app = web.Application(client_max_size=max_body_bytes)
    app[STATE_KEY] = main[STATE_KEY]
    app[SERVER_KEY] = main[SERVER_KEY]
    _add_admission_routes(app, main[STATE_KEY], handlers, max_body_bytes)
    _add_not_found(app)
    return app


def _add_admission_routes(
    app: web.Application, state: ClusterState, handlers: Mapping[str, AdmissionHandler], max_body_bytes: int
) -> None:
    expect_continue = expecting_continue(max_body_bytes)
    reads_object = rules_read(state)
    direct: dict[str, tuple[Handler, ExpectHandler]] = {}
    for path, handler in handlers.items():
        route = admission_route(path, handler, reads_object, max_body_bytes)
        app.router.add_post(path, route, expect_handler=expect_continue)
        direct[path] = (route, expect_continue)
    app[DIRECT_ROUTES] = direct


def _add_not_found(app: web.Application) -> None:
    # [\s\S]: a decoded path may hold a newline (%0A), which `.` does not match.
    app.router.add_route("*", r"/{tail:[\s\S]*}", answering_as_json(_not_found))


def _probe_routes() -> list[web.RouteDef]:
    return [web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", metrics)]


def create_probe_app(main: web.Application) -> web.Application:
    """/healthz, /readyz and /metrics of `main`, for a listener of their own: kubelet probes and
    the metrics scraper reach them without a client certificate, and past the main port's cap."""
    app = web.Application(client_max_size=64 * 1024, middlewares=[errors_as_json])
    app[SERVER_KEY] = main[SERVER_KEY]
    app.router.add_routes(_probe_routes())
    return app


def _settings_problem(state: ClusterState) -> ReadinessCheck:
    def check() -> str | None:
        error = state.snapshot().settings_error
        return None if error is None else f"settings ConfigMap refused, the last good settings serve: {error}"

    return check


CLUSTER_MODE_ONLY = "ClusterModeOnly"


def cluster_mode_only_routes() -> list[web.RouteDef]:
    """In folder mode (--state) the admin API does not exist: say why instead of a bare 404.
    Registered after the folder mode's own routes, so it answers only what they do not serve."""

    async def needs_cluster(request: web.Request) -> web.Response:
        reason = (
            f"{request.method} {request.path} needs cluster mode: this server reads a folder (--state), "
            "which has no Run:ai or namespaces to change; run it against a cluster (in-cluster or --kubeconfig)"
        )
        return web.json_response({"error": reason, "code": CLUSTER_MODE_ONLY}, status=404)

    return [web.route("*", "/api/{tail:.*}", needs_cluster)]


def _caches_ready(state: ClusterState) -> ReadinessCheck:
    def check() -> str | None:
        if state.ready():
            return None
        pending = sorted(kind for kind, done in state.synced.items() if not done) or ["initial sync"]
        return "caches: " + ", ".join(pending)

    return check
