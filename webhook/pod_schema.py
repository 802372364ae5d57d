"""The typed schema of a pod's AdmissionReview, for msgspec's decoder.

Decoding against it builds only what the rules read. The big parts of a pod that no rule reads
(most of each container, the pod's volumes and tolerations, managedFields) are skipped while the
JSON is parsed: no Python object is made for them. Every other field the API defines is named,
most as `Any`, so a rule reading it sees what a plain JSON parse gives.

The fields the rules read are typed as `admission.SHAPES["Pod"]` demands them (exact JSON types,
no null), so a review this schema accepts is one whose object `admission.object_errors` passes. A
review it does not accept (another kind, a null, a number where a string goes, malformed JSON) is
no verdict: `admission.parse_pod_review` then hands it to the full path, which answers it as
before. `tests/test_pod_schema.py` holds the two paths together, and these types to the shape field
by field; `tests/e2e/test_pod_schema.py` holds the field lists to the real apiserver's OpenAPI.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Required, TypedDict

import msgspec

# What the schema leaves out, by the OpenAPI definition it belongs to. Nothing under
# webhook/ reads these on the request path (the test greps for them).
DROPPED: dict[str, frozenset[str]] = {
    # Of a container the rules read its name and resources (and restartPolicy: an init container
    # that restarts is a sidecar, which runs beside the app containers).
    "io.k8s.api.core.v1.Container": frozenset(
        {
            "args",
            "command",
            "env",
            "envFrom",
            "image",
            "imagePullPolicy",
            "lifecycle",
            "livenessProbe",
            "ports",
            "readinessProbe",
            "resizePolicy",
            "restartPolicyRules",
            "securityContext",
            "startupProbe",
            "stdin",
            "stdinOnce",
            "terminationMessagePath",
            "terminationMessagePolicy",
            "tty",
            "volumeDevices",
            "volumeMounts",
            "workingDir",
        }
    ),
    "io.k8s.api.core.v1.PodSpec": frozenset(
        {
            "dnsConfig",
            "ephemeralContainers",
            "hostAliases",
            "imagePullSecrets",
            "readinessGates",
            "securityContext",
            "tolerations",
            "topologySpreadConstraints",
            "volumes",
        }
    ),
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": frozenset({"managedFields"}),
}

# Named though only some Kubernetes versions define them: the alpha gang-scheduling field of
# PodSpec is workloadRef in the apiserver 1.35 and schedulingGroup in the 36.x client's OpenAPI;
# evictionResponders is new in 1.37.
OF_SOME_VERSIONS: dict[str, frozenset[str]] = {
    "PodSpecIn": frozenset({"evictionResponders", "schedulingGroup", "workloadRef"})
}

Quantity = str | int | float  # as the object check takes them; the rules parse them strictly


class ResourceRequirementsIn(TypedDict, total=False):
    limits: dict[str, Quantity]
    requests: dict[str, Quantity]
    claims: Any


class ContainerIn(TypedDict, total=False):
    name: Any
    resources: ResourceRequirementsIn
    restartPolicy: Any


class NodeSelectorRequirementIn(TypedDict, total=False):
    key: str
    operator: str
    values: list[str]


class NodeSelectorTermIn(TypedDict, total=False):
    matchExpressions: list[NodeSelectorRequirementIn]
    matchFields: Any


class NodeSelectorIn(TypedDict, total=False):
    nodeSelectorTerms: list[NodeSelectorTermIn]


class NodeAffinityIn(TypedDict, total=False):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelectorIn
    preferredDuringSchedulingIgnoredDuringExecution: Any


class AffinityIn(TypedDict, total=False):
    nodeAffinity: NodeAffinityIn
    podAffinity: Any
    podAntiAffinity: Any


class PodSpecIn(TypedDict, total=False):
    activeDeadlineSeconds: Any
    affinity: AffinityIn
    automountServiceAccountToken: Any
    containers: list[ContainerIn]
    dnsPolicy: Any
    enableServiceLinks: Any
    evictionResponders: Any
    hostIPC: Any
    hostNetwork: Any
    hostPID: Any
    hostUsers: Any
    hostname: Any
    hostnameOverride: Any
    initContainers: list[ContainerIn]
    nodeName: Any
    nodeSelector: Any
    os: Any
    overhead: Any
    preemptionPolicy: Any
    priority: Any
    priorityClassName: str
    resourceClaims: Any
    resources: Any
    restartPolicy: Any
    runtimeClassName: Any
    schedulerName: Any
    schedulingGates: Any
    schedulingGroup: Any
    serviceAccount: Any
    serviceAccountName: Any
    setHostnameAsFQDN: Any
    shareProcessNamespace: Any
    subdomain: Any
    terminationGracePeriodSeconds: Any
    workloadRef: Any


class ObjectMetaIn(TypedDict, total=False):
    name: str
    generateName: str
    namespace: str
    uid: str
    resourceVersion: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[dict[str, Any]]
    creationTimestamp: Any
    deletionGracePeriodSeconds: Any
    deletionTimestamp: Any
    finalizers: Any
    generation: Any
    selfLink: Any


class PodIn(TypedDict, total=False):
    apiVersion: Any
    kind: Any
    metadata: ObjectMetaIn
    spec: PodSpecIn
    status: Any


class PodKindIn(TypedDict, total=False):
    group: Literal[""]
    version: Literal["v1"]
    kind: Required[Literal["Pod"]]


class UserInfoIn(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: Any


class PodRequestIn(TypedDict, total=False):
    uid: Required[Annotated[str, msgspec.Meta(min_length=1)]]
    kind: Required[PodKindIn]
    resource: Any
    subResource: str
    requestKind: Any
    requestResource: Any
    requestSubResource: Any
    name: str
    namespace: str
    operation: Required[Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]]
    userInfo: UserInfoIn
    object: PodIn | None
    oldObject: PodIn | None
    dryRun: bool
    options: Any


class PodReviewIn(TypedDict, total=False):
    apiVersion: Literal["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]
    kind: Literal["AdmissionReview"]
    request: Required[PodRequestIn]


POD_REVIEW = msgspec.json.Decoder(PodReviewIn)
