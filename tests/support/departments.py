"""The department tests' environment: a KubeScope of the shared real control plane, the Run:ai
stand-in (departments default, ml and research) and the clients a DepartmentMover uses, acting as
the webhook's ServiceAccount with the chart's RBAC. Used by tests/test_departments.py and by the
modules that serve the mover (tests/test_admin_api.py, tests/test_console.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient

from tests.support.cluster import namespace as namespace_obj
from tests.support.cluster import settings_configmap
from tests.support.kube_scope import KubeScope
from tests.support.runai_standin import RunaiStandin
from webhook.kube.api import KubeApi
from webhook.runai import ClientOptions, RunaiClient, SecretFile
from webhook.runai.departments import MOVE_ANNOTATION, DepartmentMover
from webhook.snapshot import DEPARTMENT_LABEL, RUNAI_PROJECT_ID_LABEL, RUNAI_QUEUE_LABEL
from webhook.state.store import ClusterState

SECRET = "standin-client-secret"
FAST = ClientOptions(timeout_s=1.0, connect_timeout_s=0.5, retries=1, backoff_s=0.01, backoff_max_s=0.05, deadline_s=4)


@dataclass
class Env:
    scope: KubeScope
    runai: RunaiStandin
    api: ApiClient  # the webhook's ServiceAccount
    kapi: KubeApi
    client: RunaiClient
    state: ClusterState

    def name(self, prefix: str) -> str:
        """The test's own namespace name for `prefix` (the Run:ai project takes the same name)."""
        return self.scope.name(prefix)

    def mover(self, **kwargs: Any) -> DepartmentMover:
        kwargs.setdefault("instance", "replica-1")
        kwargs.setdefault("delete_wait_s", 3.0)
        return DepartmentMover(self.kapi, self.client, self.state, **kwargs)

    async def project_ns(
        self,
        name: str,
        *,
        department: str | None = None,
        runai_department: str = "default",
        bound: bool = True,
        created_here: bool = True,
        gpu_quota: float = 2,
    ) -> dict[str, Any] | None:
        """A project namespace and (when bound) its Run:ai project."""
        labels: dict[str, str] = {}
        if department:
            labels[DEPARTMENT_LABEL] = department
        project = None
        if bound:
            project = self.runai.add_project(name, department=runai_department, namespace=name, gpu_quota=gpu_quota)
            labels[RUNAI_QUEUE_LABEL] = name
            if created_here:
                labels[RUNAI_PROJECT_ID_LABEL] = project["id"]
        await self.scope.create(namespace_obj(name, labels=labels))
        return project

    def pod(self, namespace: str, name: str, phase: str) -> None:
        # The mover reads pods from the watch-fed cache, as admission does.
        self.state.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
                "status": {"phase": phase},
            }
        )

    async def ns(self, name: str) -> dict[str, Any]:
        obj = await self.scope.get("v1", "Namespace", name)
        assert obj is not None
        return obj

    async def labels(self, name: str) -> dict[str, str]:
        return dict((await self.ns(name))["metadata"].get("labels") or {})

    async def intent(self, name: str) -> dict[str, Any] | None:
        raw = ((await self.ns(name))["metadata"].get("annotations") or {}).get(MOVE_ANNOTATION)
        return json.loads(raw) if raw else None

    def runai_department_of(self, project: dict[str, Any]) -> str:
        return str(self.runai.departments[project["parentId"]]["name"])

    def runai_writes(self) -> list[tuple[str, str]]:
        return [
            (r.method, r.path) for r in self.runai.requests if r.method in ("POST", "DELETE") and "org-unit" in r.path
        ]

    async def events(self, reason: str) -> list[dict[str, Any]]:
        """Events of `reason` about this test's namespaces (their names end with the scope's id)."""
        own = self.name("")
        return [
            e
            for e in await self.scope.list("v1", "Event", "default")
            if e.get("reason") == reason and str(e["involvedObject"].get("name", "")).endswith(own)
        ]


@contextlib.asynccontextmanager
async def environment(tmp_path: Path, scope: KubeScope, api: ApiClient | None = None) -> AsyncIterator[Env]:
    """The stand-in (departments default, ml, research) and clients of it and of the scope's
    cluster (`api`: another way to the apiserver, e.g. through a fault proxy)."""
    secret_dir = tmp_path / "runai-secret"
    secret_dir.mkdir()
    (secret_dir / "clientSecret").write_text(SECRET)
    async with RunaiStandin(client_secret=SECRET) as runai:
        runai.add_department("ml")
        runai.add_department("research")
        api = api or await scope.webhook_api_client()
        client = RunaiClient(runai.url, runai.client_id, SecretFile(secret_dir, "clientSecret"), options=FAST)
        state = ClusterState(scope.install_ns)
        state.apply(settings_configmap(scope.install_ns, run_ai_enable=True))
        try:
            yield Env(scope, runai, api, KubeApi(api, scope.install_ns), client, state)
        finally:
            await client.close()
            await api.close()
        assert not runai.violations, "\n\n".join(str(v) for v in runai.violations)
