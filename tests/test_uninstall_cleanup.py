"""What the chart's uninstall Job takes back from a project namespace (core/uninstall.py), as a table;
the Job itself runs in tests/e2e/test_chart_lifecycle.py."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.core.uninstall import namespace_cleanup_patch

OURS = {"finalizers": {"scheduling.hopsworks.ai/runai-project"}, "labels": {"hopsworks.ai/runai-project-id"},
        "annotations": {"scheduling.hopsworks.ai/runai-binding", "scheduling.hopsworks.ai/runai-move"}}  # fmt: skip


def ns(**meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "resourceVersion": "7", **meta}}


@pytest.mark.parametrize(
    ("namespace", "patch"),
    [
        (ns(), None),
        (ns(labels={"hopsworks.ai/project": "p", "runai/queue": "p"}, finalizers=["kubernetes"]), None),
        (
            ns(labels={"hopsworks.ai/project": "p", "runai/queue": "p", "hopsworks.ai/runai-project-id": "42"},
               annotations={"scheduling.hopsworks.ai/runai-binding": "{}", "platform/keep": "x"},
               finalizers=["other.io/keep", "scheduling.hopsworks.ai/runai-project"]),
            {"metadata": {"finalizers": ["other.io/keep"], "labels": {"hopsworks.ai/runai-project-id": None},
                          "annotations": {"scheduling.hopsworks.ai/runai-binding": None}}},
        ),
        (
            ns(finalizers=["scheduling.hopsworks.ai/runai-project"]),
            {"metadata": {"finalizers": []}},
        ),
        (
            ns(annotations={"scheduling.hopsworks.ai/runai-move": "{}"}),
            {"metadata": {"annotations": {"scheduling.hopsworks.ai/runai-move": None}}},
        ),
        (
            ns(labels={"runai/queue": "p", "hopsworks.ai/runai-project-id": "42"},
               finalizers=["scheduling.hopsworks.ai/runai-project"]),
            {"metadata": {"finalizers": [], "labels": {"hopsworks.ai/runai-project-id": None}}},
        ),
    ],
    ids=["bare", "nothing-of-ours", "bound-project", "finalizer-only", "move-intent-only", "project-label-removed"],
)  # fmt: skip
def test_only_this_systems_keys_are_taken_back(namespace: dict[str, Any], patch: dict[str, Any] | None) -> None:
    assert namespace_cleanup_patch(namespace, **OURS) == patch
