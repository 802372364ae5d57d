"""Test data that lives outside this repository: `../shared` (AdmissionReview fixtures, the Run:ai spec).

A clone on its own still runs every test that does not need it; the ones that do are skipped with
a reason naming the missing file. CI sets SCHEDULING_WEBHOOK_REQUIRE_SHARED=1 (see .ci/run) so that
the same absence fails the run instead of quietly skipping a third of the suite.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

SHARED_ENV = "SCHEDULING_WEBHOOK_SHARED"
REQUIRE_ENV = "SCHEDULING_WEBHOOK_REQUIRE_SHARED"


def shared_dir() -> Path:
    """`$SCHEDULING_WEBHOOK_SHARED`, else `shared/` beside the repository."""
    override = os.environ.get(SHARED_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[3] / "shared"


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes")


def missing(path: Path, hint: str = f"put shared/ beside the repository or set {SHARED_ENV}") -> NoReturn:
    """Skip (or, under CI, fail) the test or module that needs `path`."""
    reason = f"needs {path} (missing; {hint})"
    if required():
        pytest.fail(f"{REQUIRE_ENV} is set and a test {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def shared_file(*parts: str) -> Path:
    """A file under the shared folder; skips (or fails under CI) when it is not there."""
    path = shared_dir().joinpath(*parts)
    if not path.is_file():
        missing(path)
    return path
