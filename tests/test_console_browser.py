"""The console in a real browser: headless Chromium driven by Selenium against the running server.

Folder mode: the real Runtime on a copy of examples/cluster (with its Run:ai snapshot), no sign-in.
Cluster mode: the real Runtime against the shared real control plane (as the webhook's
ServiceAccount) and the spec-checked Run:ai stand-in; users sign in with ServiceAccount tokens the
apiserver's TokenReview knows, members by real Roles. Every number a page shows is compared
with what the API answers for the same thing; each GPU status has its warning; a move runs end to
end until the stand-in holds the recreated Run:ai project.

Skipped, with the reason, when Chromium, chromedriver or selenium is missing (`.ci/run` installs
them). `CONSOLE_SCREENSHOTS=docs` also writes the README's screenshots there.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from selenium.webdriver.common.keys import Keys

from tests.support.browser import Browser, Page, missing_browser, start_browser
from tests.support.cluster import namespace, runai_settings_configmap
from tests.support.https import LOOPBACK, CertFiles, client_ssl_context, free_port, make_cert_files, wait_until
from tests.support.kube_scope import KubeScope, eventually
from tests.support.runai_standin import RunaiStandin
from webhook.console.keys import format_keys, new_key
from webhook.console.session import COOKIE
from webhook.core.quota import format_gpus
from webhook.runtime import Runtime, ServeOptions

pytestmark = pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "cluster"
SECRET = "standin-client-secret"


def shown(value: float | None) -> str:
    """A number as the console writes it."""
    return "—" if value is None else format_gpus(float(value))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_cert_files(tmp_path_factory.mktemp("console") / "certs")


@pytest.fixture(scope="module")
def browser(certs: CertFiles) -> Iterator[Browser]:
    started = start_browser(certs.serving.cert_pem)
    try:
        yield started
    finally:
        started.quit()


@dataclass
class Served:
    runtime: Runtime
    base_url: str
    certs: CertFiles
    page: Page
    extra: dict[str, Any] = field(default_factory=dict)

    async def api(self, path: str, token: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        connector = aiohttp.TCPConnector(ssl=client_ssl_context(self.certs.ca.cert_pem))
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.get(self.base_url + path, headers=headers) as resp,
        ):
            assert resp.status == 200, (path, resp.status, await resp.text())
            return await resp.json()


async def _serve(options: ServeOptions, certs: CertFiles, browser: Browser) -> Served:
    runtime = Runtime(options)
    await runtime.start()
    # The server listens before its caches have listed; serve the pages once it is ready.
    await wait_until(runtime.state.ready, within=20, what="caches listed")
    base = f"https://localhost:{options.port}"
    page = Page(browser, base)
    await page.run(browser.driver.delete_all_cookies)
    return Served(runtime, base, certs, page)


# ---- folder mode --------------------------------------------------------------------------------


@pytest.fixture
async def folder(tmp_path: Path, certs: CertFiles, browser: Browser) -> AsyncIterator[Served]:
    state = tmp_path / "state"
    shutil.copytree(EXAMPLES, state)
    options = ServeOptions(
        host=LOOPBACK, port=free_port(), certs=certs.dir, state_dir=state, drain_seconds=0.0, linger_seconds=0.0
    )
    served = await _serve(options, certs, browser)
    await page_open(served.page, "/ui/")  # chromium up before the first check
    try:
        yield served
    finally:
        await served.runtime.shutdown()


async def page_open(page: Page, path: str) -> None:
    await page.open(path)


async def assert_project_page_matches_api(served: Served, namespace: str, token: str | None = None) -> list[str]:
    """The project page's offer, GPU numbers and warnings equal the APIs'; returns the warning codes."""
    page = served.page
    await page.open(f"/ui/projects/{namespace}")
    assert await page.text("h1") == f"Project {namespace}"
    offer = await served.api(f"/api/v1/projects/{namespace}/scheduling?kind=notebook", token)
    for key in ("affinity", "anti_affinity"):
        assert await page.texts(f"tr[data-row={key}] [data-choice]") == offer[key]["choices"], key
        assert await page.texts(f"tr[data-row={key}] [data-default]") == offer[key]["default"], key
        assert await page.text(f"tr[data-row={key}] [data-level]") == offer[key]["level"]
    classes = offer["priority_class"]["choices"]
    assert await page.attributes("tr[data-row=priority_class] [data-choice]", "data-choice") == [
        c["name"] for c in classes
    ]
    assert await page.texts("tr[data-row=priority_class] [data-value]") == [str(c["value"]) for c in classes]
    assert await page.text("tr[data-row=priority_class] [data-default]") == (
        offer["priority_class"]["default"] or "none"
    )
    allowed = await page.attributes("#gpu-offer", "data-allowed")
    assert allowed == ["yes" if offer["gpus"]["allowed"] else "no"]

    gpus = await served.api(f"/api/v1/projects/{namespace}/gpu", token)
    codes = [w["code"] for w in gpus["warnings"]]
    assert await page.attributes("#gpus [data-status]", "data-status") == codes
    if gpus["runai_enabled"]:
        project = gpus["project"] or {}
        expected = {
            "quota": shown(project.get("quota")),
            "allocated": shown(project.get("allocated")),
            "allocated_non_preemptible": shown(project.get("allocated_non_preemptible")),
            "requested": shown(project.get("requested")),
            "available_non_preemptible": shown(gpus["available_non_preemptible"]),
            "available_preemptible": shown(gpus["available_preemptible"]),
        }
        for name, value in expected.items():
            assert await page.text(f"[data-field={name}]") == value, (namespace, name)
        department = gpus["department"]
        assert (await page.text("[data-field=department]")).startswith(department["name"] if department else "—")
        assert (await page.text("[data-field=node_pool]")).startswith(gpus["node_pool"] or "—")
    else:
        assert await page.text("[data-field=pod_non_preemptible]") == shown(gpus["pod_gpus"]["non_preemptible"])
        assert await page.text("[data-field=pod_preemptible]") == shown(gpus["pod_gpus"]["preemptible"])
    return codes


async def assert_admin_pages_match_api(served: Served, token: str | None = None) -> dict[str, Any]:
    page = served.page
    view = await served.api("/api/v1/admin/runai", token)
    await page.open("/ui/admin/")
    assert await page.text("h1") == "Departments"
    assert await page.attributes("#departments tbody tr", "data-department") == [d["name"] for d in view["departments"]]
    for d in view["departments"]:
        row = f"#departments tr[data-department='{d['name']}']"
        assert await page.text(f"{row} [data-field=quota]") == shown(d["quota"])
        assert await page.text(f"{row} [data-field=allocated]") == shown(d["allocated"])
        linked = await page.text(f"{row} [data-field=linked]")
        assert linked.startswith("Linked") if d["linked"] else linked.startswith("Not linked in Run:ai"), linked
    for d in (d for d in view["departments"] if d["platform"]):
        await page.open(f"/ui/admin/departments/{d['name']}")
        projects = [p for p in view["projects"] if p["department"] == d["name"]]
        assert await page.attributes("#projects tbody tr[data-project]", "data-project") == [
            p["namespace"] for p in projects
        ]
        for p in projects:
            row = f"#projects tr[data-project='{p['namespace']}']"
            assert await page.text(f"{row} [data-field=quota]") == shown(p["quota"])
            assert await page.text(f"{row} [data-field=allocated]") == shown(p["allocated"])
            linked = await page.text(f"{row} [data-field=linked]")
            if p["linked"]:
                assert linked.startswith(p["runai_project"]), linked
            else:
                assert linked.startswith("Not linked in Run:ai"), linked
                if p["expected_department"]:
                    assert f"goes to Run:ai department {p['expected_department']}" in linked
            codes = [w["code"] for w in p["warnings"]]
            assert await page.attributes(f"{row} [data-status]", "data-status") == codes
    return view


async def test_folder_mode_pages_show_the_apis_numbers(folder: Served) -> None:
    page = folder.page
    await page.open("/ui/")
    projects = await page.texts("ul.cards a")
    assert projects == ["churn", "forecasting", "fraud-detection", "imaging", "sandbox"]
    codes = {ns: await assert_project_page_matches_api(folder, ns) for ns in projects}
    # The example's Run:ai snapshot shows a warning of each kind it can have offline.
    assert codes == {
        "churn": [],
        "forecasting": [],
        "fraud-detection": [],
        "imaging": ["RUN_AI_DEPARTMENT_DRIFT"],
        "sandbox": ["RUN_AI_PROJECT_NOT_BOUND"],
    }
    await page.open("/ui/projects/imaging")
    assert await page.text("[data-field=department]") == "default (belongs in risk)"
    warning = await page.text("[data-status=RUN_AI_DEPARTMENT_DRIFT]")
    assert "What to do:" in warning and "department risk" in warning
    view = await assert_admin_pages_match_api(folder)
    research = next(d for d in view["departments"] if d["name"] == "research")
    assert (research["linked"], research["maps_to"]) == (False, "default")
    # Reading works offline; acting needs a cluster, and the pages say so instead of offering it.
    await page.open("/ui/admin/departments/risk")
    assert await page.texts("form.move") == []
    assert "Moves need cluster mode" in await page.text("#projects tr[data-project=imaging]")
    await page.open("/ui/admin/projects/churn/move?department=risk")
    assert "needs cluster mode" in await page.text("main")
    assert await page.texts("#confirm") == []


async def test_folder_mode_screenshots_and_a_phone_sized_window(folder: Served, tmp_path: Path) -> None:
    page = folder.page
    out = Path(os.environ["CONSOLE_SCREENSHOTS"]) if os.environ.get("CONSOLE_SCREENSHOTS") else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    await page.open("/ui/projects/imaging")
    await page.screenshot(out / "console-project.png")
    await page.open("/ui/admin/departments/risk")
    await page.screenshot(out / "console-department.png")
    await page.open("/ui/admin/")
    await page.screenshot(out / "console-admin.png")
    for name in ("console-project.png", "console-admin.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A phone: nothing wider than the screen, so nothing to scroll sideways.
    driver = page.browser.driver
    await page.run(driver.set_window_size, 390, 844)
    try:
        for path in ("/ui/projects/fraud-detection", "/ui/admin/", "/ui/admin/departments/risk"):
            await page.open(path)
            overflow = await page.run(
                driver.execute_script, "return document.documentElement.scrollWidth - window.innerWidth"
            )
            assert overflow <= 0, (path, overflow)
    finally:
        await page.run(driver.set_window_size, 1280, 1000)


async def test_folder_mode_answers_with_an_explanation_when_not_on_loopback(
    tmp_path: Path, certs: CertFiles, browser: Browser
) -> None:
    state = tmp_path / "state"
    shutil.copytree(EXAMPLES, state)
    # Listening on every address: nothing to check tokens with, so nothing is shown.
    options = ServeOptions(
        host="0.0.0.0", port=free_port(), certs=certs.dir, state_dir=state, drain_seconds=0.0, linger_seconds=0.0
    )
    served = await _serve(options, certs, browser)
    try:
        await served.page.open("/ui/projects/churn")
        assert await served.page.text("h1") == "Not allowed"
        assert "loopback" in await served.page.text("main")
        assert await served.page.texts("#gpus") == []
    finally:
        await served.runtime.shutdown()


# ---- cluster mode -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Names:
    """The cluster's project namespaces (each a name of the test's own) and its users' tokens."""

    alpha: str  # department ml, bound
    busy: str  # department ml, bound, a notebook running
    waiting: str  # department stuck, where Run:ai refuses every project: never bound
    drifted: str  # adopted: its Run:ai project is in department default, its label says ml
    root: str  # a cluster admin
    bob: str  # a member of alpha only


