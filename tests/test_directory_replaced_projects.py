"""A replica's Run:ai directory stops publishing a project the moment its namespace names another
one (a department move on another replica replaced it), and a refresh does not publish it again
(`core.runai_bindings`); the end-to-end cases are tests/e2e/test_two_replicas.py (two replicas,
the real apiserver) and tests/test_directory_refresh_during_move.py (a refresh across a move)."""

from __future__ import annotations

import pytest

from tests.support.cluster import namespace
from webhook.core.runai_bindings import projects_by_namespace
from webhook.core.runai_data import RunaiProject
from webhook.runai.directory import RunaiDirectory
from webhook.snapshot import NamespaceInfo, RunaiProjectInfo
from webhook.state.store import ClusterState

ID_LABEL = "hopsworks.ai/runai-project-id"


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
