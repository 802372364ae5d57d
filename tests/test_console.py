"""The console's sign-in, session cookie and cross-site protection, over real HTTPS.

Tokens are checked by TokenReview and SubjectAccessReview on the real apiserver (a KubeScope of
the shared control plane; root is a ServiceAccount bound to cluster-admin, bob one that may get
pods in p1), through a fault proxy that counts the reviews; moves run the real DepartmentMover
against the Run:ai stand-in (as in test_admin_api). The browser tests (test_console_browser.py)
drive the same pages through Chromium.
"""

from __future__ import annotations

import contextlib
import html
import json
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from tests.support.apps import cache_app
from tests.support.cluster import cluster_queue, kueue_setup, local_queue, namespace, settings_configmap
from tests.support.control_plane.fault_proxy import FaultProxy
from tests.support.departments import Env, environment
from tests.support.https import LOOPBACK, HttpsServer, StartHttpsServer
from tests.support.kube_scope import KubeScope, eventually
from tests.support.openapi_check import validate_response
from webhook.console import Console, console_routes
from webhook.console.keys import KeyFile, format_keys, new_key
from webhook.console.session import COOKIE, Sessions
from webhook.console.signouts import Signouts, signouts_watcher
from webhook.console.wording import advice
from webhook.core.gpu_view import GpuWarning
from webhook.http.auth import AccessCheck, KubeAuthorizer, Principal
from webhook.http.gpu_api import GpuViews, RunaiDirectoryView
from webhook.http.scheduling_api import project_offer
from webhook.runai.client import RunaiError
from webhook.runai.folder_snapshot import SNAPSHOT_KIND, RunaiSnapshotDirectory, parse_snapshot
from webhook.snapshot import DEPARTMENT_LABEL
from webhook.state.folder import read_objects
from webhook.state.store import ClusterState

EVIL = "x=<script>alert('pwned')</script>"
# A bound on waiting for the apiserver's RBAC caches to catch up with a new binding.
CAUGHT_UP_WITHIN_S = 15.0


@dataclass
class Served:
    env: Env
    proxy: FaultProxy  # the console's way to the apiserver
    srv: HttpsServer
    keys: KeyFile
    root_token: str  # a cluster admin's
    bob_token: str  # may get pods in p1, nothing else

    @property
    def p1(self) -> str:
        return self.env.name("p1")

    def url(self, path: str) -> str:
        return self.srv.url(path)

    async def sign_in(self, token: str | None = None, next_page: str = "/ui/") -> aiohttp.ClientResponse:
        async with self.srv.session.post(
            self.url("/ui/signin"), data={"token": token or self.root_token, "next": next_page}, allow_redirects=False
        ) as resp:
            await resp.read()
            return resp

    async def csrf(self) -> str:
        async with self.srv.session.get(self.url("/ui/")) as resp:
            found = re.search(r'name="csrf" value="([^"]+)"', await resp.text())
        assert found, "no CSRF field on the page"
        return found.group(1)


async def _allowed(scope: KubeScope, user: str, attributes: dict[str, str]) -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "groups": ["system:authenticated"], "resourceAttributes": attributes}}  # fmt: skip
    answer = await scope.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))


async def with_users(env: Env) -> tuple[str, str]:
    """Project p1, root (a cluster admin) and bob (who may read p1): their tokens, once RBAC says so."""
    scope, p1 = env.scope, env.name("p1")
    await env.project_ns(p1, runai_department="default")
    env.state.apply(await env.ns(p1))
    root_user, root_token = await scope.admin_token("root")
    bob_user, bob_token = await scope.user_token("bob")
    await scope.allow(bob_user, "get", "pods", p1)
    for user, attributes in (
        (root_user, {"verb": "update", "resource": "namespaces"}),
        (bob_user, {"verb": "get", "resource": "pods", "namespace": p1}),
    ):
        await eventually(lambda u=user, a=attributes: _allowed(scope, u, a), within_s=CAUGHT_UP_WITHIN_S,  # type: ignore[misc]
                         interval_s=0.05, message=f"RBAC never allowed {user} {attributes}")  # fmt: skip
    return root_token, bob_token


