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
    assert last.startswith("peers: kwok: cannot download its Go modules from GOPROXY=off: "), result.stderr


def test_a_second_run_builds_nothing() -> None:
    """Where `make peers` has run (CI, any machine that ran `make test` once): a stamp check only."""
    if not (peers.peers_dir() / "stamps" / "kube").exists():
        peers.missing("the kube peer")
    env = {**os.environ, "PEERS_DIR": str(peers.peers_dir())}
    result = run(env)
    assert result.returncode == 0, result.stderr
    lines = peer_lines(result.stderr)
    assert lines and all(": up to date (" in line for line in lines), result.stderr
    assert any(line.startswith("peers: kube: up to date (") for line in lines), result.stderr


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
