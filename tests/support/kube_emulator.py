"""A small, stateful Kubernetes API server for tests, reached by the real client over HTTP.

What it keeps real (because the webhook depends on it): one global, monotonically increasing
resourceVersion; 409 on a stale update and on a create that exists; 404/409/410/422 as proper
`Status` objects; label and field selectors; merge and JSON patches; finalizers and namespace
termination; watches replayed from a resourceVersion out of a bounded history, with `410 Gone`
(an ERROR event inside the stream, as the apiserver's watch cache sends it) once that history
is gone; consistent paginated lists; items of built-in lists without kind/apiVersion.

Deliberate simplifications (say so when a test relies on them):
- strategic-merge-patch is applied as a JSON merge patch (lists are replaced, not merged by key);
  server-side apply is refused with 415;
- pods are deleted at once (no kubelet, no grace period) unless they carry finalizers;
- the namespace controller runs inline: deleting a namespace deletes its content immediately and
  the namespace goes once its content is gone and `metadata.finalizers` is empty
  (`spec.finalizers` is not emulated);
- a create keeps the `status` it is given (handy for tests; the apiserver resets pod status), while
  updates of the main resource keep the stored status for kinds with a status subresource;
- no admission, defaulting or schema validation of its own beyond names; an admission chain
  (`tests/support/admission_chain.py`) can be attached: `AdmissionChain(...).install(emulator)`
  then runs the apiserver's admission on every create, update and delete made over HTTP.

RBAC (opt-in, `KubeEmulator(rbac=True)`): every request from a non-superuser token is authorized
as the apiserver's RBAC authorizer does it, from the Role/ClusterRole/RoleBinding/ClusterRoleBinding
objects stored here (rbac.authorization.k8s.io/v1). Denials answer 403 with the apiserver's
message and are recorded in `denials`; allowed requests are recorded in `granted`. Not emulated:
aggregated ClusterRoles, impersonation, the escalation check on writes of RBAC objects, and the
default bindings beyond discovery (any authenticated user may GET /api, /apis, /version).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import random
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import jsonpatch
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

Obj = dict[str, Any]
ObjKey = tuple[str, str]  # (namespace or "", name)

_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool = False
    generation: bool = False
    custom: bool = False  # custom resources keep kind/apiVersion in list items, built-ins do not
    field_labels: frozenset[str] = frozenset()  # selectable beyond metadata.name/namespace
    virtual: bool = False  # create-only review APIs (TokenReview, SubjectAccessReview)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def verbs(self) -> tuple[str, ...]:
        return ("create",) if self.virtual else _ALL_VERBS


POD_FIELDS = frozenset(
    {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
     "status.phase", "status.podIP", "status.nominatedNodeName"}
)  # fmt: skip
EVENT_FIELDS = frozenset(
    {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
     "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
     "reason", "reportingComponent", "source", "type"}
)  # fmt: skip

NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", False, status_subresource=True,
                          field_labels=frozenset({"status.phase"}))  # fmt: skip
PODS = ResourceType("", "v1", "pods", "Pod", True, status_subresource=True, field_labels=POD_FIELDS)
CONFIGMAPS = ResourceType("", "v1", "configmaps", "ConfigMap", True)
SECRETS = ResourceType("", "v1", "secrets", "Secret", True, field_labels=frozenset({"type"}))
EVENTS = ResourceType("", "v1", "events", "Event", True, field_labels=EVENT_FIELDS)
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True)
PRIORITY_CLASSES = ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False)
DEPLOYMENTS = ResourceType("apps", "v1", "deployments", "Deployment", True, status_subresource=True,
                           generation=True)  # fmt: skip
LOCAL_QUEUES = ResourceType("kueue.x-k8s.io", "v1beta1", "localqueues", "LocalQueue", True,
                            status_subresource=True, generation=True, custom=True)  # fmt: skip
TOKEN_REVIEWS = ResourceType("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False,
                             virtual=True)  # fmt: skip
SUBJECT_ACCESS_REVIEWS = ResourceType("authorization.k8s.io", "v1", "subjectaccessreviews",
                                      "SubjectAccessReview", False, virtual=True)  # fmt: skip

RBAC_GROUP = "rbac.authorization.k8s.io"
ROLES = ResourceType(RBAC_GROUP, "v1", "roles", "Role", True)
CLUSTER_ROLES = ResourceType(RBAC_GROUP, "v1", "clusterroles", "ClusterRole", False)
ROLE_BINDINGS = ResourceType(RBAC_GROUP, "v1", "rolebindings", "RoleBinding", True)
CLUSTER_ROLE_BINDINGS = ResourceType(RBAC_GROUP, "v1", "clusterrolebindings", "ClusterRoleBinding", False)
RBAC_RESOURCES = (ROLES, CLUSTER_ROLES, ROLE_BINDINGS, CLUSTER_ROLE_BINDINGS)

DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    NAMESPACES, PODS, CONFIGMAPS, SECRETS, EVENTS, LEASES, PRIORITY_CLASSES, DEPLOYMENTS,
    LOCAL_QUEUES, TOKEN_REVIEWS, SUBJECT_ACCESS_REVIEWS,
)  # fmt: skip

_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
    409: "Conflict", 410: "Gone", 415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests",
    500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout",
}  # fmt: skip
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_PATH_SEGMENT = re.compile(r"^(?!\.\.?$)[^/%]+$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the apiserver's: no vowels, no look-alikes


class ApiError(Exception):
    """Answered as a `Status` object with this HTTP code."""

    def __init__(self, code: int, message: str, reason: str | None = None, details: Obj | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, f'{rt.plural}{"." + rt.group if rt.group else ""} "{name}" not found',
                    details={"name": name, "group": rt.group, "kind": rt.plural})  # fmt: skip


# -- selectors -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # exists, !, =, !=, in, notin
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op == "=":
            return present and value in self.values
        if self.op == "in":
            return present and value in self.values
        # != and notin also match objects without the key, as in Kubernetes.
        return not present or value not in self.values


_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_SET_RE = re.compile(rf"^(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQ_RE = re.compile(rf"^(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>[-A-Za-z0-9_.]*)$")
_EXISTS_RE = re.compile(rf"^(?P<neg>!?)\s*(?P<key>{_KEY})$")


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, []
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [t.strip() for t in terms if t.strip()]


def parse_label_selector(selector: str) -> list[Requirement]:
    """Kubernetes label selector syntax: `a=b, c!=d, e in (f,g), h notin (i), j, !k`."""
    requirements = []
    for term in _split_terms(selector):
        if m := _SET_RE.match(term):
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            requirements.append(Requirement(m["key"], m["op"], values))
        elif m := _EQ_RE.match(term):
            op = "!=" if m["op"] == "!=" else "="
            requirements.append(Requirement(m["key"], op, frozenset({m["value"]})))
        elif m := _EXISTS_RE.match(term):
            requirements.append(Requirement(m["key"], "!" if m["neg"] else "exists"))
        else:
            raise ApiError(400, f"unable to parse requirement: {term!r}")
    return requirements


def parse_field_selector(selector: str, rt: ResourceType) -> list[tuple[str, str, str]]:
    allowed = {"metadata.name", "metadata.namespace"} | rt.field_labels
    result = []
    for term in _split_terms(selector):
        m = re.match(r"^([A-Za-z0-9.]+)\s*(==|=|!=)\s*(.*)$", term)
        if not m:
            raise ApiError(400, f"invalid field selector: {term!r}")
        path, op, value = m.groups()
        if path not in allowed:
            raise ApiError(400, f'field label not supported: "{path}" for {rt.kind}')
        result.append((path, "!=" if op == "!=" else "=", value))
    return result


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return "" if node is None else str(node)


@dataclass(frozen=True, slots=True)
class Selector:
    labels: tuple[Requirement, ...] = ()
    fields: tuple[tuple[str, str, str], ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if not all(r.matches(labels) for r in self.labels):
            return False
        return all((_field_value(obj, path) == value) == (op == "=") for path, op, value in self.fields)


# -- auth tables -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class User:
    username: str
    groups: tuple[str, ...] = ()
    uid: str = ""


@dataclass(frozen=True, slots=True)
class AccessRequest:
    """A SubjectAccessReview's question, flattened."""

    user: str
    groups: tuple[str, ...]
    verb: str
    resource: str  # "" for non-resource requests
    namespace: str | None = None
    group: str = ""
    name: str = ""
    subresource: str = ""
    path: str = ""  # non-resource URL


