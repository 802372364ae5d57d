"""Leader election on a coordination.k8s.io/v1 Lease, the way client-go's leaderelection does it.

- A candidate takes the Lease when it has no holder or when the holder's record has not changed
  for `leaseDurationSeconds`, measured on the candidate's own monotonic clock from when it first
  saw that record (clock skew between nodes does not matter, as in client-go).
- Every write is a PUT with the resourceVersion just read: a 409 means another candidate wrote
  first, and it won.
- The leader renews every `retry_period_s`; if it cannot renew within `renew_deadline_s` it stops
  leading at once (its work task is cancelled) and becomes a candidate again. `renew_deadline_s`
  is shorter than the lease duration, so a leader stops before anyone else may take over.
- A graceful stop releases the Lease (empty holder, duration 1 s) so a successor takes over
  without waiting for the lease to expire.
- `predecessors` names the holders this process took the Lease over from: each had stopped
  renewing it for a whole lease duration, or released it on its way out. Work they held (a
  department move's intent) may be resumed at once.

Only `get`, `create` and `update` are used: what the Role grants on the Lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import socket
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import ApiClient, CoordinationV1Api

from webhook.kube.api import KubeConflict, KubeNotFound, Obj, raw_call
from webhook.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# Predecessors remembered: a few are plenty (each successful takeover adds one).
MAX_PREDECESSORS = 16


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    lease_duration_s: float = 15.0  # how long a record must stay unchanged before others take over
    renew_deadline_s: float = 10.0  # how long the leader keeps trying to renew before it steps down
    retry_period_s: float = 2.0  # between attempts (acquire and renew)
    request_timeout_s: float = 5.0  # one API call

    def __post_init__(self) -> None:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("need retry_period_s < renew_deadline_s < lease_duration_s")


def default_identity() -> str:
    """Unique per process: a restarted container in the same pod must not inherit the old lease."""
    base = os.environ.get("POD_NAME") or socket.gethostname() or "scheduling-webhook"
    return f"{base}_{uuid.uuid4().hex[:10]}"


def _micro_time(moment: float) -> str:
    # MicroTime: RFC 3339 with microseconds.
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """`await start()` / `await stop()`; `is_leader`; `leading` (an Event set while leading).

    `on_started_leading` is a coroutine function run as a task while this process leads; it is
    cancelled the moment leadership is lost or given up. `on_stopped_leading` is a plain callable.
    """

    def __init__(
        self,
        api_client: ApiClient,
        namespace: str,
        name: str,
        *,
        identity: str | None = None,
        timing: LeaseTiming | None = None,
        on_started_leading: Callable[[], Awaitable[None]] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
    ) -> None:
        self.api = CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.timing = timing or LeaseTiming()
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.leading = asyncio.Event()
        self._observed: Obj | None = None  # last lease spec seen
        self._observed_rv = ""
        self._observed_at = 0.0  # monotonic time the spec above was first seen
        self._renewed_at = 0.0  # monotonic time our last successful write was sent
        self._task: asyncio.Task[None] | None = None
        self._work: asyncio.Task[None] | None = None
        self._predecessors: deque[str] = deque(maxlen=MAX_PREDECESSORS)
        self._released_by = ""  # the holder of a released Lease, as last observed holding it

    # -- public -------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        # Also time-bound: a renew loop that got stuck must not leave us believing we lead.
        return self.leading.is_set() and time.monotonic() < self._renewed_at + self.timing.renew_deadline_s

    @property
    def holder(self) -> str | None:
        """The holder as last observed (None: nobody)."""
        return (self._observed or {}).get("holderIdentity") or None

    @property
    def predecessors(self) -> tuple[str, ...]:
        """Holders whose Lease this process took over (lapsed or released), oldest first."""
        return tuple(self._predecessors)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"leader-election-{self.name}")

    async def stop(self, *, release: bool = True) -> None:
        """Stop campaigning; stop the work; with `release`, hand the Lease over at once."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        was_leading = self.leading.is_set()
        await self._stop_leading()
        if release and was_leading:
            with contextlib.suppress(Exception):
                await self._release()

    # -- the loop -----------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while True:
                await self._acquire()
                await self._start_leading()
                await self._renew_until_lost()
                await self._stop_leading()
        finally:
            # Cancelled (stop, or the process dying): the work must not outlive the campaign.
            if self._work is not None:
                self._work.cancel()

    def _jittered(self, period: float) -> float:
        return period * random.uniform(1.0, 1.2)

    async def _acquire(self) -> None:
        while True:
            try:
                if await self._try_acquire_or_renew():
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("lease %s/%s: cannot acquire yet: %s", self.namespace, self.name, exc)
            await asyncio.sleep(self._jittered(self.timing.retry_period_s))

    async def _renew_until_lost(self) -> None:
        while True:
            await asyncio.sleep(self.timing.retry_period_s)
            deadline = self._renewed_at + self.timing.renew_deadline_s
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.warning(
                        "lease %s/%s: not renewed within the deadline; stepping down", self.namespace, self.name
                    )
                    return
                try:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can lose a stop's cancellation.
                    async with asyncio.timeout(remaining):
                        renewed = await self._try_acquire_or_renew()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # includes TimeoutError from the timeout
                    log.info("lease %s/%s: renew failed: %s", self.namespace, self.name, exc)
                    renewed = None
                if renewed:
                    break
                if renewed is False:
                    # Someone else holds it (we were too slow, or it was taken over): leave now.
                    log.warning("lease %s/%s: now held by %s; stepping down", self.namespace, self.name, self.holder)
                    return
                await asyncio.sleep(min(self.timing.retry_period_s, max(0.0, deadline - time.monotonic())))

    async def _start_leading(self) -> None:
        self.leading.set()
        log.info("lease %s/%s: %s is the leader", self.namespace, self.name, self.identity)
        if self.on_started_leading is not None:
            self._work = asyncio.create_task(self._guarded_work(), name="leader-work")

    async def _guarded_work(self) -> None:
        assert self.on_started_leading is not None
        try:
            await self.on_started_leading()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("leader work failed")

    async def _stop_leading(self) -> None:
        if not self.leading.is_set():
            return
        self.leading.clear()
        self._renewed_at = 0.0
        work, self._work = self._work, None
        await cancel_and_wait(work)
        if self.on_stopped_leading is not None:
            try:
                self.on_stopped_leading()
            except Exception:
                log.exception("on_stopped_leading failed")
        log.info("lease %s/%s: %s stopped leading", self.namespace, self.name, self.identity)

    # -- one attempt --------------------------------------------------------------------------
    async def _try_acquire_or_renew(self) -> bool | None:
        """True: we hold the lease now. False: someone else validly holds it. Raises on API errors."""
        sent_at = time.monotonic()
        now = time.time()
        duration = max(1, math.ceil(self.timing.lease_duration_s))
        mine: Obj = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": duration,
            "acquireTime": _micro_time(now),
            "renewTime": _micro_time(now),
            "leaseTransitions": 0,
        }
        try:
            lease = await self._call(self.api.read_namespaced_lease, self.name, self.namespace)
        except KubeNotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": mine,
            }
            try:
                created = await self._call(self.api.create_namespaced_lease, self.namespace, body)
            except KubeConflict:
                return False  # created by someone else just now
            self._observe(created)
            self._renewed_at = sent_at
            return True
        spec = dict(lease.get("spec") or {})
        self._observe(lease)
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.identity:
            self._released_by = holder  # a release empties the holder: remember who held it
        held_by_me = holder == self.identity
        if holder and not held_by_me:
            lease_s = float(spec.get("leaseDurationSeconds") or duration)
            if time.monotonic() < self._observed_at + lease_s:
                return False
        if held_by_me:
            mine["acquireTime"] = spec.get("acquireTime") or mine["acquireTime"]
            mine["leaseTransitions"] = int(spec.get("leaseTransitions") or 0)
        else:
            mine["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        body = {**lease, "spec": {**spec, **mine}}
        try:
            updated = await self._call(self.api.replace_namespaced_lease, self.name, self.namespace, body)
        except KubeConflict:
            return False  # another candidate wrote first
        previous = holder or self._released_by
        if not held_by_me and previous and previous != self.identity:
            self._predecessors.append(previous)
            log.info("lease %s/%s: taken over from %s", self.namespace, self.name, previous)
        self._observe(updated)
        self._renewed_at = sent_at
        return True

    def _observe(self, lease: Obj) -> None:
        spec = dict(lease.get("spec") or {})
        rv = str((lease.get("metadata") or {}).get("resourceVersion") or "")
        if spec != self._observed or rv != self._observed_rv:
            self._observed = spec
            self._observed_rv = rv
            self._observed_at = time.monotonic()

    async def _release(self) -> None:
        lease = await self._call(self.api.read_namespaced_lease, self.name, self.namespace)
        spec = dict(lease.get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            return
        now = _micro_time(time.time())
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=now, acquireTime=now)
        await self._call(self.api.replace_namespaced_lease, self.name, self.namespace, {**lease, "spec": spec})
        log.info("lease %s/%s: released by %s", self.namespace, self.name, self.identity)

    async def _call(self, method: Callable[..., Awaitable[Any]], *args: Any) -> Obj:
        return await raw_call(method, *args, call_path="background", _request_timeout=self.timing.request_timeout_s)