@pytest.fixture
async def cluster(tmp_path: Path, certs: CertFiles, browser: Browser, kube_scope: KubeScope) -> AsyncIterator[Served]:
    scope = kube_scope
    alpha, busy, waiting, drifted = (scope.name(n) for n in ("alpha", "busy", "waiting", "drifted"))
    async with RunaiStandin(client_secret=SECRET) as runai:
        runai.add_department("ml", gpu_quota=6)
        runai.add_department("stuck")
        # Run:ai refuses every project create in `stuck`: its namespace stays unbound.
        runai.fail_project_create_in("stuck", status=400, times=None)
        runai.add_project(drifted, department="default", namespace=drifted, gpu_quota=1)  # adopted
        await scope.put(
            runai_settings_configmap(runai, scope.install_ns, run_ai_project_gpu_quota=2, run_ai_reconcile_interval_s=1)
        )
        for obj in (
            namespace(alpha, labels={"hopsworks.ai/department": "ml"}),
            namespace(busy, labels={"hopsworks.ai/department": "ml"}),
            namespace(waiting, labels={"hopsworks.ai/department": "stuck"}),
            namespace(drifted, labels={"hopsworks.ai/department": "ml", "runai/queue": drifted}),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "notebook-0", "namespace": busy},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
            },
        ):
            await scope.create(obj)
        _, root = await scope.admin_token("root")
        alice, _ = await scope.user_token("alice")  # member of alpha and waiting
        await scope.allow(alice, "get", "pods", alpha)
        await scope.allow(alice, "get", "pods", waiting)
        bob, bob_token = await scope.user_token("bob")  # member of alpha only
        await scope.allow(bob, "get", "pods", alpha)

        async def notebook_running() -> bool:
            pod = await scope.get("v1", "Pod", "notebook-0", busy)
            return pod is not None and pod.get("status", {}).get("phase") == "Running"

        await eventually(notebook_running, within_s=30, interval_s=0.1, message="busy's notebook Running")  # kwok
        secret_dir = tmp_path / "runai-secret"
        secret_dir.mkdir()
        (secret_dir / "clientSecret").write_text(SECRET)
        console_keys = tmp_path / "console-session-keys"
        console_keys.write_text(format_keys([new_key(0)]))
        options = ServeOptions(
            host=LOOPBACK,
            port=free_port(),
            certs=certs.dir,
            kubeconfig=scope.kubeconfig,
            namespace=scope.install_ns,
            runai_secret_dir=secret_dir,
            console_keys=console_keys,
            drain_seconds=0.0,
            linger_seconds=0.0,
        )
        served = await _serve(options, certs, browser)
        served.extra.update(scope=scope, runai=runai, names=Names(alpha, busy, waiting, drifted, root, bob_token))
        try:
            state = served.runtime.state
            await wait_until(
                lambda: all(state.namespaces[n].runai_queue for n in (alpha, busy)),
                within=20,
                what="alpha and busy bound by the reconciler",
            )
            await wait_until(
                lambda: {alpha, busy, drifted} <= set(state.snapshot().runai_projects or ()),
                within=20,
                what="their Run:ai projects in the directory",
            )
            yield served
        finally:
            await served.runtime.shutdown()
        assert runai.violations == [], runai.violations


