"""Run:ai REST models (`webhook.runai.models`) turned into the core's input records
(`webhook.core.runai_data`): the one place the adapter's shapes meet the pure GPU views."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.core.runai_data import (
    GpuUsage,
    PoolMetrics,
    PoolQuota,
    RunaiData,
    RunaiDepartment,
    RunaiNodePool,
    RunaiProject,
)
from webhook.runai import models


def _usage(usage: models.GpuUsage) -> GpuUsage:
    return GpuUsage(usage.allocated, usage.allocated_non_preemptible, usage.requested)


def _quotas(quotas: Iterable[models.NodePoolGpuQuota]) -> tuple[PoolQuota, ...]:
    return tuple(PoolQuota(q.node_pool_name, q.deserved, q.limit) for q in quotas)


def _first_default_node_pool(raw: Mapping[str, Any]) -> str | None:
    # Run:ai's spec: `defaultNodePools` orders the node pools a workload that names none is
    # scheduled on; the project's own list first, else the effective one.
    for source in (raw, raw.get("effective")):
        pools = source.get("defaultNodePools") if isinstance(source, Mapping) else None
        if isinstance(pools, list) and pools and isinstance(pools[0], str) and pools[0]:
            return pools[0]
    return None


def project_record(project: models.Project) -> RunaiProject:
    return RunaiProject(
        id=project.id,
        name=project.name,
        gpu_quota=project.gpu_quota,
        quotas=_quotas(project.quotas),
        usage=_usage(project.usage),
        usage_by_node_pool={pool: _usage(u) for pool, u in project.usage_by_node_pool.items()},
        parent_id=project.parent_id,
        requested_namespace=project.requested_namespace,
        namespace=project.namespace,
        phase=project.phase,
        default_node_pool=_first_default_node_pool(project.raw),
    )


def department_record(department: models.Department) -> RunaiDepartment:
    status = department.raw.get("status")
    entries = status.get("nodePoolQuotaStatuses") if isinstance(status, Mapping) else None
    by_pool = {
        str(e["nodePoolName"]): _usage(models.GpuUsage.from_api(e))
        for e in entries or ()
        if isinstance(e, Mapping) and e.get("nodePoolName")
    }
    return RunaiDepartment(
        id=department.id,
        name=department.name,
        gpu_quota=department.gpu_quota,
        quotas=_quotas(department.quotas),
        usage=_usage(department.usage),
        usage_by_node_pool=by_pool,
    )


def node_pool_record(pool: models.NodePool) -> RunaiNodePool:
    return RunaiNodePool(pool.name, pool.is_default)


def pool_metrics(metrics: models.NodePoolMetrics) -> PoolMetrics:
    return PoolMetrics(metrics.total, metrics.allocated, metrics.unallocated, metrics.sampled_at)


def runai_data(
    *,
    reachable: bool,
    projects: Iterable[models.Project] | None,
    departments: Iterable[models.Department] | None,
    node_pools: Iterable[models.NodePool] | None,
    metrics: models.NodePoolMetrics | None = None,
) -> RunaiData:
    return RunaiData(
        reachable=reachable,
        projects=None if projects is None else [project_record(p) for p in projects],
        departments=None if departments is None else [department_record(d) for d in departments],
        node_pools=None if node_pools is None else [node_pool_record(p) for p in node_pools],
        metrics=None if metrics is None else pool_metrics(metrics),
    )
