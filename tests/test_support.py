"""The test harness's own promises: where it finds the shared test data."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.openapi_check import SPEC_ENV, spec_path


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
