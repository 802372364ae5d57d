"""AdmissionReview envelopes: parse what the apiserver sends, answer in the shape it expects.

The envelope is validated with pydantic; the objects inside (`object`, `oldObject`) stay the raw
dicts the decision functions read, so nothing unknown is lost or re-serialised.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
#
# The shape rule is written once, as data: `SHAPES`, which field is an object, a list, a string, a
# map of strings or of quantities, per kind of object. Two checks are made from it for each kind:
# a yes-or-no function written out as source (`_quick`), which every checked review takes, building
# no strings, and a walk that names the first bad field (`_compiled`), taken only when the first
# says no. The pod schema (`webhook.pod_schema`) is the rule's third form, the types msgspec decodes
# a pod's review against; tests/test_pod_schema.py holds its types to `SHAPES["Pod"]` field by field.


# Leaves: what a value must be. A quantity is what the rules parse as one: a string or a number.
STRING = "a string"
QUANTITY = "a quantity"


@dataclass(frozen=True, slots=True)
class Fields:
    """A JSON object; each named field, when present and not null, has its shape. Others are free."""

    fields: tuple[tuple[str, Shape], ...]


@dataclass(frozen=True, slots=True)
class ListOf:
    item: Shape


@dataclass(frozen=True, slots=True)
class MapOf:
    """A JSON object of any keys; `values` STRING or QUANTITY, or None for values of any type (the
    pod rules read a few keys and cope with any value there, so the rest are not theirs to refuse)."""

    values: str | None


Shape = Fields | ListOf | MapOf | str

_STRINGS = MapOf(STRING)
_ANYTHING = MapOf(None)
_OBJECT = Fields(())
_NAMES = tuple((key, STRING) for key in ("name", "namespace", "generateName", "uid", "resourceVersion"))


def _metadata(values: MapOf) -> Fields:
    return Fields((*_NAMES, ("labels", values), ("annotations", values), ("ownerReferences", ListOf(_OBJECT))))


_REQUIREMENT = Fields((("key", STRING), ("operator", STRING), ("values", ListOf(STRING))))
_TERMS = Fields((("nodeSelectorTerms", ListOf(Fields((("matchExpressions", ListOf(_REQUIREMENT)),)))),))
_NODE_AFFINITY = Fields((("requiredDuringSchedulingIgnoredDuringExecution", _TERMS),))
_CONTAINER = Fields((("resources", Fields((("limits", MapOf(QUANTITY)), ("requests", MapOf(QUANTITY))))),))
POD_SPEC = Fields(
    (
        ("priorityClassName", STRING),
        ("containers", ListOf(_CONTAINER)),
        ("initContainers", ListOf(_CONTAINER)),
        (
            "affinity",
            Fields((("nodeAffinity", Fields((("requiredDuringSchedulingIgnoredDuringExecution", _TERMS),))),)),
        ),
    )
)
_TEMPLATE = Fields((("metadata", Fields((("labels", _ANYTHING), ("annotations", _ANYTHING)))), ("spec", POD_SPEC)))


def _with_template(*path: str) -> Fields:
    """A pod owner: its pod template at `path`. Its own labels and annotations are any map, as a pod's."""
    node: Shape = _TEMPLATE
    for key in reversed(path):
        node = Fields(((key, node),))
    assert isinstance(node, Fields)
    return Fields((("metadata", _metadata(_ANYTHING)), *node.fields))


# The object of each kind the rules read; any other kind is `OTHER`.
OTHER = Fields((("metadata", _metadata(_STRINGS)), ("spec", _OBJECT)))
SHAPES: dict[str, Fields] = {
    "Pod": Fields((("metadata", _metadata(_ANYTHING)), ("spec", POD_SPEC))),
    "Deployment": _with_template("spec", "template"),
    "StatefulSet": _with_template("spec", "template"),
    "ReplicaSet": _with_template("spec", "template"),
    "Job": _with_template("spec", "template"),
    "CronJob": _with_template("spec", "jobTemplate", "spec", "template"),
    "ConfigMap": Fields((("metadata", _metadata(_STRINGS)), ("data", _STRINGS), ("spec", _OBJECT))),
}


class _Shape(Exception):
    """A value of the wrong type: what it must be, and its path, gathered from the bottom up."""

    def __init__(self, what: str, value: Any, step: str = "") -> None:
        super().__init__(what)
        self.what = what
        self.value = value
        self.steps = [step] if step else []

    def message(self, where: str) -> str:
        return f"{where}{''.join(reversed(self.steps))}: must be {self.what}, got {_type_name(self.value)}"


_QUANTITY_TYPES = (str, int, float)  # exact types: a boolean is no quantity
Walk = Callable[[Any], None]