def cluster_console(
    env: Env,
    sessions: Sessions,
    signouts: Signouts,
    reader_ttl_s: float = 30.0,
    directory: RunaiDirectoryView | None = None,
) -> web.Application:
    """The console as the runtime wires it in cluster mode, over the real apiserver and the stand-in
    (`directory`: where the GPU views read Run:ai from; None: no Run:ai data)."""
    reader = KubeAuthorizer(env.kapi, ttl_s=reader_ttl_s)
    console = Console(
        GpuViews(env.state, directory),
        reader,
        sign_in=reader.authenticate,
        actor=KubeAuthorizer(env.kapi, admin_check=AccessCheck("update", "namespaces")),
        mover=env.mover(runai_departments=lambda: {"default", "ml", "research"}),
        sessions=sessions,
        signouts=signouts,
    )
    return cache_app(env.state, routes=console_routes(console))


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, scope: KubeScope, https_server: StartHttpsServer, directory: RunaiDirectoryView | None = None
) -> AsyncIterator[Served]:
    """The console of `cluster_console` over HTTPS, its users and its session key."""
    key_path = tmp_path / "session-keys"
    key_path.write_text(format_keys([new_key(0)]))
    keys = KeyFile(key_path)
    keys.reload_now()
    async with FaultProxy(scope.cp) as proxy:
        api = await proxy.api_client_via(scope.kubeconfig)
        async with environment(tmp_path, scope, api) as env:
            root_token, bob_token = await with_users(env)
            signouts = Signouts(env.kapi)
            async with signouts_watcher(signouts, env.api, scope.install_ns):
                # Until the sign-out list is read, the console answers "starting" to every action.
                await eventually(lambda: signouts.ready, message="the sign-out list never synced")
                srv = await https_server(cluster_console(env, Sessions(keys.ring), signouts, directory=directory))
                yield Served(env, proxy, srv, keys, root_token, bob_token)


@pytest.fixture
async def served(tmp_path: Path, kube_scope: KubeScope, https_server: StartHttpsServer) -> AsyncIterator[Served]:
    async with serving(tmp_path, kube_scope, https_server) as s:
        yield s


async def test_sign_in_keeps_only_who_signed_in_in_an_encrypted_session_cookie(served: Served) -> None:
    resp = await served.sign_in(next_page=f"/ui/projects/{served.p1}")
    assert resp.status == 303 and resp.headers["Location"] == f"/ui/projects/{served.p1}"
    cookie = resp.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}=") and COOKIE.startswith("__Host-")
    for flag in ("HttpOnly", "Secure", "SameSite=Strict", "Path=/;"):
        assert flag in cookie + ";", cookie
    assert "expires" not in cookie.lower() and "max-age" not in cookie.lower()  # gone with the browser session
    assert served.root_token not in cookie
    async with served.srv.session.get(served.url(f"/ui/projects/{served.p1}")) as page:
        assert page.status == 200 and "Project <span" in await page.text()
        assert "default-src 'none'" in page.headers["Content-Security-Policy"]
        assert page.headers["Cache-Control"] == "private, no-store"
        assert page.headers["Strict-Transport-Security"] == "max-age=31536000"


async def test_a_bad_token_is_not_signed_in(served: Served) -> None:
    resp = await served.sign_in("stolen")
    assert resp.status == 401 and "Set-Cookie" not in resp.headers
    resp = await served.sign_in("x" * 20_000)  # longer than any token Kubernetes issues: not even reviewed
    assert resp.status == 400 and "Set-Cookie" not in resp.headers
    # Asked once, for "stolen" (and not for the token too long to be one).
    assert len(served.proxy.calls(verb="create", resource="tokenreviews")) == 1


@pytest.mark.parametrize("target", ["//evil.example/ui/", "https://evil.example/", "/ui/..\\evil", "/elsewhere"])
async def test_after_sign_in_the_browser_only_goes_back_into_the_console(served: Served, target: str) -> None:
    resp = await served.sign_in(next_page=target)
    assert resp.status == 303 and resp.headers["Location"] == "/ui/"


async def test_a_page_without_a_session_asks_to_sign_in(served: Served) -> None:
    async with served.srv.session.get(served.url(f"/ui/projects/{served.p1}?kind=job"), allow_redirects=False) as resp:
        assert resp.status == 303
        assert resp.headers["Location"] == f"/ui/signin?next=%2Fui%2Fprojects%2F{served.p1}%3Fkind%3Djob"
    # A cookie sealed with another key (another installation, a key rotated out) is no session.
    response = web.Response()
    other = Sessions.ephemeral()
    other.put(response, other.start(Principal("root", groups=("system:masters",))))
    value = response.cookies[COOKIE].value
    async with served.srv.session.get(
        served.url(f"/ui/projects/{served.p1}"), headers={"Cookie": f"{COOKIE}={value}"}, allow_redirects=False
    ) as resp:
        assert resp.status == 303 and resp.headers["Location"].startswith("/ui/signin")


