"""AdmissionReview envelopes: parse what the apiserver sends, answer in the shape it expects.

The envelope is validated with pydantic; the objects inside (`object`, `oldObject`) stay the raw
dicts the decision functions read, so nothing unknown is lost or re-serialised.
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Required, cast

import msgspec
import orjson
from pydantic import Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only from Python 3.12

from webhook.core.decision import Decision
from webhook.pod_schema import POD_REVIEW

SUPPORTED_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
DEFAULT_VERSION = SUPPORTED_VERSIONS[0]  # of a review that names none


class BadReview(ValueError):
    """The body is not an AdmissionReview we can answer; `status` is the HTTP code to send."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


# The envelope's schema. TypedDicts, not models: the decisions read the raw dict, so validation
# only has to check the shape, and a TypeAdapter over TypedDicts does that in about half the time of
# models (no instances, no copies of the fields we do not name: they stay in the raw dict).
class GroupVersionKind(TypedDict, total=False):
    group: str
    version: str
    kind: Required[str]


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]


class AdmissionRequest(TypedDict, total=False):
    uid: Required[Annotated[str, Field(min_length=1)]]
    kind: Required[GroupVersionKind]
    operation: Required[Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]]
    namespace: str
    name: str
    subResource: str  # wire names are camelCase
    userInfo: UserInfo
    object: dict[str, Any] | None  # a shallow check: the pod's own fields are the decisions' to read
    oldObject: dict[str, Any] | None
    dryRun: bool | None


class AdmissionReviewIn(TypedDict, total=False):
    apiVersion: str
    kind: str
    request: Required[AdmissionRequest]


_REVIEW = TypeAdapter(AdmissionReviewIn)


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
    version = raw.get("apiVersion") or DEFAULT_VERSION
    if version not in SUPPORTED_VERSIONS:
        raise BadReview(f"apiVersion {version!r} not supported; send one of {', '.join(SUPPORTED_VERSIONS)}")
    if "request" not in raw or raw["request"] is None:
        raise BadReview("AdmissionReview has no request")
    try:
        _REVIEW.validate_python(raw)
    except ValidationError as exc:
        raise BadReview(_first_errors(exc)) from None
    return version, raw["request"]


def parse_pod_review(body: bytes) -> tuple[str, dict[str, Any]] | None:
    """`parse_review` for a pod's review, decoded against `webhook.pod_schema`: what no rule reads
    is skipped while parsing, and the object is known to pass `object_errors`. None when the schema
    does not take the body: then `parse_review` and `object_errors` answer it, as for any review."""
    # msgspec checks the UTF-8 of what it keeps, not of what it skips; orjson refuses it anywhere.
    if not body.isascii():
        try:
            body.decode()
        except UnicodeDecodeError:
            return None
    try:
        raw = POD_REVIEW.decode(body)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    # The decoder makes plain dicts; the TypedDicts only told it what to build.
    return raw.get("apiVersion", DEFAULT_VERSION), cast(dict[str, Any], raw["request"])


def _first_errors(exc: ValidationError, limit: int = 3) -> str:
    parts = []
    for err in exc.errors()[:limit]:
        where = ".".join(str(p) for p in err["loc"])
        parts.append(f"{where}: {err['msg']}")
    return "invalid AdmissionReview: " + "; ".join(parts)


# Messages, warnings and audit annotations can quote what a request wrote; bounded, they cannot
# fill the apiserver's audit log or a user's terminal (the apiserver itself truncates warnings).
MAX_MESSAGE_CHARS = 4096
MAX_WARNING_CHARS = 512
MAX_AUDIT_CHARS = 256


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- the fields of `object` and `oldObject` that the decisions read ------------------------------
# The envelope's schema above checks `object` only shallowly; these checks make every field a rule
# reads the type it expects before any rule runs, so an odd value is a 400 naming the field instead
# of an exception deep in a rule. A real apiserver never sends such objects: refusing is safe.

