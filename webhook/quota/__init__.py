"""R3 across replicas: GPU reservations in the Kubernetes API, written by the pod webhook
(`webhook.http.pod_webhook`)."""

from webhook.quota.reservations import DEFAULT_TTL_S, GpuReservations, configmap_name, reservation_need

__all__ = [
    "DEFAULT_TTL_S",
    "GpuReservations",
    "configmap_name",
    "reservation_need",
]