async def test_actions_need_the_forms_secret_and_the_same_site(served: Served) -> None:
    await served.sign_in()
    move = served.url(f"/ui/admin/projects/{served.p1}/move")
    async with served.srv.session.post(move, data={"department": "ml"}) as resp:
        assert resp.status == 403 and "did not come from this console" in await resp.text()
    csrf = await served.csrf()
    async with served.srv.session.post(
        move, data={"department": "ml", "csrf": csrf}, headers={"Origin": "https://evil.example"}
    ) as resp:
        assert resp.status == 403 and "another site" in await resp.text()
    async with served.srv.session.post(
        move, data={"department": "ml", "csrf": csrf}, headers={"Sec-Fetch-Site": "cross-site"}
    ) as resp:
        assert resp.status == 403
    assert served.env.runai.requests == [] and DEPARTMENT_LABEL not in await served.env.labels(served.p1)
    async with served.srv.session.post(
        move, data={"department": "ml", "csrf": csrf}, headers={"Origin": served.url("").rstrip("/")}
    ) as resp:
        body = await resp.text()
        assert resp.status == 200, body
        assert f"{served.p1} moved" in body and "Re-add GPU quota and access rules" in body
    assert (await served.env.labels(served.p1))[DEPARTMENT_LABEL] == "ml"


async def test_a_member_may_not_act(served: Served) -> None:
    await served.sign_in(served.bob_token)
    csrf = await served.csrf()
    async with served.srv.session.post(served.url("/ui/admin/departments/ml/delete"), data={"csrf": csrf}) as resp:
        assert resp.status == 403 and served.env.name("bob") in await resp.text()
    assert served.env.runai.requests == []


async def test_every_value_is_escaped(served: Served) -> None:
    scheduler = {"available": {"affinity": [EVIL], "priorityClasses": ["batch"]}, "defaults": {"affinity": [EVIL]}}
    p2 = served.env.name("p2")
    served.env.state.apply(settings_configmap(served.env.scope.install_ns, scheduler=scheduler))
    served.env.state.apply(namespace(p2, labels={DEPARTMENT_LABEL: "ml"}))
    await served.sign_in()
    async with served.srv.session.get(served.url(f"/ui/projects/{p2}")) as resp:
        page = await resp.text()
    assert resp.status == 200
    assert "<script>alert" not in page
    assert "x=&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in page


async def test_the_project_page_shows_each_queue_as_the_scheduling_api_does(served: Served) -> None:
    state, p2 = served.env.state, served.env.name("p2")
    state.apply(settings_configmap(served.env.scope.install_ns, kueue_installed=True))
    state.apply(namespace(p2, labels={DEPARTMENT_LABEL: "ml"}))
    for obj in [
        *kueue_setup(),
        cluster_queue("cq", cohort="research", usage={"default": {"cpu": "6", "nvidia.com/gpu": "2"}}, pending=4),
        local_queue(p2, "default"),
        local_queue(p2, "orphan", "nowhere"),
    ]:
        state.apply(obj)
    offer = await project_offer(GpuViews(state, None), p2, "notebook")
    assert offer.queue is not None and len(offer.queue.queues) == 2
    await served.sign_in()
    async with served.srv.session.get(served.url(f"/ui/projects/{p2}")) as resp:
        page = await resp.text()
    assert resp.status == 200
    for view in offer.queue.queues:
        row = re.search(rf'<tr data-queue="{view.name}">(.*?)</tr>', page, re.S)
        assert row, view.name
        cells = row.group(1)
        assert f'data-field="cluster_queue">{view.cluster_queue}' in cells
        assert f'data-field="cohort">{view.cohort or "none"}' in cells
        shown = "—" if view.pending_workloads is None else str(view.pending_workloads)
        assert f'data-field="pending_workloads">{shown}' in cells
        assert re.findall(r"<li data-unit>([^<]*)</li>", cells) == view.topologies
        for flavor in view.flavors:
            for resource, quota in flavor.nominal_quota.items():
                assert f"{resource} {flavor.usage.get(resource, '0')} of {quota}" in cells
        assert [
            html.unescape(p) for p in re.findall(r"<p class=\"detail\" data-problem>([^<]*)</p>", cells)
        ] == view.problems
    assert "nvidia.com/gpu 2 of 8" in page and "cpu 6 of 32" in page


