"""R3 across replicas: GPU reservations in the Kubernetes API and the quota admission handlers."""

from webhook.quota.handlers import validate_pods_handler
from webhook.quota.reservations import DEFAULT_TTL_S, GpuReservations, configmap_name, reservation_need

__all__ = [
    "DEFAULT_TTL_S",
    "GpuReservations",
    "configmap_name",
    "reservation_need",
    "validate_pods_handler",
]
