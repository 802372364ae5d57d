"""The Kubernetes API emulator's vocabulary: resource types, the `Status` error, small helpers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

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
    short_names: tuple[str, ...] = ()  # discovery's shortNames, which kubectl resolves (`po`, `cm`)

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
                          field_labels=frozenset({"status.phase"}), short_names=("ns",))  # fmt: skip
PODS = ResourceType("", "v1", "pods", "Pod", True, status_subresource=True, field_labels=POD_FIELDS,
                    short_names=("po",))  # fmt: skip
CONFIGMAPS = ResourceType("", "v1", "configmaps", "ConfigMap", True, short_names=("cm",))
SECRETS = ResourceType("", "v1", "secrets", "Secret", True, field_labels=frozenset({"type"}))
EVENTS = ResourceType("", "v1", "events", "Event", True, field_labels=EVENT_FIELDS, short_names=("ev",))
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True)
PRIORITY_CLASSES = ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False,
                                short_names=("pc",))  # fmt: skip
DEPLOYMENTS = ResourceType("apps", "v1", "deployments", "Deployment", True, status_subresource=True,
                           generation=True, short_names=("deploy",))  # fmt: skip
REPLICA_SETS = ResourceType("apps", "v1", "replicasets", "ReplicaSet", True, status_subresource=True,
                            generation=True, short_names=("rs",))  # fmt: skip
JOBS = ResourceType("batch", "v1", "jobs", "Job", True, status_subresource=True, generation=True)
STATEFUL_SETS = ResourceType("apps", "v1", "statefulsets", "StatefulSet", True, status_subresource=True,
                             generation=True, short_names=("sts",))  # fmt: skip
KUEUE_GROUP = "kueue.x-k8s.io"
LOCAL_QUEUES = ResourceType(KUEUE_GROUP, "v1beta2", "localqueues", "LocalQueue", True,
                            status_subresource=True, generation=True, custom=True)  # fmt: skip
CLUSTER_QUEUES = ResourceType(KUEUE_GROUP, "v1beta2", "clusterqueues", "ClusterQueue", False,
                              status_subresource=True, generation=True, custom=True)  # fmt: skip
RESOURCE_FLAVORS = ResourceType(KUEUE_GROUP, "v1beta2", "resourceflavors", "ResourceFlavor", False,
                                generation=True, custom=True)  # fmt: skip
TOPOLOGIES = ResourceType(KUEUE_GROUP, "v1beta2", "topologies", "Topology", False, generation=True, custom=True)
KUEUE_RESOURCES = (LOCAL_QUEUES, CLUSTER_QUEUES, RESOURCE_FLAVORS, TOPOLOGIES)
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
    NAMESPACES, PODS, CONFIGMAPS, SECRETS, EVENTS, LEASES, PRIORITY_CLASSES, DEPLOYMENTS, REPLICA_SETS,
    STATEFUL_SETS, JOBS, *KUEUE_RESOURCES, TOKEN_REVIEWS, SUBJECT_ACCESS_REVIEWS,
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


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "t", "true")