def _compiled(shape: Shape) -> Walk:
    """The walk of `shape`: returns on a good value, raises _Shape naming the first bad one."""
    if shape == STRING:

        def walk_string(value: Any) -> None:
            if type(value) is not str:
                raise _Shape(STRING, value)

        return walk_string
    if isinstance(shape, MapOf):
        what = "a map of quantities" if shape.values == QUANTITY else "a map of strings"
        values = shape.values

        def walk_map(value: Any) -> None:
            if type(value) is not dict:
                raise _Shape(what, value)
            if values == STRING:
                for name, item in value.items():
                    if type(item) is not str:
                        raise _Shape(STRING, item, f"[{shorten(repr(name), 80)}]")
            elif values == QUANTITY:
                for name, item in value.items():
                    if type(item) not in _QUANTITY_TYPES:
                        raise _Shape(QUANTITY, item, f"[{shorten(repr(name), 80)}]")

        return walk_map
    if isinstance(shape, ListOf):
        item_walk = _compiled(shape.item)

        def walk_list(value: Any) -> None:
            if type(value) is not list:
                raise _Shape("a list", value)
            for i, item in enumerate(value):
                try:
                    item_walk(item)
                except _Shape as bad:
                    bad.steps.append(f"[{i}]")
                    raise

        return walk_list
    assert isinstance(shape, Fields)
    # A string field is checked in place: most fields the rules read are strings.
    fields = tuple((key, child == STRING, _compiled(child)) for key, child in shape.fields)

    def walk_fields(value: Any) -> None:
        if type(value) is not dict:
            raise _Shape("an object", value)
        for key, is_string, walk in fields:
            field = value.get(key)
            if field is None:
                continue
            if is_string:
                if type(field) is not str:
                    raise _Shape(STRING, field, f".{key}")
                continue
            try:
                walk(field)
            except _Shape as bad:
                bad.steps.append(f".{key}")
                raise

    return walk_fields


def _quick_source(shape: Fields) -> str:
    """The source of a function that says only yes or no for `shape`: each check written out as it
    would be by hand (exact types, no calls, no strings), which a walk over `SHAPES` at run time is
    not: interpreting the shapes cost about half again as much, on every review of a workload."""
    lines = ["def quick(v0):"]
    names = iter(range(1, 1_000))

    def emit(node: Shape, var: str, depth: int) -> None:
        pad = "    " * depth
        if node == STRING:
            lines.append(f"{pad}if type({var}) is not str: return False")
        elif isinstance(node, MapOf):
            lines.append(f"{pad}if type({var}) is not dict: return False")
            if node.values is not None:
                item = f"v{next(names)}"
                lines.append(f"{pad}for {item} in {var}.values():")
                if node.values == STRING:
                    lines.append(f"{pad}    if type({item}) is not str: return False")
                else:
                    lines.append(f"{pad}    if type({item}) not in QUANTITY_TYPES: return False")
        elif isinstance(node, ListOf):
            item = f"v{next(names)}"
            lines.append(f"{pad}if type({var}) is not list: return False")
            lines.append(f"{pad}for {item} in {var}:")
            emit(node.item, item, depth + 1)
        else:
            assert isinstance(node, Fields)
            lines.append(f"{pad}if type({var}) is not dict: return False")
            for key, child in node.fields:
                field = f"v{next(names)}"
                lines.append(f"{pad}{field} = {var}.get({key!r})")
                lines.append(f"{pad}if {field} is not None:")
                emit(child, field, depth + 1)

    emit(shape, "v0", 1)
    lines.append("    return True")
    return "\n".join(lines)


def _quick(shape: Fields) -> Callable[[Any], bool]:
    # Made from the constant SHAPES once, at import: no request's data is ever part of the source.
    namespace: dict[str, Any] = {"QUANTITY_TYPES": _QUANTITY_TYPES}
    exec(compile(_quick_source(shape), "<object shape quick check>", "exec"), namespace)
    return cast(Callable[[Any], bool], namespace["quick"])


# Per kind: the yes-or-no check every review takes, and the walk that names the field, taken only
# when the first says no. Both are made from the one shape; tests/test_robustness.py holds them to
# the same verdict.
_CHECKS = {kind: (_quick(shape), _compiled(shape)) for kind, shape in SHAPES.items()}
_OTHER_CHECKS = (_quick(OTHER), _compiled(OTHER))


def object_errors(request: Mapping[str, Any]) -> str | None:
    """Why `object` or `oldObject` cannot be read by the rules, naming the field; None when fine."""
    kind = request.get("kind")
    kind_name = (kind.get("kind") if isinstance(kind, dict) else None) or ""
    quick, walk = _CHECKS.get(kind_name, _OTHER_CHECKS) if type(kind_name) is str else _OTHER_CHECKS
    for key in ("object", "oldObject"):
        obj = request.get(key)
        if obj is not None and not quick(obj):
            try:
                walk(obj)
            except _Shape as bad:
                return bad.message(key)
    return None


def _type_name(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


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
