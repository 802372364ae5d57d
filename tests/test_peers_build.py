"""`make peers` (hack/peers/build.sh) where it cannot build: one clear line and exit 2; where it
has built: nothing again."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import peers

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "hack" / "peers" / "build.sh"


def run(env: dict[str, str], *modules: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BUILD), *modules], env=env, capture_output=True, text=True, timeout=120)


def peer_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_without_go_it_says_so_in_one_line(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("bash", "sha256sum", "cut", "cat", "mkdir", "dirname", "grep", "tr", "printf"):
        found = shutil.which(tool)
        if found:
            (bare / tool).symlink_to(found)
    result = run({"PATH": str(bare), "PEERS_DIR": str(tmp_path / "peers")}, "kwok")
    assert result.returncode == 2
    assert peer_lines(result.stderr) == [
        "peers: no Go toolchain on PATH: the test control plane is built from Go modules (Go 1.25 or newer, "
        "https://go.dev/dl)"
    ]


def test_without_the_module_proxy_it_names_it_in_one_line(tmp_path: Path) -> None:
    if shutil.which("go") is None:
        pytest.skip("needs Go")
    env = {**os.environ, "GOPROXY": "off", "GOMODCACHE": str(tmp_path / "modcache"), "GOFLAGS": "-mod=mod",
           "PEERS_DIR": str(tmp_path / "peers")}  # fmt: skip
    result = run(env, "kwok")
    assert result.returncode == 2
    last = peer_lines(result.stderr)[-1]
    prefix = f"peers: kwok {peers.kube_version()}: cannot download its Go modules from GOPROXY=off: "
    assert last.startswith(prefix), result.stderr


def test_a_second_run_builds_nothing() -> None:
    """Where `make peers` has run (CI, any machine that ran `make test` once): a stamp check only."""
    kube = peers.kube_version()
    if not (peers.peers_dir() / "stamps" / f"kube@{kube}").exists():
        peers.missing(f"the kube peer at {kube}")
    env = {**os.environ, "PEERS_DIR": str(peers.peers_dir())}
    result = run(env)
    assert result.returncode == 0, result.stderr
    lines = peer_lines(result.stderr)
    assert lines and all(": up to date (" in line for line in lines), result.stderr
    assert any(line.startswith(f"peers: kube {kube}: up to date (") for line in lines), result.stderr


def test_a_release_that_is_not_pinned_is_refused_naming_those_that_are(tmp_path: Path) -> None:
    if shutil.which("go") is None:
        pytest.skip("needs Go")
    env = {**os.environ, "PEERS_DIR": str(tmp_path / "peers"), "KUBE_VERSION": "v1.99.0"}
    result = run(env, "kube")
    assert result.returncode == 2
    [line] = peer_lines(result.stderr)
    assert line.startswith("peers: kube: no release v1.99.0 pinned (hack/peers/kube/v1.99.0/go.mod; pinned: "), line
    pinned = line.split("pinned: ")[1].rstrip(")").split()
    assert peers.release("KUBE_VERSION") in pinned and "v1.35.4" in pinned, line


@pytest.mark.parametrize(
    ("env", "name", "folder"),
    [
        ({}, "kube-apiserver", "kube/{KUBE_VERSION}/bin"),
        ({"KUBE_VERSION": "v1.35.4"}, "kubectl", "kube/v1.35.4/bin"),
        ({"KUBE_VERSION": "v1.35.4"}, "kwok", "kwok/v1.35.4/bin"),
        ({}, "helm", "helm/{HELM_VERSION}/bin"),
        ({"HELM_VERSION": "v3.21.4"}, "helm", "helm/v3.21.4/bin"),
        ({"KUBE_VERSION": "v1.35.4"}, "kueue", "bin"),
    ],
)
def test_each_release_has_its_own_folder_and_the_others_share_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], name: str, folder: str
) -> None:
    """What the tests run is where build.sh puts it: KUBE_VERSION and HELM_VERSION choose among the
    releases built side by side; a peer built once (Kueue) stays in bin/."""
    monkeypatch.setenv("PEERS_DIR", str(tmp_path))
    for variable in ("KUBE_VERSION", "HELM_VERSION"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    defaults = {r.variable: r.default for r in peers.releases()}
    path = tmp_path / folder.format(**defaults) / name
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    assert peers.binary(name) == path


def test_a_source_tarball_that_is_not_the_pinned_one_is_refused_in_one_line(tmp_path: Path) -> None:
    """KAI comes as a tarball from the shared folder (hack/peers/kai/source): checked before use."""
    if shutil.which("go") is None:
        pytest.skip("needs Go")
    tarball = tmp_path / "shared" / "peers" / "KAI-Scheduler-v0.17.0.tar.gz"
    tarball.parent.mkdir(parents=True)
    tarball.write_bytes(b"not the release")
    env = {**os.environ, "PEERS_DIR": str(tmp_path / "peers"), "SCHEDULING_WEBHOOK_SHARED": str(tmp_path / "shared")}
    result = run(env, "kai")
    assert result.returncode == 2
    assert peer_lines(result.stderr) == [
        f"peers: kai: {tarball} does not have sha256 85764d2d239785154d185b849367331b0dff074ead8396b3a9d5396738656683"
    ]
