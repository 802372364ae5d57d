"""Prometheus metrics, one registry for the process (served on /metrics)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

ADMISSION_REQUESTS = Counter(
    "webhook_admission_requests_total",
    "Admission reviews answered, by endpoint and outcome.",
    ["endpoint", "outcome"],  # outcome: allowed, patched, denied, bad_request
    registry=REGISTRY,
)
ADMISSION_LATENCY = Histogram(
    "webhook_admission_duration_seconds",
    "Time to decide one admission review, parse to answer.",
    ["endpoint"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    registry=REGISTRY,
)
# Which path made a remote call: the admission request path, or background work.
CallPath = Literal["request", "background"]
# The request path must not call out; this counts every call that does, by where it went and why.
REMOTE_CALLS = Counter(
    "webhook_remote_calls_total",
    "Calls to the Kubernetes API or Run:ai, by target and by the path that made them.",
    ["target", "path"],  # target: kubernetes, runai; path: request, background
    registry=REGISTRY,
)
WATCH_EVENTS = Counter(
    "webhook_watch_events_total",
    "Watch events applied to the caches, by resource kind and event type.",
    ["kind", "type"],
    registry=REGISTRY,
)
WATCH_RESTARTS = Counter(
    "webhook_watch_restarts_total",
    "Watches restarted, by resource kind and reason (gone, error, closed).",
    ["kind", "reason"],
    registry=REGISTRY,
)
CACHE_OBJECTS = Gauge(
    "webhook_cache_objects",
    "Objects held in the watch-fed caches, by kind.",
    ["kind"],
    registry=REGISTRY,
)
CACHE_SKIPPED = Counter(
    "webhook_cache_objects_skipped_total",
    "Objects a watch-fed cache could not take and skipped (the log names each), by kind.",
    ["kind"],
    registry=REGISTRY,
)
PODS_UNREADABLE_GPUS = Gauge(
    "webhook_pods_unreadable_gpus",
    "Cached pods whose GPU request cannot be read; each counts as the largest GPU request against its project.",
    registry=REGISTRY,
)
ADMISSION_INTERNAL_ERRORS = Counter(
    "webhook_admission_internal_errors_total",
    "Admission reviews refused because a decision raised: always a bug, the log has the traceback.",
    ["endpoint"],
    registry=REGISTRY,
)
RUNAI_REACHABLE = Gauge(
    "webhook_runai_reachable",
    "1 when the last call to the Run:ai control plane succeeded.",
    registry=REGISTRY,
)
SETTINGS_REJECTED = Gauge(
    "webhook_settings_rejected",
    "1 while the settings ConfigMap is refused (bad or both Kueue and Run:ai on) and the last good settings serve.",
    registry=REGISTRY,
)
CERT_RELOADS = Counter(
    "webhook_certificate_reloads_total",
    "Serving certificate reloads from disk, by result.",
    ["result"],
    registry=REGISTRY,
)
CONNECTIONS_OPEN = Gauge(
    "webhook_connections_open",
    "Connections a listener holds now (TLS handshakes in progress included), by listener.",
    ["listener"],  # main (admission, GPU API), probes (kubelet probes, metrics)
    registry=REGISTRY,
)
CONNECTIONS_CLOSED = Counter(
    "webhook_connections_closed_total",
    "Connections closed by the server to bound what idle or hostile clients hold, by listener and reason.",
    # shed (every connection busy), evicted (room made at the cap), header_timeout, body_timeout
    ["listener", "reason"],
    registry=REGISTRY,
)
RUNAI_ADMISSION_AVAILABLE = Gauge(
    "webhook_runai_admission_available",
    "1 while Run:ai's admission Deployment (namespace runai) is available, 0 while it is down or missing: "
    "while 0, no pod can be created in a namespace bound to Run:ai.",
    ["deployment"],
    registry=REGISTRY,
)
CERT_EXPIRY = Gauge(
    "webhook_serving_certificate_expiry_timestamp_seconds",
    "When the serving certificate new connections get expires (Unix time); the webhooks fail closed after it.",
    registry=REGISTRY,
)

_cache_log = logging.getLogger("webhook.state.store")


def log_skipped(kind: str, event: str, obj: Mapping[str, Any]) -> None:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    CACHE_SKIPPED.labels(kind).inc()
    # %.100s: the names are the object's own, of any length
    _cache_log.exception(
        "%s cache skipped a %s object %.100s/%.100s", kind, event, meta.get("namespace"), meta.get("name")
    )
