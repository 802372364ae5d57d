"""The few Kubernetes API writes and reads this system makes outside the watches, and the one error
hierarchy every Kubernetes call here raises (the watches of `webhook.kube.watch` too).

A thin adapter over kubernetes_asyncio that speaks raw JSON dicts (no model round-trip, unknown
fields kept), maps statuses to exceptions the callers act on, and counts every call in
`webhook_remote_calls_total` with the path that made it ("request" or "background").
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from webhook.metrics import REMOTE_CALLS, CallPath

Obj = dict[str, Any]  # a Kubernetes object as raw JSON

# The admissionregistration.k8s.io/v1 kinds of the compiled admission policies, which the chart
# installs and the server only reads (`KubeApi.get_admission_object`).
_ADMISSION_POLICY_KINDS = frozenset({
    "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
})  # fmt: skip

__all__ = [
    "CallPath",
    "KubeApi",
    "KubeConflict",
    "KubeError",
    "KubeGone",
    "KubeNotFound",
    "Obj",
    "kube_error",
    "now_rfc3339",
    "raw_call",
]


class KubeError(Exception):
    """The Kubernetes API answered with an error status; `str()` is "<status>: <message>"."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class KubeNotFound(KubeError):
    """404: no such object (for a custom resource: maybe its CRD is not installed)."""


class KubeConflict(KubeError):
    """409: the object changed since it was read (or already exists on create)."""


class KubeGone(KubeError):
    """410: the resourceVersion asked for is older than the server's history (a watch lists again)."""


def kube_error(status: int, body: str | bytes | None, reason: str = "", limit: int | None = None) -> KubeError:
    """The error for an error status: the message of its `Status` body, else `reason`, else the
    body itself; cut to `limit` characters. (kubernetes_asyncio's ApiException carries the body as
    bytes: read as text, never shown as its repr.)"""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body or ""
    try:
        message = json.loads(text or "{}").get("message") or reason or text
    except (ValueError, AttributeError):
        message = reason or text
    message = str(message)
    cls = {404: KubeNotFound, 409: KubeConflict, 410: KubeGone}.get(status, KubeError)
    return cls(status, message[:limit] if limit is not None else message)


def _error(exc: ApiException) -> KubeError:
    return kube_error(exc.status or 0, exc.body, str(exc.reason))


