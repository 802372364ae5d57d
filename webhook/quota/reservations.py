"""GPU reservations shared by every replica, so that two admissions never both take the last GPU.

The Kubernetes API is the shared store: one ConfigMap per project namespace, in the install
namespace, whose data maps a reservation key (the pod's uid, see `request_key`) to JSON
`{"gpus", "expires_at", "kept_until", "pod", "kind"}`.

A reservation counts only until its pod shows in the pod watch, and for `gpu_reservation_confirm_s`
(a setting, seconds) at most: a review that the apiserver never turned into a pod (one sent by
someone else than the apiserver, or refused by a later webhook) holds GPUs that briefly. The entry
itself is kept for `ttl_s`, counting nothing once lapsed, so that the same review sent again finds
its key and is not given a new count: repeating a review renews nothing. A label-selected watch feeds them to
`snapshot.gpu_reservations`, which the pure decisions read. `reserve` decides again against the
ConfigMap as the API server holds it and writes the new entry with that resourceVersion: of two
writers that read the same version, one gets 409, reads again and sees the other's GPUs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import random
import re
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, CoreV1Api

from webhook.core.decision import Decision, Reason
from webhook.core.kinds import pod_gpu_request
from webhook.core.preemptibility import runai_preemptibility
from webhook.core.quota import request_key, validate_pod
from webhook.core.scheduling import pod_target
from webhook.kube.api import KubeApi, KubeConflict, KubeError
from webhook.kube.watch import HeldListing, KubeWatcher, Listing, ResourceWatch, WatchTiming
from webhook.snapshot import ClusterSnapshot, GpuReservation
from webhook.state.store import ClusterState, apply_each

log = logging.getLogger(__name__)

RESERVATIONS_LABEL = "scheduling.hopsworks.ai/gpu-reservations"
NAMESPACE_ANNOTATION = "scheduling.hopsworks.ai/namespace"
# A namespace name is a DNS label (<= 63), so the name stays a valid DNS subdomain of <= 80 chars.
CONFIGMAP_PREFIX = "gpu-reservations."
WATCH_NAME = "GpuReservation"  # key in state.synced (/readyz) and the watch metrics
# How long an entry's key is remembered after its write (its count lapses much sooner, see the
# setting gpu_reservation_confirm_s): within it, the same review sent again reserves nothing new.
DEFAULT_TTL_S = 120.0
_DATA_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def configmap_name(namespace: str) -> str:
    return CONFIGMAP_PREFIX + namespace


def data_key(key: str) -> str:
    """A ConfigMap data key for a reservation key. Pod uids are valid as they are (the pure count
    matches reservations to cached pods by uid); anything else is hashed."""
    if _DATA_KEY.match(key):
        return key
    return "req-" + hashlib.sha256(key.encode()).hexdigest()[:40]


def parse_reservations(namespace: str, data: Mapping[str, Any] | None) -> dict[str, GpuReservation]:
    out: dict[str, GpuReservation] = {}
    for key, raw in (data or {}).items():
        try:
            value = json.loads(raw)
            expires_at = float(value["expires_at"])
            out[key] = GpuReservation(
                key=key,
                namespace=namespace,
                gpus=float(value["gpus"]),
                expires_at=expires_at,
                kept_until=max(expires_at, float(value.get("kept_until", expires_at))),
            )
        except (TypeError, ValueError, KeyError):
            # Someone edited it by hand: skip the entry rather than block the project.
            log.warning("gpu reservations of %s: ignoring malformed entry %r", namespace, key)
    return out


def _configmap_namespace(cm: Mapping[str, Any]) -> str:
    meta = cm.get("metadata") or {}
    annotated = (meta.get("annotations") or {}).get(NAMESPACE_ANNOTATION)
    if annotated:
        return str(annotated)
    name = str(meta.get("name") or "")
    return name[len(CONFIGMAP_PREFIX) :] if name.startswith(CONFIGMAP_PREFIX) else ""


def reservation_need(request: Mapping[str, Any], snapshot: ClusterSnapshot) -> tuple[str, str | None, float] | None:
    """(namespace, kind, GPUs) when the request is a GPU pod whose quota this system checks: a
    checked kind in a bound project with the Run:ai view present. Only these ever reserve."""
    target = pod_target(request, snapshot)
    if target is None or not snapshot.settings.run_ai_enable or target.namespace.runai_queue is None:
        return None
    seen = runai_preemptibility(
        target.labels, target.spec.get("priorityClassName"), snapshot.priority_classes, snapshot.settings
    )
    if seen.preemptible:
        return None
    if snapshot.runai_projects is None or target.namespace.name not in snapshot.runai_projects:
        return None
    try:
        gpus = pod_gpu_request(target.pod)
    except ValueError:
        return None
    return (target.namespace.name, target.kind, gpus) if gpus > 0 else None


class GpuReservations:
    """The reservation store of one replica: a watch-fed cache plus optimistic-concurrency writes.

    `await store.start(api_client)` / `await store.stop()` run the watch (it registers
    `GpuReservation` in `state.synced`, so /readyz waits for it). `await store.reserve(...)`
    decides and writes.
    """

    def __init__(
        self,
        state: ClusterState,
        kube: KubeApi,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_attempts: int = 10,
        jitter_s: float = 0.01,
        timeout_s: float = 5.0,
    ) -> None:
        self.state = state
        self.kube = kube
        self.install_namespace = kube.install_namespace
        self.ttl_s = ttl_s
        self.max_attempts = max_attempts
        self.jitter_s = jitter_s
        # Below the webhook's timeoutSeconds: refuse clearly rather than let the apiserver time out.
        self.timeout_s = timeout_s
        self.synced = state.synced  # the Sink protocol; shared so /readyz covers this watch
        self._objects: dict[str, dict[str, Any]] = {}  # namespace -> ConfigMap as last seen
        self._reservations: dict[str, dict[str, GpuReservation]] = {}
        state.snapshot().gpu_reservations = self._reservations
        # One writer per namespace in this replica: its own admissions then never conflict with
        # each other, only with other replicas' (which the resourceVersion settles).
        self._locks: dict[str, asyncio.Lock] = {}
        self._watcher: KubeWatcher | None = None

    # -- the watch (Sink) ---------------------------------------------------------------------
    def watch(self, api_client: ApiClient, timing: WatchTiming | None = None) -> ResourceWatch:
        core = CoreV1Api(api_client)
        return ResourceWatch(
            "ConfigMap",
            partial(core.list_namespaced_config_map, self.install_namespace),
            name=WATCH_NAME,
            label_selector=f"{RESERVATIONS_LABEL}=true",
            timing=timing or WatchTiming(),
        )

    async def start(self, api_client: ApiClient, timing: WatchTiming | None = None) -> None:
        if self._watcher is None:
            watch = self.watch(api_client, timing)
            self._watcher = KubeWatcher(self, [watch])
            await self._watcher.start()

    async def stop(self) -> None:
        if self._watcher is not None:
            await self._watcher.stop()
            self._watcher = None

    async def sweep(self, now: float) -> list[str]:
        """Delete the reservation ConfigMaps of namespaces that are gone once their entries have
        expired (the leader runs this each pass); returns the namespaces swept."""
        swept = []
        for namespace, obj in list(self._objects.items()):
            if namespace in self.state.namespaces:
                continue
            if any(r.kept_until > now for r in self._reservations.get(namespace, {}).values()):
                continue
            version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            try:
                await self.kube.delete_configmap(configmap_name(namespace), resource_version=version)
            except KubeConflict:
                continue  # written meanwhile: look again next pass
            swept.append(namespace)
        return swept

    def apply(self, obj: Mapping[str, Any]) -> None:
        namespace = _configmap_namespace(obj)
        if not namespace:
            return
        self._objects[namespace] = dict(obj)
        self._reservations[namespace] = parse_reservations(namespace, obj.get("data"))

    def delete(self, obj: Mapping[str, Any]) -> None:
        namespace = _configmap_namespace(obj)
        self._objects.pop(namespace, None)
        self._reservations.pop(namespace, None)

    def replace_all(self, kind: str, objects: Sequence[Mapping[str, Any]]) -> None:
        self._objects.clear()
        self._reservations.clear()
        apply_each(kind, objects, self.apply)

    def listing(self, kind: str) -> Listing:
        return HeldListing(self, kind)

    def reservations(self, namespace: str) -> Mapping[str, GpuReservation]:
        return self._reservations.get(namespace, {})

    # -- the write ----------------------------------------------------------------------------
    async def reserve(
        self,
        request: Mapping[str, Any],
        snapshot: ClusterSnapshot,
        now: float,
        need: tuple[str, str | None, float],
    ) -> Decision:
        """The pure decision, made again against the ConfigMap the API server holds, and the
        reservation written with its resourceVersion. `need` is `reservation_need`'s answer for a
        request that needs a reservation (not a dry run: that has no side effects)."""
        namespace, kind, gpus = need
        key = request_key(request)
        pod = (request.get("object") or {}).get("metadata") or {}
        confirm_s = min(snapshot.settings.gpu_reservation_confirm_s, self.ttl_s)
        entry = {
            "gpus": gpus,
            "expires_at": now + confirm_s,
            "kept_until": now + self.ttl_s,
            "pod": pod.get("name") or pod.get("generateName") or "",
            "kind": kind,
        }
        # Fail closed: when the reservation cannot be written, two replicas could both admit the
        # last GPU, and Run:ai would leave the extra non-preemptible pod pending with no message.
        # A clear refusal the user can retry is the better failure. It touches only GPU pods of
        # checked kinds in bound projects; everything else never reaches this write.
        try:
            async with asyncio.timeout(self.timeout_s):
                lock = self._locks.setdefault(namespace, asyncio.Lock())
                async with lock:
                    return await self._reserve(request, snapshot, now, namespace, data_key(key), entry)
        except TimeoutError:
            return self._unproven(namespace, f"no answer within {self.timeout_s:g}s")
        except (KubeError, aiohttp.ClientError, OSError) as exc:
            log.warning("gpu reservation for %s/%s failed: %s", namespace, entry["pod"], exc)
            return self._unproven(namespace, str(exc))

    async def _reserve(
        self,
        request: Mapping[str, Any],
        snapshot: ClusterSnapshot,
        now: float,
        namespace: str,
        key: str,
        entry: dict[str, Any],
    ) -> Decision:
        name = configmap_name(namespace)
        cm: dict[str, Any] | None = self._objects.get(namespace)  # first try the cache: no GET
        for attempt in range(self.max_attempts):
            if attempt:
                await asyncio.sleep(random.uniform(0, self.jitter_s * attempt))
                cm = await self.kube.get_configmap(name, call_path="request")
                if cm is not None:
                    self.apply(cm)  # fresher than the watch: the next admission starts from it
            current = parse_reservations(namespace, (cm or {}).get("data"))
            # The pod cache as this replica sees it, the reservations as the API server holds them.
            view = dataclasses.replace(snapshot, gpu_reservations={**snapshot.gpu_reservations, namespace: current})
            decision = validate_pod(request, view, now)
            if not decision.allowed:
                return decision
            if key in current:
                # The same review again (its key is the pod's uid): the entry stays as written, so
                # sending a review over and over cannot keep its GPUs held.
                return decision
            # Entries past kept_until go on every write. Entries of pods this replica already sees
            # stay: another replica's pod cache may lag, and it counts them only while it does not
            # see the pod (the pure count skips a reservation whose pod is cached).
            data = {
                k: v for k, v in ((cm or {}).get("data") or {}).items() if k in current and current[k].kept_until > now
            }
            data[key] = json.dumps(entry, separators=(",", ":"))
            try:
                if cm is None:
                    written = await self.kube.create_configmap(
                        self._new_configmap(namespace, data), call_path="request"
                    )
                else:
                    body = {**cm, "data": data}
                    written = await self.kube.replace_configmap(body, call_path="request")
            except KubeConflict:
                continue  # someone wrote first (or created it): read again and decide again
            self.apply(written)  # this replica sees its own write before the watch echoes it
            return decision
        return self._unproven(namespace, f"the reservation kept conflicting after {self.max_attempts} attempts")

    def _new_configmap(self, namespace: str, data: Mapping[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": configmap_name(namespace),
                "namespace": self.install_namespace,
                "labels": {RESERVATIONS_LABEL: "true", "app.kubernetes.io/managed-by": "scheduling-webhook"},
                "annotations": {NAMESPACE_ANNOTATION: namespace},
            },
            "data": dict(data),
        }

    @staticmethod
    def _unproven(namespace: str, why: str) -> Decision:
        return Decision.deny(
            f"GPU quota of project {namespace} cannot be checked right now: the GPU reservation could not be "
            f"written to the Kubernetes API ({why}). Try again in a moment",
            code=503,
            reason=Reason.GPU_QUOTA_UNPROVEN,
        )
