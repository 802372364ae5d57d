"""The shipped RBAC is enough and no more: the real Runtime, holding only the rendered
ServiceAccount's identity, runs its whole life against the emulator in RBAC mode (every request
authorized from the rendered Roles/ClusterRoles/bindings) and the Run:ai stand-in.

- `test_the_rendered_rbac_is_enough`: a full life with no denial at all.
- `test_a_missing_rule_is_denied`: the check can fail (a rule taken out is a recorded denial).
- `test_the_rendered_rbac_is_no_more_than_needed`: what was granted but never used.

What RBAC cannot narrow, the ValidatingAdmissionPolicies do; the real apiserver evaluates them in
tests/e2e/test_admission_policies.py.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.support import chart
from tests.support.cluster import SCHEDULER, namespace, priority_class
from tests.support.https import (
    LOOPBACK,
    SERVICE_HOST,
    StaticResolver,
    client_ssl_context,
    free_port,
    make_cert_files,
    wait_until,
)
from tests.support.kube_emulator import (
    AccessRequest,
    KubeEmulator,
    forbidden_message,
    request_attributes,
)
from tests.support.reviews import apply_patch, pod_review
from tests.support.runai_standin import RunaiStandin
from tests.support.runtime import binding_settled, write_kubeconfig
from webhook.runtime import Runtime, ServeOptions

INSTALL_NS = "hopsworks"
ROOT_TOKEN = "root-token"  # the test's own superuser: it bypasses RBAC, as system:masters does
SA_TOKEN = "scheduling-webhook-sa-token"
SECRET = "standin-client-secret"
LOADED_KINDS = ("Namespace", "ConfigMap", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
# Cluster-wide writes that cannot be narrowed to one namespace although the scenario only made
# them there, and why. Anything else of that shape fails the least-privilege test.
EXPLAINED_BROAD: dict[tuple[str, str, str], str] = {}


# -- the cluster ---------------------------------------------------------------------------------


def rendered_manifests(ca_pem: bytes, runai: RunaiStandin) -> list[dict[str, Any]]:
    settings = {
        "run_ai_enable": True,
        "run_ai_url": runai.url,
        "run_ai_client_id": runai.client_id,
        "run_ai_project_gpu_quota": 2,
        "run_ai_reconcile_interval_s": 1,
        "scheduler": SCHEDULER,
    }
    values = {"certs": {"mode": "secret", "secret": {"caBundle": base64.b64encode(ca_pem).decode()}},
              "variables": settings, "createNamespace": True}  # fmt: skip
    # The server's own objects: the uninstall hook's RBAC is helm's, for its Job only.
    return [
        o for o in chart.render(values, INSTALL_NS) if "helm.sh/hook" not in (o["metadata"].get("annotations") or {})
    ]


def one(objects: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [dict(o) for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return found


def lease_name(objects: list[dict[str, Any]]) -> str:
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return next(e["value"] for e in container["env"] if e["name"] == "SCHEDULING_WEBHOOK_LEASE_NAME")


def without_verb(
    objects: list[dict[str, Any]], kind: str, group: str, resource: str, verb: str
) -> list[dict[str, Any]]:
    """A copy of the objects with `verb` taken out of every rule of `kind` on (group, resource)."""
    objects = copy.deepcopy(objects)
    role = one(objects, kind, "scheduling-webhook")
    for rule in role["rules"]:
        if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
            rule["verbs"].remove(verb)
    role["rules"] = [r for r in role["rules"] if r["verbs"]]
    return [role if o["kind"] == kind and o["metadata"]["name"] == role["metadata"]["name"] else o for o in objects]


@dataclass
class Cluster:
    emu: KubeEmulator
    runai: RunaiStandin
    manifests: list[dict[str, Any]]
    sa_user: str
    runtime: Runtime
    base: str  # the server's URL, as the apiserver dials it
    session: aiohttp.ClientSession

    async def admit(self, path: str, review: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(f"{self.base}{path}", json=review) as resp:
            assert resp.status == 200, await resp.text()
            return dict((await resp.json())["response"])

    async def call(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.session.request(method, f"{self.base}{path}", json=body, headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)


@asynccontextmanager
async def cluster(
    tmp: Path, *, crd: bool = True, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None
) -> AsyncIterator[Cluster]:
    """The emulator in RBAC mode holding the rendered manifests, the Run:ai stand-in, and the Runtime
    started as the rendered ServiceAccount; `edit` changes the manifests before they are loaded."""
    certs = make_cert_files(tmp / "certs")
    async with KubeEmulator(token=ROOT_TOKEN, rbac=True) as emu, RunaiStandin(client_secret=SECRET) as runai:
        runai.add_department("vision-dept")
        runai.add_department("nlp-dept")
        manifests = rendered_manifests(certs.ca.cert_pem, runai)
        if not crd:
            emu.remove_resource("LocalQueue")
        # Run:ai's namespace, as its install leaves it: the server reads its admission Deployments there.
        emu.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "runai"}})
        for obj in (edit or list)(manifests):
            if obj["kind"] in LOADED_KINDS:
                emu.create_object(obj)
        for pc in (
            priority_class("batch", 1000, "Never"),
            priority_class("normal", 10000),
            priority_class("urgent", 10**5),
        ):
            emu.create_object(pc)
        account = one(manifests, "ServiceAccount")["metadata"]
        sa_user = emu.add_service_account(SA_TOKEN, account["namespace"], account["name"]).username
        secret_dir = tmp / "runai-secret"
        secret_dir.mkdir()
        (secret_dir / "clientSecret").write_text(SECRET)
        options = ServeOptions(
            host=LOOPBACK,
            port=free_port(),
            certs=certs.dir,
            kubeconfig=write_kubeconfig(tmp / "kubeconfig", emu.url, SA_TOKEN),
            namespace=INSTALL_NS,
            runai_secret_dir=secret_dir,
            lease_name=lease_name(manifests),
            drain_seconds=0.0,
        )
        runtime = Runtime(options)
        connector = aiohttp.TCPConnector(
            ssl=client_ssl_context(certs.ca.cert_pem), resolver=StaticResolver({SERVICE_HOST: LOOPBACK})
        )
        async with aiohttp.ClientSession(connector=connector) as session:
            await runtime.start()
            try:
                base = f"https://{SERVICE_HOST}:{options.port}"
                yield Cluster(emu, runai, manifests, sa_user, runtime, base, session)
            finally:
                await runtime.shutdown()
        assert runai.violations == [], runai.violations


def labels_of(emu: KubeEmulator, name: str) -> dict[str, str]:
    return dict(((emu.get_object("Namespace", name) or {}).get("metadata") or {}).get("labels") or {})


def events(emu: KubeEmulator, reason: str, about: str) -> list[dict[str, Any]]:
    # About a cluster-scoped Namespace, so in `default` (the emulator enforces it).
    return [
        e for e in emu.objects("Event", "default") if e["reason"] == reason and e["involvedObject"]["name"] == about
    ]


async def bind_vision(c: Cluster) -> None:
    c.emu.create_object(namespace("vision", labels={"hopsworks.ai/department": "vision-dept"}))
    await wait_until(lambda: "runai/queue" in labels_of(c.emu, "vision"), within=15, what="vision bound")
    state = c.runtime.state
    await wait_until(lambda: "vision" in (state.snapshot().runai_projects or {}), within=20, what="quota known")
    await binding_settled(c.runtime, "vision")


async def admit_gpu_notebook(c: Cluster, uid: str) -> dict[str, Any]:
    review = pod_review("vision", labels={"jupyter": "true"}, gpus=1, uid=uid)
    mutated = await c.admit("/mutate/pods", review)
    review["request"]["object"] = apply_patch(
        review["request"]["object"], json.loads(base64.b64decode(mutated["patch"]))
    )
    return await c.admit("/validate/pods", review)


# -- the whole life, once, for the first and the third test ------------------------------------------


@dataclass
class Life:
    emu: KubeEmulator
    sa_user: str
    manifests: list[dict[str, Any]]
    facts: dict[str, Any]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def life(tmp_path_factory: pytest.TempPathFactory) -> Life:
    async with cluster(tmp_path_factory.mktemp("rbac-life")) as c:
        emu, runtime = c.emu, c.runtime
        facts: dict[str, Any] = {}
        # Users of the GPU and admin APIs, authorized by RBAC objects too (through SubjectAccessReviews).
        emu.authorizer = emu.rbac_allows
        emu.add_user("alice-token", "alice")
        emu.add_user("bob-token", "bob")
        emu.add_user("ops-token", "ops", groups=["platform-admins"])
        emu.create_object(cluster_role("namespace-admin", [rule("", "namespaces", "get", "list", "update")]))
        emu.create_object(binding("ClusterRoleBinding", "namespace-admin", "ClusterRole", group="platform-admins"))
        emu.create_object(cluster_role("pod-reader", [rule("", "pods", "get", "list")]))

        # Leader election: the Lease is created and held, then renewed.
        lease = lease_name(c.manifests)
        await wait_until(lambda: runtime.runai.leader.is_leader, within=10, what="leader")
        first = emu.get_object("Lease", lease, INSTALL_NS)
        assert first is not None and first["spec"]["holderIdentity"] == runtime.runai.leader.identity

        # A new project namespace: the leader binds it (labels, annotation, finalizer) and says so.
        await bind_vision(c)
        meta = emu.get_object("Namespace", "vision")["metadata"]  # type: ignore[index]
        project = c.runai.project("vision")
        assert project is not None and meta["labels"]["hopsworks.ai/runai-project-id"] == project["id"]
        facts["finalizers"] = list(meta.get("finalizers") or ())
        await wait_until(lambda: events(emu, "RunaiProjectCreated", "vision"), within=5, what="created event")
        emu.create_object(binding("RoleBinding", "pod-reader", "ClusterRole", user="alice", ns="vision"))

        # GPU notebooks: a reservation is created, then updated after a conflict (a GET, a PUT
        # again); the third one finds the quota of 2 taken.
        assert (await admit_gpu_notebook(c, "nb-1"))["allowed"] is True
        emu.fail_next(1, 409, path_prefix=f"/api/v1/namespaces/{INSTALL_NS}/configmaps/", method="PUT")
        assert (await admit_gpu_notebook(c, "nb-2"))["allowed"] is True
        refused = await admit_gpu_notebook(c, "nb-3")
        assert refused["allowed"] is False and "0 of 2 deserved GPUs left" in refused["status"]["message"]
        configmaps = emu.calls(path_prefix=f"/api/v1/namespaces/{INSTALL_NS}/configmaps")
        facts["reservation_writes"] = [r.method for r in configmaps if r.method in ("POST", "PUT")]

        # The GPU API: TokenReview, then a SubjectAccessReview the RBAC objects answer.
        status, view = await c.call("GET", "/api/v1/projects/vision/gpu", "alice-token")
        assert status == 200 and view["project"]["quota"] == 2, view
        assert (await c.call("GET", "/api/v1/projects/vision/gpu", "bob-token"))[0] == 403

        # A department move through the admin API: the namespace is patched and an Event says so.
        status, moved = await c.call(
            "POST", "/api/v1/admin/projects/vision/move", "ops-token", {"department": "nlp-dept"}
        )
        assert status == 200 and moved["outcome"] == "moved", moved
        assert labels_of(emu, "vision")["hopsworks.ai/department"] == "nlp-dept"
        assert c.runai.project("vision")["parentId"] == c.runai.department("nlp-dept")["id"]  # type: ignore[index]
        await wait_until(lambda: events(emu, "RunaiProjectMoved", "vision"), within=5, what="moved event")
        status, _ = await c.call("POST", "/api/v1/admin/projects/vision/move", "alice-token", {"department": None})
        assert status == 403, "alice may read the project, not move it"

        # The console: sign in and out twice (the sign-out list is created, then patched).
        facts["signouts"] = [await console_sign_in_and_out(c, "alice-token") for _ in range(2)]

        # Deletion: the Run:ai project goes, then our finalizer, then the namespace.
        emu.delete_object("Namespace", "vision")
        await wait_until(lambda: c.runai.project("vision") is None, within=15, what="Run:ai project deleted")
        await wait_until(lambda: emu.get_object("Namespace", "vision") is None, within=15, what="namespace gone")
        renewals = f"/apis/coordination.k8s.io/v1/namespaces/{INSTALL_NS}/leases/{lease}"
        await wait_until(lambda: emu.calls("PUT", renewals), within=5, what="the Lease renewed")
        facts["renewals"] = len(emu.calls("PUT", renewals))
    # After shutdown: the Lease is released for a successor.
    facts["released"] = emu.get_object("Lease", lease, INSTALL_NS)["spec"]["holderIdentity"]  # type: ignore[index]
    return Life(emu, c.sa_user, c.manifests, facts)


async def console_sign_in_and_out(c: Cluster, token: str) -> int:
    origin = {"Origin": c.base}
    async with c.session.post(
        f"{c.base}/ui/signin", data={"token": token}, headers=origin, allow_redirects=False
    ) as resp:
        assert resp.status == 303, await resp.text()
    async with c.session.get(f"{c.base}/ui/") as resp:
        found = re.search(r'name="csrf" value="([^"]+)"', await resp.text())
    assert found is not None
    async with c.session.post(
        f"{c.base}/ui/signout", data={"csrf": found.group(1)}, headers=origin, allow_redirects=False
    ) as resp:
        return resp.status


def rule(group: str, resource: str, *verbs: str) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}


def cluster_role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    meta = {"name": name}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta, "rules": rules}


def binding(kind: str, name: str, role_kind: str, *, group: str = "", user: str = "", ns: str = "") -> dict[str, Any]:
    subject = {"kind": "Group", "name": group} if group else {"kind": "User", "name": user}
    meta = {"name": name, **({"namespace": ns} if ns else {})}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        "subjects": [{**subject, "apiGroup": "rbac.authorization.k8s.io"}],
    }


# -- 1. enough ---------------------------------------------------------------------------------------


def test_the_rendered_rbac_is_enough(life: Life) -> None:
    emu, facts = life.emu, life.facts
    assert [d.message for d in emu.denials] == []
    assert facts["finalizers"], "the binding put our finalizer on the namespace"
    assert facts["reservation_writes"][:1] == ["POST"] and facts["reservation_writes"].count("PUT") >= 2
    assert facts["renewals"] >= 1, "the Lease was renewed"
    assert facts["released"] == "", "the Lease was released on stop"
    assert facts["signouts"] == [303, 303], "both console sign-outs were recorded"
    used = {(r.verb, r.group, r.resource) for r in emu.granted if r.user == life.sa_user}
    for needed in [
        ("list", "", "namespaces"), ("watch", "", "namespaces"), ("patch", "", "namespaces"), ("get", "", "namespaces"),
        ("list", "", "pods"), ("watch", "", "pods"), ("list", "apps", "deployments"), ("watch", "apps", "deployments"),
        ("list", "scheduling.k8s.io", "priorityclasses"), ("watch", "scheduling.k8s.io", "priorityclasses"),
        ("list", "kueue.x-k8s.io", "localqueues"), ("watch", "kueue.x-k8s.io", "localqueues"),
        ("list", "kueue.x-k8s.io", "clusterqueues"), ("watch", "kueue.x-k8s.io", "clusterqueues"),
        ("list", "kueue.x-k8s.io", "resourceflavors"), ("list", "kueue.x-k8s.io", "topologies"),
        ("list", "apps", "replicasets"), ("watch", "apps", "replicasets"),
        ("list", "", "configmaps"), ("watch", "", "configmaps"),
        ("create", "", "configmaps"), ("get", "", "configmaps"), ("update", "", "configmaps"),
        ("patch", "", "configmaps"),
        ("create", "coordination.k8s.io", "leases"), ("get", "coordination.k8s.io", "leases"),
        ("update", "coordination.k8s.io", "leases"),
        ("create", "", "events"),
        ("create", "authentication.k8s.io", "tokenreviews"),
        ("create", "authorization.k8s.io", "subjectaccessreviews"),
    ]:  # fmt: skip
        assert needed in used, f"the scenario did not exercise {needed}"


async def test_startup_without_the_kueue_crd(tmp_path: Path) -> None:
    # RBAC comes before routing: without the grant a missing CRD would answer 403, which the optional
    # LocalQueue watch retries as an error (never synced) instead of taking the 404 as "absent".
    async with cluster(tmp_path, crd=False) as c:
        await wait_until(c.runtime.state.ready, within=10, what="caches synced")
        assert any(r.resource == "localqueues" and r.verb == "list" for r in c.emu.granted)
        assert [d.message for d in c.emu.denials] == []


# -- 2. the check can fail ---------------------------------------------------------------------------


async def test_a_missing_rule_is_denied_reservation_update(tmp_path: Path) -> None:
    edit = lambda objs: without_verb(objs, "Role", "", "configmaps", "update")  # noqa: E731
    async with cluster(tmp_path, edit=edit) as c:
        await wait_until(lambda: c.runtime.runai.leader.is_leader, within=10, what="leader")
        await bind_vision(c)
        assert (await admit_gpu_notebook(c, "nb-1"))["allowed"] is True  # create is still granted
        refused = await admit_gpu_notebook(c, "nb-2")
        assert refused["allowed"] is False and "could not be written" in refused["status"]["message"]
        denied = [d for d in c.emu.denials if d.request.resource == "configmaps"]
        assert denied and {d.request.verb for d in denied} == {"update"}
        name = denied[0].request.name
        assert denied[0].message == (
            f'configmaps "{name}" is forbidden: User "{c.sa_user}" cannot update resource "configmaps" '
            f'in API group "" in the namespace "{INSTALL_NS}"'
        )


async def test_a_missing_rule_is_denied_lease_create(tmp_path: Path) -> None:
    edit = lambda objs: without_verb(objs, "Role", "coordination.k8s.io", "leases", "create")  # noqa: E731
    async with cluster(tmp_path, edit=edit) as c:
        want = (
            f'leases.coordination.k8s.io is forbidden: User "{c.sa_user}" cannot create resource "leases" '
            f'in API group "coordination.k8s.io" in the namespace "{INSTALL_NS}"'
        )
        await wait_until(lambda: any(d.message == want for d in c.emu.denials), within=10, what="lease create denied")
        assert not c.runtime.runai.leader.is_leader


# -- 3. no more than needed --------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    verb: str
    group: str
    resource: str
    scope: str  # "cluster" (a ClusterRole bound cluster-wide) or the Role's namespace
    names: tuple[str, ...] = ()

    def covers(self, req: AccessRequest) -> bool:
        return (
            req.verb == self.verb
            and req.group == self.group
            and (f"{req.resource}/{req.subresource}" if req.subresource else req.resource) == self.resource
            and (self.scope == "cluster" or req.namespace == self.scope)
            and (not self.names or req.name in self.names)
        )


def grants_of(manifests: list[dict[str, Any]], user: str) -> list[Grant]:
    roles = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in manifests}
    out: list[Grant] = []
    for b in (o for o in manifests if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        ns = b["metadata"].get("namespace", "")
        if not any(f"system:serviceaccount:{s.get('namespace', ns)}:{s['name']}" == user for s in b["subjects"]):
            continue
        ref = b["roleRef"]
        role = roles[(ref["kind"], ns if ref["kind"] == "Role" else "", ref["name"])]
        scope = ns or "cluster"
        for r in role["rules"]:
            names = tuple(r.get("resourceNames") or ())
            out += [
                Grant(v, g, res, scope, names) for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]
            ]
    return out


def test_the_rendered_rbac_is_no_more_than_needed(life: Life, capsys: pytest.CaptureFixture[str]) -> None:
    used = [r for r in life.emu.granted if r.user == life.sa_user]
    grants = grants_of(life.manifests, life.sa_user)
    lines = [f"{'verb':<7} {'group':<22} {'resource':<21} {'granted in':<38} {'used in':<10} calls"]
    unused: list[Grant] = []
    broad: list[str] = []
    for g in grants:
        hits = [r for r in used if g.covers(r)]
        where = sorted({r.namespace or "cluster" for r in hits})
        granted = g.scope + (f" {list(g.names)}" if g.names else "")
        used_in = ",".join(where) or "-"
        lines.append(f"{g.verb:<7} {g.group or 'core':<22} {g.resource:<21} {granted:<38} {used_in:<10} {len(hits)}")
        if not hits:
            unused.append(g)
    # A cluster-wide write is needed only for cluster-scoped objects or in namespaces not known in
    # advance (the projects'); writes the scenario made in one namespace alone (the install
    # namespace, or `default` for Events about namespaces) belong in a Role of that namespace.
    for g in grants:
        if g.scope != "cluster" or g.verb not in WRITE_VERBS:
            continue
        writes = [r for r in used if r.verb in WRITE_VERBS and r.group == g.group and r.resource == g.resource]
        # The apiserver's request info gives a Namespace its own name as namespace.
        spread = {None if r.resource == "namespaces" else r.namespace or None for r in writes}
        if (g.verb, g.group, g.resource) in EXPLAINED_BROAD or None in spread or len(spread) > 1:
            continue
        where = next(iter(spread)) if spread else "no namespace at all"
        broad.append(f"{g.verb} {g.group or 'core'}/{g.resource} granted cluster-wide; written only in {where}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
        for g in unused:
            print(f"granted, never used in the scenario: {g.verb} {g.group or 'core'}/{g.resource} ({g.scope})")
        for (verb, group, resource), why in EXPLAINED_BROAD.items():
            print(f"kept cluster-wide: {verb} {group or 'core'}/{resource}: {why}")
    assert broad == [], broad


# -- the RBAC mode itself ----------------------------------------------------------------------------


def test_request_attributes_follow_the_apiservers_request_info() -> None:
    def attrs(method: str, path: str, **query: str) -> tuple[str, str, str | None, str, str]:
        r = request_attributes(method, path, query, "u", ())
        return r.verb, r.resource, r.namespace, r.name, r.subresource

    assert attrs("GET", "/api/v1/namespaces") == ("list", "namespaces", None, "", "")
    assert attrs("GET", "/api/v1/namespaces/p1") == ("get", "namespaces", "p1", "p1", "")
    assert attrs("PATCH", "/api/v1/namespaces/p1") == ("patch", "namespaces", "p1", "p1", "")
    assert attrs("PUT", "/api/v1/namespaces/p1/finalize") == ("update", "namespaces", "p1", "p1", "finalize")
    assert attrs("GET", "/api/v1/pods", watch="true") == ("watch", "pods", None, "", "")
    assert attrs("GET", "/api/v1/namespaces/h/configmaps", fieldSelector="metadata.name=s") == (
        "list", "configmaps", "h", "s", "")  # fmt: skip
    assert attrs("POST", "/api/v1/namespaces/h/configmaps") == ("create", "configmaps", "h", "", "")
    assert attrs("DELETE", "/api/v1/namespaces/h/configmaps") == ("deletecollection", "configmaps", "h", "", "")
    assert attrs("GET", "/apis/kueue.x-k8s.io/v1beta1") == ("get", "", None, "", "")  # discovery
    assert forbidden_message(request_attributes("GET", "/api/v1/pods", {}, "u", ())) == (
        'pods is forbidden: User "u" cannot list resource "pods" in API group "" at the cluster scope'
    )


async def test_resource_names_and_role_bindings_scope_as_in_kubernetes() -> None:
    async with KubeEmulator(token=ROOT_TOKEN, rbac=True) as emu:
        for ns in ("a", "b"):
            emu.create_object(namespace(ns, project=False))
        named = {**rule("", "configmaps", "get", "list", "watch", "create", "update"), "resourceNames": ["only"]}
        meta = {"name": "r", "namespace": "a"}
        role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": [named]}
        emu.create_object(role)
        emu.create_object({**binding("RoleBinding", "r", "Role", ns="a"), "subjects": [
            {"kind": "ServiceAccount", "name": "sa"}]})  # fmt: skip
        emu.add_service_account("t", "a", "sa")
        async with aiohttp.ClientSession(emu.url, headers={"Authorization": "Bearer t"}) as http:

            async def status(method: str, path: str, body: Any = None) -> int:
                async with http.request(method, path, json=body) as response:
                    return response.status

            cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "only"}}
            assert await status("POST", "/api/v1/namespaces/a/configmaps", cm) == 403  # no name on a create
            assert await status("GET", "/api/v1/namespaces/a/configmaps") == 403  # nor on a plain list
            assert await status("GET", "/api/v1/namespaces/a/configmaps?fieldSelector=metadata.name%3Donly") == 200
            assert await status("GET", "/api/v1/namespaces/a/configmaps/only") == 404  # allowed, not there
            assert await status("GET", "/api/v1/namespaces/a/configmaps/other") == 403
            assert await status("GET", "/api/v1/namespaces/b/configmaps/only") == 403  # the binding is a's
            assert await status("GET", "/api") == 200  # discovery
        assert [d.request.verb for d in emu.denials] == ["create", "list", "get", "get"]
        assert emu.denials[0].message == (
            'configmaps is forbidden: User "system:serviceaccount:a:sa" cannot create resource "configmaps" '
            'in API group "" in the namespace "a"'
        )
