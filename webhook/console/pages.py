"""The console's pages under /ui/: server-rendered HTML over the same answers the APIs give.

Reads go through `GpuViews` (the GPU API's answers) and `project_offer` (the scheduling API's);
admin actions through `move_project_answer` / `delete_department_answer` (the admin API's). Every
page asks the same authorizer as its API: a project page is for whoever may read the project's GPU
view, the admin pages for admins, the admin actions for those the admin API lets act.

Cluster mode: the user signs in with a Kubernetes token; the session cookie holds who the
TokenReview said they are, never the token (`session.py`), and a sign-out ends it on every replica
(`signouts.py`). Folder mode (`serve --state`, loopback only): no sign-in, and admin actions say
they need a cluster.

One function a page, each given the `PageContext` the pages share (the console's parts, the
templates, the answer headers, and the steps every page takes: the session, the authorization, the
error page); `console_routes` makes one context and the table of routes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import jinja2
from aiohttp import web

from webhook.console.session import (
    COOKIE,
    LEGACY_COOKIE,
    LEGACY_PATH,
    NoSessionKeys,
    Session,
    SessionError,
    Sessions,
    check_form,
    safe_next,
    session_cookies,
    token_expiry,
)
from webhook.console.signouts import SignoutError, Signouts
from webhook.console.wording import advice
from webhook.core.admin_view import AdminProject, RunaiAdminView
from webhook.core.departments import department_name_error
from webhook.core.quota import format_gpus
from webhook.http.admin_api import Mover, delete_department_answer, move_project_answer
from webhook.http.auth import AuthError, Principal
from webhook.http.gpu_api import NO_RUNAI_DATA, GpuViews
from webhook.http.scheduling_api import NotAProject, project_offer

log = logging.getLogger(__name__)

_STATIC = {"console.css": "text/css", "console.js": "text/javascript"}
# Everything the pages load comes from this server; nothing may frame them or post elsewhere.
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: Chromium then sends `Origin: null` with form posts, and the same-site check needs it.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "private, no-store",
}
# Cluster mode: the console is only ever HTTPS, so a browser that saw it once never tries plain
# HTTP (a downgrade in between). Not in folder mode: HSTS is per host, not per port, and there the
# host is localhost, whose other ports may well serve plain HTTP.
_HSTS = {"Strict-Transport-Security": "max-age=31536000"}


class SignIn(Protocol):
    """Checks a token by TokenReview (`webhook.http.auth.KubeAuthorizer.authenticate`)."""

    def __call__(self, token: str | None, *, client: str = "") -> Awaitable[Principal]: ...


class Reader(Protocol):
    """Who may read a project's pages and the admin pages, asked for a signed-in principal
    (`KubeAuthorizer`: SubjectAccessReview; folder mode: `LoopbackAuthorizer`)."""

    def authorize_project_for(self, principal: Principal | None, namespace: str) -> Awaitable[Principal]: ...

    def authorize_admin_for(self, principal: Principal | None) -> Awaitable[Principal]: ...


class ActionAuthorizer(Protocol):
    """Who may move projects and delete departments (`KubeAuthorizer.authorize_admin_for` with the
    admin API's check)."""

    def authorize_admin_for(self, principal: Principal | None) -> Awaitable[Principal]: ...


@dataclass
class Console:
    views: GpuViews
    reader: Reader  # the GPU API's checks: project pages and admin pages
    sign_in: SignIn | None = None  # None: folder mode, no sign-in
    actor: ActionAuthorizer | None = None  # the admin API's check
    mover: Mover | None = None  # None: admin actions need cluster mode
    sessions: Sessions = field(default_factory=Sessions.ephemeral)
    signouts: Signouts | None = None  # with sign-in, required: a sign-out must end the session

    def __post_init__(self) -> None:
        if self.sign_in is not None and self.signouts is None:
            raise ValueError("a console with sign-in needs the sign-out list (Signouts)")

    @property
    def open(self) -> bool:
        return self.sign_in is None


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("webhook.console", "templates"),
        autoescape=True,  # every value is escaped unless a template says otherwise (none does)
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["gpus"] = lambda v: "—" if v is None else format_gpus(float(v))
    env.filters["advice"] = advice
    env.filters["urlpart"] = lambda v: quote(str(v), safe="")
    return env


_RENEWED: web.RequestKey[Session] = web.RequestKey("console_session_renewed", Session)
_SIGNOUTS_NOT_READ = (
    "this replica has not read the list of signed-out sessions from the Kubernetes API yet; try again in a moment"
)
_TWO_COOKIES = (
    "this browser sent two console session cookies, one of them set by another site on this host (another "
    "port of localhost, for instance). Neither is used: clear this site's cookies and sign in again."
)
_SIGNOUT_NOT_RECORDED = (
    "the Kubernetes API did not take the sign-out, so a copy of this session's cookie stays good until it "
    "has been unused for {minutes} minutes. This browser has forgotten it."
)


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


class _Stop(Exception):
    """A page cannot be shown; `response` says why (a sign-in redirect, a 403 page...)."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Page = Callable[["PageContext", web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class PageContext:
    """What every page shares: the console's parts, the templates and the headers of every answer."""

    console: Console
    env: jinja2.Environment
    headers: Mapping[str, str]

    def render(
        self, request: web.Request, template: str, status: int = 200, session: Session | None = None, **context: Any
    ) -> web.Response:
        page = self.env.get_template(template).render(
            open_mode=self.console.open,
            signed_in=session is not None,
            csrf=session.csrf if session else "",
            path=request.path,
            **context,
        )
        return web.Response(text=page, status=status, content_type="text/html", headers=self.headers)

    def problem(self, request: web.Request, status: int, title: str, reason: str, session: Session | None) -> _Stop:
        return _Stop(self.render(request, "problem.html", status, session, title=title, reason=reason, code=status))

    def session_of(self, request: web.Request) -> Session | None:
        """The signed-in session; in cluster mode without one, a redirect to the sign-in page.
        A session due for it is sealed again (`_served` puts the new cookie on the answer)."""
        if self.console.open:
            return None
        values = session_cookies(request)
        session = self.console.sessions.open(values[0]) if values else None
        if session is not None and self.console.signouts is not None:
            if not self.console.signouts.ready:
                raise self.problem(request, 503, "The console is starting", _SIGNOUTS_NOT_READ, None)
            if self.console.signouts.signed_out(session):
                session = None
        if session is None:
            target = request.path_qs if request.method == "GET" else "/ui/"
            response = _see_other("/ui/signin?" + urlencode({"next": target}))
            if values:
                Sessions.clear(response)
            raise _Stop(response)
        renewed = self.console.sessions.renewal(session)
        if renewed is not None:
            request[_RENEWED] = renewed
            session = renewed
        return session

    async def authorized(
        self, request: web.Request, session: Session | None, check: Callable[[Principal | None], Awaitable[Principal]]
    ) -> Principal:
        try:
            return await check(session.principal if session else None)
        except AuthError as exc:
            if exc.status == 401:
                response = _see_other("/ui/signin?" + urlencode({"next": request.path, "expired": "1"}))
                Sessions.clear(response)
                raise _Stop(response) from None
            title = "Not allowed" if exc.status == 403 else "Cannot check who you are"
            raise self.problem(request, exc.status, title, exc.reason, session) from None

    def admin_data(self, request: web.Request, session: Session | None) -> RunaiAdminView:
        view = self.console.views.admin()
        if view is None:
            raise self.problem(request, 503, "Run:ai cannot be reached", NO_RUNAI_DATA, session)
        return view

    async def acting(self, request: web.Request) -> tuple[Session | None, Mapping[str, str], str]:
        """A state-changing post: signed in, same site, CSRF secret, and allowed to act."""
        session = self.session_of(request)
        form = await request.post()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        refused = check_form(request, session, fields.get("csrf"))
        if refused is not None:
            raise self.problem(request, 403, "Refused", refused, session)
        if self.console.mover is None or self.console.actor is None:
            raise self.problem(
                request,
                501,
                "Needs cluster mode",
                "moving projects and deleting departments changes Kubernetes and Run:ai: run the server "
                "against a cluster (without --state) to do it",
                session,
            )
        principal = await self.authorized(request, session, self.console.actor.authorize_admin_for)
        return session, fields, principal.username


def _served(ctx: PageContext, handler: Page) -> Handler:
    """`handler` as a route: the shared context passed in, a stop turned into its answer, a renewed
    session's cookie set."""

    async def run(request: web.Request) -> web.StreamResponse:
        if not ctx.console.open and len(session_cookies(request)) > 1:
            # Another port of this host (cookies ignore ports) or an old browser set one of its
            # own: guessing which is ours would let it sign the user in or out.
            refused = ctx.render(
                request, "problem.html", 400, None, title="Two session cookies", reason=_TWO_COOKIES, code=400
            )
            Sessions.clear(refused)
            return refused
        response: web.StreamResponse
        try:
            response = await handler(ctx, request)
        except _Stop as stop:
            response = stop.response
        renewed = request.get(_RENEWED)
        if renewed is not None and COOKIE not in response.cookies:
            ctx.console.sessions.put(response, renewed)
        if LEGACY_COOKIE in request.cookies:
            response.del_cookie(LEGACY_COOKIE, path=LEGACY_PATH)
        return response

    return run


# -- pages -------------------------------------------------------------------------------------
async def index(ctx: PageContext, request: web.Request) -> web.StreamResponse:
    session = ctx.session_of(request)
    wanted = request.query.get("project")
    if wanted is not None:
        raise _Stop(_see_other(f"/ui/projects/{quote(wanted.strip(), safe='')}"))
    admin = True
    try:
        await ctx.console.reader.authorize_admin_for(session.principal if session else None)
    except AuthError as exc:
        if exc.status != 403:
            await ctx.authorized(request, session, ctx.console.reader.authorize_admin_for)  # sign-in or error page
        admin = False
    snapshot = ctx.console.views.state.snapshot()
    projects = sorted(ns.name for ns in snapshot.namespaces.values() if ns.is_project) if admin else []
    return ctx.render(request, "index.html", session=session, admin=admin, projects=projects)


async def project(ctx: PageContext, request: web.Request) -> web.StreamResponse:
    session = ctx.session_of(request)
    namespace = request.match_info["namespace"]
    await ctx.authorized(request, session, lambda who: ctx.console.reader.authorize_project_for(who, namespace))
    gpus = await ctx.console.views.project(namespace)
    if gpus is None:
        raise ctx.problem(request, 404, "No such project", f"{namespace} is not a project namespace", session)
    try:
        # A form asks for one kind of workload; the page shows a notebook's offer until told otherwise.
        offer = await project_offer(ctx.console.views, namespace, request.query.get("kind") or "notebook")
    except NotAProject as exc:
        raise ctx.problem(request, 404, "No such project", str(exc), session) from None
    except ValueError as exc:
        raise ctx.problem(request, 400, "Unknown workload kind", str(exc), session) from None
    return ctx.render(request, "project.html", session=session, gpus=gpus, offer=offer, namespace=namespace)


async def admin(ctx: PageContext, request: web.Request) -> web.StreamResponse:
    session = ctx.session_of(request)
    await ctx.authorized(request, session, ctx.console.reader.authorize_admin_for)
    view = ctx.admin_data(request, session)
    counts: dict[str, int] = {}
    for p in view.projects:
        counts[p.department] = counts.get(p.department, 0) + 1
    return ctx.render(request, "admin.html", session=session, view=view, counts=counts)


async def department(ctx: PageContext, request: web.Request) -> web.StreamResponse:
    session = ctx.session_of(request)
    name = request.match_info["name"]
    await ctx.authorized(request, session, ctx.console.reader.authorize_admin_for)
    view = ctx.admin_data(request, session)
    row = next((d for d in view.departments if d.name == name), None)
    projects = [p for p in view.projects if p.department == name]
    if row is None and not projects:
        raise ctx.problem(request, 404, "No such department", f"no department {name}", session)
    return ctx.render(
        request,
        "department.html",
        session=session,
        view=view,
        department=row,
        name=name,
        projects=projects,
        actions=ctx.console.mover is not None,
        known=sorted({d.name for d in view.departments}),
    )


def find_project(view: RunaiAdminView, namespace: str) -> AdminProject | None:
    return next((p for p in view.projects if p.namespace == namespace), None)


def runai_target(view: RunaiAdminView, department: str) -> str:
    """The Run:ai department a platform department's projects go to (as the mover maps it)."""
    linked = {d.name for d in view.departments if d.linked}
    return department if department in linked else view.default_department


async def move_confirm(ctx: PageContext, request: web.Request) -> web.StreamResponse:
    session = ctx.session_of(request)
    namespace = request.match_info["namespace"]
    await ctx.authorized(request, session, ctx.console.reader.authorize_admin_for)
    view = ctx.admin_data(request, session)
    row = find_project(view, namespace)
    if row is None:
        raise ctx.problem(request, 404, "No such project", f"{namespace} is not a project namespace", session)
    target = (request.query.get("department") or "").strip() or view.default_department
    error = department_name_error(target)
    if error is not None:
        raise ctx.problem(request, 400, "Not a department name", error, session)
    return ctx.render(
        request,
        "move_confirm.html",
        session=session,
        project=row,
        target=target,
        runai_target=runai_target(view, target),
        actions=ctx.console.mover is not None,
    )


async def delete_confirm(ctx: PageContext, request: web.Request) -> web.StreamResponse:
    session = ctx.session_of(request)
    name = request.match_info["name"]
    await ctx.authorized(request, session, ctx.console.reader.authorize_admin_for)
    view = ctx.admin_data(request, session)
    projects = [p for p in view.projects if p.department == name]
    return ctx.render(
        request,
        "delete_confirm.html",
        session=session,
        name=name,
        projects=projects,
        default=view.default_department,
        actions=ctx.console.mover is not None,
    )


async def move(ctx: PageContext, request: web.Request) -> web.StreamResponse:
    namespace = request.match_info["namespace"]
    session, fields, who = await ctx.acting(request)
    assert ctx.console.mover is not None
    department = fields.get("department", "").strip() or None
    status, answer = await move_project_answer(ctx.console.mover, namespace, department, who)
    return ctx.render(
        request, "move_result.html", status, session, namespace=namespace, answer=answer, ok=status == 200
    )


async def delete(ctx: PageContext, request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    session, _, who = await ctx.acting(request)
    assert ctx.console.mover is not None
    status, answer = await delete_department_answer(ctx.console.mover, name, who)
    return ctx.render(request, "delete_result.html", status, session, name=name, answer=answer, ok=status == 200)


# -- sign-in -----------------------------------------------------------------------------------
def next_target(value: object) -> str:
    # Only back into the console, and only a path that is a header value as it stands: never
    # an open redirect, never a header split by a CR/LF.
    return safe_next(value) or "/ui/"


async def signin_form(ctx: PageContext, request: web.Request) -> web.StreamResponse:
    if ctx.console.open:
        raise _Stop(_see_other("/ui/"))
    expired = request.query.get("expired") == "1"
    message = "You are no longer signed in; sign in again." if expired else ""
    if request.query.get("signedout") == "1":
        message = "Signed out."
    return ctx.render(request, "signin.html", next=next_target(request.query.get("next")), message=message)


async def signin(ctx: PageContext, request: web.Request) -> web.StreamResponse:
    if ctx.console.open or ctx.console.sign_in is None:
        raise _Stop(_see_other("/ui/"))
    refused = check_form(request, None, None)
    if refused is not None:
        raise ctx.problem(request, 403, "Refused", refused, None)
    form = await request.post()
    token = form.get("token")
    target = next_target(form.get("next"))
    response = _see_other(target)
    try:
        token = Sessions.usable(token if isinstance(token, str) else "")
        # TokenReview, as every API call's token gets; this address pays if the token is new.
        principal = await ctx.console.sign_in(token, client=request.remote or "")
        # The session keeps who the token belongs to, never the token.
        ctx.console.sessions.put(response, ctx.console.sessions.start(principal, token_expiry(token)))
    except NoSessionKeys as exc:
        raise ctx.problem(request, 503, "Sign-in is off", str(exc), None) from None
    except SessionError as exc:
        return ctx.render(request, "signin.html", 400, next=target, message=str(exc))
    except AuthError as exc:
        if exc.status == 401:
            return ctx.render(request, "signin.html", 401, next=target, message=f"Not signed in: {exc.reason}")
        raise ctx.problem(request, exc.status, "Cannot check who you are", exc.reason, None) from None
    return response


async def signout(ctx: PageContext, request: web.Request) -> web.StreamResponse:
    session = ctx.session_of(request)
    form = await request.post()
    csrf = form.get("csrf")
    refused = check_form(request, session, csrf if isinstance(csrf, str) else None)
    if refused is not None:
        raise ctx.problem(request, 403, "Refused", refused, session)
    if session is not None and ctx.console.signouts is not None:
        try:
            await ctx.console.signouts.sign_out(session)  # on every replica, not only in this browser
        except SignoutError:
            response = ctx.render(
                request, "problem.html", 503, None, title="Signed out in this browser only", code=503,
                reason=_SIGNOUT_NOT_RECORDED.format(minutes=ctx.console.sessions.idle_timeout_s // 60),
            )  # fmt: skip
            Sessions.clear(response)
            return response
    response = _see_other("/ui/signin?signedout=1")
    Sessions.clear(response)
    return response


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in _STATIC:
        raise web.HTTPNotFound()
    body = resources.files("webhook.console").joinpath("static", name).read_bytes()
    return web.Response(
        body=body,
        content_type=_STATIC[name],
        headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"},
    )


async def to_index(_: web.Request) -> web.StreamResponse:
    return _see_other("/ui/")


def console_routes(console: Console) -> list[web.RouteDef]:
    ctx = PageContext(console, _environment(), _SECURITY_HEADERS if console.open else {**_SECURITY_HEADERS, **_HSTS})

    def page(handler: Page) -> Handler:
        return _served(ctx, handler)

    return [
        # The server's own root is where a person typing its address lands: the console.
        web.get("/", to_index, allow_head=False),
        web.get("/ui", to_index, allow_head=False),
        web.get("/ui/", page(index), allow_head=False),
        web.get("/ui/signin", page(signin_form), allow_head=False),
        web.post("/ui/signin", page(signin)),
        web.post("/ui/signout", page(signout)),
        web.get("/ui/projects/{namespace}", page(project), allow_head=False),
        web.get("/ui/admin/", page(admin), allow_head=False),
        web.get("/ui/admin/departments/{name}", page(department), allow_head=False),
        web.get("/ui/admin/departments/{name}/delete", page(delete_confirm), allow_head=False),
        web.post("/ui/admin/departments/{name}/delete", page(delete)),
        web.get("/ui/admin/projects/{namespace}/move", page(move_confirm), allow_head=False),
        web.post("/ui/admin/projects/{namespace}/move", page(move)),
        web.get("/ui/static/{name}", static, allow_head=False),
    ]
