"""The shipped RBAC is enough and no more: the real Runtime, holding only the chart's ServiceAccount
identity and the chart's RBAC (tests/support/kube_scope.py re-targets it to the test's install
namespace), runs its whole life against the real apiserver, whose RBAC decides every request, and
the Run:ai stand-in. Its requests go through the fault proxy, which records each one with the
apiserver's answer: a 403 there is a denial, anything else was granted.

- `test_the_rendered_rbac_is_enough`: a full life with no denial at all.
- `test_a_missing_rule_is_denied`: the check can fail (a rule taken out is a real denial).
- `test_the_rendered_rbac_is_no_more_than_needed`: what was granted but never used.

What RBAC cannot narrow, the ValidatingAdmissionPolicies do; the real apiserver evaluates them in
tests/e2e/test_admission_policies.py.
"""

from __future__ import annotations

import base64
import json
import re
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.support.cluster import SCHEDULER, runai_settings_configmap
from tests.support.control_plane.fault_proxy import Call, FaultProxy
from tests.support.https import wait_until
from tests.support.kube_scope import RUNAI_NAMESPACE, SERVICE_ACCOUNT, KubeScope, SharedCluster, eventually, scope_on
from tests.support.kueue_crds import kueue_crds
from tests.support.reviews import apply_patch, pod_review
from tests.support.runai_standin import RunaiStandin
from tests.support.runtime import apiserver_session, base_url, binding_settled, start_runtime
from webhook.runtime import Runtime

SECRET = "standin-client-secret"
LEASE = "scheduling-webhook-leader"  # the chart's SCHEDULING_WEBHOOK_LEASE_NAME
RBAC = "rbac.authorization.k8s.io/v1"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
# Cluster-wide writes that cannot be narrowed to one namespace although the scenario only made
# them there, and why. Anything else of that shape fails the least-privilege test.
_POLICY_PARAMS = (
    "the compiled admission policies' parameters, one ConfigMap named scheduling-webhook-policy in each "
    "project namespace (granted by that name only); this scenario installs no policies, so the leader writes none"
)
EXPLAINED_BROAD: dict[tuple[str, str, str], str] = {
    ("create", "", "configmaps"): _POLICY_PARAMS,
    ("patch", "", "configmaps"): _POLICY_PARAMS,
    ("delete", "", "configmaps"): _POLICY_PARAMS,
}


# -- the cluster ---------------------------------------------------------------------------------


