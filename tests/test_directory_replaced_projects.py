"""A replica's Run:ai directory stops publishing a project the moment its namespace names another
one (a department move on another replica replaced it), and neither a refresh nor a lookup of one
namespace publishes it again (`core.runai_bindings`); the end-to-end cases are
tests/e2e/test_two_replicas.py (two replicas, the real apiserver) and
tests/test_directory_refresh_during_move.py (a refresh across a move). The lookups here ask the
spec-checked Run:ai stand-in through the real RunaiClient."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.cluster import cluster_state, namespace
from tests.support.runai_standin import RunaiStandin
from webhook.core.runai_bindings import projects_by_namespace
from webhook.core.runai_data import RunaiProject
from webhook.runai import ClientOptions, RunaiClient, SecretFile
from webhook.runai.directory import RunaiDirectory
from webhook.snapshot import NamespaceInfo, RunaiProjectInfo
from webhook.state.store import ClusterState

ID_LABEL = "hopsworks.ai/runai-project-id"
PROJECTS = "/api/v1/org-unit/projects"
FAST = ClientOptions(timeout_s=1.0, connect_timeout_s=0.5, retries=1, backoff_s=0.02, backoff_max_s=0.05, deadline_s=3)


@pytest.mark.parametrize(
    ("labels", "kept"),
    [
        ({"runai/queue": "p1", ID_LABEL: "old"}, True),  # the published project: kept
        ({"runai/queue": "p1"}, True),  # no id (adopted): nothing to compare, kept
        ({"runai/queue": "p1", ID_LABEL: "new"}, False),  # replaced by a move: dropped
    ],
    ids=["same-id", "no-id", "another-id"],
)
def test_a_namespace_naming_another_project_drops_the_published_one(labels: dict[str, str], kept: bool) -> None:
    state = ClusterState()
    directory = RunaiDirectory(state, lambda: None, interval_s=60)  # Run:ai off: nothing is called
    state.snapshot().runai_projects = {
        "p1": RunaiProjectInfo(id="old", name="p1", namespace="p1", deserved_gpus=2),
        "p2": RunaiProjectInfo(id="other", name="p2", namespace="p2", deserved_gpus=1),
    }
    state.apply(namespace("p1", labels=labels))
    directory.follow_namespace("p1")
    published = state.snapshot().runai_projects or {}
    assert ("p1" in published) is kept
    assert published["p2"].id == "other"  # other namespaces' records are untouched


def project(project_id: str, name: str = "p1", bound: str | None = "p1") -> RunaiProject:
    return RunaiProject(id=project_id, name=name, gpu_quota=1, requested_namespace=bound, namespace=bound)


@pytest.mark.parametrize(
    ("labels", "listed", "published"),
    [
        ({"runai/queue": "p1", ID_LABEL: "old"}, [project("old")], "old"),
        ({"runai/queue": "p1"}, [project("old")], "old"),  # adopted by name: no id to compare
        # Listed before a move, published after it: the replaced project is not brought back.
        ({"runai/queue": "p1", ID_LABEL: "new"}, [project("old")], None),
        ({"runai/queue": "p1", ID_LABEL: "new"}, [project("old"), project("new")], "new"),
        ({"runai/queue": "p1", ID_LABEL: "new"}, [project("new"), project("old")], "new"),
        # Not named by the queue label, only bound to the namespace: the same veto.
        ({"runai/queue": "other", ID_LABEL: "new"}, [project("old")], None),
        ({"runai/queue": "other", ID_LABEL: "new"}, [project("old"), project("new")], "new"),
    ],
    ids=["same-id", "no-id", "replaced", "replaced-then-new", "new-then-replaced", "bound-replaced", "bound-new"],
)
def test_a_refresh_publishes_no_project_the_namespace_no_longer_names(
    labels: dict[str, str], listed: list[RunaiProject], published: str | None
) -> None:
    namespaces = {"p1": NamespaceInfo("p1", labels=labels)}
    chosen = projects_by_namespace(namespaces, listed)
    assert (chosen["p1"].id if "p1" in chosen else None) == published


def test_a_namespace_the_cache_does_not_have_keeps_the_project_bound_to_it() -> None:
    chosen = projects_by_namespace({}, [project("old", bound="gone-from-cache")])
    assert chosen["gone-from-cache"].id == "old"


@pytest.fixture
async def runai_client(tmp_path: Path) -> AsyncIterator[tuple[RunaiStandin, RunaiClient]]:
    secret = tmp_path / "runai-secret"
    secret.mkdir()
    (secret / "clientSecret").write_text("standin-client-secret")
    async with (
        RunaiStandin() as runai,
        RunaiClient(runai.url, runai.client_id, SecretFile(secret, "clientSecret"), options=FAST) as client,
    ):
        yield runai, client
    assert not runai.violations, "\n\n".join(str(v) for v in runai.violations)


def vision(project_id: str) -> dict[str, object]:
    return namespace("vision", labels={"runai/queue": "vision", ID_LABEL: project_id})


async def test_a_lookup_answered_across_a_move_does_not_publish_the_replaced_project(
    runai_client: tuple[RunaiStandin, RunaiClient],
) -> None:
    # `vision` was bound after this replica's last refresh: admission looks its project up. The
    # answer is read before a move on another replica and arrives after it; the replica published
    # the replaced project (1 deserved GPU) and counted against it until the next refresh.
    runai, client = runai_client
    old = runai.add_project("vision", namespace="vision", gpu_quota=1)
    state = cluster_state(namespaces=[vision(old["id"])], run_ai_enable=True)
    directory = RunaiDirectory(state, lambda: client, interval_s=600)
    hold = runai.hold_next("GET", PROJECTS, query=lambda q: "name==vision" in q.get("filterBy", ""))
    lookup = asyncio.create_task(directory.lookup("vision", timeout_s=5))
    await asyncio.wait_for(hold.answered.wait(), 5)

    # The move: the old project goes, one without quota in `ml` replaces it, the namespace names it.
    del runai.projects[old["id"]]
    runai.add_department("ml")
    new = runai.add_project("vision", department="ml", namespace="vision", gpu_quota=0)
    state.apply(vision(new["id"]))
    directory.follow_namespace("vision")  # as the namespace watch does

    hold.release()
    await asyncio.wait_for(lookup, 5)
    published = (state.snapshot().runai_projects or {}).get("vision")
    assert published is None or published.id == new["id"], f"the replaced project is published: {published}"
    await directory.lookup("vision", timeout_s=5)  # admission's next try: the project the namespace names
    published = (state.snapshot().runai_projects or {}).get("vision")
    assert published is not None and (published.id, published.deserved_gpus) == (new["id"], 0), published


async def test_a_lookup_that_finds_two_projects_of_the_name_takes_the_one_the_namespace_names(
    runai_client: tuple[RunaiStandin, RunaiClient],
) -> None:
    # A move replaced the project; Run:ai still lists the old one (deleting) before the new one,
    # both bound to the namespace. The lookup took the first listed: the replaced one.
    runai, client = runai_client
    runai.add_department("ml")
    runai.add_project("vision", namespace="vision", gpu_quota=1, phase="Deleting")
    new = runai.add_project("vision", department="ml", namespace="vision", gpu_quota=0)
    state = cluster_state(namespaces=[vision(new["id"])], run_ai_enable=True)
    directory = RunaiDirectory(state, lambda: client, interval_s=600)
    await directory.lookup("vision", timeout_s=5)
    published = (state.snapshot().runai_projects or {}).get("vision")
    assert published is not None and published.id == new["id"], published
