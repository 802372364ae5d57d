"""One real Kubernetes for the tests that are not e2e, and each test's own corner of it: a pytest
plugin, registered in tests/conftest.py.

shared_control_plane  (session) the real control plane of tests/support/control_plane (etcd,
                      apiserver, controllers, scheduler, kwok and its fake nodes), started the first
                      time a test asks for it and stopped at the end of the session; a run that
                      never asks starts nothing. The platform's PriorityClasses and Run:ai's
                      namespace are there from the start, shared, so a test only reads them. No
                      chart is installed.
kube_scope            (test) a KubeScope: the test's names, namespaces and objects on that cluster,
                      an install namespace of its own with the chart's RBAC in it, and a kubeconfig
                      that acts as the webhook's ServiceAccount. Everything it made goes after the
                      test.

As envtest and Kueue's integration suites do, many tests share one apiserver and stay independent
because nothing they make is shared: every namespace and cluster-scoped object a test creates has a
name carrying the scope's id (`scope.name("churn")` is `churn-<id>`), and the install namespace is
the test's own. A Runtime started for a test reads the whole cluster, as a real replica does, so it
sees what earlier tests left while their namespaces terminate; the teardown therefore deletes a
test's pods at once and makes its namespaces plain ones (no label but their name, no annotation, no
finalizer) before deleting them, so that no later Runtime counts them as projects or as GPUs in use.

Why this is not tests/e2e's `real_control_plane`: the e2e session installs the chart, and its two
replicas act on every project namespace of the cluster (binding, labels, finalizers, reservations),
which would race with the Runtime a test here runs against its own namespaces.

The RBAC is the chart's, rendered once per session by the real helm for a placeholder namespace and
re-targeted per test: the ServiceAccount, Role and RoleBinding in the test's install namespace, and
the cluster-scoped ClusterRole, ClusterRoleBinding and ValidatingAdmissionPolicies (and the Roles
the chart puts in `default` and `runai`) under names carrying the scope's id. A Runtime under test
therefore meets the same denials a real install would.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException

from tests.support import chart
from tests.support.cluster import (
    PRIORITY_CLASSES,
    namespace,
    priority_class,
    runai_admission_objects,
    settings_configmap,
)
from tests.support.control_plane.cluster import ControlPlane, control_plane

Obj = dict[str, Any]

# The chart is rendered for this namespace once; every occurrence is then replaced by a test's own.
TEMPLATE_NS = "kube-scope-template"
SERVICE_ACCOUNT = "scheduling-webhook"  # the chart's ServiceAccount, in every install namespace
RUNAI_NAMESPACE = "runai"  # Run:ai's own namespace: its name is fixed by Run:ai, so one per cluster
PROJECT_LABEL = "hopsworks.ai/project"
NAME_LABEL = "kubernetes.io/metadata.name"  # set by the apiserver on every namespace
# The chart's objects a Runtime's permissions come from (its Deployment, Service, webhooks and
# certificates are not needed: the test runs the Runtime in-process and plays the apiserver).
RBAC_KINDS = frozenset({"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"})  # fmt: skip
CLUSTER_SCOPED = frozenset({"Namespace", "Node", "PriorityClass", "ClusterRole", "ClusterRoleBinding",
                            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                            "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                            "CustomResourceDefinition", "ClusterQueue", "ResourceFlavor", "Topology",
                            "Cohort"})  # fmt: skip
TEARDOWN_WITHIN_S = 60.0


def resource_path(api_version: str, kind: str, namespace: str | None = None, name: str | None = None) -> str:
    """The REST path of a kind's collection (or of one object), as the apiserver names them."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    lower = kind.lower()
    plural = lower + "es" if lower.endswith("s") else lower[:-1] + "ies" if lower.endswith("y") else lower + "s"
    where = f"/namespaces/{namespace}" if namespace and kind not in CLUSTER_SCOPED else ""
    return f"{base}{where}/{plural}" + (f"/{name}" if name else "")


