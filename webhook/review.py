"""`scheduling-webhook review FILE --state DIR`: an offline dry run of the admission decisions.

Reads a Pod (or a whole AdmissionReview) from FILE or, for `-`, stdin, and a folder of cluster
state; prints the decision, the warnings and the patched object, and exits 1 on a refusal, like
`kyverno apply` or `gator test` (2 for bad input; 141 when the reader of stdout went away).
It runs the handlers `serve --state` serves, so the two cannot disagree.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import jsonpatch
import yaml

from webhook.admission import DEFAULT_VERSION, BadReview, build_response, dumps, object_errors, parse_review
from webhook.core.decision import Decision, Reason
from webhook.core.guard_config import GuardConfig
from webhook.http.app import rules_read
from webhook.http.handlers import admission_handlers
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
    """Mutation, then validation of the mutated pod, as the apiserver orders them, by the handlers
    `serve --state` serves (`webhook.http.handlers`) behind the same object check: what the served
    folder mode answers, the offline review answers too."""
    return asyncio.run(_decide(request, state))


async def _decide(request: dict[str, Any], state: ClusterState) -> tuple[Decision, dict[str, Any] | None]:
    handlers = admission_handlers(state, GuardConfig(install_namespace=state.install_namespace))
    reads_object = rules_read(state)

    async def answer(path: str, review: dict[str, Any]) -> Decision:
        problem = object_errors(review) if reads_object(review) else None
        if problem is not None:
            return Decision.deny(f"cannot read the object: {problem}", 400, Reason.BAD_REQUEST)
        return await handlers[path](review)

    mutation = await answer("/mutate/pods", request)
    obj = request.get("object")
    if not mutation.allowed or not isinstance(obj, dict):
        return mutation, None
    patched = jsonpatch.JsonPatch(list(mutation.patch)).apply(copy.deepcopy(obj))
    validation = await answer("/validate/pods", {**request, "object": patched})
    warnings = mutation.warnings + validation.warnings
    if not validation.allowed:
        return replace(validation, warnings=warnings), None
    return Decision(True, patch=mutation.patch, warnings=warnings, audit=joined_audit(mutation, validation)), patched


def joined_audit(*decisions: Decision) -> dict[str, str]:
    """The audit annotations of the webhooks in turn. The apiserver keeps each under its webhook's
    name; here both land in one map, so a key that both wrote (a would-be refusal of the mutation's
    rules and of the quota) keeps both values instead of the last."""
    audit: dict[str, str] = {}
    for decision in decisions:
        for key, value in decision.audit.items():
            audit[key] = f"{audit[key]}; {value}" if key in audit and audit[key] != value else value
    return audit


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
    if args.output == "text":
        _print_text(decision, patched, out)
    else:
        answer = review_answer(request, decision, patched)
        if args.output == "json":
            print(json.dumps(answer, indent=2), file=out)
        else:
            yaml.safe_dump(answer, out, sort_keys=False)
    if decision.allowed:
        return 0
    return 2 if decision.reason == Reason.BAD_REQUEST else 1


def review_answer(request: dict[str, Any], decision: Decision, patched: dict[str, Any] | None) -> dict[str, Any]:
    """One object a script can read: the AdmissionReview response the server would send (the
    same shortened texts), its patch decoded, and the patched object when allowed."""
    # Through the wire encoding: plain JSON types only (the reason is an enum until then).
    answer: dict[str, Any] = json.loads(dumps(build_response(DEFAULT_VERSION, str(request.get("uid", "")), decision)))[
        "response"
    ]
    if "patch" in answer:
        answer["patch"] = list(decision.patch)
    if patched is not None:
        answer["object"] = patched
    return answer


def _print_text(decision: Decision, patched: dict[str, Any] | None, out: TextIO) -> None:
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
