"""`scheduling-webhook review`: the offline dry run prints the decision and exits non-zero on a refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.reviews import assert_valid_pod, review
from webhook.core.decision import Decision
from webhook.review import joined_audit

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / "examples" / "cluster"


def run_review(file: Path, state: Path = STATE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", "review", str(file), "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_example_notebook_is_allowed_with_its_patch_and_patched_pod() -> None:
    result = run_review(ROOT / "examples" / "requests" / "notebook-pod.yaml")
    assert result.returncode == 0, result.stderr
    head, _, patched_yaml = result.stdout.partition("\n---\n")
    assert "decision: ALLOWED" in head
    assert "injected: priority-class=hopsworks-normal" in head
    assert "injected: affinity=topology.kubernetes.io/zone=eu-1a" in head
    patched = yaml.safe_load(patched_yaml)
    assert patched["spec"]["priorityClassName"] == "hopsworks-normal"
    assert patched["spec"]["priority"] == 10000
    assert_valid_pod(patched)


def test_a_refusal_exits_1_and_says_why(tmp_path: Path) -> None:
    pod = yaml.safe_load((ROOT / "examples" / "requests" / "notebook-pod.yaml").read_text())
    pod["spec"]["priorityClassName"] = "hopsworks-high"
    file = tmp_path / "pod.yaml"
    file.write_text(yaml.safe_dump(pod))
    result = run_review(file)
    assert result.returncode == 1
    assert "decision: REFUSED" in result.stdout
    assert "allowed: hopsworks-low, hopsworks-normal" in result.stdout
    assert "---" not in result.stdout  # no patched object for a refused pod


def test_a_whole_admission_review_is_read_too(tmp_path: Path) -> None:
    whole = review("pod-create-kubectl-run.json")
    whole["request"]["namespace"] = "fraud-detection"
    whole["request"]["object"]["metadata"]["namespace"] = "fraud-detection"
    file = tmp_path / "review.json"
    file.write_text(json.dumps(whole))
    result = run_review(file)
    assert result.returncode == 0, result.stderr
    assert "injected: priority-class=hopsworks-high" in result.stdout  # the project's own default
    assert "nvidia.com/gpu.product=A100" in result.stdout


def test_bad_input_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    file = tmp_path / "cm.yaml"
    file.write_text("kind: ConfigMap\nmetadata: {name: x}\n")
    result = run_review(file)
    assert result.returncode == 2
    assert "expected a Pod or an AdmissionReview" in result.stderr
    assert "Traceback" not in result.stderr
    missing = run_review(file, state=tmp_path / "nowhere")
    assert missing.returncode == 2 and "is not a folder" in missing.stderr


def test_an_object_the_rules_cannot_read_is_bad_input_as_served(tmp_path: Path) -> None:
    pod = yaml.safe_load((ROOT / "examples" / "requests" / "notebook-pod.yaml").read_text())
    pod["spec"]["priorityClassName"] = 5
    file = tmp_path / "pod.yaml"
    file.write_text(yaml.safe_dump(pod))
    result = run_review(file)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot read the object: object.spec.priorityClassName: must be a string, got number" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("mutation", "validation", "joined"),
    [
        ({}, {}, {}),
        ({"a": "1"}, {"b": "2"}, {"a": "1", "b": "2"}),
        ({"would-refuse": "priority-class: x"}, {"would-refuse": "gpu-quota: y"},
         {"would-refuse": "priority-class: x; gpu-quota: y"}),
        ({"k": "same"}, {"k": "same"}, {"k": "same"}),
    ],
)  # fmt: skip
def test_the_offline_review_keeps_what_both_webhooks_wrote_under_one_audit_key(
    mutation: dict[str, str], validation: dict[str, str], joined: dict[str, str]
) -> None:
    assert joined_audit(Decision(True, audit=mutation), Decision(True, audit=validation)) == joined
