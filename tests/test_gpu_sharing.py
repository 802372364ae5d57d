"""Run:ai's GPU-sharing grammar, as KAI-Scheduler's admission validates it.

The cases of KAI v0.17.0's own validator tests (`pkg/binder/plugins/gpusharing/gpu-request/
gpu_request_validator_test.go`, `pkg/admission/webhook/v1alpha2/gpusharing/gpu_sharing_test.go`),
written here as our own table, plus the edges of Go's ParseFloat/ParseUint that KAI relies on.
tests/e2e/test_kai.py runs every row through KAI's real admission too: it refuses the same rows,
but the hostile long fraction, which we refuse unparsed and KAI admits.
A pod KAI would refuse is refused by the mutating phase (before Run:ai's webhooks see it) and
the validating phase, with our reason, before anything counts its GPUs.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.cluster import cluster_state, namespace
from tests.support.reviews import admitted_labels, assert_decision, pod_review
from webhook.core.decision import Reason
from webhook.core.gpu_sharing import gpu_sharing_error
from webhook.core.quota import validate_pod
from webhook.core.scheduling import mutate_pod


def pod(annotations: dict[str, str], *limits: str | None, init: str | None = None) -> dict[str, Any]:
    """A pod with one container per entry of `limits` (an nvidia.com/gpu limit, or None)."""
    containers = [
        {"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": limit} if limit is not None else {}}}
        for i, limit in enumerate(limits or (None,))
    ]
    spec: dict[str, Any] = {"containers": containers}
    if init is not None:
        spec["initContainers"] = [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": init}}}]
    return {"metadata": {"annotations": annotations}, "spec": spec}


F, M, D = "gpu-fraction", "gpu-memory", "gpu-fraction-num-devices"
WITH_INIT = {
    "metadata": {"annotations": {M: "10", "gpu-fraction-container-name": "init"}},
    "spec": {"containers": [{"name": "c0", "resources": {}}], "initContainers": [{"name": "init", "resources": {}}]},
}
# (case, pod, None if KAI admits it else a part of our reason)
CASES: list[tuple[str, dict[str, Any], str | None]] = [
    # KAI's cases.
    ("MPS with a fraction", pod({"mps": "true", F: "0.5"}), None),
    ("MPS with whole GPUs only", pod({"mps": "true"}, "1"), "needs a gpu-fraction or gpu-memory request"),
    ("MPS with nothing", pod({"mps": "true"}), "(GPU sharing through MPS)"),
    ("fraction with a GPU limit (2m)", pod({F: "0.5"}, "2m"), "cannot be combined with a nvidia.com/gpu limit"),
    ("fraction above 1", pod({F: "1.5"}), "must be more than 0 and less than 1"),
    ("whole GPU limit of 2", pod({}, "2"), None),
    ("whole GPU limit of 2 in millis", pod({}, "2000m"), None),
    ("fraction with memory", pod({F: "0.5", M: "1"}), "gpu-memory cannot be combined with gpu-fraction"),
    ("two containers with whole GPUs", pod({}, "1", "2"), None),
    ("memory with a GPU limit", pod({M: "1"}, "1m"), "gpu-memory cannot be combined with a nvidia.com/gpu limit"),
    ("memory with a GPU limit in a sidecar", pod({M: "1"}, None, "1m"), "cannot be combined with a nvidia.com/gpu"),
    ("negative memory", pod({M: "-1"}), "gpu-memory must be a whole number of MiB above 0"),
    ("negative fraction", pod({F: "-1"}), "must be more than 0 and less than 1"),
    ("fraction of 1.2", pod({F: "1.2"}), "must be more than 0 and less than 1"),
    ("device count alone", pod({D: "1"}), "gpu-fraction-num-devices needs gpu-fraction or gpu-memory"),
    ("device count of 1.2", pod({D: "1.2", F: "0.2"}), "gpu-fraction-num-devices must be a whole number above 0"),
    ("device count with memory", pod({D: "2", M: "1000"}), None),
    ("device count with a fraction", pod({D: "2", F: "0.3"}), None),
    ("NaN fraction", pod({F: "NaN"}), "written with a decimal point or an exponent"),
    ("scientific fraction", pod({F: "1.2e-10"}), None),
    ("hex float fraction", pod({F: "0x1p-1"}), "written with a decimal point or an exponent"),
    ("GPU sharing pod, memory", pod({M: "1024"}), None),
    ("whole GPU pod", pod({}, "1"), None),
    # The edges of the Go parsers KAI uses, and of what we bound.
    ("fraction of exactly 1 (Run:ai wants less than a GPU)", pod({F: "1"}), "must be more than 0 and less than 1"),
    ("fraction of 0", pod({F: "0"}), "must be more than 0 and less than 1"),
    ("fraction with an SI suffix", pod({F: "500m"}), "written with a decimal point or an exponent"),
    ("fraction with a sign", pod({F: "+0.25"}), None),
    ("fraction written .5", pod({F: ".5"}), None),
    ("fraction with spaces", pod({F: " 0.5"}), "written with a decimal point or an exponent"),
    ("fraction overflowing to infinity", pod({F: "1e999"}), "must be more than 0 and less than 1"),
    ("fraction of Inf", pod({F: "Inf"}), "written with a decimal point or an exponent"),
    ("fraction beside a GPU limit of 0", pod({F: "0.5"}, "0"), "cannot be combined with a nvidia.com/gpu limit"),
    ("fraction beside an init container's GPU", pod({F: "0.5"}, init="1"), "cannot be combined"),
    ("memory in Mi", pod({M: "1024Mi"}), "digits only"),
    ("memory of 0", pod({M: "0"}), "above 0"),
    ("memory with leading zeros", pod({M: "0100"}), None),
    ("memory past uint64", pod({M: str(2**64)}), "above 0 (digits only)"),
    ("device count of 0", pod({D: "0", F: "0.5"}), "gpu-fraction-num-devices must be a whole number above 0"),
    ("device count of 1e3", pod({D: "1e3", F: "0.5"}), "digits only"),
    ("fraction container that exists", pod({F: "0.5", "gpu-fraction-container-name": "c0"}), None),
    ("memory for the init container", WITH_INIT, None),
    ("fraction container that is missing", pod({F: "0.5", "gpu-fraction-container-name": "x"}), "not a container"),
    ("container name without sharing", pod({"gpu-fraction-container-name": "x"}), None),
    ("a long hostile fraction", pod({F: "0." + "5" * 5000}), "written with a decimal point"),
]


@pytest.mark.parametrize(("case", "spec", "refused"), CASES, ids=[c[0] for c in CASES])
def test_the_grammar_agrees_with_kais_validator(case: str, spec: dict[str, Any], refused: str | None) -> None:
    error = gpu_sharing_error(spec)
    if refused is None:
        assert error is None, error
    else:
        assert error is not None and refused in error, error


NS = namespace("vision", labels={"runai/queue": "vision", "hopsworks.ai/runai-project-id": "7"})
REFUSED = [(c, s, r) for c, s, r in CASES if r is not None]


@pytest.mark.parametrize(("case", "spec", "refused"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_pod_kai_would_refuse_is_refused_by_both_our_webhooks_first(
    case: str, spec: dict[str, Any], refused: str
) -> None:
    snap = cluster_state(namespaces=[NS], run_ai_enable=True).snapshot()
    labels = {"jupyter": "true", "runai/queue": "vision", **admitted_labels("notebook")}
    data = pod_review("vision", labels=labels, annotations=spec["metadata"]["annotations"])
    data["request"]["object"]["spec"]["containers"] = [{**c, "image": "i"} for c in spec["spec"]["containers"]]
    if "initContainers" in spec["spec"]:
        data["request"]["object"]["spec"]["initContainers"] = [
            {**c, "image": "i"} for c in spec["spec"]["initContainers"]
        ]
    for decide in (mutate_pod, validate_pod):
        decision = decide(data["request"], snap)
        assert_decision(decision, allowed=False, reason=Reason.INVALID, message=("GPU request: ", refused))


def test_with_run_ai_off_the_annotations_are_not_run_ais_to_judge() -> None:
    snap = cluster_state(namespaces=[NS], run_ai_enable=False).snapshot()
    data = pod_review("vision", labels={"jupyter": "true"}, annotations={F: "1"})
    assert mutate_pod(data["request"], snap).allowed
    assert validate_pod(data["request"], snap).allowed