def object_path(obj: Mapping[str, Any], *, named: bool = True) -> str:
    meta = obj["metadata"]
    return resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"] if named else None)


async def eventually(
    condition: Callable[[], Any], within_s: float = 10.0, interval_s: float = 0.02, message: str = ""
) -> Any:
    """Poll until `condition()` is truthy (returns it); fail the test after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(message or f"condition not met within {within_s}s")
        await asyncio.sleep(interval_s)


@dataclass(frozen=True)
class SharedCluster:
    """The session's control plane and what every scope is made from."""

    cp: ControlPlane
    rbac: tuple[Obj, ...]  # the chart's RBAC objects, rendered for TEMPLATE_NS


def _render_rbac() -> tuple[Obj, ...]:
    # With Run:ai on, the chart adds its read access to Run:ai's Deployments in `runai`.
    values = {"variables": {"run_ai_enable": True, "run_ai_client_id": "hopsworks", "kueue_installed": False}}
    return tuple(o for o in chart.render(values, TEMPLATE_NS) if o["kind"] in RBAC_KINDS)


@contextlib.contextmanager
def running_cluster(report: Callable[[str], None] = print) -> Iterator[SharedCluster]:
    """The control plane every scope of a session (or of a bench) shares, until the block ends."""
    dir = Path(tempfile.mkdtemp(prefix="swh-kube-scope-"))  # not under basetemp: nothing left behind
    try:
        rbac = _render_rbac()
        with control_plane(dir) as cp:
            cp.apply(
                [priority_class(name, value, policy, default) for name, value, policy, default in PRIORITY_CLASSES]
            )
            cp.apply([namespace(RUNAI_NAMESPACE, project=False)])
            timings = ", ".join(f"{k} {v:.1f} s" for k, v in cp.timings.items())
            report(f"shared control plane at {cp.url}: ready: {timings}")
            yield SharedCluster(cp, rbac)
    finally:
        shutil.rmtree(dir, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_control_plane(pytestconfig: pytest.Config) -> Iterator[SharedCluster]:
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")

    def report(line: str) -> None:
        if reporter is not None:
            reporter.write_line(f"\n{line}")

    with running_cluster(report) as shared:
        yield shared


async def admin_api_client(cp: ControlPlane) -> ApiClient:
    configuration = Configuration()
    await config.load_kube_config(config_file=str(cp.admin_kubeconfig), client_configuration=configuration)
    return ApiClient(configuration)


@dataclass
class KubeScope:
    """One test's part of the shared cluster. Names: `name(prefix)`; objects: `create`, `put`,
    `get`, `patch`, `delete` (as the cluster's admin); the Runtime's view: `install_ns`,
    `kubeconfig` (the webhook's ServiceAccount, with the chart's RBAC)."""

    cp: ControlPlane
    api: ApiClient  # the cluster's admin
    id: str
    dir: Path
    install_ns: str = ""
    kubeconfig: Path = Path()
    _namespaces: list[str] = field(default_factory=list)
    _others: list[Obj] = field(default_factory=list)  # cluster-scoped or in a shared namespace

    @property
    def service_account_user(self) -> str:
        return f"system:serviceaccount:{self.install_ns}:{SERVICE_ACCOUNT}"

    def name(self, prefix: str) -> str:
        """The test's own name for `prefix`: the same prefix gives the same name within a test."""
        return f"{prefix}-{self.id}"

    # -- REST, as the admin -------------------------------------------------------------------

    async def call(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                   query: list[tuple[str, str]] | None = None) -> Any:  # fmt: skip
        """One request to the apiserver as its admin; an error answer raises ApiException."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        url = self.api.configuration.host + path
        response = await self.api.rest_client.request(method, url, query_params=query or [], headers=headers,
                                                      body=body)  # fmt: skip
        data = response.data
        return json.loads(data) if data else None

    async def create(self, obj: Mapping[str, Any]) -> Obj:
        """Creates `obj` as given (its name is the test's business: use `name`); it goes after the test."""
        created: Obj = await self.call("POST", object_path(obj, named=False), dict(obj))
        self._track(created)
        return created

    async def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        try:
            got: Obj = await self.call("GET", resource_path(api_version, kind, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return got

    async def put(self, obj: Mapping[str, Any]) -> Obj:
        """Creates `obj`, or replaces the stored one with it (whatever its resourceVersion)."""
        meta = obj["metadata"]
        current = await self.get(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        if current is None:
            return await self.create(obj)
        body = copy.deepcopy(dict(obj))
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        replaced: Obj = await self.call("PUT", object_path(obj), body)
        return replaced

    async def patch(self, api_version: str, kind: str, name: str, patch: Mapping[str, Any],
                    namespace: str | None = None, *, subresource: str = "") -> Obj:  # fmt: skip
        """A JSON merge patch of the object (or of its `subresource`, e.g. "status")."""
        path = resource_path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        patched: Obj = await self.call("PATCH", path, dict(patch), content_type="application/merge-patch+json")
        return patched

    async def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        """Deletes the object (in the background for its dependents); one already gone is fine."""
        try:
            await self.call("DELETE", resource_path(api_version, kind, namespace, name),
                            {"propagationPolicy": "Background"})  # fmt: skip
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def list(self, api_version: str, kind: str, namespace: str | None = None,
                   label_selector: str = "") -> list[Obj]:  # fmt: skip
        query = [("labelSelector", label_selector)] if label_selector else []
        listed = await self.call("GET", resource_path(api_version, kind, namespace), query=query)
        return list(listed["items"])

    # -- what tests make ------------------------------------------------------------------------

    async def namespace(self, prefix: str, *, project: bool = True, labels: Mapping[str, str] | None = None,
                        annotations: Mapping[str, str] | None = None) -> str:  # fmt: skip
        """A new namespace named `name(prefix)` (a project unless `project=False`); its name."""
        name = self.name(prefix)
        await self.create(namespace(name, project=project, labels=labels, annotations=annotations))
        return name

    async def settings(self, **flat: Any) -> Obj:
        """The settings ConfigMap of the install namespace, created or replaced (tests.support.cluster's
        `settings_configmap` with these values)."""
        return await self.put(settings_configmap(self.install_ns, **flat))

    async def token(self, service_account: str, namespace: str, seconds: int = 3600) -> str:
        """A TokenRequest token of the ServiceAccount, as the kubelet mounts one."""
        path = resource_path("v1", "ServiceAccount", namespace, service_account) + "/token"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds}}  # fmt: skip
        answer = await self.call("POST", path, body)
        return str(answer["status"]["token"])

    async def user_token(self, prefix: str, namespace: str | None = None) -> tuple[str, str]:
        """A new ServiceAccount (in `namespace`, else the install namespace) and a token of it:
        a caller the apiserver authenticates. Returns (its username, the token)."""
        where = namespace or self.install_ns
        name = self.name(prefix)
        await self.create(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": where}}
        )
        return f"system:serviceaccount:{where}:{name}", await self.token(name, where)

    async def webhook_api_client(self) -> ApiClient:
        """A kubernetes_asyncio ApiClient as the webhook's ServiceAccount (the Runtime's kubeconfig),
        for a test that builds the server's parts itself; the caller closes it."""
        configuration = Configuration()
        await config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
        return ApiClient(configuration)

    async def allow(self, user: str, verb: str, resource: str, namespace: str, group: str = "") -> None:
        """RBAC for `user`: `verb` on `resource` in `namespace` (a Role and its RoleBinding)."""
        who = hashlib.sha256(user.encode()).hexdigest()[:8]  # several users may get the same verb here
        name = self.name(f"allow-{who}-{verb}-{resource}").replace("*", "all")
        rbac = "rbac.authorization.k8s.io/v1"
        meta = {"name": name, "namespace": namespace}
        await self.create({"apiVersion": rbac, "kind": "Role", "metadata": meta,
                           "rules": [{"apiGroups": [group], "resources": [resource], "verbs": [verb]}]})  # fmt: skip
        group_of_rbac = "rbac.authorization.k8s.io"
        await self.create({"apiVersion": rbac, "kind": "RoleBinding", "metadata": meta,
                           "roleRef": {"apiGroup": group_of_rbac, "kind": "Role", "name": name},
                           "subjects": [{"apiGroup": group_of_rbac, "kind": "User", "name": user}]})  # fmt: skip
        # The apiserver's RBAC reads roles from its informers: a call made at once may still be denied.
        attributes = {"verb": verb, "resource": resource, "namespace": namespace, "group": group}
        await eventually(lambda: self._allows({"user": user}, attributes),
                         message=f"RBAC never allowed {user} {attributes}")  # fmt: skip

    async def _allows(self, subject: Obj, attributes: Obj) -> bool:
        """Whether the apiserver's RBAC lets `subject` (a SubjectAccessReview's user and groups) do
        what `attributes` say, now."""
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {**subject, "resourceAttributes": attributes}}  # fmt: skip
        answer = await self.call("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        return bool(answer["status"].get("allowed"))

    async def admin_token(self, prefix: str = "admin") -> tuple[str, str]:
        """A ServiceAccount bound to the cluster's `cluster-admin` ClusterRole, and a token of it."""
        user, token = await self.user_token(prefix)
        rbac = "rbac.authorization.k8s.io"
        await self.create({"apiVersion": f"{rbac}/v1", "kind": "ClusterRoleBinding",
                           "metadata": {"name": self.name(f"{prefix}-cluster-admin")},
                           "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "cluster-admin"},
                           "subjects": [{"apiGroup": rbac, "kind": "User", "name": user}]})  # fmt: skip
        return user, token

    async def runai_admission(self, *, wait: bool = True) -> None:
        """Run:ai's two admission Deployments in its namespace, as Run:ai's install leaves them (run
        by kwok; Available unless `wait=False`): a Runtime with Run:ai on then reports nothing about
        them. Their names are Run:ai's, so they are the test's for its duration and go after it."""
        for obj in runai_admission_objects():
            if obj["kind"] == "Deployment":
                await self.create({k: v for k, v in obj.items() if k != "status"})
        if not wait:
            return

        async def available() -> bool:
            listed = await self.list("apps/v1", "Deployment", RUNAI_NAMESPACE)
            return (
                all(
                    any(
                        c["type"] == "Available" and c["status"] == "True"
                        for c in d.get("status", {}).get("conditions", [])
                    )
                    for d in listed
                )
                and len(listed) >= 2
            )

        await eventually(available, within_s=60, interval_s=0.1, message="Run:ai's admission Deployments Available")

    # -- setup and teardown ---------------------------------------------------------------------

    def _track(self, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        if obj["kind"] == "Namespace":
            self._namespaces.append(meta["name"])
        elif obj["kind"] in CLUSTER_SCOPED or meta.get("namespace") not in self._namespaces:
            self._others.append({"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                                 "metadata": {"name": meta["name"], "namespace": meta.get("namespace")}})  # fmt: skip

    async def _install(self, rbac: tuple[Obj, ...]) -> None:
        """The install namespace with the chart's RBAC re-targeted to it, and the kubeconfig."""
        self.install_ns = await self.namespace("swh", project=False)
        text = yaml.safe_dump_all(list(rbac)).replace(TEMPLATE_NS, self.install_ns)
        objects = [o for o in yaml.safe_load_all(text) if o]
        renamed: dict[str, str] = {}
        for obj in objects:
            meta = obj["metadata"]
            if obj["kind"] in CLUSTER_SCOPED or meta.get("namespace") != self.install_ns:
                renamed[meta["name"]] = meta["name"] = f"{meta['name']}.{self.id}"
        for obj in objects:
            ref = obj.get("roleRef") or {}
            if ref.get("name") in renamed:
                ref["name"] = renamed[ref["name"]]
            spec = obj.get("spec") or {}
            if spec.get("policyName") in renamed:
                spec["policyName"] = renamed[spec["policyName"]]
        # At once: a binding may name a role or a ServiceAccount that does not exist yet.
        await asyncio.gather(*(self.create(obj) for obj in objects))
        await self._wait_authorized()
        token = await self.token(SERVICE_ACCOUNT, self.install_ns)
        self.kubeconfig = self.cp.token_kubeconfig(self.dir / "kubeconfig", token)

    async def _wait_authorized(self) -> None:
        """Until the apiserver's RBAC has caught up with the new bindings (its informers take a moment)."""

        account = {"user": self.service_account_user,
                   "groups": ["system:serviceaccounts", f"system:serviceaccounts:{self.install_ns}",
                              "system:authenticated"]}  # fmt: skip
        checks = [{"verb": "watch", "resource": "namespaces"},
                  {"verb": "watch", "resource": "configmaps", "namespace": self.install_ns},
                  {"verb": "create", "resource": "events", "namespace": "default"}]  # fmt: skip
        await asyncio.gather(
            *(eventually(lambda a=a: self._allows(account, a), message=f"RBAC never allowed {a}") for a in checks)  # type: ignore[misc]
        )

    async def _cleanup(self) -> None:
        """Everything the test made goes; its namespaces first become plain ones (see the module doc)."""

        async def plain_and_deleted(name: str) -> None:
            current = await self.get("v1", "Namespace", name)
            if current is None:
                return  # the test deleted it already
            # Every label but the name, every annotation and every finalizer go: nothing is left
            # that a later test's Runtime would take for a project, a binding or a record to keep.
            meta = current["metadata"]
            plain = {"metadata": {"labels": {k: None for k in meta.get("labels") or {} if k != NAME_LABEL},
                                  "annotations": {k: None for k in meta.get("annotations") or {}},
                                  "finalizers": None}}  # fmt: skip
            try:
                await self.patch("v1", "Namespace", name, plain)
            except ApiException as exc:
                if exc.status != 404:
                    raise
            # Pods first, at once (grace period 0): the namespace controller would give each its
            # grace period, and a later test must not count their GPUs.
            await self.call("DELETE", resource_path("v1", "Pod", name), {"gracePeriodSeconds": 0})
            await self.delete("v1", "Namespace", name)

        await asyncio.gather(*(plain_and_deleted(name) for name in self._namespaces))
        await asyncio.gather(
            *(self.delete(o["apiVersion"], o["kind"], o["metadata"]["name"], o["metadata"].get("namespace"))
              for o in self._others)
        )  # fmt: skip

        async def no_pods_left() -> bool:
            for name in self._namespaces:
                if await self.list("v1", "Pod", name):
                    return False
            return True

        left = f"pods of {self._namespaces} still there {TEARDOWN_WITHIN_S:.0f} s after their deletion"
        await eventually(no_pods_left, within_s=TEARDOWN_WITHIN_S, interval_s=0.2, message=left)


@contextlib.asynccontextmanager
async def scope_on(shared: SharedCluster, dir: Path) -> AsyncIterator[KubeScope]:
    """A KubeScope of the shared cluster for as long as the block runs (what `kube_scope` gives a
    test; a parametrized fixture that needs a scope for some params only opens one itself)."""
    api = await admin_api_client(shared.cp)
    scope = KubeScope(shared.cp, api, uuid.uuid4().hex[:6], dir)
    await asyncio.to_thread(dir.mkdir, parents=True, exist_ok=True)
    try:
        await scope._install(shared.rbac)
        yield scope
    finally:
        try:
            await scope._cleanup()
        finally:
            await api.close()


@pytest.fixture
async def kube_scope(shared_control_plane: SharedCluster, tmp_path: Path) -> AsyncIterator[KubeScope]:
    async with scope_on(shared_control_plane, tmp_path / "kube-scope") as scope:
        yield scope
