"""Run:ai for the embedded default (`serve --state DIR`): a snapshot in the state folder.

A document of kind `RunaiSnapshot` holds what Run:ai's REST API answers (its cluster, departments,
projects and node pools, exactly as `GET /api/v1/...` returns them) and one GPU sample per node
pool. `RunaiSnapshotDirectory` serves it as the GPU API's `RunaiDirectoryView`, so the GPU view,
the admin view and the console show real-looking numbers with no cluster and no Run:ai. The file
is read again when the folder changes, like the rest of the state folder.

    apiVersion: scheduling.hopsworks.ai/v1alpha1
    kind: RunaiSnapshot
    metadata: {name: runai}
    cluster: {uuid: ..., name: ...}                 # GET /api/v1/clusters, one entry
    departments: [...]                              # GET /api/v1/org-unit/departments
    projects: [...]                                 # GET /api/v1/org-unit/projects
    nodePools: [...]                                # GET /api/v1/node-pools
    nodePoolMetrics: [{nodePool: default, total: 16, allocated: 6, sampledAt: "2026-11-30T09:00:00Z"}]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from webhook.runai.client import RunaiError
from webhook.runai.models import Department, NodePool, NodePoolMetrics, Project
from webhook.state.folder import StateFolderError, fingerprint, read_objects

log = logging.getLogger(__name__)

SNAPSHOT_KIND = "RunaiSnapshot"


@dataclass(frozen=True, slots=True)
class RunaiSnapshot:
    cluster_id: str
    departments: tuple[Department, ...]
    projects: tuple[Project, ...]
    node_pools: tuple[NodePool, ...]
    metrics: Mapping[str, NodePoolMetrics]


def parse_snapshot(doc: Mapping[str, Any]) -> RunaiSnapshot:
    """Raises ValueError naming what is wrong."""
    try:
        cluster = doc.get("cluster") or {}
        cluster_id = str(cluster["uuid"])
        pools = tuple(NodePool.from_api(p) for p in doc.get("nodePools") or ())
        metrics: dict[str, NodePoolMetrics] = {}
        for sample in doc.get("nodePoolMetrics") or ():
            total, allocated = _number(sample.get("total")), _number(sample.get("allocated"))
            sampled = sample.get("sampledAt")
            metrics[str(sample["nodePool"])] = NodePoolMetrics(
                cluster_id=cluster_id,
                node_pool=str(sample["nodePool"]),
                total=total,
                allocated=allocated,
                unallocated=None if total is None or allocated is None else max(0.0, total - allocated),
                sampled_at=datetime.fromisoformat(str(sampled).replace("Z", "+00:00")) if sampled else None,
            )
        return RunaiSnapshot(
            cluster_id=cluster_id,
            departments=tuple(Department.from_api(d) for d in doc.get("departments") or ()),
            projects=tuple(Project.from_api(p) for p in doc.get("projects") or ()),
            node_pools=pools,
            metrics=metrics,
        )
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"{SNAPSHOT_KIND}: {type(exc).__name__}: {exc}") from None


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


class RunaiSnapshotDirectory:
    """`webhook.http.gpu_api.RunaiDirectoryView` over the state folder's `RunaiSnapshot` (none: the
    directory has no data, as a Run:ai that was never reached)."""

    def __init__(self, folder: Path, *, recheck_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.folder = folder
        self.recheck_s = recheck_s
        self._clock = clock
        self._checked_at = -float("inf")
        self._seen: object = None
        self._snapshot: RunaiSnapshot | None = None
        self.last_error: str | None = None

    def _current(self) -> RunaiSnapshot | None:
        now = self._clock()
        if now - self._checked_at < self.recheck_s:
            return self._snapshot
        self._checked_at = now
        seen = fingerprint(self.folder)
        if seen != self._seen:
            self._seen = seen
            self._load()
        return self._snapshot

    def _load(self) -> None:
        try:
            docs = [o for o in read_objects(self.folder) if o.get("kind") == SNAPSHOT_KIND]
            self._snapshot = parse_snapshot(docs[-1]) if docs else None
            self.last_error = None
        except (StateFolderError, ValueError) as exc:
            # Keep the previous snapshot: a file saved half-way must not empty the view.
            self.last_error = str(exc)
            log.error("Run:ai snapshot not reloaded, keeping the previous one: %s", exc)

    @property
    def cluster_id(self) -> str | None:
        snapshot = self._current()
        return snapshot.cluster_id if snapshot else None

    @property
    def reachable(self) -> bool:
        return self._current() is not None

    def projects(self) -> Sequence[Project] | None:
        snapshot = self._current()
        return snapshot.projects if snapshot else None

    def departments(self) -> Sequence[Department] | None:
        snapshot = self._current()
        return snapshot.departments if snapshot else None

    def node_pools(self) -> Sequence[NodePool] | None:
        snapshot = self._current()
        return snapshot.node_pools if snapshot else None

    async def node_pool_metrics(self, node_pool: str) -> NodePoolMetrics:
        snapshot = self._current()
        sample = snapshot.metrics.get(node_pool) if snapshot else None
        if sample is None:
            raise RunaiError(f"the Run:ai snapshot has no metrics for node pool {node_pool}")
        return sample
