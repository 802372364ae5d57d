"""Run:ai projects left behind by project namespaces deleted while `run_ai_enable` was false.

With the integration off this system makes no Run:ai call, so it cannot delete the Run:ai project
it created for a namespace being deleted (R4). It does not hold the deletion up for that either:
it writes down what it knew (the namespace's `runai/queue` and `hopsworks.ai/runai-project-id`)
in the ConfigMap `runai-projects-left` of the install namespace, then lets the namespace go. The
admin view lists these records; the leader, once Run:ai is on and reachable again, deletes each
recorded project that still exists and no namespace has taken back, and drops the record.

One data key per namespace name, value JSON `{"runaiProject", "runaiProjectId", "deletedAt"}`
(`runaiProjectId` null when a binder had recorded its intent but not yet labelled the namespace).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from webhook.kube.api import KubeApi, KubeConflict
from webhook.snapshot import LeftProject, NamespaceInfo

log = logging.getLogger(__name__)

LEFT_CONFIGMAP = "runai-projects-left"
# Far below a ConfigMap's 1 MiB; beyond it the oldest records go (and the log says so).
MAX_RECORDS = 1000
_ROUNDS = 8  # optimistic-concurrency retries


def dump(entry: LeftProject) -> str:
    return json.dumps(
        {"runaiProject": entry.runai_project, "runaiProjectId": entry.runai_project_id, "deletedAt": entry.deleted_at},
        separators=(",", ":"),
    )


def parse_left(data: Mapping[str, Any] | None) -> list[LeftProject]:
    """The records of the ConfigMap's data, oldest first; entries that do not parse are skipped."""
    out = []
    for namespace, raw in (data or {}).items():
        try:
            value = json.loads(raw)
            out.append(
                LeftProject(
                    namespace=str(namespace),
                    runai_project=_optional(value.get("runaiProject")),
                    runai_project_id=_optional(value.get("runaiProjectId")),
                    deleted_at=str(value.get("deletedAt") or ""),
                )
            )
        except (TypeError, ValueError, AttributeError):
            log.warning("%s: ignoring malformed entry %r", LEFT_CONFIGMAP, namespace)
    return sorted(out, key=lambda r: r.deleted_at)


def _optional(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


class LeftProjects:
    """Reads and writes the records (Kubernetes API calls off the admission path)."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube

    async def load(self) -> list[LeftProject]:
        cm = await self.kube.get_configmap(LEFT_CONFIGMAP)
        return parse_left((cm or {}).get("data"))

    async def record(self, info: NamespaceInfo) -> LeftProject:
        entry = LeftProject(
            namespace=info.name,
            runai_project=info.runai_queue,
            runai_project_id=info.runai_project_id,
            deleted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        await self._update(add=[entry])
        return entry

    async def drop(self, namespaces: Iterable[str]) -> None:
        await self._update(remove=set(namespaces))

    async def _update(self, add: Iterable[LeftProject] = (), remove: set[str] | None = None) -> None:
        add = list(add)
        for _ in range(_ROUNDS):
            cm = await self.kube.get_configmap(LEFT_CONFIGMAP)
            data = dict((cm or {}).get("data") or {})
            for name in remove or ():
                data.pop(name, None)
            for entry in add:
                data[entry.namespace] = dump(entry)
            if len(data) > MAX_RECORDS:
                oldest = [r.namespace for r in parse_left(data)][: len(data) - MAX_RECORDS]
                log.warning(
                    "%s holds more than %d records; dropping the oldest: %s", LEFT_CONFIGMAP, MAX_RECORDS, oldest
                )
                for name in oldest:
                    data.pop(name, None)
            try:
                if cm is None:
                    if not data:
                        return
                    await self.kube.create_configmap(self._new(data))
                else:
                    await self.kube.replace_configmap({**cm, "data": data})
                return
            except KubeConflict:
                continue  # written (or created) meanwhile: read again
        raise KubeConflict(409, f"{LEFT_CONFIGMAP} kept changing while being written")

    def _new(self, data: Mapping[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": LEFT_CONFIGMAP,
                "namespace": self.kube.install_namespace,
                "labels": {"app.kubernetes.io/managed-by": "scheduling-webhook"},
            },
            "data": dict(data),
        }
