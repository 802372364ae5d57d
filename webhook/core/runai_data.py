"""What the pure core reads of Run:ai: plain records, filled by the Run:ai adapter
(`webhook.runai.records` converts the REST models), so the core depends on no adapter.

Only what the GPU views and the quota record need: identities, binding, GPU quota per node pool
and usage. `RunaiData` is one reading: the directory's cached org units plus one metrics sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """GPUs Run:ai has allocated to an org unit, and those asked for."""

    allocated: float = 0.0
    allocated_non_preemptible: float = 0.0
    requested: float = 0.0


@dataclass(frozen=True, slots=True)
class PoolQuota:
    """An org unit's GPU quota on one node pool."""

    node_pool: str | None
    deserved: float
    limit: float | None  # as Run:ai wrote it: None or negative means no limit


@dataclass(frozen=True, slots=True)
class RunaiOrgUnit:
    """Quota and usage of a Run:ai project or department."""

    id: str
    name: str
    gpu_quota: float  # deserved GPUs summed over node pools
    quotas: tuple[PoolQuota, ...] = ()
    usage: GpuUsage = GpuUsage()  # summed over node pools
    usage_by_node_pool: Mapping[str, GpuUsage] = field(default_factory=dict)

    def quota_on(self, node_pool: str) -> PoolQuota | None:
        return next((q for q in self.quotas if q.node_pool == node_pool), None)

    def usage_on(self, node_pool: str) -> GpuUsage:
        # Without a per-pool breakdown, Run:ai's sum is all there is.
        return self.usage_by_node_pool.get(node_pool, GpuUsage()) if self.usage_by_node_pool else self.usage


@dataclass(frozen=True, slots=True)
class RunaiDepartment(RunaiOrgUnit):
    pass


@dataclass(frozen=True, slots=True)
class RunaiProject(RunaiOrgUnit):
    parent_id: str | None = None  # its department's id
    requested_namespace: str | None = None
    namespace: str | None = None  # the namespace Run:ai actually bound
    phase: str | None = None
    # The first of the project's default node pools (its own, else the effective ones): where a
    # workload that names no node pool is scheduled first.
    default_node_pool: str | None = None

    def bound_to(self, namespace: str) -> bool:
        return namespace in (self.requested_namespace, self.namespace)


@dataclass(frozen=True, slots=True)
class RunaiNodePool:
    name: str
    is_default: bool = False


@dataclass(frozen=True, slots=True)
class PoolMetrics:
    """The latest GPU totals of one node pool."""

    total: float | None
    allocated: float | None
    unallocated: float | None
    sampled_at: datetime | None


@dataclass(frozen=True)
class RunaiData:
    """What the views read of Run:ai: the directory's cached org units and one live metrics sample.

    `projects`/`departments`/`node_pools` are None until the directory's first successful refresh.
    """

    reachable: bool = False
    projects: Sequence[RunaiProject] | None = None
    departments: Sequence[RunaiDepartment] | None = None
    node_pools: Sequence[RunaiNodePool] | None = None
    metrics: PoolMetrics | None = None
    metrics_error: str | None = None  # why `metrics` is missing, when a fetch was tried

    @property
    def has_data(self) -> bool:
        return self.projects is not None and self.departments is not None
