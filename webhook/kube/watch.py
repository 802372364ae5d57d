"""Watch-fed caches: for each kind admission reads, list, then watch from the list's resourceVersion.

Each `ResourceWatch` runs one informer-like loop: a paginated list replaces the kind in the store in
one synchronous step (no reader ever sees it half-filled), marks it synced for /readyz, then a watch
applies events. The pages go to the sink's `Listing` as they arrive, so a sink may keep less of each
object than the page held (the pod cache keeps a record of each pod, not the object). `410 Gone`
(as an HTTP status or as an ERROR event inside the stream) means the history we would resume from
is gone: re-list. Other failures back off with jitter and resume from the last resourceVersion
seen, so a dropped connection costs no re-list. A clean end of the stream
(the server's timeoutSeconds) resumes at once.

Responses are read as raw JSON (`_preload_content=False`): no model round-trip, unknown fields kept,
and the store gets plain dicts with `kind` set, exactly what the folder-backed feeder gives it. A
watch may decode its list pages itself (`decode_page`), keeping only the fields its sink reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from webhook.kube.api import KubeGone, Obj, kube_error
from webhook.metrics import (
    CACHE_LIST_SECONDS,
    CACHE_OBJECTS,
    REMOTE_CALLS,
    WATCH_EVENTS,
    WATCH_RESTARTS,
    log_skipped,
)

log = logging.getLogger(__name__)
# A kubernetes_asyncio `list_*` method (namespace and the like already bound with functools.partial).
# It is called with keyword arguments only and `_preload_content=False`, so it returns the raw
# aiohttp response; the client's annotations name only the model list it returns otherwise, hence
# `Any` here and the response typed where it is awaited.
ListFn = Callable[..., Awaitable[Any]]


# A list page's body -> the page as JSON (`metadata` and `items`), its items already slimmed; None
# for a page not of the decoder's schema, which is then parsed whole and each item slimmed.
PageDecoder = Callable[[bytes], Mapping[str, Any] | None]


class Listing(Protocol):
    """A fresh list on its way into a sink: each page is added as it arrives; `finish` replaces the
    kind with all of them in one synchronous step."""

    def add(self, objects: Sequence[Obj]) -> None: ...

    def finish(self) -> None: ...


class Sink(Protocol):
    """Where a watch delivers objects; `ClusterState` is one."""

    synced: dict[str, bool]

    def apply(self, obj: Mapping[str, Any]) -> None: ...

    def delete(self, obj: Mapping[str, Any]) -> None: ...

    def replace_all(self, kind: str, objects: Sequence[Mapping[str, Any]]) -> None: ...

    def listing(self, kind: str) -> Listing: ...


class HeldListing:
    """A sink's `Listing` that holds every object until the list is complete, then hands them all
    to `replace_all`."""

    def __init__(self, sink: Sink, kind: str) -> None:
        self.sink = sink
        self.kind = kind
        self.objects: list[Obj] = []

    def add(self, objects: Sequence[Obj]) -> None:
        self.objects.extend(objects)

    def finish(self) -> None:
        self.sink.replace_all(self.kind, self.objects)


class _Absent(Exception):
    """An optional resource is not served (its CRD is not installed)."""


@dataclass(frozen=True, slots=True)
class WatchTiming:
    page_size: int = 500
    # The pod list's pages are larger: the apiserver's time per page grows with what is left to
    # list, so small pages over tens of thousands of pods made a restarted replica's list grow
    # faster than the pods (bench/README.md, bench.list_pages); a page is decoded into records and
    # let go before the next, so the peak memory grows with the page, not the pods.
    pod_page_size: int = 2000
    # Server-side watch timeout; each watch picks a random value in [t, 2t) so replicas spread out.
    watch_timeout_s: float = 300.0
    request_timeout_s: float = 60.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    # How often an optional resource that is not served (a missing CRD) is listed again.
    absent_retry_s: float = 60.0
    # A watch that ends cleanly sooner than this without events counts as a failure (no hot loop).
    min_watch_s: float = 1.0


@dataclass(eq=False)
class ResourceWatch:
    """One list-then-watch loop. Add a resource with one line, e.g.
    `ResourceWatch("ConfigMap", partial(core.list_namespaced_config_map, ns), name="ConfigMap/x",
    label_selector="app=x")`."""

    kind: str  # set on every object handed to the sink (list items of built-ins come without it)
    list_fn: ListFn
    name: str = ""  # key in `sink.synced` and the metrics' kind label; defaults to `kind`
    field_selector: str | None = None
    label_selector: str | None = None
    optional: bool = False  # a 404 (CRD absent) counts as synced and empty, and is retried slowly
    # Likewise a 403: for reads the install grants only where another product lives (Run:ai's
    # namespace), which must never keep /readyz, and so every pod webhook, down.
    forbidden_ok: bool = False
    slim: Callable[[Obj], Obj] | None = None  # drop what the store does not need (memory, at 100k pods)
    # Decodes a list page and slims its items at once (`slim` then applies to watch events, and to
    # a page the decoder refuses); None: every page is parsed whole and each item slimmed.
    decode_page: PageDecoder | None = None
    timing: WatchTiming = field(default_factory=WatchTiming)
    page_size: int | None = None  # None: the timing's page_size
    resource_version: str | None = field(default=None, init=False)  # last seen; None: list next

    def __post_init__(self) -> None:
        if not self.name:
            self.name = self.kind

    # -- the loop ----------------------------------------------------------------------------------
    async def run(self, sink: Sink) -> None:
        """Run until cancelled; never raises otherwise."""
        failures = 0
        while True:
            try:
                if self.resource_version is None:
                    await self._list(sink)
                    failures = 0
                started = time.monotonic()
                events = await self._watch(sink)
                WATCH_RESTARTS.labels(self.name, "closed").inc()
                if events or time.monotonic() - started >= self.timing.min_watch_s:
                    failures = 0
                    continue
                failures += 1
                await asyncio.sleep(self._backoff(failures))
            except KubeGone:
                WATCH_RESTARTS.labels(self.name, "gone").inc()
                log.info("%s: resourceVersion %s is gone, listing again", self.name, self.resource_version)
                self.resource_version = None
                failures += 1
                if failures > 1:  # a second 410 in a row: do not hammer the server
                    await asyncio.sleep(self._backoff(failures))
            except _Absent:
                WATCH_RESTARTS.labels(self.name, "absent").inc()
                log.info("%s: not served (CRD not installed?); retrying in %ss", self.name, self.timing.absent_retry_s)
                sink.replace_all(self.kind, [])
                sink.synced[self.name] = True
                CACHE_OBJECTS.labels(self.name).set(0)
                self.resource_version = None
                failures = 0
                await asyncio.sleep(self.timing.absent_retry_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Network errors, 5xx, 401/403, malformed streams: back off, resume from the last version.
                WATCH_RESTARTS.labels(self.name, "error").inc()
                failures += 1
                delay = self._backoff(failures)
                log.warning("%s: %s: %s; retrying in %.1fs", self.name, type(exc).__name__, exc, delay)
                await asyncio.sleep(delay)

    def _backoff(self, failures: int) -> float:
        ceiling = min(self.timing.backoff_max_s, self.timing.backoff_initial_s * 2 ** max(0, failures - 1))
        return random.uniform(ceiling / 2, ceiling)

    def _prepared_items(self, items: Iterable[Any]) -> list[Obj]:
        prepared = []
        for item in items:
            try:
                prepared.append(self._prepare(item))
            except Exception:
                log_skipped(self.name, "list", item if isinstance(item, dict) else {})
        return prepared

    def _prepare(self, obj: Obj) -> Obj:
        if self.slim is not None:
            obj = self.slim(obj)
        if "kind" not in obj:
            obj["kind"] = self.kind
        return obj

    def _selectors(self) -> dict[str, str]:
        selectors = {}
        if self.field_selector:
            selectors["field_selector"] = self.field_selector
        if self.label_selector:
            selectors["label_selector"] = self.label_selector
        return selectors

    def _decode_page(self, body: bytes) -> tuple[Mapping[str, Any], list[Obj]]:
        """A list page and its items, ready for the sink."""
        page = self.decode_page(body) if self.decode_page is not None else None
        if page is not None:
            return page, self._kinded_items(page.get("items") or ())
        page = json.loads(body)
        return page, self._prepared_items(page.get("items") or ())

    def _kinded_items(self, items: Iterable[Any]) -> list[Obj]:
        kinded = []
        for item in items:
            if "kind" not in item:
                item["kind"] = self.kind
            kinded.append(item)
        return kinded

    async def _list(self, sink: Sink) -> None:
        listing = sink.listing(self.kind)
        started = time.monotonic()
        count = 0
        cont: str | None = None
        rv = ""
        while True:
            kwargs: dict[str, Any] = {**self._selectors(), "limit": self.page_size or self.timing.page_size}
            if cont:
                kwargs["_continue"] = cont
            REMOTE_CALLS.labels("kubernetes", "background").inc()
            response: aiohttp.ClientResponse = await self.list_fn(
                **kwargs, _preload_content=False, _request_timeout=self.timing.request_timeout_s
            )
            try:
                if response.status != 200:
                    raise await self._error(response)
                body = await response.read()
            finally:
                response.release()
            page, items = self._decode_page(body)
            del body
            count += len(items)
            listing.add(items)
            meta = page.get("metadata") or {}
            rv = meta.get("resourceVersion") or rv
            cont = meta.get("continue")
            if not cont:
                break
        try:
            listing.finish()  # one synchronous step: readers see old or new, never a mix
        except Exception:
            # Part of the list may be in: never report such a cache as synced (it would under-count).
            sink.synced[self.name] = False
            raise
        sink.synced[self.name] = True
        CACHE_OBJECTS.labels(self.name).set(count)
        CACHE_LIST_SECONDS.labels(self.name).set(time.monotonic() - started)
        self.resource_version = rv
        log.info("%s: listed %d at resourceVersion %s", self.name, count, rv)

    async def _watch(self, sink: Sink) -> int:
        """Apply events until the stream ends cleanly; returns how many. Raises on anything else."""
        timeout = random.uniform(self.timing.watch_timeout_s, 2 * self.timing.watch_timeout_s)
        REMOTE_CALLS.labels("kubernetes", "background").inc()
        response: aiohttp.ClientResponse = await self.list_fn(
            **self._selectors(),
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=int(timeout),
            _preload_content=False,
            # No total timeout: the server ends the stream; a silent connection is caught by sock_read.
            _request_timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.timing.request_timeout_s, sock_read=timeout + 30
            ),
        )
        count = 0
        try:
            if response.status != 200:
                raise await self._error(response)
            gauge = CACHE_OBJECTS.labels(self.name)
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                if not isinstance(event, dict):
                    raise ValueError(f"watch event is not an object: {line[:100]!r}")
                etype = event.get("type")
                obj = event.get("object")
                obj = obj if isinstance(obj, dict) else {}
                if etype == "ERROR":
                    code = obj.get("code")
                    raise kube_error(int(code or 500), None, str(obj.get("message") or obj))
                meta = obj.get("metadata")
                rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
                WATCH_EVENTS.labels(self.name, etype or "").inc()
                count += 1
                if etype in ("ADDED", "MODIFIED", "DELETED"):
                    self._deliver(sink, etype, obj)
                    if etype == "ADDED":
                        gauge.inc()
                    elif etype == "DELETED":
                        gauge.dec()
                elif etype != "BOOKMARK":
                    log.warning("%s: unknown watch event type %r", self.name, etype)
                if rv:
                    self.resource_version = rv
        finally:
            response.close()
        return count

    def _deliver(self, sink: Sink, etype: str, obj: Any) -> None:
        try:
            obj = self._prepare(obj)
            if etype == "DELETED":
                sink.delete(obj)
            else:
                sink.apply(obj)
        except Exception:
            # One object the store cannot take must not wedge the watch (it would replay it forever).
            log_skipped(self.name, etype, obj if isinstance(obj, dict) else {})

    async def _error(self, response: aiohttp.ClientResponse) -> Exception:
        if (response.status == 404 and self.optional) or (response.status == 403 and self.forbidden_ok):
            return _Absent()
        return kube_error(response.status, await response.text(errors="replace"), limit=300)


class KubeWatcher:
    """Runs watches that feed a `ClusterState` (or any `Sink`) until stopped.

    `async with KubeWatcher(state, watches):` or `await w.start()` / `await w.stop()`; the caches'
    own watches come from `webhook.state.watches.cache_watcher`.
    """

    def __init__(self, state: Sink, watches: Iterable[ResourceWatch]) -> None:
        self.state = state
        self.watches: list[ResourceWatch] = list(watches)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        if self._tasks:
            return
        for watch in self.watches:
            # Registered before the first list so /readyz waits for every kind, not only the fast ones.
            self.state.synced.setdefault(watch.name, False)
        self._tasks = [asyncio.create_task(watch.run(self.state), name=f"watch-{watch.name}") for watch in self.watches]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def synced(self) -> bool:
        return all(self.state.synced.get(w.name) for w in self.watches)

    async def wait_synced(self, within_s: float | None = None) -> bool:
        """True once every watch has listed; False if that takes longer than `within_s`."""
        deadline = None if within_s is None else time.monotonic() + within_s
        while not self.synced():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def __aenter__(self) -> KubeWatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
