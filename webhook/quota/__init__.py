"""R3 across replicas: GPU reservations in the Kubernetes API and the quota admission handlers."""

from webhook.quota.handlers import (
    Bind,
    ReadWorkload,
    kube_workload_reader,
    validate_pods_handler,
    validate_workloads_handler,
)
from webhook.quota.reservations import DEFAULT_TTL_S, GpuReservations, configmap_name, reservation_need

__all__ = [
    "DEFAULT_TTL_S",
    "Bind",
    "GpuReservations",
    "ReadWorkload",
    "configmap_name",
    "kube_workload_reader",
    "reservation_need",
    "validate_pods_handler",
    "validate_workloads_handler",
]
