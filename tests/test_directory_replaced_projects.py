"""A replica's Run:ai directory stops publishing a project the moment its namespace names another
one (a department move on another replica replaced it); the end-to-end case, through the real
apiserver with two replicas, is tests/e2e/test_two_replicas.py."""

from __future__ import annotations

import pytest

from tests.support.cluster import namespace
from webhook.runai.directory import RunaiDirectory
from webhook.snapshot import RunaiProjectInfo
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
