"""`make e2e-kind` where something it needs is missing: one line naming it, and a failure."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_e2e_kind_names_what_is_missing_in_one_line_and_fails() -> None:
    # KIND names no program: never creates a cluster, even where kind exists. Run as from a shell,
    # not as a sub-make of `make test`.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env["KIND"] = "/nonexistent/kind"
    result = subprocess.run(["make", "--no-print-directory", "e2e-kind"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if not re.match(r"make(\[\d+\])?: \*\*\*", line)]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("make e2e-kind needs ") and "kind" in lines[0], lines[0]


def test_the_kind_script_deletes_the_cluster_on_exit_and_pins_the_node_image() -> None:
    script = (ROOT / "hack/e2e/kind.sh").read_text()
    # The trap is set before the cluster is created, so a failure anywhere after still deletes it.
    assert script.index("trap cleanup EXIT") < script.index('create cluster --name "$KIND_CLUSTER_NAME"')
    assert 'cleanup() { "$KIND" delete cluster --name "$KIND_CLUSTER_NAME"' in script
    assert "kindest/node:v1.32.2@sha256:" in script
    assert "SCHEDULING_WEBHOOK_E2E_KUBECONFIG" in script and "tests/e2e" in script
