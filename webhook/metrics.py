"""Prometheus metrics, one registry for the process (served on /metrics)."""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

REGISTRY = CollectorRegistry(auto_describe=True)
# The series every Prometheus client exports by default (process_* memory, CPU and file
# descriptors; python_gc_*; python_info), which dashboards and alerts expect of any process: the
# registry is this process's own, so they are registered here rather than inherited.
ProcessCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

# Admission answers, counted per review as plain integers (AdmissionCounts) and exported by
# collectors under the names, labels and help that prometheus_client's Counter and Histogram gave
# them, where `inc()` and `observe()` took a lock and walked bucket objects on every review
# (tests/test_server.py holds the exposition to what those types write).
ADMISSION_OUTCOMES = ("allowed", "patched", "denied", "bad_request")
ADMISSION_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# The `le` labels, as Histogram writes them ("1.0", "+Inf").
_LATENCY_LE = [floatToGoString(b) for b in (*ADMISSION_LATENCY_BUCKETS, float("inf"))]  # type: ignore[no-untyped-call]
ADMISSION_REQUESTS_HELP = "Admission reviews answered, by endpoint and outcome."
ADMISSION_LATENCY_HELP = "Time to decide one admission review, parse to answer."
ADMISSION_INTERNAL_ERRORS_HELP = (
    "Admission reviews refused because a decision raised: always a bug, the log has the traceback."
)


class AdmissionCounts:
    """One endpoint's answers: by outcome, internal errors, and the latency histogram. Only the
    event loop's thread writes them (and reads them, for /metrics)."""

    __slots__ = ("allowed", "bad_request", "buckets", "created", "denied", "endpoint", "internal_errors", "patched",
                 "seconds")  # fmt: skip

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.created = time.time()
        self.allowed = 0
        self.patched = 0
        self.denied = 0
        self.bad_request = 0
        self.internal_errors = 0
        # Not cumulative: the i-th counts the reviews above bound i-1 and at most bound i; the last, +Inf.
        self.buckets = [0] * (len(ADMISSION_LATENCY_BUCKETS) + 1)
        self.seconds = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left: the first bound >= seconds, as Histogram's `seconds <= bound`.
        self.buckets[bisect_left(ADMISSION_LATENCY_BUCKETS, seconds)] += 1
        self.seconds += seconds


_ADMISSION_COUNTS: dict[str, AdmissionCounts] = {}


def admission_counts(endpoint: str) -> AdmissionCounts:
    """The process's counts of `endpoint` (every app serving it adds to the same, as a Counter's
    child would); its series are exported, at zero, from this call on."""
    counts = _ADMISSION_COUNTS.get(endpoint)
    if counts is None:
        counts = _ADMISSION_COUNTS[endpoint] = AdmissionCounts(endpoint)
    return counts


class _Collected(Collector):
    def __init__(self, collect: Callable[[], Metric]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return [self._collect()]


def _admission_requests() -> Metric:
    family = CounterMetricFamily("webhook_admission_requests_total", ADMISSION_REQUESTS_HELP,
                                 labels=["endpoint", "outcome"])  # fmt: skip
    for counts in _ADMISSION_COUNTS.values():
        for outcome in ADMISSION_OUTCOMES:
            family.add_metric([counts.endpoint, outcome], getattr(counts, outcome), created=counts.created)
    return family


def _admission_latency() -> Metric:
    family = HistogramMetricFamily("webhook_admission_duration_seconds", ADMISSION_LATENCY_HELP, labels=["endpoint"])
    for counts in _ADMISSION_COUNTS.values():
        cumulative: list[tuple[str, float]] = []
        running = 0
        for le, count in zip(_LATENCY_LE, counts.buckets, strict=True):
            running += count
            cumulative.append((le, float(running)))
        family.add_metric([counts.endpoint], cumulative, counts.seconds)
        family.samples.append(Sample(family.name + "_created", {"endpoint": counts.endpoint}, counts.created))
    return family


def _admission_internal_errors() -> Metric:
    family = CounterMetricFamily("webhook_admission_internal_errors_total", ADMISSION_INTERNAL_ERRORS_HELP,
                                 labels=["endpoint"])  # fmt: skip
    for counts in _ADMISSION_COUNTS.values():
        family.add_metric([counts.endpoint], counts.internal_errors, created=counts.created)
    return family


# Registered where the Counter and Histogram were, so /metrics lists them in the same order.
REGISTRY.register(_Collected(_admission_requests))
REGISTRY.register(_Collected(_admission_latency))

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
CACHE_LIST_SECONDS = Gauge(
    "webhook_cache_list_seconds",
    "How long the last complete list of each cache took, first page asked to cache filled, by kind "
    "(a started replica is ready after its longest).",
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
REGISTRY.register(_Collected(_admission_internal_errors))
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
    # shed (every connection busy), evicted (room made at the cap), header_timeout, body_timeout,
    # client_refused (a client certificate naming none of the accepted clients), answer_timeout
    # (answers not read), pipeline_limit (too many requests ahead of their answers)
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

WOULD_REFUSE = Counter(
    "webhook_would_refuse_total",
    "Requests admitted only because their refusal family (rule) is in warn mode, by rule and project: a pod "
    "once, an owner when created or updated to carry what would be refused.",
    ["rule", "project"],
    registry=REGISTRY,
)
# What the admin view lists: the projects with would-be refusals in the last hour.
WOULD_REFUSE_WINDOW_S = 3600.0
_WOULD_REFUSE_KEPT = 1000  # times kept per project and rule: a count, not a log


class WouldRefuse:
    """The would-be refusals of the last hour, per (project, rule), on this replica; the metric
    above is the cluster-wide count (summed over replicas by whoever scrapes them)."""

    def __init__(self) -> None:
        self._times: dict[tuple[str, str], list[float]] = {}

    def record(self, rule: str, project: str, now: float) -> None:
        WOULD_REFUSE.labels(rule, project).inc()
        times = self._times.setdefault((project, rule), [])
        times.append(now)
        if len(times) > _WOULD_REFUSE_KEPT:
            del times[: len(times) - _WOULD_REFUSE_KEPT]

    def recent(self, now: float) -> list[tuple[str, str, int, float]]:
        """(project, rule, count, last) of the last hour, by project and rule."""
        since = now - WOULD_REFUSE_WINDOW_S
        found = []
        for key in sorted(self._times):
            times = [t for t in self._times[key] if t >= since]
            if times:
                self._times[key] = times
                found.append((*key, len(times), times[-1]))
            else:
                del self._times[key]
        return found


WOULD_REFUSE_RECENT = WouldRefuse()

_cache_log = logging.getLogger("webhook.state.store")


def log_skipped(kind: str, event: str, obj: Mapping[str, Any]) -> None:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    CACHE_SKIPPED.labels(kind).inc()
    # %.100s: the names are the object's own, of any length
    _cache_log.exception(
        "%s cache skipped a %s object %.100s/%.100s", kind, event, meta.get("namespace"), meta.get("name")
    )