@dataclass(frozen=True, slots=True)
class AccessRule:
    """`subject` is a user name or `group:<name>`; `*` is a wildcard; namespace None = everywhere."""

    subject: str
    verb: str = "*"
    resource: str = "*"
    namespace: str | None = None

    def allows(self, req: AccessRequest) -> bool:
        subjects = {req.user, *(f"group:{g}" for g in req.groups)}
        resource = f"{req.resource}/{req.subresource}" if req.subresource else req.resource
        return (
            self.subject in subjects
            and self.verb in ("*", req.verb)
            and self.resource in ("*", resource)
            and (self.namespace is None or self.namespace == req.namespace)
        )


@dataclass(frozen=True, slots=True)
class Denial:
    """A request the RBAC mode refused, and the message it answered with."""

    request: AccessRequest
    message: str


# Any authenticated user may read these (the default `system:discovery` and
# `system:public-info-viewer` bindings); longer /api and /apis paths are resource requests.
_DISCOVERY_PREFIXES = ("/api", "/apis", "/version", "/healthz", "/livez", "/readyz", "/openapi")
_VERB_OF_METHOD = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
                   "DELETE": "delete"}  # fmt: skip
_NAMESPACE_SUBRESOURCES = ("status", "finalize")


def request_attributes(
    method: str, path: str, query: Mapping[str, str], user: str, groups: tuple[str, ...]
) -> AccessRequest:
    """The authorization attributes of one HTTP request, as the apiserver's RequestInfoFactory
    derives them: verb from method and query, namespace, resource, subresource and name from the
    path; a list or watch names an object only through a `metadata.name` field selector."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return AccessRequest(user, groups, method.lower(), "", path=path or "/")
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]  # also for the Namespace object itself, as in Kubernetes
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    verb = _VERB_OF_METHOD.get(method, method.lower())
    if verb == "delete" and not name:
        verb = "deletecollection"
    if verb == "get" and not name:
        verb = "watch" if _truthy(query.get("watch")) else "list"
        for term in _split_terms(query.get("fieldSelector", "")):
            m = re.match(r"^metadata\.name\s*==?\s*(.+)$", term)
            if m:
                name = m[1].strip()
    return AccessRequest(user, groups, verb, resource, namespace or None, group, name, subresource)


def _subject_matches(subject: Mapping[str, Any], user: str, groups: tuple[str, ...], binding_ns: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == user
    if kind == "Group":
        return name in groups
    if kind == "ServiceAccount":
        # A RoleBinding may leave out the namespace of a ServiceAccount of its own namespace.
        namespace = subject.get("namespace") or binding_ns
        return bool(namespace) and user == f"system:serviceaccount:{namespace}:{name}"
    return False


def _rule_allows(rule: Mapping[str, Any], req: AccessRequest) -> bool:
    """rbac/v1 PolicyRule matching, as `RuleAllows` in Kubernetes."""
    verbs = rule.get("verbs") or ()
    if "*" not in verbs and req.verb not in verbs:
        return False
    if not req.resource:  # a non-resource URL
        return any(u == req.path or (u.endswith("*") and req.path.startswith(u[:-1]))
                   for u in rule.get("nonResourceURLs") or ())  # fmt: skip
    groups = rule.get("apiGroups") or ()
    if "*" not in groups and req.group not in groups:
        return False
    combined = f"{req.resource}/{req.subresource}" if req.subresource else req.resource
    resources = rule.get("resources") or ()
    if not any(r in ("*", combined) or (req.subresource and r == f"*/{req.subresource}") for r in resources):
        return False
    names = rule.get("resourceNames") or ()
    return not names or req.name in names


def forbidden_message(req: AccessRequest) -> str:
    """The apiserver's 403 message (`responsewriters.Forbidden` over `apierrors.NewForbidden`)."""
    if not req.resource:
        return f'forbidden: User "{req.user}" cannot {req.verb} path "{req.path}"'
    resource = f"{req.resource}/{req.subresource}" if req.subresource else req.resource
    scope = f'in the namespace "{req.namespace}"' if req.namespace else "at the cluster scope"
    why = f'User "{req.user}" cannot {req.verb} resource "{resource}" in API group "{req.group}" {scope}'
    qualified = f"{req.resource}.{req.group}" if req.group else req.resource
    return f'{qualified} "{req.name}" is forbidden: {why}' if req.name else f"{qualified} is forbidden: {why}"


def _check_event_namespace(event: Mapping[str, Any], ns: str) -> None:
    """The apiserver's legacy Event validation: an Event lives in its object's namespace, and one
    about a cluster-scoped object (a Namespace, a Node) in `default`."""
    involved = (event.get("involvedObject") or {}).get("namespace") or ""
    expected = involved or "default"
    if ns != expected:
        raise ApiError(
            422,
            f'Event "{(event.get("metadata") or {}).get("name", "")}" is invalid: involvedObject.namespace: '
            f"Invalid value: {involved!r}: does not match event.namespace",
            "Invalid",
        )


# -- recorded requests and watches -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    query: Mapping[str, str]
    body: Any

    @property
    def is_watch(self) -> bool:
        return _truthy(self.query.get("watch"))


@dataclass(slots=True)
class _Event:
    rv: int
    rt_key: tuple[str, str]
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None  # the object before this event (None for ADDED)


_BODY = web.RequestKey("body", object)  # the parsed request body, read once by the middleware
_DROP = object()  # abort the connection, as a network failure would
_CLOSE = object()  # end the stream cleanly, as at timeoutSeconds


@dataclass(eq=False, slots=True)
class _Watch:
    rt: ResourceType
    namespace: str | None
    selector: Selector
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)


