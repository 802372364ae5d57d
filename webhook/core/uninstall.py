"""What an uninstall takes back from a project namespace: this system's finalizer, labels and
annotations, and nothing else (a pure function of the stored namespace)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any


def namespace_cleanup_patch(
    namespace: Mapping[str, Any],
    finalizers: Collection[str],
    labels: Collection[str],
    annotations: Collection[str],
) -> dict[str, Any] | None:
    """A JSON merge patch removing these finalizers, labels and annotations where present; None
    when the namespace carries none of them. The finalizer list is written whole (a merge patch
    replaces lists), so it must be applied at the namespace's resourceVersion."""
    meta = namespace.get("metadata") or {}
    patch: dict[str, Any] = {}
    present = list(meta.get("finalizers") or ())
    if any(f in finalizers for f in present):
        patch["finalizers"] = [f for f in present if f not in finalizers]
    for key, owned in (("labels", labels), ("annotations", annotations)):
        removed = {k: None for k in (meta.get(key) or {}) if k in owned}
        if removed:
            patch[key] = removed
    return {"metadata": patch} if patch else None
