"""The repository on its own: what a clone without ../shared does, and the plumbing around the two commands."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support.shared import REQUIRE_ENV, SHARED_ENV

ROOT = Path(__file__).resolve().parents[1]

NEEDS_FIXTURE = """
from tests.support.reviews import review

def test_uses_a_fixture():
    assert review("pod-create-kubectl-run.json")["request"]["uid"]
"""
NEEDS_SPEC = """
from tests.support.openapi_check import checked_spec

def test_uses_the_spec():
    assert checked_spec()
"""


def run_pytest(tmp_path: Path, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """pytest on two small tests that need ../shared, with SCHEDULING_WEBHOOK_SHARED at an empty folder."""
    tests = tmp_path / "tests_needing_shared"
    tests.mkdir()
    (tests / "test_fixture_user.py").write_text(NEEDS_FIXTURE)
    (tests / "test_spec_user.py").write_text(NEEDS_SPEC)
    env = {k: v for k, v in os.environ.items() if k not in (REQUIRE_ENV, "RUNAI_OPENAPI_SPEC")}
    env |= {SHARED_ENV: str(tmp_path / "no-shared"), **env_extra}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "--rootdir", str(ROOT), str(tests)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_without_shared_the_tests_that_need_it_skip_naming_the_file(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, {})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 skipped" in result.stdout, result.stdout
    missing = tmp_path / "no-shared"
    assert f"needs {missing}/fixtures/admissionreview/pod-create-kubectl-run.json (missing" in result.stdout
    assert f"needs {missing}/runai/runai-openapi.json (missing" in result.stdout


def test_under_ci_the_same_absence_fails(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, {REQUIRE_ENV: "1"})
    assert result.returncode == 1, result.stdout
    assert "2 failed" in result.stdout and f"{REQUIRE_ENV} is set" in result.stdout


def test_ci_entry_point_requires_shared_and_runs_make_test() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert f"export {REQUIRE_ENV}=1" in script
    assert script.rstrip().endswith("make test")


def fake_python(path: Path, version: str, supported: bool) -> Path:
    """An interpreter that answers the Makefile's version question as Python `version` would."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "{version} {supported}"\n')
    path.chmod(0o755)
    return path


def make_dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-n", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_make_refuses_a_python_older_than_3_11(tmp_path: Path) -> None:
    old = fake_python(tmp_path / "python3.10", "3.10", False)
    result = make_dry_run("venv", f"PYTHON={old}", f"VENV={tmp_path / 'venv'}")
    assert result.returncode != 0
    assert "is Python 3.10; scheduling-webhook needs 3.11+" in result.stderr, result.stderr


def test_make_recreates_a_venv_made_by_another_python(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    fake_python(venv / "bin" / "python", "3.10", False)
    (venv / ".installed-run").touch()  # newer than pyproject.toml: only the version says it is stale
    (venv / ".installed").touch()
    stale = make_dry_run("venv", f"VENV={venv}")
    assert f"rm -rf {venv}" in stale.stdout, stale.stdout + stale.stderr
    assert "-m venv" in stale.stdout
    current = sys.version_info
    fake_python(venv / "bin" / "python", f"{current[0]}.{current[1]}", True)
    (venv / ".installed-run").touch()
    (venv / ".installed").touch()
    fresh = make_dry_run("venv", f"VENV={venv}", f"PYTHON={sys.executable}")
    assert "rm -rf" not in fresh.stdout and "-m venv" not in fresh.stdout, fresh.stdout


def test_license_is_an_spdx_string() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"


def test_certs_folder_ships_its_readme_and_nothing_else() -> None:
    readme = ROOT / "certs" / "README.md"
    assert readme.is_file()
    text = readme.read_text()
    assert "never" in text and "commit" in text and "certs/dev" in text and "certs/cluster" in text
    tracked = subprocess.run(
        ["git", "ls-files", "certs"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
    )
    if tracked.returncode == 0:  # a git checkout: only the README is tracked there
        assert tracked.stdout.split() in ([], ["certs/README.md"])
        keys = ["certs/dev/tls.key", "certs/cluster/ca.key"]
        ignored = subprocess.run(
            ["git", "check-ignore", *keys], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
        )
        assert ignored.stdout.split() == keys  # git ignores the keys
