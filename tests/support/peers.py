"""Where the real peers built by `make peers` are (kube-apiserver, etcd, kubectl, kwok, helm, ...).

$PEERS_DIR (the same variable `make peers` takes; default `.peers` in the clone) holds `bin/` and
`share/`. A missing binary skips the test with the make target that builds it; in CI
(`SCHEDULING_WEBHOOK_REQUIRE_PEERS=1`, set by `.ci/run`) it fails instead, so CI never passes as a
quieter suite.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REQUIRE_ENV = "SCHEDULING_WEBHOOK_REQUIRE_PEERS"


def peers_dir() -> Path:
    given = os.environ.get("PEERS_DIR")
    path = Path(given) if given else REPO / ".peers"
    return path if path.is_absolute() else REPO / path


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes")


def missing(what: str) -> None:
    """Skip (or, in CI, fail) for want of a built peer."""
    reason = f"{what} is not built: run `make peers` (builds the real peers into {peers_dir()})"
    if required():
        pytest.fail(f"{REQUIRE_ENV} is set and {reason}", pytrace=False)
    pytest.skip(reason)


def binary(name: str) -> Path:
    path = peers_dir() / "bin" / name
    if not os.access(path, os.X_OK):
        missing(f"{name} ({path})")
    return path


def share(relative: str) -> Path:
    path = peers_dir() / "share" / relative
    if not path.exists():
        missing(f"{relative} ({path})")
    return path