@dataclass
class Cluster:
    scope: KubeScope
    proxy: FaultProxy
    runai: RunaiStandin
    runtime: Runtime
    base: str  # the server's URL, as the apiserver dials it
    session: aiohttp.ClientSession

    @property
    def sa_user(self) -> str:
        return self.scope.service_account_user

    def denials(self) -> list[Call]:
        return [c for c in self.proxy.requests if c.status == 403]

    async def admit(self, path: str, review: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(f"{self.base}{path}", json=review) as resp:
            assert resp.status == 200, await resp.text()
            return dict((await resp.json())["response"])

    async def call(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.session.request(method, f"{self.base}{path}", json=body, headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)


@asynccontextmanager
async def cluster(tmp: Path, scope: KubeScope) -> AsyncIterator[Cluster]:
    """The Run:ai stand-in, the settings with Run:ai on, and the Runtime started as the chart's
    ServiceAccount through a fault proxy of its own."""
    async with FaultProxy(scope.cp) as proxy, RunaiStandin(client_secret=SECRET) as runai:
        runai.add_department("vision-dept")
        runai.add_department("nlp-dept")
        await scope.put(runai_settings_configmap(runai, scope.install_ns, run_ai_project_gpu_quota=2,
                                                 run_ai_reconcile_interval_s=1, scheduler=SCHEDULER))  # fmt: skip
        secret_dir = tmp / "runai-secret"
        secret_dir.mkdir(parents=True)
        (secret_dir / "clientSecret").write_text(SECRET)
        runtime, options, certs = await start_runtime(
            tmp, scope, kubeconfig=proxy.via(scope.kubeconfig), runai_secret_dir=secret_dir, lease_name=LEASE
        )
        try:
            async with apiserver_session(certs) as session:
                yield Cluster(scope, proxy, runai, runtime, base_url(options), session)
        finally:
            await runtime.shutdown()
        assert runai.violations == [], runai.violations


async def labels_of(scope: KubeScope, name: str) -> dict[str, str]:
    got = await scope.get("v1", "Namespace", name)
    return dict(((got or {}).get("metadata") or {}).get("labels") or {})


async def events(scope: KubeScope, reason: str, about: str) -> list[dict[str, Any]]:
    # About a cluster-scoped Namespace, so in `default`.
    return [e for e in await scope.list("v1", "Event", "default")
            if e.get("reason") == reason and e["involvedObject"]["name"] == about]  # fmt: skip


async def bind_vision(c: Cluster) -> str:
    vision = await c.scope.namespace("vision", labels={"hopsworks.ai/department": "vision-dept"})

    async def bound() -> bool:
        return "runai/queue" in await labels_of(c.scope, vision)

    await eventually(bound, within_s=15, message="vision bound")
    state = c.runtime.state
    await wait_until(lambda: vision in (state.snapshot().runai_projects or {}), within=20, what="quota known")
    await binding_settled(c.runtime, vision)
    return vision


async def admit_gpu_notebook(c: Cluster, vision: str, uid: str) -> dict[str, Any]:
    review = pod_review(vision, labels={"jupyter": "true"}, gpus=1, uid=uid)
    mutated = await c.admit("/mutate/pods", review)
    review["request"]["object"] = apply_patch(
        review["request"]["object"], json.loads(base64.b64decode(mutated["patch"]))
    )
    return await c.admit("/validate/pods", review)


async def scope_rbac(scope: KubeScope) -> list[dict[str, Any]]:
    """The chart's RBAC objects as the scope installed them (re-targeted, renamed)."""
    objects: list[dict[str, Any]] = []
    for ns in (scope.install_ns, "default", RUNAI_NAMESPACE):
        for kind in ("Role", "RoleBinding"):
            objects += [{**o, "kind": kind} for o in await scope.list(RBAC, kind, ns)]
    for kind in ("ClusterRole", "ClusterRoleBinding"):
        objects += [
            {**o, "kind": kind} for o in await scope.list(RBAC, kind) if o["metadata"]["name"].endswith(scope.id)
        ]
    return objects


async def without_verb(scope: KubeScope, group: str, resource: str, verb: str) -> None:
    """Take `verb` out of every rule of the install namespace's Role on (group, resource), and wait
    until the apiserver's RBAC says so."""
    role = await scope.get(RBAC, "Role", SERVICE_ACCOUNT, scope.install_ns)
    assert role is not None
    for rule in role["rules"]:
        if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
            rule["verbs"].remove(verb)
    role["rules"] = [r for r in role["rules"] if r["verbs"]]
    await scope.put(role)

    async def denied() -> bool:
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": scope.service_account_user, "groups": ["system:serviceaccounts",
                           f"system:serviceaccounts:{scope.install_ns}", "system:authenticated"],
                           "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                                  "namespace": scope.install_ns, "name": "any"}}}  # fmt: skip
        answer = await scope.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        return not answer["status"].get("allowed")

    await eventually(denied, within_s=30, message=f"RBAC still allows {verb} {resource}")


# -- the whole life, once, for the first and the third test ------------------------------------------


@dataclass
class Life:
    sa_user: str
    manifests: list[dict[str, Any]]  # the RBAC the Runtime held
    granted: list[Call]  # what the apiserver let it do
    denied: list[Call]
    facts: dict[str, Any]


def rule(group: str, resource: str, *verbs: str) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}


@pytest.fixture(scope="module")
def kueue_installed(shared_control_plane: SharedCluster) -> Iterator[None]:
    with kueue_crds(shared_control_plane.cp):
        yield


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def life(shared_control_plane: SharedCluster, kueue_installed: None) -> Life:
    with tempfile.TemporaryDirectory(prefix="rbac-life-") as tmp:
        async with scope_on(shared_control_plane, Path(tmp) / "scope") as scope:
            return await _live(scope, Path(tmp))


