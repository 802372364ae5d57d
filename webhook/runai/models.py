"""Typed views of the Run:ai REST objects this system reads (field names as in runai-openapi.json).

Each model keeps the raw JSON object as `raw`: callers that recreate a project (department move
rollback) need the settings this module does not model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def _num(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class GpuUsage:
    """`QuotaStatus` / `QuotaStatusNodePool` (GPU part): what Run:ai has allocated and what is asked for."""

    allocated: float = 0.0
    allocated_non_preemptible: float = 0.0
    requested: float = 0.0

    @classmethod
    def from_api(cls, quota_status: Mapping[str, Any] | None) -> GpuUsage:
        qs = _obj(quota_status)
        return cls(
            allocated=_num(_obj(qs.get("allocated")).get("gpu")) or 0.0,
            allocated_non_preemptible=_num(_obj(qs.get("allocatedNonPreemptible")).get("gpu")) or 0.0,
            requested=_num(_obj(qs.get("requested")).get("gpu")) or 0.0,
        )


@dataclass(frozen=True)
class NodePoolGpuQuota:
    """One entry of `resources[]`: the GPU quota of an org unit on one node pool."""

    node_pool_id: str | None
    node_pool_name: str | None
    deserved: float
    limit: float | None  # null or -1 in Run:ai means no limit
    over_quota_weight: float | None

    @classmethod
    def from_api(cls, entry: Mapping[str, Any]) -> NodePoolGpuQuota:
        pool = _obj(entry.get("nodePool"))
        gpu = _obj(entry.get("gpu"))
        return cls(
            node_pool_id=pool.get("id"),
            node_pool_name=pool.get("name"),
            deserved=_num(gpu.get("deserved")) or 0.0,
            limit=_num(gpu.get("limit")),
            over_quota_weight=_num(gpu.get("overQuotaWeight")),
        )


def _quotas(raw: Mapping[str, Any]) -> tuple[NodePoolGpuQuota, ...]:
    return tuple(NodePoolGpuQuota.from_api(e) for e in raw.get("resources") or () if isinstance(e, Mapping))


def _total_gpu_quota(raw: Mapping[str, Any], quotas: tuple[NodePoolGpuQuota, ...]) -> float:
    # totalResources.gpuQuota is Run:ai's own sum over node pools; fall back to summing resources[].
    total = _num(_obj(raw.get("totalResources")).get("gpuQuota"))
    return total if total is not None else sum(q.deserved for q in quotas)


@dataclass(frozen=True)
class Cluster:
    """`DisplayedCluster`: `uuid` is the `clusterId` every other call uses."""

    uuid: str
    name: str
    version: str | None = None
    state: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> Cluster:
        return cls(
            uuid=str(raw["uuid"]),
            name=str(raw.get("name", "")),
            version=raw.get("version"),
            state=_obj(raw.get("status")).get("state"),
            raw=raw,
        )


@dataclass(frozen=True)
class Department:
    """`DepartmentForList` / `Department`."""

    id: str
    name: str
    cluster_id: str
    gpu_quota: float  # deserved GPUs summed over node pools
    quotas: tuple[NodePoolGpuQuota, ...]
    usage: GpuUsage  # status.quotaStatus: summed over node pools (needs verbosity=verbose)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> Department:
        quotas = _quotas(raw)
        return cls(
            id=str(raw["id"]),
            name=str(raw["name"]),
            cluster_id=str(raw.get("clusterId", "")),
            gpu_quota=_total_gpu_quota(raw, quotas),
            quotas=quotas,
            usage=GpuUsage.from_api(_obj(raw.get("status")).get("quotaStatus")),
            raw=raw,
        )

    def quota_on(self, node_pool: str) -> NodePoolGpuQuota | None:
        return next((q for q in self.quotas if q.node_pool_name == node_pool), None)


@dataclass(frozen=True)
class Project:
    """`Project`: identity, binding, quota (`resources[].gpu`) and usage (`status.quotaStatus`)."""

    id: str
    name: str
    cluster_id: str
    parent_id: str | None  # the department's id
    requested_namespace: str | None
    namespace: str | None  # status.namespace: the namespace Run:ai actually bound
    phase: str | None
    phase_message: str | None
    gpu_quota: float  # deserved GPUs summed over node pools
    quotas: tuple[NodePoolGpuQuota, ...]
    usage: GpuUsage  # summed over node pools
    usage_by_node_pool: Mapping[str, GpuUsage]  # status.nodePoolQuotaStatuses, by nodePoolName
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> Project:
        status = _obj(raw.get("status"))
        quotas = _quotas(raw)
        by_pool = {
            str(s["nodePoolName"]): GpuUsage.from_api(s)
            for s in status.get("nodePoolQuotaStatuses") or ()
            if isinstance(s, Mapping) and s.get("nodePoolName")
        }
        parent_id = raw.get("parentId")
        return cls(
            id=str(raw["id"]),
            name=str(raw["name"]),
            cluster_id=str(raw.get("clusterId", "")),
            parent_id=str(parent_id) if parent_id is not None else None,
            requested_namespace=raw.get("requestedNamespace"),
            namespace=status.get("namespace"),
            phase=status.get("phase"),
            phase_message=status.get("phaseMessage"),
            gpu_quota=_total_gpu_quota(raw, quotas),
            quotas=quotas,
            usage=GpuUsage.from_api(status.get("quotaStatus")),
            usage_by_node_pool=by_pool,
            raw=raw,
        )

    def bound_to(self, namespace: str) -> bool:
        return namespace in (self.requested_namespace, self.namespace)

    def quota_on(self, node_pool: str) -> NodePoolGpuQuota | None:
        return next((q for q in self.quotas if q.node_pool_name == node_pool), None)


@dataclass(frozen=True)
class NodePool:
    """`Nodepool` from `GET /api/v1/node-pools`."""

    id: str
    name: str
    cluster_id: str
    is_default: bool
    phase: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> NodePool:
        return cls(
            id=str(raw["id"]),
            name=str(raw["name"]),
            cluster_id=str(raw.get("clusterId", "")),
            is_default=bool(raw.get("isDefault", False)),
            phase=raw.get("phase"),
            raw=raw,
        )


@dataclass(frozen=True)
class NodePoolMetrics:
    """Latest samples of TOTAL_GPU / ALLOCATED_GPU / UNALLOCATED_GPU for one node pool."""

    cluster_id: str
    node_pool: str
    total: float | None
    allocated: float | None
    unallocated: float | None
    sampled_at: datetime | None
    partial: bool = False  # the control plane answered 207: some series are missing
