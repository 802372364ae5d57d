"""Label and field selectors, parsed and matched as the apiserver does."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.support.kube_emulator_types import ApiError, ResourceType


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