async def _live(scope: KubeScope, tmp: Path) -> Life:
    facts: dict[str, Any] = {}
    # Users of the GPU and admin APIs: ServiceAccounts the apiserver authenticates, and RBAC.
    alice, alice_token = await scope.user_token("alice")
    _, bob_token = await scope.user_token("bob")
    ops, ops_token = await scope.user_token("ops")
    admin_role = scope.name("namespace-admin")
    await scope.create({"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": admin_role},
                        "rules": [rule("", "namespaces", "get", "list", "update")]})  # fmt: skip
    group = "rbac.authorization.k8s.io"
    await scope.create({"apiVersion": RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": admin_role},
                        "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": admin_role},
                        "subjects": [{"apiGroup": group, "kind": "User", "name": ops}]})  # fmt: skip
    async with cluster(tmp / "runtime", scope) as c:
        runtime = c.runtime
        # Leader election: the Lease is created and held, then renewed.
        await wait_until(lambda: runtime.runai.leader.is_leader, within=15, what="leader")
        first = await scope.get("coordination.k8s.io/v1", "Lease", LEASE, scope.install_ns)
        assert first is not None and first["spec"]["holderIdentity"] == runtime.runai.leader.identity

        # A new project namespace: the leader binds it (labels, annotation, finalizer) and says so.
        vision = await bind_vision(c)
        meta = (await scope.get("v1", "Namespace", vision) or {})["metadata"]
        project = c.runai.project(vision)
        assert project is not None and meta["labels"]["hopsworks.ai/runai-project-id"] == project["id"]
        facts["finalizers"] = list(meta.get("finalizers") or ())
        await eventually(lambda: events(scope, "RunaiProjectCreated", vision), within_s=10, message="created event")
        await scope.allow(alice, "get", "pods", vision)

        # GPU notebooks: a reservation is created, then updated after a conflict (a GET, a PUT
        # again); the third one finds the quota of 2 taken.
        assert (await admit_gpu_notebook(c, vision, "nb-1"))["allowed"] is True
        c.proxy.fail(409, n=1, verb="update", resource="configmaps", namespace=scope.install_ns)
        assert (await admit_gpu_notebook(c, vision, "nb-2"))["allowed"] is True
        refused = await admit_gpu_notebook(c, vision, "nb-3")
        assert refused["allowed"] is False and "0 of 2 deserved GPUs left" in refused["status"]["message"]
        configmaps = c.proxy.calls(resource="configmaps", namespace=scope.install_ns)
        facts["reservation_writes"] = [r.method for r in configmaps if r.method in ("POST", "PUT")]

        # The GPU API: TokenReview, then a SubjectAccessReview the RBAC objects answer.
        status, view = await c.call("GET", f"/api/v1/projects/{vision}/gpu", alice_token)
        assert status == 200 and view["project"]["quota"] == 2, view
        assert (await c.call("GET", f"/api/v1/projects/{vision}/gpu", bob_token))[0] == 403

        # A department move through the admin API: the namespace is patched and an Event says so.
        status, moved = await c.call(
            "POST", f"/api/v1/admin/projects/{vision}/move", ops_token, {"department": "nlp-dept"}
        )
        assert status == 200 and moved["outcome"] == "moved", moved
        assert (await labels_of(scope, vision))["hopsworks.ai/department"] == "nlp-dept"
        assert c.runai.project(vision)["parentId"] == c.runai.department("nlp-dept")["id"]  # type: ignore[index]
        await eventually(lambda: events(scope, "RunaiProjectMoved", vision), within_s=10, message="moved event")
        status, _ = await c.call("POST", f"/api/v1/admin/projects/{vision}/move", alice_token, {"department": None})
        assert status == 403, "alice may read the project, not move it"

        # The console: sign in and out twice (the sign-out list is created, then patched).
        facts["signouts"] = [await console_sign_in_and_out(c, alice_token) for _ in range(2)]

        # Deletion: the Run:ai project goes, then our finalizer, then the namespace.
        await scope.delete("v1", "Namespace", vision)
        await wait_until(lambda: c.runai.project(vision) is None, within=20, what="Run:ai project deleted")

        async def gone() -> bool:
            return await scope.get("v1", "Namespace", vision) is None

        await eventually(gone, within_s=30, message="namespace gone")
        await wait_until(lambda: bool(c.proxy.calls(verb="update", resource="leases")), within=10, what="renewed")
        facts["renewals"] = len(c.proxy.calls(verb="update", resource="leases"))
    # After shutdown: the Lease is released for a successor.
    released = await scope.get("coordination.k8s.io/v1", "Lease", LEASE, scope.install_ns)
    facts["released"] = (released or {}).get("spec", {}).get("holderIdentity") or ""
    calls = c.proxy.requests
    return Life(
        scope.service_account_user,
        await scope_rbac(scope),
        [r for r in calls if r.status not in (None, 401, 403)],
        [r for r in calls if r.status == 403],
        facts,
    )


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