async def sign_in(page: Page, token: str, then: str = "/ui/") -> None:
    await page.open(f"/ui/signin?next={then}")
    await page.fill("#token", token)
    await page.click("form.stack button[type=submit]")
    assert await page.path() == then, await page.text("main")


@pytest.mark.slow
async def test_cluster_pages_show_the_apis_numbers_and_each_warning(cluster: Served) -> None:
    page, runai, n = cluster.page, cluster.extra["runai"], cluster.extra["names"]
    await page.open(f"/ui/projects/{n.alpha}")
    assert (await page.path()).startswith("/ui/signin")  # not signed in: no data, a sign-in form
    await sign_in(page, n.root, f"/ui/projects/{n.alpha}")
    assert await assert_project_page_matches_api(cluster, n.alpha, n.root) == []
    assert await page.text("[data-field=quota]") == "2"  # run_ai_project_gpu_quota
    assert await assert_project_page_matches_api(cluster, n.waiting, n.root) == ["RUN_AI_PROJECT_NOT_BOUND"]
    assert "Not linked to Run:ai yet" in await page.text("[data-status=RUN_AI_PROJECT_NOT_BOUND]")
    assert await page.attributes("#gpu-offer", "data-allowed") == ["no"]
    assert await assert_project_page_matches_api(cluster, n.drifted, n.root) == ["RUN_AI_DEPARTMENT_DRIFT"]
    drift = await page.text("[data-status=RUN_AI_DEPARTMENT_DRIFT]")
    assert "belongs in ml" in drift and "department ml" in drift
    view = await assert_admin_pages_match_api(cluster, n.root)
    assert {d["name"] for d in view["departments"] if not d["linked"]} == set()
    # Run:ai's metrics stop answering: the page says Run:ai cannot be reached, and what to do.
    # (Metrics are cached for a few seconds per node pool: the page shows it once the cache expires.)
    runai.fail_next(1000, 503, path="/api/v1/clusters/*/nodepools/*/metrics")
    deadline = asyncio.get_running_loop().time() + 20
    while [w["code"] for w in (await cluster.api(f"/api/v1/projects/{n.busy}/gpu", n.root))["warnings"]] != [
        "RUN_AI_UNREACHABLE"
    ]:
        assert asyncio.get_running_loop().time() < deadline, "no RUN_AI_UNREACHABLE status"
        await asyncio.sleep(0.3)
    assert await assert_project_page_matches_api(cluster, n.busy, n.root) == ["RUN_AI_UNREACHABLE"]
    assert "Try again" in await page.text("[data-status=RUN_AI_UNREACHABLE]")
    runai.clear_faults()
    # The integration is turned off while namespaces are still bound: binding left behind.
    scope: KubeScope = cluster.extra["scope"]
    off = {"data": {"run_ai_enable": "false"}}
    await scope.patch("v1", "ConfigMap", "hopsworks-cluster-settings", off, scope.install_ns)
    await wait_until(lambda: not cluster.runtime.state.settings.run_ai_enable, what="settings followed")
    assert await assert_project_page_matches_api(cluster, n.alpha, n.root) == ["RUN_AI_BINDING_LEFT"]
    assert "integration is off" in await page.text("#runai-off")
    assert "remove" in (await page.text("[data-status=RUN_AI_BINDING_LEFT]")).lower()