_POD_TEMPLATE_PATHS = {
    "Pod": (),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


class _Shape(Exception):
    """A field of the wrong type; the message names it."""


def object_errors(request: Mapping[str, Any]) -> str | None:
    """Why `object` or `oldObject` cannot be read by the rules, naming the field; None when fine."""
    kind = request.get("kind")
    kind_name = str((kind.get("kind") if isinstance(kind, dict) else None) or "")
    try:
        for key in ("object", "oldObject"):
            obj = request.get(key)
            # The yes-or-no walk first: it builds no field path. Only an object it does not pass
            # is walked again to name the field (or, when the two disagree, found fine after all).
            if obj is not None and not _object_ok(obj, kind_name):
                _check_object(obj, kind_name, key)
    except _Shape as exc:
        return str(exc)
    return None


# -- the same checks as yes or no, for every request: exact JSON types, no strings built. Never
# more lenient than the naming walk below (tests/test_hostile_requests.py holds them together).


def _object_ok(obj: Any, kind: str) -> bool:
    if type(obj) is not dict:
        return False
    meta = obj.get("metadata")
    if meta is not None:
        if type(meta) is not dict:
            return False
        for key in ("name", "namespace", "generateName", "uid", "resourceVersion"):
            value = meta.get(key)
            if value is not None and type(value) is not str:
                return False
        strict = kind not in _POD_TEMPLATE_PATHS
        for key in ("labels", "annotations"):
            if not _map_ok(meta.get(key), strict):
                return False
        refs = meta.get("ownerReferences")
        if refs is not None:
            if type(refs) is not list:
                return False
            for ref in refs:
                if type(ref) is not dict:
                    return False
    if kind == "ConfigMap" and not _map_ok(obj.get("data"), True):
        return False
    path = _POD_TEMPLATE_PATHS.get(kind)
    if path is None:
        spec = obj.get("spec")
        return spec is None or type(spec) is dict
    node: Any = obj
    for key in path:
        node = node.get(key)
        if node is None:
            return True
        if type(node) is not dict:
            return False
    if kind != "Pod":
        tmeta = node.get("metadata")
        if tmeta is not None:
            if type(tmeta) is not dict:
                return False
            if not _map_ok(tmeta.get("labels"), False) or not _map_ok(tmeta.get("annotations"), False):
                return False
    spec = node.get("spec")
    if spec is None:
        return True
    return type(spec) is dict and _pod_spec_ok(spec)


def _map_ok(values: Any, strict: bool) -> bool:
    if values is None:
        return True
    if type(values) is not dict:
        return False
    if strict:
        for value in values.values():
            if type(value) is not str:
                return False
    return True


def _pod_spec_ok(spec: dict[str, Any]) -> bool:
    value = spec.get("priorityClassName")
    if value is not None and type(value) is not str:
        return False
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        if containers is None:
            continue
        if type(containers) is not list:
            return False
        for container in containers:
            if type(container) is not dict:
                return False
            resources = container.get("resources")
            if resources is None:
                continue
            if type(resources) is not dict:
                return False
            for section in ("limits", "requests"):
                amounts = resources.get(section)
                if amounts is None:
                    continue
                if type(amounts) is not dict:
                    return False
                for amount in amounts.values():
                    kind = type(amount)
                    if kind is not str and kind is not int and kind is not float:
                        return False
    required: dict[str, Any] = spec
    for key in ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"):
        node = required.get(key)
        if node is None:
            return True
        if type(node) is not dict:
            return False
        required = node
    terms = required.get("nodeSelectorTerms")
    if terms is None:
        return True
    if type(terms) is not list:
        return False
    for term in terms:
        if type(term) is not dict:
            return False
        expressions = term.get("matchExpressions")
        if expressions is None:
            continue
        if type(expressions) is not list:
            return False
        for expression in expressions:
            if type(expression) is not dict:
                return False
            for key in ("key", "operator"):
                value = expression.get(key)
                if value is not None and type(value) is not str:
                    return False
            values = expression.get("values")
            if values is None:
                continue
            if type(values) is not list:
                return False
            for value in values:
                if type(value) is not str:
                    return False
    return True


# -- the naming walk: the first field of the wrong type, as a 400's reason


def _type_name(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _expect(value: Any, expected: type | tuple[type, ...], where: str, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, expected):  # no field read here is a boolean
        raise _Shape(f"{where}: must be {what}, got {_type_name(value)}")


def _optional(parent: Mapping[str, Any], key: str, expected: type, where: str, what: str) -> Any:
    value = parent.get(key)
    if value is not None:
        _expect(value, expected, f"{where}.{key}", what)
    return value


def _string_map(parent: Mapping[str, Any], key: str, where: str, strict: bool = True) -> None:
    """A map; with `strict`, of strings only. The pod rules read a few keys and cope with a value of
    any type there, so a pod's other labels and annotations are not theirs to refuse."""
    values = _optional(parent, key, dict, where, "a map of strings")
    if not strict:
        return
    for name, value in (values or {}).items():
        if not isinstance(value, str):
            raise _Shape(f"{where}.{key}[{shorten(repr(name), 80)}]: must be a string, got {_type_name(value)}")


def _check_object(obj: Any, kind: str, where: str) -> None:
    _expect(obj, dict, where, "an object")
    meta = _optional(obj, "metadata", dict, where, "an object")
    if meta is not None:
        for key in ("name", "namespace", "generateName", "uid", "resourceVersion"):
            _optional(meta, key, str, f"{where}.metadata", "a string")
        strict = kind not in _POD_TEMPLATE_PATHS
        _string_map(meta, "labels", f"{where}.metadata", strict)
        _string_map(meta, "annotations", f"{where}.metadata", strict)
        refs = _optional(meta, "ownerReferences", list, f"{where}.metadata", "a list")
        for i, ref in enumerate(refs or ()):
            _expect(ref, dict, f"{where}.metadata.ownerReferences[{i}]", "an object")
    if kind == "ConfigMap":
        _string_map(obj, "data", where)
    if kind in _POD_TEMPLATE_PATHS:
        node: Any = obj
        path = where
        for key in _POD_TEMPLATE_PATHS[kind]:
            node = _optional(node, key, dict, path, "an object")
            path = f"{path}.{key}"
            if node is None:
                return
        if kind != "Pod":
            tmeta = _optional(node, "metadata", dict, path, "an object")
            if tmeta is not None:
                _string_map(tmeta, "labels", f"{path}.metadata", strict=False)
                _string_map(tmeta, "annotations", f"{path}.metadata", strict=False)
        spec = _optional(node, "spec", dict, path, "an object")
        if spec is not None:
            _check_pod_spec(spec, f"{path}.spec")
    else:
        _optional(obj, "spec", dict, where, "an object")


def _check_pod_spec(spec: Mapping[str, Any], where: str) -> None:
    _optional(spec, "priorityClassName", str, where, "a string")
    for key in ("containers", "initContainers"):
        for i, container in enumerate(_optional(spec, key, list, where, "a list") or ()):
            at = f"{where}.{key}[{i}]"
            _expect(container, dict, at, "an object")
            resources = _optional(container, "resources", dict, at, "an object")
            for section in ("limits", "requests"):
                amounts = _optional(resources or {}, section, dict, f"{at}.resources", "a map of quantities")
                for name, amount in (amounts or {}).items():
                    if not isinstance(amount, str | int | float) or isinstance(amount, bool):
                        raise _Shape(
                            f"{at}.resources.{section}[{shorten(repr(name), 80)}]: must be a quantity, "
                            f"got {_type_name(amount)}"
                        )
    affinity = _optional(spec, "affinity", dict, where, "an object")
    node_affinity = _optional(affinity or {}, "nodeAffinity", dict, f"{where}.affinity", "an object")
    at = f"{where}.affinity.nodeAffinity"
    required = _optional(node_affinity or {}, "requiredDuringSchedulingIgnoredDuringExecution", dict, at, "an object")
    at = f"{at}.requiredDuringSchedulingIgnoredDuringExecution"
    for i, term in enumerate(_optional(required or {}, "nodeSelectorTerms", list, at, "a list") or ()):
        term_at = f"{at}.nodeSelectorTerms[{i}]"
        _expect(term, dict, term_at, "an object")
        for j, expression in enumerate(_optional(term, "matchExpressions", list, term_at, "a list") or ()):
            expr_at = f"{term_at}.matchExpressions[{j}]"
            _expect(expression, dict, expr_at, "an object")
            _optional(expression, "key", str, expr_at, "a string")
            _optional(expression, "operator", str, expr_at, "a string")
            for k, value in enumerate(_optional(expression, "values", list, expr_at, "a list") or ()):
                _expect(value, str, f"{expr_at}.values[{k}]", "a string")


def build_response(version: str, uid: str, decision: Decision) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {
            "code": decision.code,
            "message": shorten(decision.message, MAX_MESSAGE_CHARS),
            "reason": decision.reason,
            "status": "Failure",
        }
    if decision.patch and decision.allowed:
        response["patchType"] = "JSONPatch"
        # binascii directly: base64.b64encode is a Python wrapper around the same call.
        response["patch"] = binascii.b2a_base64(dumps(decision.patch), newline=False).decode()
    # Each text is measured inline and shortened only when too long: a call per text was a
    # noticeable part of the answer.
    if decision.warnings:
        response["warnings"] = [
            w if len(w) <= MAX_WARNING_CHARS else shorten(w, MAX_WARNING_CHARS) for w in decision.warnings
        ]
    if decision.audit:
        response["auditAnnotations"] = {
            k: v if len(v) <= MAX_AUDIT_CHARS else shorten(v, MAX_AUDIT_CHARS) for k, v in decision.audit.items()
        }
    return {"apiVersion": version, "kind": "AdmissionReview", "response": response}


def is_dry_run(request: Mapping[str, Any]) -> bool:
    return bool(request.get("dryRun"))
