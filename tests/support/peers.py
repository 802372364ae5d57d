"""Where the real peers built by `make peers` are (kube-apiserver, etcd, kubectl, kwok, helm, ...).

$PEERS_DIR (the same variable `make peers` takes; default `.peers` in the clone) holds `bin/` and
`share/`. A module built per release of what it follows (hack/peers/releases: Kubernetes for kube
and kwok, Helm for helm) has its own `MODULE/RELEASE/bin` and `share` there instead, so that
`KUBE_VERSION=v1.35.4` and the default release live side by side; the release is read from the
same variable as hack/peers/build.sh reads, else the default of hack/peers/releases.

A missing binary skips the test with the make target that builds it; in CI
(`SCHEDULING_WEBHOOK_REQUIRE_PEERS=1`, set by `.ci/run`) it fails instead, so CI never passes as a
quieter suite.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack" / "peers"
REQUIRE_ENV = "SCHEDULING_WEBHOOK_REQUIRE_PEERS"


@dataclass(frozen=True)
class Release:
    """A line of hack/peers/releases: the variable that chooses a release, its default, the modules."""

    variable: str
    default: str
    modules: tuple[str, ...]

    def chosen(self) -> str:
        return os.environ.get(self.variable, "").strip() or self.default


@functools.cache
def releases() -> tuple[Release, ...]:
    found = []
    for line in (HACK / "releases").read_text().splitlines():
        words = line.split()
        if words and not words[0].startswith("#"):
            found.append(Release(words[0], words[1], tuple(words[2:])))
    return tuple(found)


def release(variable: str) -> str:
    """The release `variable` chooses (KUBE_VERSION, HELM_VERSION): the environment's, else the default."""
    for r in releases():
        if r.variable == variable:
            return r.chosen()
    raise KeyError(f"{variable} is not in {HACK / 'releases'}")


def kube_version() -> str:
    """The Kubernetes release the tests run (`v1.X.Y`): KUBE_VERSION, else the default."""
    return release("KUBE_VERSION")


def helm_version() -> str:
    """The Helm release the tests run (`vX.Y.Z`): HELM_VERSION, else the default."""
    return release("HELM_VERSION")


def _module_file(module: str, rel: str, name: str) -> Path:
    own = HACK / module / rel / name
    return own if own.exists() else HACK / module / name


def _entries(path: Path, column: int) -> list[str]:
    if not path.exists():
        return []
    lines = (line.split() for line in path.read_text().splitlines())
    return [words[column] for words in lines if len(words) > column and not words[0].startswith("#")]


def _release_home(kind: str, wanted: str) -> Path | None:
    """$PEERS_DIR/MODULE/RELEASE of the release-bound module that builds binary or share folder
    `wanted` (kind "binaries", column 0; kind "files", column 2), or None for a module built once."""
    column = 0 if kind == "binaries" else 2
    for r in releases():
        rel = r.chosen()
        for module in r.modules:
            for entry in _entries(_module_file(module, rel, kind), column):
                if wanted == entry or wanted.startswith(entry + "/"):
                    return peers_dir() / module / rel
    return None


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
    home = _release_home("binaries", name) or peers_dir()
    path = home / "bin" / name
    if not os.access(path, os.X_OK):
        missing(f"{name} ({path})")
    return path


def share(relative: str) -> Path:
    home = _release_home("files", relative) or peers_dir()
    path = home / "share" / relative
    if not path.exists():
        missing(f"{relative} ({path})")
    return path
