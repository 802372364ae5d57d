"""The department tests' environment on the Kubernetes emulator, for the one module that still
builds on it (tests/test_console_sessions.py); the others use tests/support/departments.py."""

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
from tests.support.kube_emulator import KubeEmulator
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
    kube: KubeEmulator
    runai: RunaiStandin
    api: ApiClient
    kapi: KubeApi
    client: RunaiClient
    state: ClusterState

    def mover(self, **kwargs: Any) -> DepartmentMover:
        kwargs.setdefault("instance", "replica-1")
        kwargs.setdefault("delete_wait_s", 3.0)
        return DepartmentMover(self.kapi, self.client, self.state, **kwargs)

    def project_ns(
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
        self.kube.create_object(namespace_obj(name, labels=labels))
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

    def ns(self, name: str) -> dict[str, Any]:
        obj = self.kube.get_object("Namespace", name)
        assert obj is not None
        return obj

    def labels(self, name: str) -> dict[str, str]:
        return self.ns(name)["metadata"].get("labels") or {}

    def intent(self, name: str) -> dict[str, Any] | None:
        raw = (self.ns(name)["metadata"].get("annotations") or {}).get(MOVE_ANNOTATION)
        return json.loads(raw) if raw else None

    def runai_department_of(self, project: dict[str, Any]) -> str:
        return self.runai.departments[project["parentId"]]["name"]

    def runai_writes(self) -> list[tuple[str, str]]:
        return [
            (r.method, r.path) for r in self.runai.requests if r.method in ("POST", "DELETE") and "org-unit" in r.path
        ]

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.kube.objects("Event") if e.get("reason") == reason]


@contextlib.asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[Env]:
    """The emulator, the stand-in (departments default, ml, research) and clients over HTTP."""
    secret_dir = tmp_path / "runai-secret"
    secret_dir.mkdir()
    (secret_dir / "clientSecret").write_text(SECRET)
    async with KubeEmulator() as kube, RunaiStandin(client_secret=SECRET) as runai:
        runai.add_department("ml")
        runai.add_department("research")
        kube.create_object(namespace_obj("hopsworks", project=False))
        api = kube.api_client()
        client = RunaiClient(runai.url, runai.client_id, SecretFile(secret_dir, "clientSecret"), options=FAST)
        state = ClusterState("hopsworks")
        state.apply(settings_configmap(run_ai_enable=True))
        try:
            yield Env(kube, runai, api, KubeApi(api, "hopsworks"), client, state)
        finally:
            await client.close()
            await api.close()
        assert not runai.violations, "\n\n".join(str(v) for v in runai.violations)
