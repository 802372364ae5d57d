"""NVIDIA Run:ai control-plane client."""

from .client import (
    ClientOptions,
    RunaiAuthError,
    RunaiClient,
    RunaiConflict,
    RunaiError,
    RunaiNotFound,
    RunaiUnreachable,
    SecretFile,
    SecretSource,
)
from .models import Cluster, Department, GpuUsage, NodePool, NodePoolGpuQuota, NodePoolMetrics, Project

__all__ = [
    "ClientOptions",
    "Cluster",
    "Department",
    "GpuUsage",
    "NodePool",
    "NodePoolGpuQuota",
    "NodePoolMetrics",
    "Project",
    "RunaiAuthError",
    "RunaiClient",
    "RunaiConflict",
    "RunaiError",
    "RunaiNotFound",
    "RunaiUnreachable",
    "SecretFile",
    "SecretSource",
]
