"""The files behind `scheduling-webhook manifests`: where `manifests/` is, reading its objects and a
values file, and writing rendered objects as YAML. What the values change is `webhook.manifests`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

RESOURCE_FILE = re.compile(r"^\d{2}-[a-z0-9-]+\.ya?ml$")
MANIFESTS_ENV = "SCHEDULING_WEBHOOK_MANIFESTS"


class RenderError(ValueError):
    """The values cannot be rendered; the message says which value and why."""


def load_values(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RenderError(f"cannot read values file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise RenderError(f"values file {path} is not valid YAML: {exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise RenderError(f"values file {path} must hold a mapping, not {type(loaded).__name__}")
    return loaded


def load_base(source: Path | None = None) -> list[dict[str, Any]]:
    """The objects in the numbered files of `manifests/`, in file order."""
    folder = source or manifests_dir()
    objects: list[dict[str, Any]] = []
    for path in resource_files(folder):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                objects.append(doc)
    if not objects:
        raise RenderError(f"no manifests found in {folder}")
    return objects


def resource_files(folder: Path) -> list[Path]:
    """`NN-name.yaml` files: the objects. The values example and READMEs are not objects."""
    return sorted(p for p in folder.iterdir() if p.is_file() and RESOURCE_FILE.match(p.name))


def manifests_dir() -> Path:
    candidates: list[Path] = []
    if os.environ.get(MANIFESTS_ENV):
        candidates.append(Path(os.environ[MANIFESTS_ENV]))
    candidates += [Path(__file__).resolve().parent.parent / "manifests", Path.cwd() / "manifests"]
    for folder in candidates:
        if folder.is_dir() and resource_files(folder):
            return folder
    raise RenderError(
        f"cannot find the manifests folder (looked in {', '.join(map(str, candidates))}); set {MANIFESTS_ENV}"
    )


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the `scheduler` block) as literal blocks, so the output reads like the files."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def dump(obj: Mapping[str, Any]) -> str:
    return yaml.dump(dict(obj), Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def dump_all(objects: Iterable[Mapping[str, Any]]) -> str:
    return "".join(f"---\n{dump(obj)}" for obj in objects)


def write_dir(objects: list[dict[str, Any]], out: Path) -> list[Path]:
    """One file per object, numbered so that `kubectl apply -f DIR` keeps the apply order."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for index, obj in enumerate(objects):
        name = f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        path = out / re.sub(r"[^a-z0-9.-]+", "-", name.lower())
        path.write_text(dump(obj), encoding="utf-8")
        written.append(path)
    return written
