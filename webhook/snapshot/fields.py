"""Reading the fields of a stored object leniently: a record parser takes what it needs and
passes over what has another shape, since an object of any shape may be stored, and it must not stop
a cache from syncing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)


def object_meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def section(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def mappings(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def count_of(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def string_map(meta: Mapping[str, Any], key: str) -> dict[str, str]:
    """Labels or annotations, keeping only string values: an apiserver stores nothing else, and a
    value of another type (a 5,000-digit number, deep nesting) must not block the project's pods."""
    values = meta.get(key) or {}
    kept = {k: v for k, v in values.items() if isinstance(k, str) and isinstance(v, str)}
    if len(kept) != len(values):
        log.warning("namespace %.100s: %s that are not strings ignored", meta.get("name"), key)
    return kept
