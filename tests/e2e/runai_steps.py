"""Steps of a Run:ai project's life on the real cluster, shared by the e2e tests that walk it:
bound by the leader, GPU pods admitted, moved to another department by an admin, deleted."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp
import yaml

from tests.e2e.conftest import Cluster, Obj, Result
from tests.e2e.test_kubectl import as_a_controller, pod
from tests.support.control_plane.install import ADMISSION_PORT, Install

T = TypeVar("T")
FINALIZER = "scheduling.hopsworks.ai/runai-project"
DEPARTMENT_LABEL = "hopsworks.ai/department"
PROJECT_ID_LABEL = "hopsworks.ai/runai-project-id"


def in_standin(local: Install, fn: Callable[[], T]) -> T:
    """Run `fn` on the Run:ai stand-in's own loop (it serves from another thread)."""

    async def call() -> T:
        return fn()

    return local.background.run(call())


async def ensure_department(cluster: Cluster, local: Install, name: str) -> None:
    """A Run:ai department, known to both replicas' directories (refreshed every second meanwhile)."""
    await cluster.settings(run_ai_directory_refresh_s="1")
    in_standin(local, lambda: local.runai.department(name) or local.runai.add_department(name))
    await asyncio.sleep(3)  # a refresh on both replicas (setup, not an assertion)


async def admin_token(cluster: Cluster) -> str:
    """A platform admin: a ServiceAccount bound to cluster-admin, with a TokenRequest token."""
    admins = await cluster.plain_namespace("admins")
    await cluster.ok("create", "serviceaccount", "platform-admin", "-n", admins)
    await cluster.ok("create", "clusterrolebinding", f"{admins}-admin", "--clusterrole=cluster-admin",
                     f"--serviceaccount={admins}:platform-admin")  # fmt: skip
    return (await cluster.ok("create", "token", "platform-admin", "-n", admins)).strip()


async def namespace_meta(cluster: Cluster, name: str) -> Obj:
    return dict((await cluster.get("namespace", name))["metadata"])


async def wait_bound(cluster: Cluster, project: str, within_s: float = 30, *, created: bool = True) -> Obj:
    """The leader's pass binds a new project: runai/queue, and when it created the Run:ai project,
    the project id and our finalizer (an adopted project gets the label only)."""

    async def bound() -> Obj | None:
        meta = await namespace_meta(cluster, project)
        labels = meta.get("labels") or {}
        ours = FINALIZER in (meta.get("finalizers") or ())
        return meta if "runai/queue" in labels and (ours or not created) else None

    return dict(await cluster.eventually(bound, f"{project} bound to Run:ai", within_s))


def gpu_notebook(name: str, namespace: str, gpus: int = 1) -> Obj:
    notebook = pod(name, namespace)
    notebook["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return notebook


async def create_pod(cluster: Cluster, obj: Obj, *extra: str) -> Result:
    """kubectl create, again after a retryable refusal while the binding settles or a replica looks
    the project up, as a controller would retry."""
    deadline = time.monotonic() + 30
    while True:
        result, _ = await as_a_controller(cluster, "create", *extra, "-f", "-", stdin=yaml.safe_dump(obj))
        if result.rc == 0 or "try again" not in result.stderr or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.5)


async def call_server(local: Install, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
    """An HTTPS call to the install's Service, as a user of its APIs makes it (either replica answers)."""
    ctx = ssl.create_default_context(cafile=str(local.dir / "ca.crt"))
    ctx.check_hostname = False  # the certificate names the Service, not its address
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session:
        url = f"https://{local.service_ip}:443{path}"
        async with session.request(method, url, ssl=ctx, json=body, headers=headers) as r:
            return r.status, json.loads(await r.text() or "null")


async def review_pod(local: Install, path: str, pod: Obj, *, dry_run: bool = True) -> Obj:
    """One AdmissionReview of creating `pod`, as the apiserver sends it (to the admission port, with
    the apiserver's client certificate), on a connection of its own: the kernel spreads new
    connections over the replicas listening on the Service's address."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "namespace": pod["metadata"]["namespace"], "name": pod["metadata"]["name"], "object": pod,
        "dryRun": dry_run, "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
    }}  # fmt: skip
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"https://{local.service_ip}:{ADMISSION_PORT}{path}", ssl=local.admission_ssl(), json=review) as r,
    ):
        status, answer = r.status, json.loads(await r.text() or "null")
    assert status == 200, (status, answer)
    return dict(answer["response"])


async def move(local: Install, token: str, project: str, department: str | None, within_s: float = 40) -> Any:
    """POST the admin API's move, again while it answers busy (the replicas' caches still show the
    pods that were just deleted)."""
    deadline = time.monotonic() + within_s
    while True:
        status, answer = await call_server(local, "POST", f"/api/v1/admin/projects/{project}/move", token,
                                           {"department": department})  # fmt: skip
        if status != 409 or time.monotonic() > deadline:
            assert status == 200, (status, answer)
            return answer
        await asyncio.sleep(1)


async def delete_pods(cluster: Cluster, namespace: str) -> None:
    await cluster.ok("delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=60s")