# ---- the folder mode's Run:ai snapshot ------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "cluster"
CONSOLE_CSS = Path(__file__).resolve().parents[1] / "webhook" / "console" / "static" / "console.css"


def test_the_example_runai_snapshot_is_what_runai_answers() -> None:
    """Each list in examples/cluster's RunaiSnapshot is a valid answer of the Run:ai API it names."""
    doc = next(o for o in read_objects(EXAMPLES) if o.get("kind") == SNAPSHOT_KIND)
    base = "https://runai.example"
    for path, key in (
        ("/api/v1/org-unit/departments", "departments"),
        ("/api/v1/org-unit/projects", "projects"),
        ("/api/v1/node-pools", "nodepools"),
    ):
        body = json.dumps({key: doc["nodePools" if key == "nodepools" else key]}).encode()
        assert validate_response("GET", base + path, 200, {"Content-Type": "application/json"}, body) == [], path
    assert (
        validate_response(
            "GET",
            base + "/api/v1/clusters",
            200,
            {"Content-Type": "application/json"},
            json.dumps([doc["cluster"]]).encode(),
        )
        == []
    )
    snapshot = parse_snapshot(doc)
    assert {p.name for p in snapshot.projects} == {"churn", "fraud-detection", "forecasting", "imaging"}
    assert snapshot.metrics["default"].unallocated == 10


async def test_the_snapshot_is_read_again_when_the_folder_changes(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    shutil.copytree(EXAMPLES, folder)
    clock = [0.0]
    directory = RunaiSnapshotDirectory(folder, clock=lambda: clock[0])
    assert directory.reachable and len(directory.projects() or ()) == 4
    snapshot_file = folder / "90-runai-snapshot.yaml"
    doc = yaml.safe_load(snapshot_file.read_text())
    doc["projects"] = doc["projects"][:1]
    snapshot_file.write_text(yaml.safe_dump(doc))
    assert len(directory.projects() or ()) == 4  # checked again only after a second
    clock[0] = 2.0
    assert len(directory.projects() or ()) == 1
    snapshot_file.write_text("kind: RunaiSnapshot\ncluster: {}\n")  # broken: the last good one stays
    clock[0] = 4.0
    assert len(directory.projects() or ()) == 1 and "RunaiSnapshot" in (directory.last_error or "")
    snapshot_file.unlink()
    clock[0] = 6.0
    assert not directory.reachable and directory.projects() is None  # no snapshot: no Run:ai data
    with pytest.raises(RunaiError):
        await directory.node_pool_metrics("default")


async def test_a_session_made_on_one_replica_is_good_on_the_other(
    served: Served, https_server: StartHttpsServer
) -> None:
    """Behind the Service a browser's requests reach either replica; both mount the same session
    key Secret, so a sign-in on one is a sign-in on both."""
    env = served.env
    signouts = Signouts(env.kapi)
    signouts.synced["ConfigMap/scheduling-webhook-console-signouts"] = True  # none yet

    def replica() -> web.Application:
        reader = KubeAuthorizer(env.kapi)
        console = Console(
            GpuViews(env.state, None),
            reader,
            sign_in=reader.authenticate,
            sessions=Sessions(served.keys.ring),
            signouts=signouts,
        )
        return cache_app(env.state, routes=console_routes(console))

    first, second = await https_server(replica()), await https_server(replica())
    async with first.session.post(
        first.url("/ui/signin"),
        data={"token": served.root_token, "next": f"/ui/projects/{served.p1}"},
        allow_redirects=False,
    ) as resp:
        assert resp.status == 303
        cookie = resp.cookies[COOKIE].value
    async with second.session.get(
        second.url(f"/ui/projects/{served.p1}"), headers={"Cookie": f"{COOKIE}={cookie}"}, allow_redirects=False
    ) as resp:
        assert resp.status == 200, resp.headers.get("Location")
    # Another installation's key opens nothing of it.
    assert Sessions.ephemeral().open(cookie) is None and Sessions(served.keys.ring).open(cookie) is not None


@pytest.mark.parametrize(
    ("warning", "title", "action"),
    [
        (
            GpuWarning(code="RUN_AI_PROJECT_MISSING", message="m", actual="ghost"),
            "Run:ai has no such project",
            "recreate",
        ),
        (
            GpuWarning(code="RUN_AI_SOMETHING_NEW", message="what the server says"),
            "GPU status RUN_AI_SOMETHING_NEW",
            "administrator",
        ),
    ],
    ids=["missing", "a-status-added-later"],
)
def test_every_status_gets_a_warning_that_says_what_to_do(warning: GpuWarning, title: str, action: str) -> None:
    words = advice(warning)
    assert words.title == title and action in words.action and words.detail == warning.message


async def test_the_admin_page_warns_while_run_ais_admission_is_down(
    tmp_path: Path, kube_scope: KubeScope, https_server: StartHttpsServer
) -> None:
    # The Deployments' watch (tests/test_runai_admission_health.py) feeds the same store.
    down = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "admission", "namespace": "runai"},
        "spec": {"replicas": 0},
        "status": {"conditions": [{"type": "Available", "status": "False"}]},
    }
    directory = RunaiSnapshotDirectory(EXAMPLES)  # Run:ai data from the example folder
    async with serving(tmp_path, kube_scope, https_server, directory=directory) as served:
        served.env.state.replace_all("Deployment", [down])
        await served.sign_in()
        async with served.srv.session.get(served.url("/ui/admin/")) as page:
            text = await page.text()
    assert page.status == 200, text
    assert 'data-status="RUN_AI_ADMISSION_DOWN"' in text and "admission is down" in text
    assert "runai-admission-controller" in text and "admission has 0 of 0 replicas available" in text