@dataclass(slots=True)
class _Fault:
    remaining: int
    status: int
    path_prefix: str | None
    method: str | None
    delay: float = 0.0  # seconds before answering; with status 0 the request then proceeds normally


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "t", "true")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _without_rv(obj: Mapping[str, Any]) -> Obj:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}


@dataclass(frozen=True, slots=True)
class AdmissionAttributes:
    """One write as admission sees it (the apiserver's admission.Attributes)."""

    operation: str  # CREATE, UPDATE, DELETE
    rt: ResourceType
    namespace: str
    name: str
    obj: Obj | None  # None on DELETE
    old: Obj | None  # None on CREATE
    dry_run: bool
    user: User
    subresource: str = ""


class Admission(Protocol):
    """Called around a write made over HTTP: `mutate` before the object is prepared for storage
    (it may return a changed object), `validate` on the prepared object just before it is stored.
    Both raise ApiError to refuse."""

    async def mutate(self, attrs: AdmissionAttributes) -> Obj | None: ...

    async def validate(self, attrs: AdmissionAttributes) -> None: ...


Observer = Callable[[str, ResourceType, Obj], None]  # (event type, resource type, object) per commit
ADMIN = User("kubernetes-admin", ("system:masters", "system:authenticated"), "admin-uid")


class KubeEmulator:
    """Start with `async with KubeEmulator() as kube:`; point a client at `kube.client_config()`."""

    def __init__(
        self,
        *,
        token: str | None = None,
        resources: Iterable[ResourceType] = DEFAULT_RESOURCES,
        history_limit: int = 1000,
        strict_namespaces: bool = True,
        default_watch_timeout: float = 1800.0,
        bookmark_interval: float | None = None,
        gone_in_stream: bool = True,
        rbac: bool = False,
    ) -> None:
        self.token = token  # when set, every request needs `Authorization: Bearer <token>` (or a user's)
        # RBAC mode: users' requests are authorized by the stored RBAC objects; `token` is a superuser.
        self.rbac = rbac
        self.denials: list[Denial] = []
        self.granted: list[AccessRequest] = []  # the allowed requests of non-superusers
        self.strict_namespaces = strict_namespaces  # 404/403 for content of missing/terminating ns
        self.history_limit = history_limit
        self.default_watch_timeout = default_watch_timeout
        self.bookmark_interval = bookmark_interval
        # True: a too-old watch gets 200 and an ERROR event (the watch cache); False: HTTP 410.
        self.gone_in_stream = gone_in_stream
        self.latency = 0.0  # seconds added to every request
        # Seconds added to every list (a GET without watch=true) whose path starts with the key:
        # a large cluster's slow first list, e.g. {"/api/v1/pods": 5.0}. Read while waiting, so
        # removing the entry lets the lists under way finish at once.
        self.list_latency: dict[str, float] = {}
        self.requests: list[RecordedRequest] = []
        self.users: dict[str, User] = {}  # token -> user, for TokenReview
        self.rules: list[AccessRule] = []  # for SubjectAccessReview, unless `authorizer` is set
        self.authorizer: Callable[[AccessRequest], bool] | None = None
        self._types: dict[tuple[str, str], ResourceType] = {}
        for rt in (*resources, *(RBAC_RESOURCES if rbac else ())):
            self.add_resource(rt)
        self._store: dict[tuple[str, str], dict[ObjKey, Obj]] = {}
        self._rv = 1
        self._history: deque[_Event] = deque()
        self._floor = self._rv  # watches/lists older than this get 410 Gone
        self._watches: dict[_Watch, web.Request] = {}
        self._faults: list[_Fault] = []
        self._continues: dict[str, tuple[int, list[Obj]]] = {}
        self._runner: web.AppRunner | None = None
        self._port = 0
        self.admission: Admission | None = None  # runs on writes made over HTTP when set
        self.observers: list[Observer] = []  # told of every committed change, e.g. an admission cache
        # Every cluster has `default`; Events about cluster-scoped objects live there.
        self.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware], client_max_size=16 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        for watch in list(self._watches):
            watch.queue.put_nowait(_CLOSE)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> KubeEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def client_config(self, token: str | None = None) -> Configuration:
        config = Configuration(host=self.url)
        bearer = token or self.token
        if bearer:
            config.api_key = {"BearerToken": bearer}
            config.api_key_prefix = {"BearerToken": "Bearer"}
        return config

    def api_client(self, token: str | None = None) -> ApiClient:
        return ApiClient(self.client_config(token))

    # -- resource types ----------------------------------------------------------------------------
    def add_resource(self, rt: ResourceType) -> None:
        """Register a type (e.g. install a CRD in the middle of a test)."""
        self._types[rt.key] = rt

    def remove_resource(self, kind: str) -> None:
        """Unregister a type (its URLs answer 404, like a missing CRD); its objects are kept."""
        rt = self._resolve(kind)
        self._types.pop(rt.key, None)
        for watch in [w for w in self._watches if w.rt.key == rt.key]:
            watch.queue.put_nowait(_CLOSE)

    def _resolve(self, kind: str) -> ResourceType:
        for rt in self._types.values():
            if kind in (rt.kind, rt.plural, f"{rt.plural}.{rt.group}"):
                return rt
        raise KeyError(f"unknown resource {kind!r}")

    def _resolve_object(self, obj: Mapping[str, Any]) -> ResourceType:
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        for rt in self._types.values():
            if rt.kind == kind and (not api_version or rt.api_version == api_version):
                return rt
        raise KeyError(f"unknown resource {api_version}/{kind}")

    # -- fault injection and inspection ------------------------------------------------------------
    def fail_next(
        self, n: int = 1, status: int = 500, path_prefix: str | None = None, method: str | None = None
    ) -> None:
        """The next `n` requests (matching the path prefix and method, if given) fail with `status`."""
        self._faults.append(_Fault(n, status, path_prefix, method.upper() if method else None))

    def slow_next(
        self, n: int = 1, seconds: float = 40.0, path_prefix: str | None = None, method: str | None = None
    ) -> None:
        """The next `n` matching requests hang for `seconds`, then are answered normally."""
        self._faults.append(_Fault(n, 0, path_prefix, method.upper() if method else None, seconds))

    def clear_faults(self) -> None:
        self._faults.clear()

    def drop_watches(self) -> int:
        """Abort every open watch connection without a clean end; returns how many."""
        for watch in self._watches:
            watch.queue.put_nowait(_DROP)
        return len(self._watches)

    def close_watches(self) -> int:
        """End every open watch cleanly, as the apiserver does at timeoutSeconds."""
        for watch in self._watches:
            watch.queue.put_nowait(_CLOSE)
        return len(self._watches)

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    def calls(
        self, method: str | None = None, path_prefix: str | None = None, watch: bool | None = None
    ) -> list[RecordedRequest]:
        return [
            r
            for r in self.requests
            if (method is None or r.method == method.upper())
            and (path_prefix is None or r.path.startswith(path_prefix))
            and (watch is None or r.is_watch == watch)
        ]

    @property
    def resource_version(self) -> int:
        return self._rv

    def compact(self) -> None:
        """Forget all history: a watch or exact list from any older resourceVersion gets 410 Gone."""
        self._history.clear()
        self._floor = self._rv
        self._continues.clear()

    # -- auth tables -------------------------------------------------------------------------------
    def add_user(self, token: str, username: str, groups: Iterable[str] = (), uid: str = "") -> None:
        self.users[token] = User(username, tuple(groups), uid or str(uuid.uuid4()))

    def allow(self, subject: str, verb: str = "*", resource: str = "*", namespace: str | None = None) -> None:
        self.rules.append(AccessRule(subject, verb, resource, namespace))

    def add_service_account(self, token: str, namespace: str, name: str) -> User:
        """A token that authenticates as the ServiceAccount, with the groups Kubernetes gives it."""
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")
        self.add_user(token, f"system:serviceaccount:{namespace}:{name}", groups)
        return self.users[token]

    def rbac_allows(self, req: AccessRequest) -> bool:
        """The RBAC authorizer's decision; set `authorizer = emu.rbac_allows` to answer
        SubjectAccessReviews from the stored RBAC objects too."""
        return self._rbac_decision(req)[0]

    def _rbac_decision(self, req: AccessRequest) -> tuple[bool, str]:
        """(allowed, reason); the reason names RBAC objects a binding refers to but that are missing."""
        if not req.resource and any(req.path == p or req.path.startswith(p + "/") for p in _DISCOVERY_PREFIXES):
            return req.verb == "get" and "system:authenticated" in req.groups, ""
        errors: list[str] = []
        bindings = [(b, "") for b in self._bucket(CLUSTER_ROLE_BINDINGS).values()]
        if req.namespace:  # RoleBindings apply only in their own namespace
            bindings += [
                (b, req.namespace) for (ns, _), b in self._bucket(ROLE_BINDINGS).items() if ns == req.namespace
            ]
        for binding, ns in bindings:
            if not any(_subject_matches(s, req.user, req.groups, ns) for s in binding.get("subjects") or ()):
                continue
            ref = binding.get("roleRef") or {}
            role_name = str(ref.get("name", ""))
            role_type = ROLES if ref.get("kind") == "Role" and ns else CLUSTER_ROLES
            role = self._bucket(role_type).get((ns if role_type is ROLES else "", role_name))
            if role is None:
                errors.append(f'{role_type.plural}.{RBAC_GROUP} "{role_name}" not found')
                continue
            if any(_rule_allows(rule, req) for rule in role.get("rules") or ()):
                return True, ""
        return False, f"RBAC: [{', '.join(errors)}]" if errors else ""

    def _authorize(self, request: web.Request, user: User) -> ApiError | None:
        groups = tuple(dict.fromkeys((*user.groups, "system:authenticated")))
        req = request_attributes(request.method, request.path, request.query, user.username, groups)
        allowed, reason = self._rbac_decision(req)
        if allowed:
            self.granted.append(req)
            return None
        message = forbidden_message(req) + (f": {reason}" if reason else "")
        self.denials.append(Denial(req, message))
        details = {"name": req.name, "group": req.group, "kind": req.resource} if req.resource else None
        return ApiError(403, message, details=details)

    def _groups_of(self, user: User) -> list[str]:
        # A real authenticator adds system:authenticated; only the RBAC mode relies on it.
        extra = ("system:authenticated",) if self.rbac else ()
        return list(dict.fromkeys((*user.groups, *extra)))

    def is_allowed(self, req: AccessRequest) -> bool:
        if self.authorizer is not None:
            return self.authorizer(req)
        return any(rule.allows(req) for rule in self.rules)

    # -- Python access (same code paths as HTTP, so watches see the changes) -----------------------
    def objects(self, kind: str, namespace: str | None = None) -> list[Obj]:
        rt = self._resolve(kind)
        return [
            copy.deepcopy(obj)
            for (ns, _), obj in sorted(self._store.get(rt.key, {}).items())
            if namespace is None or ns == namespace
        ]

    def get_object(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        rt = self._resolve(kind)
        obj = self._store.get(rt.key, {}).get((namespace or "" if rt.namespaced else "", name))
        return copy.deepcopy(obj) if obj is not None else None

    def create_object(self, obj: Mapping[str, Any]) -> Obj:
        rt = self._resolve_object(obj)
        ns = (obj.get("metadata") or {}).get("namespace", "") if rt.namespaced else ""
        return copy.deepcopy(self._create(rt, ns, copy.deepcopy(dict(obj))))

    def put_object(self, obj: Mapping[str, Any]) -> Obj:
        """Create, or replace unconditionally (unless the object carries a resourceVersion)."""
        rt = self._resolve_object(obj)
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace", "") if rt.namespaced else ""
        if meta.get("name") and (ns, meta["name"]) in self._store.get(rt.key, {}):
            return copy.deepcopy(self._update(rt, ns, meta["name"], copy.deepcopy(dict(obj)), keep_status=False))
        return copy.deepcopy(self._create(rt, ns, copy.deepcopy(dict(obj))))

    def delete_object(self, kind: str, name: str, namespace: str | None = None) -> Obj:
        rt = self._resolve(kind)
        return copy.deepcopy(self._delete(rt, namespace or "" if rt.namespaced else "", name, {}))

    # -- storage core ------------------------------------------------------------------------------
    def _bucket(self, rt: ResourceType) -> dict[ObjKey, Obj]:
        return self._store.setdefault(rt.key, {})

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _commit(self, rt: ResourceType, etype: str, key: ObjKey, obj: Obj, old: Obj | None) -> None:
        """Store (or drop) the object, record history and tell the watches. Objects are never mutated
        after this, so history and watch queues can share them."""
        if etype == "DELETED":
            self._bucket(rt).pop(key, None)
        else:
            self._bucket(rt)[key] = obj
        event = _Event(int(obj["metadata"]["resourceVersion"]), rt.key, etype, obj, old)
        self._history.append(event)
        while len(self._history) > self.history_limit:
            self._floor = self._history.popleft().rv
        for watch in self._watches:
            if watch.rt.key == rt.key:
                out = self._filter(watch, event)
                if out is not None:
                    watch.queue.put_nowait(out)
        for observer in self.observers:
            observer(etype, rt, obj)

    @staticmethod
    def _filter(watch: _Watch, event: _Event) -> tuple[str, Obj] | None:
        """What a selective watch sees: objects moving in or out of its selector become ADDED/DELETED."""
        ns = event.obj["metadata"].get("namespace")
        if watch.namespace is not None and ns != watch.namespace:
            return None
        now = watch.selector.matches(event.obj)
        before = event.old is not None and watch.selector.matches(event.old)
        if event.type == "ADDED":
            return ("ADDED", event.obj) if now else None
        if event.type == "DELETED":
            return ("DELETED", event.obj) if now or before else None
        if now and before:
            return ("MODIFIED", event.obj)
        if now:
            return ("ADDED", event.obj)
        if before:
            return ("DELETED", event.obj)
        return None

    def _check_namespace(self, rt: ResourceType, ns: str) -> None:
        if not rt.namespaced or not self.strict_namespaces:
            return
        namespace = self._bucket(NAMESPACES).get(("", ns))
        if namespace is None:
            raise _not_found(NAMESPACES, ns)
        if namespace["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                f'{rt.plural} "{rt.kind}" is forbidden: unable to create new content in namespace {ns} '
                "because it is being terminated",
            )

    def _create(self, rt: ResourceType, ns: str, body: Any, dry_run: bool = False) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        if body.get("kind", rt.kind) != rt.kind or body.get("apiVersion", rt.api_version) != rt.api_version:
            raise ApiError(400, f"the API version in the data ({body.get('apiVersion')}) does not match "
                           f"the expected API version ({rt.api_version})")  # fmt: skip
        meta = dict(body.get("metadata") or {})
        if rt.kind == "Event":
            _check_event_namespace(body, ns)
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", ns):
                raise ApiError(400, "the namespace of the provided object does not match the namespace "
                               "sent on the request")  # fmt: skip
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise ApiError(400, "resourceVersion should not be set on objects to be created")
        bucket = self._bucket(rt)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, f"{rt.kind} is invalid: metadata.name: Required value: name or "
                               "generateName is required")  # fmt: skip
            for _ in range(100):
                name = meta["generateName"] + "".join(random.choices(_GENERATE_ALPHABET, k=5))
                if (ns, name) not in bucket:
                    break
            meta["name"] = name
        name = meta["name"]
        pattern = _DNS_LABEL if rt.kind == "Namespace" else _DNS_SUBDOMAIN
        if rt.group == RBAC_GROUP:
            pattern = _PATH_SEGMENT  # RBAC names need only be path segments ("hopsworks:webhook")
        if not isinstance(name, str) or len(name) > 253 or not pattern.match(name):
            raise ApiError(422, f'{rt.kind} "{name}" is invalid: metadata.name: Invalid value: "{name}": '
                           "a lowercase RFC 1123 name must consist of lower case alphanumeric characters, "
                           "'-' or '.'")  # fmt: skip
        self._check_namespace(rt, ns)
        if (ns, name) in bucket:
            raise ApiError(409, f'{rt.plural}{"." + rt.group if rt.group else ""} "{name}" already exists',
                           reason="AlreadyExists", details={"name": name, "group": rt.group,
                                                            "kind": rt.plural})  # fmt: skip
        for transient in ("deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            meta.pop(transient, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        if rt.generation:
            meta["generation"] = 1
        obj = {**body, "apiVersion": rt.api_version, "kind": rt.kind, "metadata": meta}
        if rt.kind == "Namespace":
            obj["status"] = {"phase": "Active"}
        elif rt.kind == "Pod":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        if dry_run:
            return obj
        return self._store_created(rt, ns, obj)

    def _store_created(self, rt: ResourceType, ns: str, obj: Obj) -> Obj:
        """Commit an object `_create(dry_run=True)` prepared (re-checked: admission awaited in between)."""
        name = obj["metadata"]["name"]
        self._check_namespace(rt, ns)
        if (ns, name) in self._bucket(rt):
            raise ApiError(409, f'{rt.plural}{"." + rt.group if rt.group else ""} "{name}" already exists',
                           reason="AlreadyExists", details={"name": name, "group": rt.group,
                                                            "kind": rt.plural})  # fmt: skip
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        self._commit(rt, "ADDED", (ns, name), obj, None)
        return obj

    def _update(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        body: Any,
        subresource: str = "",
        dry_run: bool = False,
        keep_status: bool = True,
    ) -> Obj:
        current = self._bucket(rt).get((ns, name))
        if current is None:
            raise _not_found(rt, name)
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        meta = dict(body.get("metadata") or {})
        if meta.get("name", name) != name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        if rt.namespaced and meta.get("namespace", ns) != ns:
            raise ApiError(400, "the namespace of the provided object does not match the namespace "
                           "sent on the request")  # fmt: skip
        cur_meta = current["metadata"]
        sent_rv = meta.get("resourceVersion")
        if sent_rv and str(sent_rv) != cur_meta["resourceVersion"]:
            raise ApiError(409, f'Operation cannot be fulfilled on {rt.plural}{"." + rt.group if rt.group else ""} '
                           f'"{name}": the object has been modified; please apply your changes to the latest '
                           "version and try again", details={"name": name, "group": rt.group,
                                                             "kind": rt.plural})  # fmt: skip
        if subresource == "status":
            new = {**current, "status": copy.deepcopy(body.get("status"))}
            if new["status"] is None:
                new.pop("status")
        else:
            new = {**body, "apiVersion": rt.api_version, "kind": rt.kind}
            for immutable in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                              "generation"):  # fmt: skip
                if immutable in cur_meta:
                    meta[immutable] = cur_meta[immutable]
                else:
                    meta.pop(immutable, None)
            meta["name"] = name
            if rt.namespaced:
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            new["metadata"] = meta
            if rt.status_subresource and keep_status:
                if "status" in current:
                    new["status"] = current["status"]
                else:
                    new.pop("status", None)
        new["metadata"] = {**new["metadata"], "resourceVersion": cur_meta["resourceVersion"]}
        if cur_meta.get("deletionTimestamp") and set(new["metadata"].get("finalizers") or ()) - set(
            cur_meta.get("finalizers") or ()
        ):
            raise ApiError(422, f'{rt.kind} "{name}" is invalid: metadata.finalizers: Forbidden: no new '
                           "finalizers can be added if the object is being deleted")  # fmt: skip
        if new == current:
            return current  # a no-op write does not bump resourceVersion, as in Kubernetes
        if rt.generation and new.get("spec") != current.get("spec"):
            new["metadata"]["generation"] = int(cur_meta.get("generation") or 1) + 1
        if dry_run:
            return new
        new["metadata"]["resourceVersion"] = str(self._next_rv())
        self._commit(rt, "MODIFIED", (ns, name), new, current)
        self._after_write(rt, ns, name)
        return self._bucket(rt).get((ns, name), new)

    def _after_write(self, rt: ResourceType, ns: str, name: str) -> None:
        """Objects being deleted go once their last finalizer is removed."""
        obj = self._bucket(rt).get((ns, name))
        if obj is None or not obj["metadata"].get("deletionTimestamp") or obj["metadata"].get("finalizers"):
            return
        if rt.kind == "Namespace":
            self._finish_namespace(name)
        else:
            self._remove(rt, ns, name)

    def _remove(self, rt: ResourceType, ns: str, name: str) -> Obj:
        current = self._bucket(rt)[(ns, name)]
        gone = {**current, "metadata": {**current["metadata"], "resourceVersion": str(self._next_rv())}}
        self._commit(rt, "DELETED", (ns, name), gone, current)
        if rt.namespaced:
            namespace = self._bucket(NAMESPACES).get(("", ns))
            if namespace is not None and namespace["metadata"].get("deletionTimestamp"):
                self._finish_namespace(ns)
        return gone

    def _mark_deleting(self, rt: ResourceType, ns: str, name: str, extra: Obj | None = None) -> Obj:
        current = self._bucket(rt)[(ns, name)]
        meta = {**current["metadata"], "deletionTimestamp": _now(), "deletionGracePeriodSeconds": 0}
        meta["resourceVersion"] = str(self._next_rv())
        new = {**current, "metadata": meta, **(extra or {})}
        self._commit(rt, "MODIFIED", (ns, name), new, current)
        return new

    def _delete(self, rt: ResourceType, ns: str, name: str, options: Mapping[str, Any], dry_run: bool = False) -> Obj:
        current = self._bucket(rt).get((ns, name))
        if current is None:
            raise _not_found(rt, name)
        pre = options.get("preconditions") or {}
        meta = current["metadata"]
        if (pre.get("uid") and pre["uid"] != meta["uid"]) or (
            pre.get("resourceVersion") and str(pre["resourceVersion"]) != meta["resourceVersion"]
        ):
            raise ApiError(409, f'Operation cannot be fulfilled on {rt.plural} "{name}": Precondition failed',
                           details={"name": name, "group": rt.group, "kind": rt.plural})  # fmt: skip
        if dry_run:
            return current
        if rt.kind == "Namespace":
            if not meta.get("deletionTimestamp"):
                self._mark_deleting(rt, ns, name, {"status": {**(current.get("status") or {}),
                                                              "phase": "Terminating"}})  # fmt: skip
            for other in list(self._types.values()):
                if not other.namespaced:
                    continue
                for obj_ns, obj_name in [k for k in self._bucket(other) if k[0] == name]:
                    with contextlib.suppress(ApiError):
                        self._delete(other, obj_ns, obj_name, {})
            self._finish_namespace(name)
            return self._bucket(rt).get((ns, name)) or self._last_state(rt, name)
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return current
            return self._mark_deleting(rt, ns, name)
        return self._remove(rt, ns, name)

    def _last_state(self, rt: ResourceType, name: str) -> Obj:
        for event in reversed(self._history):
            if event.rt_key == rt.key and event.obj["metadata"]["name"] == name:
                return event.obj
        return {"apiVersion": rt.api_version, "kind": rt.kind, "metadata": {"name": name}}

    def _finish_namespace(self, name: str) -> None:
        namespace = self._bucket(NAMESPACES).get(("", name))
        if namespace is None or namespace["metadata"].get("finalizers"):
            return
        for rt in self._types.values():
            if rt.namespaced and any(k[0] == name for k in self._bucket(rt)):
                return
        self._remove(NAMESPACES, "", name)

    def _select(self, rt: ResourceType, items: Iterable[Obj], ns: str | None, selector: Selector) -> list[Obj]:
        return [o for o in items if (ns is None or o["metadata"].get("namespace") == ns) and selector.matches(o)]

    def _state_at(self, rt: ResourceType, rv: int) -> list[Obj]:
        """The objects of one type as they were at `rv`, by undoing later history."""
        state = dict(self._bucket(rt))
        for event in reversed(self._history):
            if event.rv <= rv:
                break
            if event.rt_key != rt.key:
                continue
            meta = event.obj["metadata"]
            key = (meta.get("namespace", ""), meta["name"])
            if event.old is None:
                state.pop(key, None)
            else:
                state[key] = event.old
        return [state[k] for k in sorted(state)]

    def _list_latency(self, path: str) -> float:
        return max((d for prefix, d in self.list_latency.items() if path.startswith(prefix)), default=0.0)

    # -- HTTP --------------------------------------------------------------------------------------
    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        raw = await request.read() if request.can_read_body else b""
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
        request[_BODY] = body
        self.requests.append(RecordedRequest(request.method, request.path, dict(request.query), body))
        if self.latency:
            await asyncio.sleep(self.latency)
        if request.method == "GET" and request.query.get("watch") not in ("true", "1"):
            started = time.monotonic()
            for _ in range(1_000_000):  # polled: the entry can be removed meanwhile
                if time.monotonic() - started >= self._list_latency(request.path):
                    break
                await asyncio.sleep(0.01)
        for fault in self._faults:
            if fault.remaining > 0 and (fault.path_prefix is None or request.path.startswith(fault.path_prefix)) and (
                fault.method is None or fault.method == request.method
            ):  # fmt: skip
                fault.remaining -= 1
                self._faults = [f for f in self._faults if f.remaining > 0]
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.status:
                    return self._status_response(ApiError(fault.status, "injected fault"))
                break
        if self.token is not None or self.rbac:
            auth = request.headers.get("Authorization", "")
            bearer = auth[7:] if auth.startswith("Bearer ") else None
            if bearer is None or (bearer != self.token and bearer not in self.users):
                return self._status_response(ApiError(401, "Unauthorized"))
            if self.rbac and bearer != self.token:
                denied = self._authorize(request, self.users[bearer])
                if denied is not None:
                    return self._status_response(denied)
        try:
            return await handler(request)
        except ApiError as exc:
            return self._status_response(exc)

    @staticmethod
    def _status_response(exc: ApiError) -> web.Response:
        return web.json_response(exc.status(), status=exc.code)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if parts == ["version"]:
            return web.json_response({"major": "1", "minor": "31", "gitVersion": "v1.31.0-emulator"})
        if parts and parts[0] == "api":
            if len(parts) == 1:
                return web.json_response({"kind": "APIVersions", "versions": ["v1"],
                                          "serverAddressByClientCIDRs": []})  # fmt: skip
            group, version, rest = "", parts[1], parts[2:]
        elif parts and parts[0] == "apis":
            if len(parts) == 1:
                return web.json_response(self._group_list())
            if len(parts) == 2:
                groups = [g for g in self._group_list()["groups"] if g["name"] == parts[1]]
                if not groups:
                    raise ApiError(404, "the server could not find the requested resource")
                return web.json_response({"kind": "APIGroup", "apiVersion": "v1", **groups[0]})
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource")
        if not rest:
            return web.json_response(self._resource_list(group, version))
        return await self._resource_request(request, group, version, rest)

    def _group_list(self) -> Obj:
        versions: dict[str, list[str]] = {}
        for rt in self._types.values():
            if rt.group and rt.version not in versions.setdefault(rt.group, []):
                versions[rt.group].append(rt.version)
        groups = [
            {
                "name": g,
                "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
            }
            for g, vs in sorted(versions.items())
        ]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _resource_list(self, group: str, version: str) -> Obj:
        resources: list[Obj] = []
        for rt in self._types.values():
            if rt.group != group or rt.version != version:
                continue
            resources.append({"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                              "kind": rt.kind, "verbs": list(rt.verbs)})  # fmt: skip
            if rt.status_subresource:
                resources.append({"name": f"{rt.plural}/status", "singularName": "", "namespaced": rt.namespaced,
                                  "kind": rt.kind, "verbs": ["get", "patch", "update"]})  # fmt: skip
        if not resources:
            raise ApiError(404, "the server could not find the requested resource")
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}

    def _type(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self._types.get((group, plural))
        if rt is None or rt.version != version:
            raise ApiError(404, "the server could not find the requested resource")
        return rt

    async def _resource_request(
        self, request: web.Request, group: str, version: str, rest: list[str]
    ) -> web.StreamResponse:
        # Shapes: {plural}[/{name}[/{sub}]] and namespaces/{ns}/{plural}[/{name}[/{sub}]].
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
            ns, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise ApiError(404, "the server could not find the requested resource")
        rt = self._type(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        if rt.namespaced and ns is None and (name is not None or request.method not in ("GET",)):
            raise ApiError(404, "the server could not find the requested resource")
        if not rt.namespaced and ns is not None:
            raise ApiError(404, "the server could not find the requested resource")
        if sub and (sub not in ("status", "finalize") or (sub == "status" and not rt.status_subresource)):
            raise ApiError(404, "the server could not find the requested resource")
        obj_ns = ns or ""
        q = request.query
        dry_run = q.get("dryRun") == "All"
        body = request.get(_BODY)
        method = request.method
        if rt.virtual:
            if method != "POST" or name is not None:
                raise ApiError(405, f"{method} is not supported on {rt.plural}")
            return web.json_response(self._review(rt, body), status=201)
        if name is None:
            if method == "GET":
                selector = self._selector(rt, q)
                if _truthy(q.get("watch")):
                    return await self._watch(request, rt, ns, selector)
                return web.json_response(self._list(rt, ns, selector, q))
            if method == "POST":
                if self.admission is not None:
                    created = await self._admitted_create(request, rt, obj_ns, body, dry_run)
                    return web.json_response(created, status=201)
                return web.json_response(self._create(rt, obj_ns, body, dry_run), status=201)
            if method == "DELETE":
                selector = self._selector(rt, q)
                deleted = [self._delete(rt, o["metadata"].get("namespace", ""), o["metadata"]["name"], {}, dry_run)
                           for o in self._select(rt, list(self._bucket(rt).values()), ns, selector)]  # fmt: skip
                return web.json_response(self._list_body(rt, deleted, self._rv))
            raise ApiError(405, f"{method} is not supported on a collection")
        if method == "GET":
            obj = self._bucket(rt).get((obj_ns, name))
            if obj is None:
                raise _not_found(rt, name)
            return web.json_response(obj)
        if method == "PUT":
            if sub == "finalize":  # namespaces/{name}/finalize: spec.finalizers only, not emulated
                return web.json_response(self._bucket(rt).get((obj_ns, name)) or self._missing(rt, name))
            updated = self._update(rt, obj_ns, name, body, sub, dry_run=self.admission is not None or dry_run)
            return web.json_response(await self._admitted_update(request, rt, obj_ns, name, updated, sub, dry_run))
        if method == "PATCH":
            patched = self._patch(
                rt, obj_ns, name, request.content_type, body, sub, self.admission is not None or dry_run
            )
            return web.json_response(await self._admitted_update(request, rt, obj_ns, name, patched, sub, dry_run))
        if method == "DELETE":
            options = body if isinstance(body, dict) else {}
            if self.admission is not None:
                current = self._bucket(rt).get((obj_ns, name))
                if current is None:
                    raise _not_found(rt, name)
                attrs = AdmissionAttributes(
                    "DELETE", rt, obj_ns, name, None, current, dry_run, self._request_user(request), sub
                )
                await self.admission.mutate(attrs)
                await self.admission.validate(attrs)
            return web.json_response(self._delete(rt, obj_ns, name, options, dry_run))
        raise ApiError(405, f"{method} is not supported")

    def _request_user(self, request: web.Request) -> User:
        auth = request.headers.get("Authorization", "")
        return self.users.get(auth[7:] if auth.startswith("Bearer ") else "", ADMIN)

    async def _admitted_create(self, request: web.Request, rt: ResourceType, ns: str, body: Any, dry_run: bool) -> Obj:
        """The apiserver's order: mutating admission on the object as sent (no name from
        generateName, no uid yet), then naming and defaults, then validating admission, then storage."""
        assert self.admission is not None
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        user = self._request_user(request)
        name = str((body.get("metadata") or {}).get("name") or "")
        attrs = AdmissionAttributes("CREATE", rt, ns, name, copy.deepcopy(body), None, dry_run, user)
        mutated = await self.admission.mutate(attrs)
        prepared = self._create(rt, ns, mutated if mutated is not None else body, dry_run=True)
        final = AdmissionAttributes("CREATE", rt, ns, prepared["metadata"]["name"], prepared, None, dry_run, user)
        await self.admission.validate(final)
        return prepared if dry_run else self._store_created(rt, ns, prepared)

    async def _admitted_update(
        self, request: web.Request, rt: ResourceType, ns: str, name: str, new: Obj, sub: str, dry_run: bool
    ) -> Obj:
        """`new` is the update as prepared (not stored) when admission is on; else already stored."""
        current = self._bucket(rt).get((ns, name))
        if self.admission is None or current is None or new is current:
            return new  # no admission, or a no-op write (stored as it was)
        user = self._request_user(request)
        attrs = AdmissionAttributes("UPDATE", rt, ns, name, copy.deepcopy(new), current, dry_run, user, sub)
        mutated = await self.admission.mutate(attrs)
        candidate = mutated if mutated is not None else new
        final = AdmissionAttributes("UPDATE", rt, ns, name, candidate, current, dry_run, user, sub)
        await self.admission.validate(final)
        # Written with the resourceVersion it was prepared from: a change made meanwhile is a 409.
        return self._update(rt, ns, name, candidate, sub, dry_run)

    @staticmethod
    def _missing(rt: ResourceType, name: str) -> Obj:
        raise _not_found(rt, name)

    def _selector(self, rt: ResourceType, q: Mapping[str, str]) -> Selector:
        return Selector(
            tuple(parse_label_selector(q.get("labelSelector", ""))),
            tuple(parse_field_selector(q.get("fieldSelector", ""), rt)),
        )

    def _patch(
        self, rt: ResourceType, ns: str, name: str, content_type: str, patch: Any, sub: str, dry_run: bool
    ) -> Obj:
        current = self._bucket(rt).get((ns, name))
        if current is None:
            raise _not_found(rt, name)
        if content_type == "application/json-patch+json":
            if not isinstance(patch, list):
                raise ApiError(400, "json patch must be a list of operations")
            try:
                patched = jsonpatch.apply_patch(current, patch)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, f"the server rejected our request due to an error in our request: {exc}") from None
        elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(patch, dict):
                raise ApiError(400, "merge patch must be a JSON object")
            patched = merge_patch(current, patch)
        else:
            raise ApiError(415, "the body of the request was in an unknown format - accepted media types "
                           "include: application/json-patch+json, application/merge-patch+json, "
                           "application/strategic-merge-patch+json")  # fmt: skip
        if not isinstance(patched, dict):
            raise ApiError(422, "the patch does not produce an object")
        if sub != "status" and rt.status_subresource:
            patched["status"] = current.get("status")
            if patched["status"] is None:
                patched.pop("status")
        return self._update(rt, ns, name, patched, sub, dry_run)

    def _list_body(self, rt: ResourceType, items: list[Obj], rv: int, cont: str = "", remaining: int = 0) -> Obj:
        if not rt.custom:  # the apiserver omits these on items of built-in lists
            items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in items]
        meta: Obj = {"resourceVersion": str(rv)}
        if cont:
            meta["continue"] = cont
            meta["remainingItemCount"] = remaining
        return {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": items}

    def _list(self, rt: ResourceType, ns: str | None, selector: Selector, q: Mapping[str, str]) -> Obj:
        limit = int(q.get("limit") or 0)
        token = q.get("continue")
        if token:
            try:
                decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
                snap_id, offset = decoded["id"], int(decoded["offset"])
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "continue key is not valid") from None
            if snap_id not in self._continues:
                raise ApiError(410, "The provided continue parameter is too old to display a consistent list "
                               "result. You can start a new list without the continue parameter.",
                               reason="Expired")  # fmt: skip
            rv, items = self._continues[snap_id]
        else:
            rv, offset = self._rv, 0
            requested, match = q.get("resourceVersion", ""), q.get("resourceVersionMatch", "")
            if requested not in ("", "0"):
                try:
                    wanted = int(requested)
                except ValueError:
                    raise ApiError(400, f"invalid resource version: {requested}") from None
                if wanted > self._rv:
                    raise ApiError(504, "Too large resource version", reason="Timeout")
                if match == "Exact":
                    if wanted < self._floor:
                        raise ApiError(410, f"too old resource version: {wanted} ({self._floor})", reason="Expired")
                    rv = wanted
            source = self._state_at(rt, rv) if rv != self._rv else [
                self._bucket(rt)[k] for k in sorted(self._bucket(rt))
            ]  # fmt: skip
            items = self._select(rt, source, ns, selector)
        page = items[offset : offset + limit] if limit else items[offset:]
        cont = ""
        if limit and offset + limit < len(items):
            snap_id = decoded["id"] if token else uuid.uuid4().hex
            self._continues[snap_id] = (rv, items)
            while len(self._continues) > 64:
                self._continues.pop(next(iter(self._continues)))
            cont = base64.urlsafe_b64encode(json.dumps({"id": snap_id, "offset": offset + limit}).encode()).decode()
        return self._list_body(rt, page, rv, cont, len(items) - offset - len(page))

    async def _watch(
        self, request: web.Request, rt: ResourceType, ns: str | None, selector: Selector
    ) -> web.StreamResponse:
        q = request.query
        requested = q.get("resourceVersion", "")
        timeout = float(q.get("timeoutSeconds") or self.default_watch_timeout)
        bookmarks = _truthy(q.get("allowWatchBookmarks"))
        watch = _Watch(rt, ns, selector)
        initial: list[tuple[str, Obj]] = []
        gone: ApiError | None = None
        # No await between reading history and registering: no event can fall in between.
        if requested in ("", "0"):
            items = self._select(rt, [self._bucket(rt)[k] for k in sorted(self._bucket(rt))], ns, selector)
            initial = [("ADDED", o) for o in items]
        else:
            try:
                since = int(requested)
            except ValueError:
                raise ApiError(400, f"invalid resource version: {requested}") from None
            if since < self._floor:
                gone = ApiError(410, f"too old resource version: {since} ({self._floor})", reason="Expired")
                if not self.gone_in_stream:
                    raise gone
            else:
                for event in self._history:
                    if event.rv > since and event.rt_key == rt.key:
                        out = self._filter(watch, event)
                        if out is not None:
                            initial.append(out)
        if gone is None:
            self._watches[watch] = request  # before the first await: no event can slip in between
        # A bookmark may only claim what this watch has delivered: the global version once its queue
        # is drained, else the version of the last event sent.
        sent = self._rv

        def bookmark() -> bytes:
            rv = self._rv if watch.queue.empty() else sent
            meta = {"resourceVersion": str(rv)}
            return self._line("BOOKMARK", {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta})

        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            if gone is not None:
                await response.write(self._line("ERROR", gone.status()))
                await response.write_eof()
                return response
            for etype, obj in initial:
                await response.write(self._line(etype, obj))
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                wait = min(remaining, self.bookmark_interval) if bookmarks and self.bookmark_interval else remaining
                try:
                    item = await asyncio.wait_for(watch.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and self.bookmark_interval and deadline - time.monotonic() > 0:
                        await response.write(bookmark())
                    continue
                if item is _DROP:
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                if item is _CLOSE:
                    break
                etype, obj = item
                await response.write(self._line(etype, obj))
                sent = int(obj["metadata"]["resourceVersion"])
            if bookmarks:  # like the apiserver: a last bookmark so the client resumes from there
                await response.write(bookmark())
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self._watches.pop(watch, None)
        return response

    @staticmethod
    def _line(etype: str, obj: Obj) -> bytes:
        return json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n"

    # -- review APIs -------------------------------------------------------------------------------
    def _review(self, rt: ResourceType, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        spec = body.get("spec") or {}
        out = {**body, "apiVersion": rt.api_version, "kind": rt.kind}
        out.setdefault("metadata", {}).setdefault("creationTimestamp", None)
        if rt.kind == "TokenReview":
            user = self.users.get(spec.get("token") or "")
            if user is None:
                out["status"] = {"authenticated": False, "user": {}, "error": "invalid bearer token"}
            else:
                out["status"] = {
                    "authenticated": True,
                    "user": {"username": user.username, "uid": user.uid, "groups": self._groups_of(user)},
                    "audiences": spec.get("audiences") or [],
                }
            return out
        attrs = spec.get("resourceAttributes")
        non_resource = spec.get("nonResourceAttributes") or {}
        if attrs is None and not non_resource:
            raise ApiError(422, "SubjectAccessReview is invalid: spec.resourceAttributes: Invalid value: "
                           "exactly one of nonResourceAttributes or resourceAttributes must be specified")  # fmt: skip
        attrs = attrs or {}
        req = AccessRequest(
            user=spec.get("user") or "",
            groups=tuple(spec.get("groups") or ()),
            verb=(attrs or non_resource).get("verb") or "",
            resource=attrs.get("resource") or "",
            namespace=attrs.get("namespace") or None,
            group=attrs.get("group") or "",
            name=attrs.get("name") or "",
            subresource=attrs.get("subresource") or "",
            path=non_resource.get("path") or "",
        )
        allowed = self.is_allowed(req)
        out["status"] = {"allowed": allowed, **({} if allowed else {"reason": "no rule allows it"})}
        return out


async def eventually(
    condition: Callable[[], Any], within_s: float = 5.0, interval_s: float = 0.01, message: str = ""
) -> Any:
    """Poll until `condition()` is truthy (returns it); fail the test after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(message or f"condition not met within {within_s}s")
        await asyncio.sleep(interval_s)
