"""Deleting a project namespace on the real cluster: the namespace controller empties it, our
finalizer (scheduling.hopsworks.ai/runai-project, put on by the binding) holds it until the
leader has dealt with the Run:ai project, then the namespace goes.

- a Run:ai project this system created is deleted in Run:ai first (and while Run:ai refuses, the
  namespace waits, Terminating);
- an adopted one is left in place (the binding put no finalizer on it);
- with Run:ai off nothing is held up: what was ours in Run:ai is written down in
  runai-projects-left, and deleted by the leader once Run:ai is on again;
- a namespace an installer took the project label off still goes: the finalizer is ours to
  remove whatever labels are left, and Run:ai's delete is called once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.e2e.conftest import Cluster, Obj
from tests.e2e.runai_steps import FINALIZER, PROJECT_ID_LABEL, in_standin, namespace_meta, wait_bound
from tests.e2e.test_first_pod import deployment
from tests.e2e.test_kubectl import turn_runai_on
from tests.support.control_plane.install import INSTALL_NS, SERVICE_ACCOUNT_USER, Install

pytestmark = pytest.mark.slow
LEFT = "runai-projects-left"


async def gone(cluster: Cluster, name: str) -> bool:
    result = await cluster.kubectl("get", "namespace", name)
    return result.rc != 0 and "NotFound" in result.stderr


async def events(cluster: Cluster, namespace: str, reason: str) -> list[Obj]:
    # Events about a Namespace (cluster-scoped) live in `default`.
    selector = f"involvedObject.kind=Namespace,involvedObject.name={namespace},reason={reason}"
    out = await cluster.ok("get", "events", "-n", "default", "--field-selector", selector, "-o", "json")
    return list(json.loads(out)["items"])


def deletes(local: Install, project_id: str) -> list[Any]:
    return in_standin(local, lambda: local.runai.calls("DELETE", f"/api/v1/org-unit/projects/{project_id}"))


async def test_a_project_this_system_created_is_deleted_in_runai_before_the_namespace_goes(cluster: Cluster) -> None:
    local = cluster.needs_local("needs the Run:ai stand-in")
    await turn_runai_on(cluster)
    project = await cluster.project("doomed")
    meta = await wait_bound(cluster, project)
    created = in_standin(local, lambda: local.runai.project(project))
    assert created is not None and meta["labels"][PROJECT_ID_LABEL] == created["id"]
    # Something for the namespace controller to delete: a Deployment, its ReplicaSet and pod.
    await cluster.apply(deployment("web", project, "deployment"))
    await cluster.eventually(lambda: cluster.list("pods", project, "-l", "app=web"), "the pod of Deployment web", 60)

    # Run:ai refuses the delete for now: the namespace is emptied but stays, Terminating, with our finalizer.
    in_standin(local, lambda: local.runai.fail_when(lambda method, path, body: method == "DELETE", 503))
    try:
        await cluster.ok("delete", "namespace", project, "--wait=false")
        await cluster.eventually(lambda: deletes(local, created["id"]), "the leader asks Run:ai to delete", 30)
        await cluster.eventually(lambda: _emptied(cluster, project), f"{project} emptied by its controller", 60)
        meta = await namespace_meta(cluster, project)
        assert meta.get("deletionTimestamp") and FINALIZER in meta["finalizers"], meta
        assert in_standin(local, lambda: local.runai.project(project)) is not None
    finally:
        in_standin(local, local.runai.clear_faults)
    await cluster.eventually(lambda: gone(cluster, project), f"{project} gone", 90)
    assert in_standin(local, lambda: local.runai.project(project)) is None
    assert [c.status for c in deletes(local, created["id"])][-1] in (200, 202, 204)
    await cluster.eventually(lambda: events(cluster, project, "RunaiProjectDeleted"), "the deleted Event", 10)


async def test_a_namespace_an_installer_took_the_project_label_off_still_goes_and_its_project_is_deleted_once(
    cluster: Cluster,
) -> None:
    local = cluster.needs_local("needs the Run:ai stand-in")
    await turn_runai_on(cluster)
    # Passes every second: a Run:ai delete repeated by the passes would show in the count below.
    await cluster.settings(run_ai_reconcile_interval_s="1")
    project = await cluster.project("unlabelled")
    await wait_bound(cluster, project)
    created = in_standin(local, lambda: local.runai.project(project))
    assert created is not None
    # The admin is in system:masters, one of the install's installer identities: allowed, with a warning.
    await cluster.ok("label", "namespace", project, "hopsworks.ai/project-")
    meta = await namespace_meta(cluster, project)
    assert "hopsworks.ai/project" not in meta["labels"] and FINALIZER in meta["finalizers"], meta

    await cluster.ok("delete", "namespace", project, "--wait=false")
    await cluster.eventually(lambda: gone(cluster, project), f"{project} gone", 60)
    assert in_standin(local, lambda: local.runai.project(project)) is None
    assert [c.status for c in deletes(local, created["id"])] in ([200], [202], [204])
    await cluster.eventually(lambda: events(cluster, project, "RunaiProjectDeleted"), "the deleted Event", 10)


async def _emptied(cluster: Cluster, namespace: str) -> bool:
    out = await cluster.kubectl("get", "deployments,replicasets,pods", "-n", namespace, "-o", "name")
    return out.rc == 0 and out.stdout.strip() == ""


async def test_an_adopted_project_is_left_in_runai(cluster: Cluster) -> None:
    local = cluster.needs_local("needs the Run:ai stand-in")
    await turn_runai_on(cluster)
    name = await cluster.plain_namespace("shared")  # made a project below, once Run:ai knows it
    adopted = in_standin(local, lambda: local.runai.add_project(f"{name}-queue", namespace=name))
    await cluster.ok("label", "namespace", name, f"hopsworks.ai/project={name}")
    meta = await wait_bound(cluster, name, created=False)
    # Adopted: labelled with its queue only; no project id and no finalizer, nothing to hold it.
    assert meta["labels"]["runai/queue"] == f"{name}-queue" and PROJECT_ID_LABEL not in meta["labels"], meta
    assert FINALIZER not in (meta.get("finalizers") or ()), meta
    await cluster.ok("delete", "namespace", name, "--wait=false")
    await cluster.eventually(lambda: gone(cluster, name), f"{name} gone", 60)
    assert in_standin(local, lambda: adopted["id"] in local.runai.projects)
    assert deletes(local, adopted["id"]) == []


async def test_with_runai_off_nothing_is_held_up_and_what_was_left_is_deleted_once_it_is_on(cluster: Cluster) -> None:
    local = cluster.needs_local("needs the Run:ai stand-in")
    audit = local.cp.audit
    since = audit.mark()
    # Never bound: Run:ai is off (the fixture's settings), so the namespace has no finalizer at all.
    never = await cluster.project("plain")
    assert "finalizers" not in await namespace_meta(cluster, never)
    await cluster.ok("delete", "namespace", never, "--wait=false")
    await cluster.eventually(lambda: gone(cluster, never), f"{never} gone", 30)

    # Bound while on, deleted while off: no Run:ai call, the namespace goes, the project is recorded.
    await turn_runai_on(cluster)
    project = await cluster.project("left")
    await wait_bound(cluster, project)
    created = in_standin(local, lambda: local.runai.project(project))
    assert created is not None
    await cluster.settings(run_ai_enable="false")
    await asyncio.sleep(3)  # both replicas' settings watches have the change (setup, not an assertion)
    calls = in_standin(local, lambda: len(local.runai.requests))
    await cluster.ok("delete", "namespace", project, "--wait=false")
    await cluster.eventually(lambda: gone(cluster, project), f"{project} gone", 30)
    assert in_standin(local, lambda: len(local.runai.requests)) == calls, "a Run:ai call while off"
    left = json.loads((await cluster.get("configmap", LEFT, INSTALL_NS))["data"][project])
    assert left["runaiProjectId"] == created["id"], left
    await cluster.eventually(lambda: events(cluster, project, "RunaiProjectLeft"), "the left Event", 10)

    # On again (a short pass interval): the leader deletes the project left behind and the record.
    await cluster.settings(run_ai_reconcile_interval_s="1")
    await turn_runai_on(cluster)
    await cluster.eventually(lambda: in_standin(local, lambda: local.runai.project(project)) is None,
                             "the left project deleted in Run:ai", 60)  # fmt: skip
    await cluster.eventually(lambda: _not_recorded(cluster, project), "the record dropped", 30)
    # The record's writes (create or update, then update) passed the ConfigMap policy.
    written = [e for e in audit.events(since, user=SERVICE_ACCOUNT_USER) if e.name == LEFT and e.is_write]
    assert written and all(e.code < 400 for e in written), [str(e) for e in written]


async def _not_recorded(cluster: Cluster, project: str) -> bool:
    data = (await cluster.get("configmap", LEFT, INSTALL_NS)).get("data") or {}
    return project not in data
