"""AdmissionReview envelopes: parse what the apiserver sends, answer in the shape it expects.

The envelope is validated with pydantic; the objects inside (`object`, `oldObject`) stay the raw
dicts the decision functions read, so nothing unknown is lost or re-serialised.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from webhook.core.decision import Decision

SUPPORTED_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


class BadReview(ValueError):
    """The body is not an AdmissionReview we can answer; `status` is the HTTP code to send."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class _Lenient(BaseModel):
    # Only checks the shape: the decisions read the raw dict, so unknown fields stay there and
    # need not be copied into the model (that copy was a third of the validation).
    model_config = ConfigDict(extra="ignore", frozen=True)


class GroupVersionKind(_Lenient):
    group: str = ""
    version: str = ""
    kind: str


class UserInfo(_Lenient):
    username: str = ""
    uid: str = ""
    groups: list[str] = Field(default_factory=list)


class AdmissionRequest(_Lenient):
    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    namespace: str = ""
    name: str = ""
    subResource: str = ""  # wire names are camelCase
    userInfo: UserInfo = Field(default_factory=UserInfo)
    # Checked without copying: a pod is a few hundred nested dicts the decisions read as they are.
    object: Any = None
    oldObject: Any = None
    dryRun: bool | None = False

    @field_validator("object", "oldObject")
    @classmethod
    def _object_or_null(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, dict):
            raise ValueError("must be an object or null")
        return value


class AdmissionReviewIn(_Lenient):
    apiVersion: str = "admission.k8s.io/v1"
    kind: str = "AdmissionReview"
    request: AdmissionRequest


def loads(body: bytes) -> Any:
    """Strict RFC 8259 JSON (orjson: about twice as fast as the stdlib on a pod, and it refuses
    NaN, invalid UTF-8 and integers beyond 64 bits, none of which a real apiserver sends)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc) or "recursion" in str(exc):
            raise RecursionError(str(exc)) from None
        raise


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def parse_review(body: bytes) -> tuple[str, dict[str, Any]]:
    """(apiVersion, request dict). Raises BadReview with a reason a human can act on."""
    try:
        raw = loads(body)
    except ValueError as exc:
        # JSONDecodeError, UnicodeDecodeError, and the plain ValueError of an integer literal past
        # Python's digit limit (CVE-2020-10735): all a bad body, never a 500.
        raise BadReview(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise BadReview("body is nested too deeply") from None
    if not isinstance(raw, dict):
        raise BadReview("body must be a JSON object (an AdmissionReview)")
    if raw.get("kind", "AdmissionReview") != "AdmissionReview":
        raise BadReview(f"kind must be AdmissionReview, got {raw.get('kind')!r}")
    version = raw.get("apiVersion") or "admission.k8s.io/v1"
    if version not in SUPPORTED_VERSIONS:
        raise BadReview(f"apiVersion {version!r} not supported; send one of {', '.join(SUPPORTED_VERSIONS)}")
    if "request" not in raw or raw["request"] is None:
        raise BadReview("AdmissionReview has no request")
    try:
        AdmissionReviewIn.model_validate(raw)
    except ValidationError as exc:
        raise BadReview(_first_errors(exc)) from None
    return version, raw["request"]


def _first_errors(exc: ValidationError, limit: int = 3) -> str:
    parts = []
    for err in exc.errors()[:limit]:
        where = ".".join(str(p) for p in err["loc"])
        parts.append(f"{where}: {err['msg']}")
    return "invalid AdmissionReview: " + "; ".join(parts)


def build_response(version: str, uid: str, decision: Decision) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {
            "code": decision.code,
            "message": decision.message,
            "reason": decision.reason,
            "status": "Failure",
        }
    if decision.patch and decision.allowed:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(dumps(list(decision.patch))).decode()
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    if decision.audit:
        response["auditAnnotations"] = dict(decision.audit)
    return {"apiVersion": version, "kind": "AdmissionReview", "response": response}


def is_dry_run(request: Mapping[str, Any]) -> bool:
    return bool(request.get("dryRun"))
