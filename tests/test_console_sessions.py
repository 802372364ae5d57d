"""Console sessions, over real HTTPS, on the shared real control plane: callers are
ServiceAccounts with real tokens and real RBAC; the console's reviews and its sign-out list go as
the webhook's ServiceAccount through the test's fault proxy, which counts them and fails them on
demand.

- a sign-out ends the session on both replicas (two real Runtimes, one sign-out list in the cluster);
- a session unused for the idle timeout is over, use renews it, and none outlives 8 h or its token;
- the session keys are a Secret of their own, followed through a real rotation (a kubelet-style
  `..data` swap) on two replicas, the old and the new key accepted while it must be;
- the cookie seals the reviewed principal, never the token, and every page is a SubjectAccessReview
  for that principal;
- two session cookies are refused; the cookie is `__Host-` with `Path=/`;
- an unsafe `next` is ignored, a CR/LF one without a traceback.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.support.apps import cache_app
from tests.support.control_plane.fault_proxy import FaultProxy
from tests.support.departments import Env, environment
from tests.support.https import (
    SERVICE_HOST,
    HttpsServer,
    KubeletSecretDir,
    StartHttpsServer,
    StaticResolver,
    client_ssl_context,
    wait_until,
)
from tests.support.kube_scope import KubeScope, eventually
from tests.support.runtime import base_url, start_runtime
from webhook.console import Console, console_routes
from webhook.console.keys import KeyFile, KeyRing, format_keys, new_key, parse_keys, rotated
from webhook.console.keys_cli import console_keys_command
from webhook.console.session import (
    COOKIE,
    IDLE_TIMEOUT_S,
    MAX_SESSION_S,
    Session,
    Sessions,
    safe_next,
)
from webhook.console.signouts import (
    PER_USER_ENTRIES,
    SIGNOUTS_CONFIGMAP,
    Signouts,
    is_signed_out,
    parse_entries,
    signout_patch,
    signouts_watcher,
)
from webhook.http.auth import AccessCheck, KubeAuthorizer, Principal
from webhook.http.gpu_api import GpuViews
from webhook.kube.watch import KubeWatcher
from webhook.snapshot import DEPARTMENT_LABEL
from webhook.tls.issuing import make_ca


@dataclass
class Client:
    """A browser of one cookie: sends it by hand (no cookie jar), so a test can replay a copy."""

    http: aiohttp.ClientSession
    base: str
    cookie: str | None = None
    follow: bool = True  # take the cookie of each answer (renewals), as a browser does

    def headers(self, cookie: str | None = None) -> dict[str, str]:
        value = cookie if cookie is not None else self.cookie
        return {"Origin": self.base, **({"Cookie": f"{COOKIE}={value}"} if value else {})}

    def _take(self, resp: aiohttp.ClientResponse) -> None:
        if self.follow and COOKIE in resp.cookies:
            self.cookie = resp.cookies[COOKIE].value or None

    async def sign_in(self, token: str, next_page: str = "/ui/") -> aiohttp.ClientResponse:
        async with self.http.post(
            self.base + "/ui/signin",
            data={"token": token, "next": next_page},
            headers={"Origin": self.base},
            allow_redirects=False,
        ) as resp:
            await resp.read()
            self._take(resp)
            return resp

    async def get(self, path: str, cookie: str | None = None) -> tuple[aiohttp.ClientResponse, str]:
        async with self.http.get(self.base + path, headers=self.headers(cookie), allow_redirects=False) as resp:
            body = await resp.text()
            if cookie is None:
                self._take(resp)
            return resp, body

    async def post(
        self, path: str, data: dict[str, str], cookie: str | None = None
    ) -> tuple[aiohttp.ClientResponse, str]:
        async with self.http.post(
            self.base + path, data=data, headers=self.headers(cookie), allow_redirects=False
        ) as resp:
            body = await resp.text()
            if cookie is None:
                self._take(resp)
            return resp, body

    async def csrf(self) -> str:
        resp, page = await self.get("/ui/")
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        assert found, (resp.status, page[:300])
        return found.group(1)


async def ready(client: Client) -> None:
    deadline = time.monotonic() + 10
    while True:
        async with client.http.get(client.base + "/readyz") as resp:
            if resp.status == 200:
                return
            assert time.monotonic() < deadline, await resp.text()
        await asyncio.sleep(0.02)


def client_of(srv: HttpsServer) -> Client:
    http = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            ssl=srv.client_ssl_context(), resolver=StaticResolver({SERVICE_HOST: "127.0.0.1"})
        ),
        cookie_jar=aiohttp.DummyCookieJar(),
    )
    return Client(http, srv.url("").rstrip("/"))


def write_keys(path: Path, keys: list[Any]) -> None:
    path.write_text(format_keys(keys))


@dataclass
class Clock:
    now: float = field(default_factory=time.time)

    def __call__(self) -> float:
        return self.now


@dataclass
class Replica:
    srv: HttpsServer
    client: Client
    signouts: Signouts
    sessions: Sessions
    watcher: KubeWatcher


@dataclass
class Users:
    """Project p1; root (bound to cluster-admin) and bob (who may get pods in p1), real
    ServiceAccounts of the test with their tokens."""

    p1: str
    root: str
    root_token: str
    bob: str
    bob_token: str


@dataclass
class Served:
    env: Env
    proxy: FaultProxy
    users: Users
    start: Callable[..., Any]
    replicas: list[Replica] = field(default_factory=list)

    @property
    def p1(self) -> str:
        return self.users.p1

    def signout_writes(self) -> list[Any]:
        ns = self.env.scope.install_ns
        return [c for c in self.proxy.calls(resource="configmaps", namespace=ns) if c.verb in ("create", "patch")]


def cluster_console(env: Env, sessions: Sessions, signouts: Signouts, reader_ttl_s: float = 30.0) -> web.Application:
    """The console as the runtime wires it in cluster mode: reviews and moves as the webhook's
    ServiceAccount, no Run:ai data in the GPU views."""
    reader = KubeAuthorizer(env.kapi, ttl_s=reader_ttl_s)
    console = Console(
        GpuViews(env.state, None),
        reader,
        sign_in=reader.authenticate,
        actor=KubeAuthorizer(env.kapi, admin_check=AccessCheck("update", "namespaces")),
        mover=env.mover(runai_departments=lambda: {"default", "ml", "research"}),
        sessions=sessions,
        signouts=signouts,
    )
    return cache_app(env.state, routes=console_routes(console))


async def with_users(env: Env) -> Users:
    p1 = env.name("p1")
    await env.project_ns(p1, runai_department="default")
    env.state.apply(await env.ns(p1))
    root, _ = await env.scope.admin_token("root")
    # Longer than a session may last (8 h), so that only the session's own limits end it.
    root_token = await env.scope.token(env.scope.name("root"), env.scope.install_ns, seconds=10 * 3600)
    bob, bob_token = await env.scope.user_token("bob")
    await env.scope.allow(bob, "get", "pods", p1)
    return Users(p1, root, root_token, bob, bob_token)


@pytest.fixture
async def served(
    tmp_path: Path, https_server: StartHttpsServer, kube_scope: KubeScope, fault_proxy: FaultProxy
) -> AsyncIterator[Served]:
    """The console's routes as the runtime wires them (sessions, the sign-out list watched from the
    cluster), started per replica by `await served.start(keys=..., clock=...)`."""
    api = await fault_proxy.api_client_via(kube_scope.kubeconfig)
    async with environment(tmp_path, kube_scope, api=api) as env:
        served = Served(env, fault_proxy, await with_users(env), lambda **_: None)

        async def start(
            keys: Callable[[], KeyRing | None], clock: Callable[[], float] = time.time, reader_ttl_s: float = 30.0
        ) -> Replica:
            signouts = Signouts(env.kapi, clock=clock)
            watcher = signouts_watcher(signouts, env.api, env.scope.install_ns)
            await watcher.start()
            await wait_until(lambda: signouts.ready, what="sign-outs listed")
            sessions = Sessions(keys, clock=clock)
            srv = await https_server(cluster_console(env, sessions, signouts, reader_ttl_s))
            replica = Replica(srv, client_of(srv), signouts, sessions, watcher)
            served.replicas.append(replica)
            return replica

        served.start = start
        try:
            yield served
        finally:
            for r in served.replicas:
                await r.client.http.close()
                await r.watcher.stop()


def one_key_file(tmp_path: Path) -> KeyFile:
    path = tmp_path / "session-keys"
    write_keys(path, [new_key(0)])
    keys = KeyFile(path)
    keys.reload_now()
    return keys


# -- the cookie: a principal, never the token ------------------------------------------------------


async def test_the_cookie_seals_who_signed_in_never_the_token(served: Served, tmp_path: Path) -> None:
    keys = one_key_file(tmp_path)
    a = await served.start(keys.ring)
    resp = await a.client.sign_in(served.users.root_token, f"/ui/projects/{served.p1}")
    assert resp.status == 303 and resp.headers["Location"] == f"/ui/projects/{served.p1}"
    set_cookie = resp.headers["Set-Cookie"]
    assert set_cookie.startswith(f"{COOKIE}=") and COOKIE.startswith("__Host-")
    for flag in ("HttpOnly", "Secure", "SameSite=Strict", "Path=/;"):
        assert flag in set_cookie + ";", set_cookie
    assert "Domain" not in set_cookie and "max-age" not in set_cookie.lower()
    # Opened with the key: the reviewed principal, and nothing of the token.
    ring = keys.ring()
    assert ring is not None and a.client.cookie is not None
    plain = ring.opening().decrypt(a.client.cookie.encode()).decode()
    assert served.users.root_token not in plain and "token" not in json.loads(plain)
    assert json.loads(plain)["user"] == served.users.root
    assert "system:serviceaccounts" in json.loads(plain)["groups"]

    # Later pages ask SubjectAccessReview for that principal; the token is never sent again.
    for _ in range(3):
        page, _ = await a.client.get(f"/ui/projects/{served.p1}")
        assert page.status == 200
    reviews = served.proxy.calls(verb="create", resource="tokenreviews")
    assert len(reviews) == 1
    access = [json.loads(r.body) for r in served.proxy.calls(verb="create", resource="subjectaccessreviews")]
    assert access and all(r["spec"]["user"] == served.users.root for r in access)
    assert all("system:serviceaccounts" in r["spec"]["groups"] for r in access)
    assert all(served.users.root_token not in json.dumps(r) for r in access)


async def test_authorization_stays_real_for_the_sealed_principal(served: Served, tmp_path: Path) -> None:
    a = await served.start(one_key_file(tmp_path).ring, reader_ttl_s=0.05)
    await a.client.sign_in(served.users.bob_token)
    page, _ = await a.client.get(f"/ui/projects/{served.p1}")
    assert page.status == 200
    scope = served.env.scope
    for binding in await scope.list("rbac.authorization.k8s.io/v1", "RoleBinding", served.p1):
        if any(s.get("name") == served.users.bob for s in binding.get("subjects") or []):  # bob's taken away
            await scope.delete("rbac.authorization.k8s.io/v1", "RoleBinding", binding["metadata"]["name"], served.p1)

    async def refused() -> bool:  # once the apiserver's RBAC and the console's cache have caught up
        page, body = await a.client.get(f"/ui/projects/{served.p1}")
        return page.status == 403 and served.users.bob in body

    await eventually(refused, within_s=30, interval_s=0.1, message="bob still reads p1")
    csrf = await a.client.csrf()
    moved, _ = await a.client.post(f"/ui/admin/projects/{served.p1}/move", {"department": "ml", "csrf": csrf})
    assert moved.status == 403 and DEPARTMENT_LABEL not in await served.env.labels(served.p1)


async def test_a_session_never_outlives_the_token_it_started_from(served: Served, tmp_path: Path) -> None:
    clock = Clock()
    a = await served.start(one_key_file(tmp_path).ring, clock=clock)
    # A cluster admin's token of the shortest lifetime the TokenRequest API issues (600 s).
    scope = served.env.scope
    await scope.admin_token("ops")
    jwt = await scope.token(scope.name("ops"), scope.install_ns, seconds=600)
    claims = json.loads(base64.urlsafe_b64decode(jwt.split(".")[1] + "=="))
    clock.now = float(claims["exp"]) - 600
    assert (await a.client.sign_in(jwt)).status == 303
    clock.now += 590
    assert (await a.client.get(f"/ui/projects/{served.p1}"))[0].status == 200
    clock.now += 20  # past the token's exp, long before 8 h
    page, _ = await a.client.get(f"/ui/projects/{served.p1}")
    assert page.status == 303 and page.headers["Location"].startswith("/ui/signin")


async def test_a_principal_too_large_for_a_cookie_is_refused_at_sign_in(served: Served, tmp_path: Path) -> None:
    a = await served.start(one_key_file(tmp_path).ring)
    carol, carol_token = await served.env.scope.user_token("carol")
    groups = [f"team-{i:04d}-of-the-platform" for i in range(400)]

    def in_many_groups(review: dict[str, Any]) -> dict[str, Any]:
        # No token of a real apiserver carries 400 groups; an authenticator in front of it may.
        user = review.get("status", {}).get("user") or {}
        if user.get("username") == carol:
            user["groups"] = [*user.get("groups", []), *groups]
        return review

    served.proxy.rewrite(in_many_groups, verb="create", resource="tokenreviews")
    resp = await a.client.sign_in(carol_token)
    assert resp.status == 400 and a.client.cookie is None


# -- idle timeout under the absolute 8 h ------------------------------------------------------------


async def test_an_idle_session_ends_and_use_renews_it_up_to_eight_hours(served: Served, tmp_path: Path) -> None:
    clock = Clock()
    a = await served.start(one_key_file(tmp_path).ring, clock=clock)
    await a.client.sign_in(served.users.root_token)
    first = a.client.cookie
    # Used every 20 minutes: each use seals the cookie again, and the session lasts.
    elapsed = 0
    while elapsed + 20 * 60 < MAX_SESSION_S:
        clock.now += 20 * 60
        elapsed += 20 * 60
        page, _ = await a.client.get(f"/ui/projects/{served.p1}")
        assert page.status == 200, elapsed
        assert COOKIE in page.cookies  # renewed
    # The first cookie was left unused for far longer than the idle timeout.
    old, _ = await a.client.get(f"/ui/projects/{served.p1}", cookie=first)
    assert old.status == 303
    clock.now += MAX_SESSION_S - elapsed  # 8 h after sign-in: over, however busy
    page, _ = await a.client.get(f"/ui/projects/{served.p1}")
    assert page.status == 303 and page.headers["Location"].startswith("/ui/signin")

    await a.client.sign_in(served.users.root_token)
    clock.now += 30  # a renewal at most once a minute
    page, _ = await a.client.get(f"/ui/projects/{served.p1}")
    assert page.status == 200 and COOKIE not in page.cookies
    clock.now += IDLE_TIMEOUT_S + 1  # unused for longer than the idle timeout
    page, _ = await a.client.get(f"/ui/projects/{served.p1}")
    assert page.status == 303


# -- sign-out: over on every replica ----------------------------------------------------------------


async def test_sign_out_ends_the_session_on_both_replicas(served: Served, tmp_path: Path) -> None:
    keys = one_key_file(tmp_path)
    a, b = await served.start(keys.ring), await served.start(keys.ring)
    await a.client.sign_in(served.users.root_token)
    stolen = a.client.cookie
    assert stolen is not None
    csrf = await a.client.csrf()
    b.client.cookie = stolen
    assert (await b.client.get(f"/ui/projects/{served.p1}"))[0].status == 200  # one session, both replicas

    signout, _ = await a.client.post("/ui/signout", {"csrf": csrf})
    assert signout.status == 303 and signout.headers["Location"] == "/ui/signin?signedout=1"
    assert served.signout_writes()
    # The replica that signed out refuses the copy at once; the other once its watch delivered it.
    for replica in (a, b):
        if replica is b:
            await wait_until(lambda: b.signouts.signed_out(_session_of(b, stolen)), within=5, what="b saw it")
        page, _ = await replica.client.get(f"/ui/projects/{served.p1}", cookie=stolen)
        assert page.status == 303 and page.headers["Location"].startswith("/ui/signin"), replica
        move, _ = await replica.client.post(
            f"/ui/admin/projects/{served.p1}/move", {"department": "ml", "csrf": csrf}, cookie=stolen
        )
        assert move.status == 303 and move.headers["Location"].startswith("/ui/signin")
    assert DEPARTMENT_LABEL not in await served.env.labels(served.p1) and served.env.runai.requests == []
    # A new sign-in is a new session, good on both.
    await a.client.sign_in(served.users.root_token)
    assert (await b.client.get(f"/ui/projects/{served.p1}", cookie=a.client.cookie))[0].status == 200


def _session_of(replica: Replica, cookie: str) -> Session:
    session = replica.sessions.open(cookie)
    assert session is not None
    return session


async def test_a_sign_out_the_cluster_did_not_take_says_so(served: Served, tmp_path: Path) -> None:
    a = await served.start(one_key_file(tmp_path).ring)
    await a.client.sign_in(served.users.root_token)
    csrf = await a.client.csrf()
    served.proxy.fail(500, n=5, path=f"/api/v1/namespaces/{served.env.scope.install_ns}/configmaps")
    resp, body = await a.client.post("/ui/signout", {"csrf": csrf})
    assert resp.status == 503 and "Signed out in this browser only" in body
    assert a.client.cookie is None  # the browser forgets it all the same


async def test_no_session_is_served_before_the_sign_outs_are_read(served: Served, tmp_path: Path) -> None:
    keys = one_key_file(tmp_path)
    a = await served.start(keys.ring)
    await a.client.sign_in(served.users.root_token)
    a.signouts.synced.clear()  # as before the first list
    page, body = await a.client.get(f"/ui/projects/{served.p1}")
    assert page.status == 503 and "signed-out" in body


def test_the_sign_out_list_stays_bounded_per_user() -> None:
    now = 1_000_000
    alice = Principal("alice", uid="u-1")

    def session(sid: str, issued: int = now - 10) -> Session:
        return Session(sid, "csrf", alice, issued, issued + MAX_SESSION_S, issued)

    odd = {"junk": "not an entry", "s.huge": "9" * 5000 + " x", "u.unicode": "²³ ¹"}
    assert parse_entries(odd) == {}  # whatever else is written there, the list still reads
    data: dict[str, str] = {"s.gone": f"{now - 1} someone", **odd}
    for i in range(PER_USER_ENTRIES):
        patch = signout_patch(data, session(f"{i:032x}"), now)
        if i == 0:
            assert patch["s.gone"] is None and patch["junk"] is None  # run out, or no entry: pruned
        data = {k: v for k, v in {**data, **patch}.items() if v is not None}
    assert len(data) == PER_USER_ENTRIES
    # One more: the user's entries collapse into one, which still ends every one of them.
    patch = signout_patch(data, session("f" * 32), now)
    data = {k: v for k, v in {**data, **patch}.items() if v is not None}
    assert sorted(k[:2] for k in data) == ["s.", "u."]  # the user's, and the session signing out
    entries = parse_entries(data)
    assert all(is_signed_out(entries, session(f"{i:032x}"), now) for i in range(PER_USER_ENTRIES))
    assert is_signed_out(entries, session("f" * 32, issued=now), now)
    assert not is_signed_out(entries, session("a" * 32, issued=now), now + 1)  # signed in afterwards
    assert not is_signed_out(entries, Session("b" * 32, "c", Principal("bob"), now - 5, now + 99, now), now)
    assert not is_signed_out(entries, session(f"{0:032x}"), now + MAX_SESSION_S)  # run out, prunable


# -- the session keys: a Secret of their own, rotated --------------------------------------------


async def test_a_real_key_rotation_on_two_replicas(served: Served, tmp_path: Path) -> None:
    """The Secret's volume as kubelet writes it (`..data` swapped in one rename), read by both
    replicas' KeyFile. The new key seals only after its not-before, by which time both open it; the
    old key is dropped once nothing valid is sealed with it."""
    clock = Clock()
    first = new_key(clock.now - 60)
    volume = KubeletSecretDir(tmp_path / "console", {"session-keys": format_keys([first]).encode()})
    files = [KeyFile(tmp_path / "console" / "session-keys", interval_s=0.02) for _ in range(2)]
    for f in files:
        await f.start()
    try:
        a, b = await served.start(files[0].ring, clock=clock), await served.start(files[1].ring, clock=clock)
        await a.client.sign_in(served.users.root_token)
        old_cookie = a.client.cookie
        assert old_cookie is not None and KeyRing([first]).opening().decrypt(old_cookie.encode())

        keys = rotated([first], clock.now, activate_in_s=300, cookie_lifetime_s=IDLE_TIMEOUT_S)
        assert len(keys) == 2 and keys[0] == first and keys[1].not_before == int(clock.now) + 300
        second = keys[1]
        volume.update({"session-keys": format_keys(keys).encode()})
        await wait_until(lambda: all(len(f.ring().keys) == 2 for f in files), what="both replicas read the new file")  # type: ignore[union-attr]
        # Before its not-before the new key only opens: a sign-in on b is still sealed with the old one.
        await b.client.sign_in(served.users.root_token)
        assert b.client.cookie is not None and KeyRing([first]).opening().decrypt(b.client.cookie.encode())
        assert (await a.client.get("/ui/", cookie=b.client.cookie))[0].status == 200

        clock.now += 301  # the new key seals now; the old cookie, renewed, comes back under it
        page, _ = await a.client.get(f"/ui/projects/{served.p1}")
        assert page.status == 200 and a.client.cookie != old_cookie
        renewed = a.client.cookie
        assert renewed is not None and KeyRing([second]).opening().decrypt(renewed.encode())
        assert (await b.client.get(f"/ui/projects/{served.p1}", cookie=renewed))[0].status == 200
        assert (await b.client.get(f"/ui/projects/{served.p1}", cookie=old_cookie))[0].status == 200  # still accepted

        # Rotated again once the new key has sealed for longer than a cookie lives: the first goes.
        clock.now += 1000
        assert (await a.client.get(f"/ui/projects/{served.p1}"))[0].status == 200  # in use: renewed under the second
        clock.now += IDLE_TIMEOUT_S + 300 - 1000 + 1
        assert (await a.client.get(f"/ui/projects/{served.p1}"))[0].status == 200
        keys = rotated(keys, clock.now, activate_in_s=300, cookie_lifetime_s=IDLE_TIMEOUT_S)
        assert [k.secret for k in keys[:1]] == [second.secret] and len(keys) == 2
        volume.update({"session-keys": format_keys(keys).encode()})
        await wait_until(lambda: all(first not in f.ring().keys for f in files), what="first key dropped")  # type: ignore[union-attr]
        for replica in (a, b):
            assert (await replica.client.get(f"/ui/projects/{served.p1}", cookie=a.client.cookie))[0].status == 200
            forged, _ = await replica.client.get(
                f"/ui/projects/{served.p1}", cookie=b.client.cookie
            )  # sealed with the first
            assert forged.status == 303
    finally:
        for f in files:
            await f.stop()


async def test_a_broken_key_file_keeps_the_last_good_keys(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "session-keys"
    good = new_key(0)
    write_keys(path, [good])
    keys = KeyFile(path)
    assert keys.reload_now() and keys.ring() is not None
    path.write_text("2025-01-01T00:00:00Z not-base64!\n")
    with caplog.at_level(logging.ERROR):
        assert not keys.reload_now()
        assert not keys.reload_now()  # logged once per content
    assert [r.levelname for r in caplog.records] == ["ERROR"] and "line 1" in caplog.text
    assert keys.ring().keys == (good,)  # type: ignore[union-attr]
    path.unlink()
    assert not keys.reload_now() and keys.ring().keys == (good,)  # type: ignore[union-attr]
    missing = KeyFile(tmp_path / "absent")
    missing.reload_now()
    assert missing.ring() is None and "cannot read" in (missing.error or "")


async def test_without_a_key_sign_in_is_off_with_a_reason(served: Served, tmp_path: Path) -> None:
    a = await served.start(KeyFile(tmp_path / "absent").ring)
    resp = await a.client.sign_in(served.users.root_token)
    assert resp.status == 503 and a.client.cookie is None


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "no key"),
        ("2025-01-01T00:00:00Z", "expected"),
        ("yesterday " + base64.urlsafe_b64encode(b"k" * 32).decode(), "UTC time"),
        ("2025-01-01T00:00:00Z " + base64.urlsafe_b64encode(b"short").decode(), "32 bytes"),
    ],
)
def test_a_key_file_is_read_strictly(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_keys(text)


def test_console_keys_writes_rotates_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "cluster" / "console-session-keys"

    def run(**kw: Any) -> list[Any]:
        args = type("Args", (), {"file": str(path), "activate_in": 300, "replace": False, **kw})
        assert console_keys_command(args) == 0
        return parse_keys(path.read_text())

    first = run()
    assert len(first) == 1 and first[0].not_before <= time.time() and path.stat().st_mode & 0o777 == 0o600
    second = run()
    assert second[0] == first[0] and len(second) == 2 and second[1].not_before > time.time() + 250
    replaced = run(replace=True)
    assert len(replaced) == 1 and replaced[0].secret not in {k.secret for k in second}


# -- cookies and the sign-in target ---------------------------------------------------------------


async def test_a_request_with_two_session_cookies_is_refused(served: Served, tmp_path: Path) -> None:
    a = await served.start(one_key_file(tmp_path).ring)
    await a.client.sign_in(served.users.root_token)
    mine = a.client.cookie
    csrf = await a.client.csrf()
    await a.client.sign_in(served.users.bob_token)
    other = a.client.cookie
    # As another port of localhost would arrange it: its cookie beside ours, in one header or two.
    for headers in (
        [("Cookie", f"{COOKIE}={other}; {COOKIE}={mine}")],
        [("Cookie", f"{COOKIE}={other}"), ("Cookie", f"{COOKIE}={mine}")],
    ):
        for method, path in (
            ("GET", f"/ui/projects/{served.p1}"),
            ("POST", f"/ui/admin/projects/{served.p1}/move"),
            ("POST", "/ui/signout"),
        ):
            async with a.client.http.request(
                method,
                a.client.base + path,
                headers=[*headers, ("Origin", a.client.base)],
                data={"department": "ml", "csrf": csrf} if method == "POST" else None,
                allow_redirects=False,
            ) as resp:
                body = await resp.text()
                assert resp.status == 400 and "two console session cookies" in body, (method, path)
    assert DEPARTMENT_LABEL not in await served.env.labels(served.p1)
    assert not served.signout_writes()


@pytest.mark.parametrize(
    "target",
    [
        "/ui/\r\nSet-Cookie: evil=1",
        "/ui/projects/p1\nLocation: https://evil.example/",
        "/ui/\x00",
        "/ui/ space",
        "/ui/../healthz",
        "/ui/%2e%2E/metrics",
        "//evil.example/ui/",
        "/ui//evil.example",
        "https://evil.example/ui/",
        "/ui/\\evil",
        "/ui/é",
        "/ui/" + "a" * 3000,
    ],
)
async def test_an_unsafe_next_is_ignored_without_a_traceback(
    served: Served, tmp_path: Path, target: str, caplog: pytest.LogCaptureFixture
) -> None:
    a = await served.start(one_key_file(tmp_path).ring)
    with caplog.at_level(logging.WARNING):
        resp = await a.client.sign_in(served.users.root_token, target)
        assert resp.status == 303 and resp.headers["Location"] == "/ui/"
        async with a.client.http.get(a.client.base + "/ui/signin", params={"next": target}) as form:
            assert form.status == 200 and 'name="next" value="/ui/"' in await form.text()
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("target", ["/ui/", "/ui/projects/p1?kind=job", "/ui/admin/departments/ml%20x"])
def test_a_local_path_is_kept(target: str) -> None:
    assert safe_next(target) == target


# -- two real replicas --------------------------------------------------------------------------------


async def test_two_servers_sign_out_on_one_and_the_other_refuses(tmp_path: Path, kube_scope: KubeScope) -> None:
    """`serve` twice, as the Deployment's two replicas: one key file (the Secret both mount), one
    sign-out list (the ConfigMap both watch)."""
    churn = await kube_scope.namespace("churn")
    _, root_token = await kube_scope.admin_token("root")
    key_file = tmp_path / "console" / "session-keys"
    key_file.parent.mkdir()
    write_keys(key_file, [new_key(0)])
    ca = make_ca(days=30)
    replicas = []
    try:
        for name in ("a", "b"):
            replicas.append(await start_runtime(tmp_path / name, kube_scope, ca=ca, console_keys=key_file))
        connector = aiohttp.TCPConnector(
            ssl=client_ssl_context(ca.cert_pem), resolver=StaticResolver({SERVICE_HOST: "127.0.0.1"})
        )
        async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as http:
            a, b = (Client(http, base_url(options)) for _, options, _ in replicas)
            for client in (a, b):
                await ready(client)  # /readyz waits for the sign-out list too
            await a.sign_in(root_token, f"/ui/projects/{churn}")
            assert a.cookie is not None
            csrf = await a.csrf()
            b.cookie = a.cookie
            assert (await b.get(f"/ui/projects/{churn}"))[0].status == 200
            assert (await a.post("/ui/signout", {"csrf": csrf}))[0].status == 303
            stolen = b.cookie

            async def refused_on_b() -> bool:
                return (await b.get(f"/ui/projects/{churn}", cookie=stolen))[0].status != 200

            await eventually(refused_on_b, within_s=10, interval_s=0.01, message="b still serves the session")
            for client in (a, b):
                page, _ = await client.get(f"/ui/projects/{churn}", cookie=stolen)
                assert page.status == 303 and page.headers["Location"].startswith("/ui/signin")
    finally:
        for runtime, _, _ in replicas:
            await runtime.shutdown()
    stored = await kube_scope.get("v1", "ConfigMap", SIGNOUTS_CONFIGMAP, kube_scope.install_ns)
    assert stored is not None and len(stored["data"]) == 1


async def test_the_old_cookie_that_held_a_token_is_cleared(served: Served, tmp_path: Path) -> None:
    a = await served.start(one_key_file(tmp_path).ring)
    async with a.client.http.get(
        a.client.base + "/ui/signin", headers={"Cookie": "scheduling_webhook_session=gAAAAAB-old"}
    ) as resp:
        assert resp.status == 200
        cleared = resp.cookies["scheduling_webhook_session"]
        assert cleared.value == "" and cleared["path"] == "/ui/" and cleared["max-age"] == "0"
