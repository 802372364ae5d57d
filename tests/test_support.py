"""The test harness's own promises: where it finds the shared test data, and how the Run:ai stand-in
maps to KAI's Queues."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.control_plane.kai import quantity, queue, queue_usage
from tests.support.openapi_check import SPEC_ENV, spec_path
from tests.support.runai_standin import RunaiStandin


def test_run_ai_spec_is_read_from_the_shared_folder_the_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SPEC_ENV, raising=False)
    monkeypatch.setenv("SCHEDULING_WEBHOOK_SHARED", str(tmp_path))
    assert spec_path() == tmp_path / "runai" / "runai-openapi.json"


def test_an_explicit_run_ai_spec_wins_over_the_shared_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULING_WEBHOOK_SHARED", str(tmp_path / "shared"))
    monkeypatch.setenv(SPEC_ENV, str(tmp_path / "spec.json"))
    assert spec_path() == tmp_path / "spec.json"


def test_the_runai_standin_keeps_a_kai_queue_for_each_department_and_project() -> None:
    """Run:ai's cluster side (QueueSync): departments are parent queues, projects their children,
    deserved GPUs the quota on the default node pool (-1, no quota, for a department given none);
    usage comes back from the Queues' status."""
    runai = RunaiStandin(check_spec=False)
    runai.add_department("vision-dept", gpu_quota=3)
    runai.add_project("vision", department="vision-dept", gpu_quota=2)
    runai.add_project("nlp", gpu_quota=1.5)
    assert sorted(runai.kai_queues(), key=str) == sorted(
        [("default", None, -1.0), ("vision-dept", None, 3.0), ("vision", "vision-dept", 2.0), ("nlp", "default", 1.5)],
        key=str,
    )
    assert queue("vision", 2, "vision-dept")["spec"]["parentQueue"] == "vision-dept"
    assert "parentQueue" not in queue("vision-dept", 3)["spec"]
    status = {"status": {"allocated": {"nvidia.com/gpu": "1500m"}, "allocatedNonPreemptible": {"nvidia.com/gpu": "1"}}}
    assert queue_usage(status) == (1.5, 1.0, 0.0)
    assert (quantity("2"), quantity("250m"), quantity(None)) == (2.0, 0.25, 0.0)
    runai.take_queue_usage({"vision": (1.5, 1.0, 2.0)})
    vision, nlp = runai.project("vision"), runai.project("nlp")
    assert vision is not None and nlp is not None
    assert vision["status"]["quotaStatus"]["allocated"]["gpu"] == 1.5
    assert vision["status"]["quotaStatus"]["allocatedNonPreemptible"]["gpu"] == 1.0
    assert nlp["status"]["quotaStatus"]["allocated"]["gpu"] == 0  # no Queue status yet: nothing allocated