async def test_a_move_end_to_end_and_a_refused_one_and_a_department_delete(cluster: Served) -> None:
    page, runai, n = cluster.page, cluster.extra["runai"], cluster.extra["names"]
    old = runai.project(n.alpha)
    assert old is not None and old["parentId"] == runai.department("ml")["id"]
    await sign_in(page, n.root, "/ui/admin/departments/ml")
    await page.fill(f"#to-{n.alpha}", "default")
    await page.click(f"tr[data-project={n.alpha}] form.move button")
    assert await page.path() == f"/ui/admin/projects/{n.alpha}/move?department=default"
    consequences = await page.text("#consequences")
    assert "deleted and created again" in consequences and "no GPU quota" in consequences
    assert runai.project(n.alpha)["id"] == old["id"]  # nothing happens before the confirmation
    await page.click("#confirm")
    assert await page.text("h1") == f"{n.alpha} moved"
    reminder = await page.text("#reminder")
    assert "Re-add GPU quota and access rules" in reminder
    new = runai.project(n.alpha)
    assert new is not None and new["id"] != old["id"]
    assert new["parentId"] == runai.department("default")["id"] and new["requestedNamespace"] == n.alpha
    assert all(r["gpu"].get("deserved", 0) == 0 for r in new["resources"])  # no quota taken along
    moved = await cluster.extra["scope"].get("v1", "Namespace", n.alpha)
    assert moved["metadata"]["labels"]["hopsworks.ai/department"] == "default"

    # A busy project is refused, and the page names the pods in the way.
    await page.open(f"/ui/admin/projects/{n.busy}/move?department=default")
    await page.click("#confirm")
    assert await page.text("h1") == f"{n.busy} was not moved"
    assert await page.texts("#busy-pods li") == ["notebook-0"]
    assert runai.project(n.busy)["parentId"] == runai.department("ml")["id"]

    # Deleting ml moves its projects one at a time and stops at busy.
    await page.open("/ui/admin/departments/ml/delete")
    await page.click("#confirm")
    assert "delete stopped" in await page.text("h1")
    assert await page.attributes("#stopped-at", "data-namespace") == [n.busy]
    assert n.busy in await page.text("main")


