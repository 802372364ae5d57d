"""Build minimal RFC 6902 patches against a pod dict without copying or re-serialising it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def escape(key: str) -> str:
    """A JSON Pointer reference token (RFC 6901: `~` -> `~0`, `/` -> `~1`)."""
    return key.replace("~", "~0").replace("/", "~1")


class PodPatch:
    """Collects the changes a decision means and emits only those operations.

    `add` on an existing object member replaces it (RFC 6902 §4.1), so one verb serves both cases;
    a missing parent map is added whole, so the patch never points into a path that is not there.
    Nothing is ever removed.
    """

    def __init__(self, pod: Mapping[str, Any]) -> None:
        self._pod = pod
        self._labels: dict[str, str] = {}
        self._annotations: dict[str, str] = {}
        self._spec: dict[str, Any] = {}
        self._ops: list[dict[str, Any]] = []

    def set_label(self, key: str, value: str) -> None:
        if self._meta_map("labels").get(key) != value:
            self._labels[key] = value

    def set_annotation(self, key: str, value: str) -> None:
        if self._meta_map("annotations").get(key) != value:
            self._annotations[key] = value

    def set_spec(self, field: str, value: Any) -> None:
        spec = self._pod.get("spec") or {}
        if field not in spec or spec[field] != value:
            self._spec[field] = value

    def add(self, path: str, value: Any) -> None:
        """A raw operation for paths whose parents the caller has checked."""
        self._ops.append({"op": "add", "path": path, "value": value})

    def _meta_map(self, name: str) -> Mapping[str, Any]:
        meta = self._pod.get("metadata") or {}
        value = meta.get(name)
        return value if isinstance(value, Mapping) else {}

    def operations(self) -> list[dict[str, Any]]:
        ops: list[dict[str, Any]] = []
        meta = self._pod.get("metadata")
        if not isinstance(meta, Mapping) and (self._labels or self._annotations):
            ops.append({"op": "add", "path": "/metadata", "value": {}})
            meta = {}
        for name, values in (("labels", self._labels), ("annotations", self._annotations)):
            if not values:
                continue
            if isinstance(meta, Mapping) and isinstance(meta.get(name), Mapping):
                ops.extend(
                    {"op": "add", "path": f"/metadata/{name}/{escape(k)}", "value": v} for k, v in values.items()
                )
            else:
                ops.append({"op": "add", "path": f"/metadata/{name}", "value": dict(values)})
        ops.extend({"op": "add", "path": f"/spec/{escape(k)}", "value": v} for k, v in self._spec.items())
        ops.extend(self._ops)
        return ops
