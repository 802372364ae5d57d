"""docs/values.md, the chart's values reference, generated from the descriptions of
manifests/chart/values.schema.json and the defaults of manifests/chart/values.yaml.

`make manifests` writes it (`python -m tests.support.values_reference`); tests/test_chart.py fails
when it is not what the chart says. The schema is the one place a value is described, so that the
page, `helm install`'s refusals and the chart cannot tell three stories.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from tests.support import peers

CHART = peers.REPO / "manifests" / "chart"
PAGE = peers.REPO / "docs" / "values.md"
HEADER = """\
# The chart's values

Generated from the descriptions in `manifests/chart/values.schema.json` and the defaults of
`manifests/chart/values.yaml` by `make manifests`; edit those, not this page. The schema is strict:
`helm install` and `helm upgrade` refuse an unknown key or a wrong type and name the value.

| value | type | default | description |
|---|---|---|---|
"""


def _type(node: Mapping[str, Any]) -> str:
    if "enum" in node:
        return " | ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    kind = node.get("type", "")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array" and isinstance(node.get("items"), Mapping) and node["items"].get("type"):
        return f"array of {node['items']['type']}"
    return str(kind)


def _default(values: Any, path: tuple[str, ...]) -> str:
    node = values
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return ""
        node = node[key]
    if isinstance(node, Mapping) and node:
        return ""  # a table: its keys have rows of their own
    return f"`{json.dumps(node)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(node: Mapping[str, Any], values: Any, path: tuple[str, ...]) -> Iterator[str]:
    for key, child in (node.get("properties") or {}).items():
        here = (*path, key)
        description = child.get("description")
        if description is None:
            raise ValueError(f"values.schema.json: {'.'.join(here)} has no description")
        yield (
            f"| `{'.'.join(here)}` | {_cell(_type(child))} | {_cell(_default(values, here))} | {_cell(description)} |\n"
        )
        yield from _rows(child, values, here)


def reference(schema: Mapping[str, Any], values: Any) -> str:
    """The page for this schema and these defaults; ValueError names a value without a description."""
    return HEADER + "".join(_rows(schema, values, ()))


def current() -> str:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return reference(schema, values)


if __name__ == "__main__":
    PAGE.write_text(current())
    print(PAGE.relative_to(peers.REPO))
