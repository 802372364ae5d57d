"""The chart in manifests/chart, run by the real helm (`make peers` builds it): templates rendered
offline, and releases installed, upgraded, rolled back and uninstalled on a test control plane."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support import peers

Obj = dict[str, Any]
CHART = peers.REPO / "manifests" / "chart"
RELEASE = "scheduling-webhook"
NAMESPACE = "hopsworks"


class HelmFailed(AssertionError):
    """helm exited non-zero; `stderr` holds its message."""

    def __init__(self, args: Sequence[str], stderr: str) -> None:
        super().__init__(f"helm {' '.join(args)} failed: {stderr.strip()}")
        self.stderr = stderr


@functools.cache
def _home() -> Path:
    # helm keeps a config, cache and data folder; none of the machine's own is read or written.
    return Path(tempfile.mkdtemp(prefix="swh-helm-"))


def helm(*args: str, kubeconfig: Path | None = None, values: Mapping[str, Any] | None = None,
         timeout: float = 300) -> str:  # fmt: skip
    """Runs helm with `args` (and the values as a file) and returns its stdout; HelmFailed if it fails."""
    home = _home()
    env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data")}  # fmt: skip
    env.pop("KUBECONFIG", None)
    argv = [str(peers.binary("helm")), *args]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=home) as file:
        if values is not None:
            yaml.safe_dump(dict(values), file)
            file.flush()
            argv += ["--values", file.name]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise HelmFailed(args, done.stderr)
    return done.stdout


# certs.mode helm refuses to render without a cluster (its CA would be new at every render); the
# tests' renders are read once and never applied twice, which is what this value allows.
OFFLINE_CA = "certs.helm.renderWithoutCluster=true"


def helm_major() -> int:
    """The major release of the helm the tests run (HELM_VERSION): 4 applies server-side."""
    return int(peers.helm_version().lstrip("v").split(".")[0])


def template(
    values: Mapping[str, Any] | None = None, namespace: str = NAMESPACE, api_versions: Sequence[str] = ()
) -> str:
    """`helm template` of the chart for these values: the YAML an install would apply (certs.mode
    helm's certificates issued for this render only), on a cluster that serves `api_versions`
    beside Helm's built-in list."""
    served = [arg for version in api_versions for arg in ("--api-versions", version)]
    return helm("template", RELEASE, str(CHART), "--namespace", namespace, "--set", OFFLINE_CA, *served,
                values=values or {})  # fmt: skip


def render(
    values: Mapping[str, Any] | None = None, namespace: str = NAMESPACE, api_versions: Sequence[str] = ()
) -> list[Obj]:
    """The objects of `template`, in helm's install order."""
    return [o for o in yaml.safe_load_all(template(values, namespace, api_versions)) if o]


PLAIN_DIR = peers.REPO / "manifests"
PLAIN_VALUES = CHART / "ci" / "kubectl-values.yaml"
PLAIN_HEADER = (
    "# Generated from manifests/chart by `make manifests` (helm template with\n"
    "# manifests/chart/ci/kubectl-values.yaml); edit the chart, not this file.\n"
)
_SOURCE = re.compile(r"^# Source: [^/]+/templates/(?P<file>[^\n]+)\n", re.MULTILINE)


def plain_manifests() -> dict[str, str]:
    """The plain YAML of manifests/ (file name -> text): each template's objects in a file of its name."""
    values = yaml.safe_load(PLAIN_VALUES.read_text())
    files: dict[str, list[str]] = {}
    for doc in template(values).split("\n---\n"):
        found = _SOURCE.search(doc)
        if found is None:
            continue
        body = doc[found.end() :].strip("\n")
        files.setdefault(found["file"], []).append(body + "\n")
    return {name: PLAIN_HEADER + "---\n".join(docs) for name, docs in sorted(files.items())}


def write_plain_manifests() -> list[Path]:
    """`make manifests`: manifests/*.yaml rewritten from the chart, stale ones removed."""
    wanted = plain_manifests()
    for old in PLAIN_DIR.glob("*.yaml"):
        if old.name not in wanted:
            old.unlink()
    written = []
    for name, text in wanted.items():
        (PLAIN_DIR / name).write_text(text)
        written.append(PLAIN_DIR / name)
    return written


if __name__ == "__main__":
    for path in write_plain_manifests():
        print(path.relative_to(peers.REPO))
