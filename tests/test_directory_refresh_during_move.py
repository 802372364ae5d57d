"""A directory refresh that lists Run:ai's projects before a department move and publishes after it
must not bring the replaced project back for the moved namespace (the replica would count against
its quota again until the next refresh). The move is done by hand, as another replica would: the
old project goes, one without quota takes its place in another department, and the namespace is
relabelled with the new id while the refresh's page of projects is held back by the stand-in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.cluster import settings_configmap
from tests.support.https import wait_until
from tests.support.kube_scope import KubeScope
from tests.support.reviews import pod_review
from tests.support.runai_standin import RunaiStandin
from tests.support.runtime import apiserver_session, base_url, start_runtime
from webhook.runtime import Runtime, ServeOptions

SECRET = "refresh-during-move-secret"
ID_LABEL = "hopsworks.ai/runai-project-id"
PROJECTS = "/api/v1/org-unit/projects"


async def review(options: ServeOptions, session: aiohttp.ClientSession, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(f"{base_url(options)}/validate/pods", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return dict((await resp.json())["response"])


@pytest.fixture
async def runai(kube_scope: KubeScope) -> AsyncIterator[RunaiStandin]:
    async with RunaiStandin(client_secret=SECRET) as runai:
        await kube_scope.put(
            settings_configmap(
                kube_scope.install_ns,
                run_ai_enable=True,
                run_ai_url=runai.url,
                run_ai_client_id=runai.client_id,
                run_ai_client_secret_name="runai-hopsworks",
                run_ai_client_secret_key="clientSecret",
                run_ai_project_gpu_quota=1,
                run_ai_reconcile_interval_s=300,
                run_ai_directory_refresh_s=600,  # only the refresh this test starts
            )
        )
        yield runai
        assert runai.violations == [], runai.violations


async def test_a_refresh_listed_before_a_move_does_not_publish_the_replaced_project(
    kube_scope: KubeScope, runai: RunaiStandin, tmp_path: Path
) -> None:
    secret_dir = tmp_path / "runai-secret"
    secret_dir.mkdir()
    (secret_dir / "clientSecret").write_text(SECRET)
    runtime: Runtime
    runtime, options, certs = await start_runtime(tmp_path / "a", kube_scope, runai_secret_dir=secret_dir)
    session = apiserver_session(certs)
    try:
        assert runtime.runai is not None
        directory = runtime.runai.directory
        vision = await kube_scope.namespace("vision")
        await wait_until(
            lambda: (ns := runtime.state.namespaces.get(vision)) is not None and ns.runai_project_id is not None,
            within=15,
            what="vision bound (1 deserved GPU) and seen by the replica",
        )
        old = runai.project(vision)
        assert old is not None and old["id"] == runtime.state.namespaces[vision].runai_project_id

        # A refresh lists the projects while `vision` is still on the old one; its page is held.
        hold = runai.hold_next("GET", PROJECTS, query=lambda q: "name==" not in q.get("filterBy", ""))
        refresh = asyncio.create_task(directory.refresh_now())
        await asyncio.wait_for(hold.answered.wait(), 10)

        # Meanwhile the move: the old project goes, one without quota in `ml` replaces it.
        del runai.projects[old["id"]]
        runai.add_department("ml")
        new = runai.add_project(vision, department="ml", namespace=vision, gpu_quota=0)
        await kube_scope.patch("v1", "Namespace", vision, {"metadata": {"labels": {ID_LABEL: new["id"]}}})
        await wait_until(
            lambda: runtime.state.namespaces[vision].runai_project_id == new["id"],
            within=10,
            what="the replica's namespace cache shows the new project id",
        )

        hold.release()
        assert await asyncio.wait_for(refresh, 10)
        published = (runtime.state.snapshot().runai_projects or {}).get(vision)
        assert published is None or published.id == new["id"], f"the replaced project is published: {published}"
        # The leader's drift check reads the refreshed list too: not the old project's department.
        listed = directory.project_for_namespace(vision)
        assert listed is None or listed.id == new["id"], f"the replaced project is listed for vision: {listed}"

        answer = await review(
            options,
            session,
            pod_review(vision, labels={"jupyter": "true", "runai/queue": vision}, gpus=1, uid="nb-1"),
        )
        assert answer["allowed"] is False, f"admitted on the replaced project's quota: {answer}"
        assert f"project {vision} has 0 of 0 deserved GPUs left" in answer["status"]["message"], answer
    finally:
        await session.close()
        await runtime.shutdown()
