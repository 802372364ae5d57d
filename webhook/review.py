"""`scheduling-webhook review FILE --state DIR`: an offline dry run of the admission decisions.

Reads a Pod (or a whole AdmissionReview) from FILE or, for `-`, stdin, and a folder of cluster
state; prints the decision, the warnings and the patched object, and exits 1 on a refusal, like
`kyverno apply` or `gator test` (2 for bad input; 141 when the reader of stdout went away).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import uuid
from pathlib import Path
from typing import Any, TextIO

import jsonpatch
import yaml

from webhook.admission import BadReview, parse_review
from webhook.core.decision import Decision, Reason
from webhook.core.scheduling import mutate_pod
from webhook.state.folder import StateFolderError, load_into
from webhook.state.store import ClusterState


def request_for(document: dict[str, Any]) -> dict[str, Any]:
    """The AdmissionReview request for a file: a review as is, a Pod as its CREATE."""
    if document.get("kind") == "AdmissionReview":
        _, request = parse_review(json.dumps(document).encode())
        return request
    if document.get("kind") != "Pod":
        raise BadReview(f"expected a Pod or an AdmissionReview, got kind {document.get('kind')!r}")
    meta = document.get("metadata") or {}
    return {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": meta.get("namespace", "default"),
        "name": meta.get("name", ""),
        "userInfo": {"username": "review"},
        "object": document,
        "dryRun": True,
    }


def decide(request: dict[str, Any], state: ClusterState) -> tuple[Decision, dict[str, Any] | None]:
    """Mutation, then validation of the mutated pod, as the apiserver orders them."""
    from webhook.core.quota import validate_pod

    snapshot = state.snapshot()
    mutation = mutate_pod(request, snapshot)
    obj = request.get("object")
    if not mutation.allowed or not isinstance(obj, dict):
        return mutation, None
    patched = jsonpatch.JsonPatch(list(mutation.patch)).apply(copy.deepcopy(obj))
    validation = validate_pod({**request, "object": patched}, snapshot)
    warnings = mutation.warnings + validation.warnings
    if not validation.allowed:
        return Decision.deny(validation.message, validation.code, validation.reason or Reason.FORBIDDEN, warnings), None
    return Decision(True, patch=mutation.patch, warnings=warnings, audit=mutation.audit), patched


def review_command(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    state = ClusterState(args.namespace)
    try:
        load_into(state, Path(args.state))
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        document = yaml.safe_load(text)  # YAML reads JSON too
        if not isinstance(document, dict):
            raise BadReview(f"{'stdin' if args.file == '-' else args.file} must hold one Kubernetes object")
        request = request_for(document)
    except (OSError, yaml.YAMLError, StateFolderError, BadReview) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    decision, patched = decide(request, state)
    verdict = "ALLOWED" if decision.allowed else "REFUSED"
    print(f"decision: {verdict}", file=out)
    if decision.message:
        print(f"message: {decision.message}", file=out)
    for warning in decision.warnings:
        print(f"warning: {warning}", file=out)
    for key, value in decision.audit.items():
        print(f"injected: {key}={value}", file=out)
    if decision.patch:
        print("patch:", file=out)
        print(json.dumps(list(decision.patch), indent=2), file=out)
    if patched is not None:
        print("---", file=out)
        yaml.safe_dump(patched, out, sort_keys=False)
    return 0 if decision.allowed else 1