async def test_members_and_strangers_get_what_they_may_see_with_the_keyboard(cluster: Served) -> None:
    page, n = cluster.page, cluster.extra["names"]
    # Sign in with the keyboard only: Tab to the token field, type, Tab to the button, Enter.
    await page.open("/ui/signin?next=/ui/admin/")
    for _ in range(12):
        await page.keys(Keys.TAB)
        if (await page.focused())["id"] == "token":
            break
    assert (await page.focused())["id"] == "token"
    await page.keys(n.bob, Keys.TAB)
    focused = await page.focused()
    assert (focused["tag"], focused["text"]) == ("button", "Sign in")
    await page.keys(Keys.ENTER, navigates=True)
    # bob is no admin: a clear 403 page and no data.
    assert await page.path() == "/ui/admin/"
    assert await page.text("h1") == "Not allowed"
    assert "bob" in await page.text("[role=alert]")
    assert await page.texts("#departments") == []
    await page.open(f"/ui/projects/{n.drifted}")
    assert await page.text("h1") == "Not allowed" and await page.texts("#gpus") == []
    await page.open(f"/ui/projects/{n.alpha}")
    assert await page.text("h1") == f"Project {n.alpha}"
    # The project page's kind form, by keyboard: Tab to the select, pick "job", Tab, Enter.
    for _ in range(12):
        await page.keys(Keys.TAB)
        if (await page.focused())["id"] == "kind":
            break
    assert (await page.focused())["id"] == "kind"
    await page.keys("j", Keys.TAB)
    await page.keys(Keys.ENTER, navigates=True)
    assert await page.path() == f"/ui/projects/{n.alpha}?kind=job"
    assert "for a job" in await page.text("#gpu-offer")
    # The session cookie as Chromium keeps it: __Host-, Path=/, HttpOnly, Secure, Strict.
    cookies = {c["name"]: c for c in await page.run(page.browser.driver.get_cookies)}
    session = cookies[COOKIE]
    assert (session["path"], session["httpOnly"], session["secure"], session["sameSite"]) == ("/", True, True, "Strict")
    assert session.get("domain", "localhost") == "localhost"  # host-only: no Domain attribute
    # Signing out ends the session: the next page asks again, and a copy of the cookie (as someone
    # who took it would replay it) is refused by the server too.
    await page.click("header form.signout button")
    await page.open(f"/ui/projects/{n.alpha}")
    assert (await page.path()).startswith("/ui/signin")
    connector = aiohttp.TCPConnector(ssl=client_ssl_context(cluster.certs.ca.cert_pem))
    async with (
        aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as http,
        http.get(
            cluster.base_url + f"/ui/projects/{n.alpha}",
            headers={"Cookie": f"{COOKIE}={session['value']}"},
            allow_redirects=False,
        ) as replay,
    ):
        assert replay.status == 303 and replay.headers["Location"].startswith("/ui/signin")