async def raw_call(call: Any, *args: Any, call_path: CallPath, **kwargs: Any) -> Obj:
    """One API call as raw JSON, counted; error statuses raise KubeError (KubeNotFound, KubeConflict)."""
    REMOTE_CALLS.labels(target="kubernetes", path=call_path).inc()
    try:
        response = await call(*args, _preload_content=False, **kwargs)
    except ApiException as exc:
        raise _error(exc) from None
    async with response:
        raw = await response.read()
        # With _preload_content=False the client hands back error statuses instead of raising.
        if not 200 <= response.status <= 299:
            failed = ApiException(status=response.status, reason=response.reason)
            failed.body = raw.decode("utf-8", "replace")
            raise _error(failed)
        obj: Obj = json.loads(raw)  # an API object: a JSON object
        return obj


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeApi:
    def __init__(self, api_client: ApiClient, install_namespace: str, component: str = "scheduling-webhook") -> None:
        self.api_client = api_client
        self.install_namespace = install_namespace
        self.component = component
        self.core = client.CoreV1Api(api_client)
        self.authn = client.AuthenticationV1Api(api_client)
        self.authz = client.AuthorizationV1Api(api_client)
        self.instance = os.environ.get("POD_NAME") or f"{component}-{uuid.uuid4().hex[:8]}"

    # -- namespaces -------------------------------------------------------------------------
    async def get_namespace(self, name: str, *, call_path: CallPath = "background") -> Obj:
        return await raw_call(self.core.read_namespace, name, call_path=call_path)

    async def patch_namespace(
        self,
        name: str,
        patch: Mapping[str, Any],
        *,
        resource_version: str | None = None,
        call_path: CallPath = "background",
    ) -> Obj:
        """A JSON merge patch; with `resource_version` it applies only to that version (else 409)."""
        body: dict[str, Any] = json.loads(json.dumps(patch))
        if resource_version:
            body.setdefault("metadata", {})["resourceVersion"] = resource_version
        return await raw_call(
            self.core.patch_namespace,
            name,
            body,
            call_path=call_path,
            _content_type="application/merge-patch+json",
        )

    async def list_namespaces(self, label_selector: str = "", *, call_path: CallPath = "background") -> list[Obj]:
        """Every namespace matching `label_selector` (empty: all of them), page by page."""
        items: list[Obj] = []
        token: str | None = None
        while True:
            more = {"_continue": token} if token else {}
            page = await raw_call(
                self.core.list_namespace, call_path=call_path, label_selector=label_selector, limit=500, **more
            )
            items.extend(page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    # -- configmaps in the install namespace ------------------------------------------------
    async def get_configmap(self, name: str, *, call_path: CallPath = "background") -> Obj | None:
        try:
            return await raw_call(
                self.core.read_namespaced_config_map, name, self.install_namespace, call_path=call_path
            )
        except KubeNotFound:
            return None

    async def create_configmap(self, body: Mapping[str, Any], *, call_path: CallPath = "background") -> Obj:
        return await raw_call(
            self.core.create_namespaced_config_map, self.install_namespace, dict(body), call_path=call_path
        )

    async def replace_configmap(self, body: Mapping[str, Any], *, call_path: CallPath = "background") -> Obj:
        """PUT with the body's metadata.resourceVersion: 409 (KubeConflict) if someone wrote first."""
        name = body["metadata"]["name"]
        return await raw_call(
            self.core.replace_namespaced_config_map, name, self.install_namespace, dict(body), call_path=call_path
        )

    async def patch_configmap(self, name: str, patch: Mapping[str, Any], *, call_path: CallPath = "background") -> Obj:
        """A JSON merge patch (a key set to None is removed): no read first, and no conflict with
        another writer of other keys."""
        return await raw_call(
            self.core.patch_namespaced_config_map,
            name,
            self.install_namespace,
            dict(patch),
            call_path=call_path,
            _content_type="application/merge-patch+json",
        )

    async def delete_configmap(
        self, name: str, *, resource_version: str | None = None, call_path: CallPath = "background"
    ) -> None:
        """Delete, only at `resource_version` when given (409 if it changed); absent is fine."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if resource_version:
            body["preconditions"] = {"resourceVersion": resource_version}
        try:
            await raw_call(
                self.core.delete_namespaced_config_map, name, self.install_namespace, body=body, call_path=call_path
            )
        except KubeNotFound:
            return

    # -- the compiled admission policies' parameters, by server-side apply -----------------------
    @staticmethod
    def _only_configmaps(kind: str) -> None:
        # The server writes no admission policy (the chart does): nothing else is applied here.
        if kind != "ConfigMap":
            raise ValueError(f"no server-side apply for kind {kind}")

    async def apply(self, obj: Mapping[str, Any], field_manager: str, *, call_path: CallPath = "background") -> Obj:
        """Server-side apply of a ConfigMap, taking over fields another manager set (force)."""
        self._only_configmaps(obj["kind"])
        meta = obj["metadata"]
        return await raw_call(
            self.core.patch_namespaced_config_map,
            meta["name"],
            meta["namespace"],
            dict(obj),
            call_path=call_path,
            field_manager=field_manager,
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    async def delete_object(
        self, kind: str, name: str, namespace: str | None = None, *, call_path: CallPath = "background"
    ) -> None:
        """Delete one object of a kind `apply` writes; absent is fine."""
        self._only_configmaps(kind)
        try:
            await raw_call(self.core.delete_namespaced_config_map, name, namespace, call_path=call_path)
        except KubeNotFound:
            return

    async def get_admission_object(self, kind: str, name: str, *, call_path: CallPath = "background") -> Obj | None:
        """One admission policy or binding of admissionregistration.k8s.io/v1, or None when absent."""
        if kind not in _ADMISSION_POLICY_KINDS:
            raise ValueError(f"not an admission policy kind: {kind}")
        snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in kind).lstrip("_")
        read = getattr(client.AdmissionregistrationV1Api(self.api_client), f"read_{snake}")
        try:
            return await raw_call(read, name, call_path=call_path)
        except KubeNotFound:
            return None

    async def list_configmaps_named(self, name: str, *, call_path: CallPath = "background") -> list[Obj]:
        """The ConfigMaps of this name in every namespace (a field selector on the name, which RBAC
        can grant by resourceNames)."""
        items: list[Obj] = []
        more: dict[str, Any] = {}
        while True:
            page = await raw_call(
                self.core.list_config_map_for_all_namespaces,
                call_path=call_path,
                field_selector=f"metadata.name={name}",
                limit=500,
                **more,
            )
            items.extend(page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            more = {"_continue": token}

    # -- events ------------------------------------------------------------------------------
    async def create_event(
        self,
        involved: Mapping[str, Any],
        reason: str,
        message: str,
        *,
        type_: Literal["Normal", "Warning"] = "Normal",
        call_path: CallPath = "background",
    ) -> Obj:
        """A core/v1 Event about `involved` (an object dict with kind and metadata)."""
        meta = involved.get("metadata") or {}
        # The apiserver keeps an Event in its object's namespace, and one about a cluster-scoped
        # object (our Namespaces) in `default`, as client-go's recorder does.
        namespace = meta.get("namespace") or "default"
        stamp = now_rfc3339()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'object')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", "v1"),
                "kind": involved.get("kind", ""),
                "name": meta.get("name", ""),
                "namespace": meta.get("namespace", ""),
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        return await raw_call(self.core.create_namespaced_event, namespace, body, call_path=call_path)

    # -- authentication and authorization for the GPU API ------------------------------------
    async def token_review(self, token: str, *, call_path: CallPath = "request") -> Obj:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        return await raw_call(self.authn.create_token_review, body, call_path=call_path)

    async def subject_access_review(
        self, user: Mapping[str, Any], attributes: Mapping[str, Any], *, call_path: CallPath = "request"
    ) -> Obj:
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user.get("username", ""),
                "uid": user.get("uid", ""),
                "groups": list(user.get("groups") or ()),
                "extra": dict(user.get("extra") or {}),
                "resourceAttributes": dict(attributes),
            },
        }
        return await raw_call(self.authz.create_subject_access_review, body, call_path=call_path)
