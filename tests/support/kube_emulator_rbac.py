"""Authentication and authorization: users by token, the RBAC authorizer over the stored
Role/ClusterRole/RoleBinding/ClusterRoleBinding objects, and the TokenReview and
SubjectAccessReview APIs."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.support.kube_emulator_selectors import _split_terms
from tests.support.kube_emulator_store import KubeStore
from tests.support.kube_emulator_types import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    RBAC_GROUP,
    ROLE_BINDINGS,
    ROLES,
    ApiError,
    Obj,
    ResourceType,
    _truthy,
)


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


ADMIN = User("kubernetes-admin", ("system:masters", "system:authenticated"), "admin-uid")


class KubeRbac(KubeStore):
    """The store, plus who may do what to it."""

    def __init__(self, resources: Iterable[ResourceType], history_limit: int, strict_namespaces: bool,
                 rbac: bool) -> None:  # fmt: skip
        # RBAC mode: users' requests are authorized by the stored RBAC objects.
        self.rbac = rbac
        self.denials: list[Denial] = []
        self.granted: list[AccessRequest] = []  # the allowed requests of non-superusers
        self.users: dict[str, User] = {}  # token -> user, for TokenReview
        self.rules: list[AccessRule] = []  # for SubjectAccessReview, unless `authorizer` is set
        self.authorizer: Callable[[AccessRequest], bool] | None = None
        super().__init__(resources, history_limit, strict_namespaces)

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

    def _groups_of(self, user: User) -> list[str]:
        # A real authenticator adds system:authenticated; only the RBAC mode relies on it.
        extra = ("system:authenticated",) if self.rbac else ()
        return list(dict.fromkeys((*user.groups, *extra)))

    def is_allowed(self, req: AccessRequest) -> bool:
        if self.authorizer is not None:
            return self.authorizer(req)
        return any(rule.allows(req) for rule in self.rules)

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