# ---- what the project page explains (folder mode: examples/cluster) --------------------------------


async def folder_page(aiohttp_client: Any, folder: Path, path: str) -> str:
    from webhook.local_mode import folder_mode_routes
    from webhook.state.folder import load_into

    state = ClusterState("hopsworks")
    load_into(state, folder)
    client = await aiohttp_client(cache_app(state, routes=folder_mode_routes(state, folder, LOOPBACK)))
    resp = await client.get(path, headers={"Host": "localhost"})
    assert resp.status == 200, await resp.text()
    return str(await resp.text())


async def test_the_project_page_explains_available_and_says_when_runai_sampled(aiohttp_client: Any) -> None:
    page = await folder_page(aiohttp_client, EXAMPLES, "/ui/projects/fraud-detection")
    numbers = dict(re.findall(r'<dd data-field="(\w+)">([^<]*)</dd>', page))
    # Deserved 4, allocated 3 of which 2 non-preemptible: 2 available for a notebook.
    assert (numbers["quota"], numbers["allocated"], numbers["allocated_non_preemptible"]) == ("4", "3", "2")
    assert numbers["available_non_preemptible"] == "2"
    assert 'id="available-means"' in page and "A job is preemptible" in page
    assert '<span id="sampled-at">Run:ai sampled them at 2026-11-30 09:00:00 UTC.</span>' in page
    # Every cell of the offer says its column on a narrow screen (console.css), the defaults too.
    assert page.count('<td class="choose">') == 3 and page.count('<td class="default">') == 2
    assert '<td class="choose"><ul class="chips"><li data-choice="hopsworks-low">' in page
    assert '<td class="default" data-default>hopsworks-high</td>' in page
    css = CONSOLE_CSS.read_text()
    assert 'td.choose::before { content: "May choose: "' in css and 'td.default::before { content: "Default: "' in css


async def test_with_kueue_on_the_topology_row_says_no_one_set_a_default(aiohttp_client: Any, tmp_path: Path) -> None:
    folder = tmp_path / "cluster"
    shutil.copytree(EXAMPLES, folder)
    settings = folder / "20-settings.yaml"
    doc = yaml.safe_load(settings.read_text())
    doc["data"].update(kueue_installed="true", run_ai_enable="false")
    settings.write_text(yaml.safe_dump(doc))
    page = await folder_page(aiohttp_client, folder, "/ui/projects/churn")
    row = re.search(r'<tr data-row="topology">(.*?)</tr>', page, re.S)
    assert row, page
    assert "<td data-level>no one: no project or cluster default</td>" in row.group(1)
