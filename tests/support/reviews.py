"""AdmissionReview test data built from the real fixtures in shared/fixtures/admissionreview.

The fixtures are never edited: variants are deep copies with the change a test needs.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from functools import cache
from typing import Any

import jsonpatch
import kubernetes_validate

from tests.support.shared import missing, shared_dir, shared_file
from webhook.core.decision import Decision

KUBERNETES_VERSION = "1.33"


FIXTURES = shared_dir() / "fixtures" / "admissionreview"


@cache
def _load(name: str) -> dict[str, Any]:
    return json.loads(shared_file("fixtures", "admissionreview", name).read_text())


def fixture_names() -> list[str]:
    """Every fixture; skips the calling module (a parametrize list) when the folder is missing."""
    if not FIXTURES.is_dir():
        missing(FIXTURES)
    return sorted(p.name for p in FIXTURES.glob("*.json"))


def review(name: str) -> dict[str, Any]:
    """A fixture as a full AdmissionReview (req-only files wrapped as the apiserver would)."""
    data = copy.deepcopy(_load(name))
    if "request" not in data:
        data = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": data}
    return data


def pod_review(
    namespace: str,
    *,
    base: str = "pod-create-kubectl-run.json",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
    gpus: float | None = None,
    operation: str = "CREATE",
    dry_run: bool = False,
    uid: str | None = None,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A real pod CREATE review moved into `namespace`, with labels/annotations/spec fields set
    (`owners`: its ownerReferences, e.g. `owned_by("Job")`)."""
    data = review(base)
    request = data["request"]
    request["namespace"] = namespace
    request["operation"] = operation
    request["dryRun"] = dry_run
    if uid is not None:
        request["uid"] = uid
    pod = request["object"]
    pod.setdefault("metadata", {})["namespace"] = namespace
    if uid is not None and "uid" in pod["metadata"]:
        pod["metadata"]["uid"] = f"pod-{uid}"  # distinct pods, distinct uids
    if labels:
        pod["metadata"].setdefault("labels", {}).update(labels)
    if annotations:
        pod["metadata"].setdefault("annotations", {}).update(annotations)
    if owners is not None:
        pod["metadata"]["ownerReferences"] = copy.deepcopy(owners)
    if spec:
        pod["spec"].update(copy.deepcopy(dict(spec)))
    if gpus is not None:
        limits = pod["spec"]["containers"][0].setdefault("resources", {}).setdefault("limits", {})
        limits["nvidia.com/gpu"] = str(gpus) if gpus != int(gpus) else str(int(gpus))
    return data


def owned_by(
    kind: str = "Job", api_version: str = "batch/v1", name: str = "train", *, controller: bool = True
) -> list[dict[str, Any]]:
    """ownerReferences as a controller writes them on the pods it creates (the Job controller's)."""
    return [
        {
            "apiVersion": api_version,
            "kind": kind,
            "name": name,
            "uid": f"uid-{kind.lower()}-{name}",
            "controller": controller,
            "blockOwnerDeletion": True,
        }
    ]


PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"


def admitted_labels(kind: str | None) -> dict[str, str]:
    """The preemptibility label the mutating webhook writes on a pod of `kind` (Run:ai on, stock
    settings): what a test pod that "went through admission" carries."""
    return {PREEMPTIBILITY_LABEL: "preemptible" if kind in ("job", "system-job") else "non-preemptible"}


def apply_patch(obj: Mapping[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply with an independent RFC 6902 implementation (raises on an invalid patch)."""
    return jsonpatch.JsonPatch(patch).apply(copy.deepcopy(dict(obj)))


def assert_valid_pod(pod: Mapping[str, Any]) -> None:
    """The Kubernetes Pod schema, strict (unknown fields fail)."""
    candidate = copy.deepcopy(dict(pod))
    candidate.setdefault("apiVersion", "v1")
    candidate.setdefault("kind", "Pod")
    meta = candidate.setdefault("metadata", {})
    # The fixtures carry a non-string annotation on purpose; the schema rightly rejects it.
    if "annotations" in meta:
        meta["annotations"] = {k: str(v) for k, v in meta["annotations"].items()}
    kubernetes_validate.validate(candidate, KUBERNETES_VERSION, strict=True)


def assert_decision(
    decision: Decision,
    *,
    allowed: bool,
    reason: str = "",
    message: tuple[str, ...] = (),
    warning: str | None = None,
) -> None:
    """The checks every table of decision cases makes: outcome, reason, message parts, a warning."""
    assert decision.allowed is allowed, decision.message
    if reason:
        assert decision.reason == reason
    for part in message:
        assert part in decision.message, decision.message
    if warning:
        assert any(warning in w for w in decision.warnings), decision.warnings
