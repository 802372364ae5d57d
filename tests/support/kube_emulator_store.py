"""The emulator's storage: objects by type, one global resourceVersion, a bounded history that
replays watches and serves exact lists, namespace lifecycle and finalizers, patches. No HTTP here:
the server (`kube_emulator.py`) calls these, and tests call the public methods directly."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import jsonpatch

from tests.support.kube_emulator_selectors import Selector, parse_field_selector, parse_label_selector
from tests.support.kube_emulator_types import (
    _DNS_LABEL,
    _DNS_SUBDOMAIN,
    _GENERATE_ALPHABET,
    _PATH_SEGMENT,
    NAMESPACES,
    RBAC_GROUP,
    ApiError,
    Obj,
    ObjKey,
    ResourceType,
    _not_found,
)


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


@dataclass(slots=True)
class _Event:
    rv: int
    rt_key: tuple[str, str]
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None  # the object before this event (None for ADDED)


_DROP = object()  # abort the connection, as a network failure would
_CLOSE = object()  # end the stream cleanly, as at timeoutSeconds


@dataclass(eq=False, slots=True)
class _Watch:
    rt: ResourceType
    namespace: str | None
    selector: Selector
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)


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


# Strategic merge patch: lists merged by key, as the `patchMergeKey` tags of the Kubernetes types
# say. The emulator has no schemas, so the key is looked up by the list's field name; a list not
# named here is replaced, as an atomic list is.
_MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath", "imagePullSecrets": "name",
    "webhooks": "name", "ownerReferences": "uid", "conditions": "type", "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey", "resourceClaims": "name",
}  # fmt: skip
_MERGED_PRIMITIVE_LISTS = frozenset({"finalizers"})


def _merge_key(field_name: str, item: Any) -> str | None:
    if field_name == "ports":  # a container's ports by containerPort, a Service's by port
        return "containerPort" if isinstance(item, Mapping) and "containerPort" in item else "port"
    return _MERGE_KEYS.get(field_name)


def _without_directives(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_without_directives(v) for v in value]
    return copy.deepcopy(value)


def _merge_list(field_name: str, current: list[Any], patch: list[Any]) -> list[Any]:
    result = copy.deepcopy(current)
    for item in patch:
        key = _merge_key(field_name, item)
        if key is None or not isinstance(item, Mapping):
            if item not in result:
                result.append(copy.deepcopy(item))
            continue
        index = next((i for i, old in enumerate(result) if isinstance(old, Mapping) and old.get(key) == item.get(key)),
                     None)  # fmt: skip
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(_without_directives(item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def _reorder(field_name: str, items: list[Any], order: list[Any]) -> list[Any]:
    def identity(item: Any) -> Any:
        key = _merge_key(field_name, item)
        return json.dumps(item.get(key) if key and isinstance(item, Mapping) else item, sort_keys=True)

    rank = {identity(item): i for i, item in enumerate(order)}
    return sorted(items, key=lambda item: rank.get(identity(item), len(rank)))


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """The apiserver's strategic merge patch for what kubectl sends (apply, edit, patch): maps merge,
    `null` deletes, keyed lists merge by key, and the directives `$patch: replace|delete`,
    `$setElementOrder/`, `$deleteFromPrimitiveList/` and `$retainKeys`."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return _without_directives(patch)
    result = copy.deepcopy(target) if isinstance(target, Mapping) else {}
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys"):
            continue
        if key.startswith("$setElementOrder/"):
            orders[key.partition("/")[2]] = value if isinstance(value, list) else []
        elif key.startswith("$deleteFromPrimitiveList/"):
            name = key.partition("/")[2]
            result[name] = [v for v in result.get(name) or [] if v not in (value or [])]
        elif value is None or (isinstance(value, Mapping) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif (
            isinstance(value, list)
            and isinstance(result.get(key), list)
            and (key in _MERGED_PRIMITIVE_LISTS or any(_merge_key(key, v) for v in value))
        ):
            result[key] = _merge_list(key, result[key], value)
        elif isinstance(value, Mapping):
            result[key] = strategic_merge_patch(result.get(key), value)
        else:
            result[key] = _without_directives(value)
    for name, order in orders.items():
        if isinstance(result.get(name), list):
            result[name] = _reorder(name, result[name], order)
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _without_rv(obj: Mapping[str, Any]) -> Obj:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}


NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def _label_namespace_name(meta: Obj) -> None:
    """The apiserver sets this label on every namespace (create and update), so selectors can
    name namespaces; a write cannot remove or change it."""
    labels = meta.get("labels") or {}
    if isinstance(labels, dict):  # a malformed object a test stores on purpose stays as it is
        meta["labels"] = {**labels, NAMESPACE_NAME_LABEL: meta["name"]}


Observer = Callable[[str, ResourceType, Obj], None]  # (event type, resource type, object) per commit


class KubeStore:
    """What the apiserver keeps in etcd and its watch cache, with the writes' own rules."""

    def __init__(self, resources: Iterable[ResourceType], history_limit: int, strict_namespaces: bool) -> None:
        self.strict_namespaces = strict_namespaces  # 404/403 for content of missing/terminating ns
        self.history_limit = history_limit
        self._types: dict[tuple[str, str], ResourceType] = {}
        for rt in resources:
            self.add_resource(rt)
        self._store: dict[tuple[str, str], dict[ObjKey, Obj]] = {}
        self._rv = 1
        self._history: deque[_Event] = deque()
        self._floor = self._rv  # watches/lists older than this get 410 Gone
        self._watches: dict[_Watch, Any] = {}  # open watches, with their HTTP request
        self._continues: dict[str, tuple[int, list[Obj]]] = {}
        self.observers: list[Observer] = []  # told of every committed change, e.g. an admission cache

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

    @property
    def resource_version(self) -> int:
        return self._rv

    def compact(self) -> None:
        """Forget all history: a watch or exact list from any older resourceVersion gets 410 Gone."""
        self._history.clear()
        self._floor = self._rv
        self._continues.clear()

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
            _label_namespace_name(meta)
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
            if rt.kind == "Namespace":
                _label_namespace_name(meta)
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
            strategic = content_type == "application/strategic-merge-patch+json" and not rt.custom
            patched = strategic_merge_patch(current, patch) if strategic else merge_patch(current, patch)
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