# -- 0. before Kueue ------------------------------------------------------------------------------


async def test_startup_without_the_kueue_crd(tmp_path: Path, kube_scope: KubeScope) -> None:
    # First in the module: the shared cluster has no Kueue until `life` installs its CRDs.
    # RBAC comes before routing: without the grant a missing CRD would answer 403, which the optional
    # LocalQueue watch retries as an error (never synced) instead of taking the 404 as "absent".
    async with cluster(tmp_path, kube_scope) as c:
        await wait_until(c.runtime.state.ready, within=15, what="caches synced")
        assert [r.status for r in c.proxy.calls(verb="list", resource="localqueues")][:1] == [404]
        assert [d.error for d in c.denials()] == []


# -- 1. enough ---------------------------------------------------------------------------------------


def test_the_rendered_rbac_is_enough(life: Life) -> None:
    facts = life.facts
    assert [d.error for d in life.denied] == []
    assert facts["finalizers"], "the binding put our finalizer on the namespace"
    assert facts["reservation_writes"][:1] == ["POST"] and facts["reservation_writes"].count("PUT") >= 2
    assert facts["renewals"] >= 1, "the Lease was renewed"
    assert facts["released"] == "", "the Lease was released on stop"
    assert facts["signouts"] == [303, 303], "both console sign-outs were recorded"
    used = {(r.verb, r.group, r.resource) for r in life.granted}
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


# -- 2. the check can fail ---------------------------------------------------------------------------


async def test_a_missing_rule_is_denied_reservation_update(tmp_path: Path, kube_scope: KubeScope) -> None:
    await without_verb(kube_scope, "", "configmaps", "update")
    async with cluster(tmp_path, kube_scope) as c:
        await wait_until(lambda: c.runtime.runai.leader.is_leader, within=15, what="leader")
        vision = await bind_vision(c)
        assert (await admit_gpu_notebook(c, vision, "nb-1"))["allowed"] is True  # create is still granted
        refused = await admit_gpu_notebook(c, vision, "nb-2")
        assert refused["allowed"] is False and "could not be written" in refused["status"]["message"]
        denied = [d for d in c.denials() if d.resource == "configmaps"]
        assert denied and {d.verb for d in denied} == {"update"}
        assert json.loads(denied[0].error)["message"].startswith(
            f'configmaps "{denied[0].name}" is forbidden: User "{c.sa_user}" cannot update resource "configmaps" '
            f'in API group "" in the namespace "{kube_scope.install_ns}"'
        )


async def test_a_missing_rule_is_denied_lease_create(tmp_path: Path, kube_scope: KubeScope) -> None:
    await without_verb(kube_scope, "coordination.k8s.io", "leases", "create")
    async with cluster(tmp_path, kube_scope) as c:
        want = (
            f'leases.coordination.k8s.io is forbidden: User "{c.sa_user}" cannot create resource "leases" '
            f'in API group "coordination.k8s.io" in the namespace "{kube_scope.install_ns}"'
        )

        def refused() -> bool:
            return any(json.loads(d.error)["message"].startswith(want) for d in c.denials() if d.error)

        await wait_until(refused, within=15, what="lease create denied")
        assert not c.runtime.runai.leader.is_leader


# -- 3. no more than needed --------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    verb: str
    group: str
    resource: str
    scope: str  # "cluster" (a ClusterRole bound cluster-wide) or the Role's namespace
    names: tuple[str, ...] = ()

    def covers(self, req: Call) -> bool:
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
    used = life.granted
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
        only = next(iter(spread)) if spread else "no namespace at all"
        broad.append(f"{g.verb} {g.group or 'core'}/{g.resource} granted cluster-wide; written only in {only}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
        for g in unused:
            print(f"granted, never used in the scenario: {g.verb} {g.group or 'core'}/{g.resource} ({g.scope})")
        for (verb, group, resource), why in EXPLAINED_BROAD.items():
            print(f"kept cluster-wide: {verb} {group or 'core'}/{resource}: {why}")
    assert broad == [], broad
