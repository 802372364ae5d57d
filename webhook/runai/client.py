"""Async client for the NVIDIA Run:ai control plane REST API (paths and fields as in runai-openapi.json).

Only what this system needs: a token by client credentials, clusters, departments, projects
(list/get/create/delete), node pools and their GPU metrics. Every HTTP attempt is counted in
REMOTE_CALLS and moves RUNAI_REACHABLE. The client secret and the access token never reach a log
line, an exception message or a repr: messages are built here and scrubbed of both.

Why one file over ~450 lines: the endpoints and the transport under them (token, retries within
one deadline, error mapping, scrubbing) share the session and the secret, and keeping them
together keeps every path a secret could leak through in one place to review.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp

from webhook.metrics import REMOTE_CALLS, RUNAI_REACHABLE, CallPath

from .models import Cluster, Department, NodePool, NodePoolMetrics, Project

log = logging.getLogger("webhook.runai")

# 429 is not in the spec for these paths, but proxies in front of the control plane send it.
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_PAGE_LIMIT = 500  # the spec's maximum for `limit`
_MAX_PAGES = 200
# Settings of a project that a re-create (department move rollback) carries over.
_COPIED_PROJECT_FIELDS = ("description", "schedulingRules", "defaultNodePools", "nodeTypes", "enforceRunaiScheduler")
_RESOURCE_FIELDS = ("nodePool", "gpu", "cpu", "memory", "priority")
_GPU_METRICS = ("TOTAL_GPU", "ALLOCATED_GPU", "UNALLOCATED_GPU")


class RunaiError(Exception):
    """A Run:ai call failed. The message never contains the client secret or a token."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        method: str | None = None,
        path: str | None = None,
        retried: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.method = method
        self.path = path
        self.retried = retried  # the request was sent more than once (a create may have landed)


class RunaiUnreachable(RunaiError):
    """No usable answer: connection refused, DNS, timeout, or 5xx/429 after the retries."""


class RunaiAuthError(RunaiError):
    """Credentials refused (token request, or 401 after one refresh) or a permission missing (403)."""


class RunaiNotFound(RunaiError):
    """404 from the control plane."""


class RunaiConflict(RunaiError):
    """409: a project with that name exists. `existing` is that project when it could be looked up."""

    def __init__(self, message: str, *, existing: Project | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.existing = existing


class SecretSource(Protocol):
    def read(self) -> str: ...


class SecretFile:
    """A key of a Kubernetes Secret mounted as files: `<directory>/<key>`.

    Read on every token request, so a rotated Secret (the kubelet swaps the files) is picked up
    without a restart.
    """

    def __init__(self, directory: Path | str, key: str) -> None:
        self.path = Path(directory) / key

    def read(self) -> str:
        try:
            value = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise RunaiAuthError(f"cannot read the Run:ai client secret file {self.path}: {exc.strerror}") from None
        # `--from-file` secrets often end with a newline that is not part of the secret.
        value = value.rstrip("\r\n")
        if not value:
            raise RunaiAuthError(f"the Run:ai client secret file {self.path} is empty")
        return value

    def __repr__(self) -> str:
        return f"SecretFile({str(self.path)!r})"


@dataclass(frozen=True)
class ClientOptions:
    timeout_s: float = 5.0  # one HTTP attempt, connect to last byte
    connect_timeout_s: float = 2.0
    retries: int = 3  # extra attempts after the first, for idempotent calls and creates
    backoff_s: float = 0.2  # first backoff; doubles per retry
    backoff_max_s: float = 2.0
    deadline_s: float = 15.0  # one method call, all attempts and backoffs included
    token_refresh_margin_s: float = 60.0  # refresh this long before expiresIn runs out


class _TokenCache:
    """Shared by a client and its `with_options` views, so they make one token request, not several."""

    def __init__(self) -> None:
        self.value: str | None = None
        self.refresh_at = 0.0  # monotonic
        self.lock = asyncio.Lock()
        self.secrets: set[str] = set()  # every value to scrub from messages (secret, tokens)


@dataclass
class _Reply:
    status: int
    body: Any
    retried: bool


class _Transient(Exception):
    """One attempt failed in a way worth retrying (connection, timeout, 5xx, 429)."""

    def __init__(self, reason: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after = retry_after


class RunaiClient:
    """Run:ai REST client. Use as `async with RunaiClient(...) as client:` or call `close()`.

    Each method takes `call_path` ("request" for the admission path, "background" otherwise): it
    labels REMOTE_CALLS, so a remote call on the request path shows up in the metrics.
    """

    def __init__(
        self,
        base_url: str,
        client_id: str,
        client_secret: SecretSource,
        *,
        options: ClientOptions | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.client_id = client_id
        self._secret_source = client_secret
        self.options = options or ClientOptions()
        self._session = session
        self._owns_session = session is None
        self._root = self  # views from with_options() share the root's session
        self._tokens = _TokenCache()

    def with_options(self, **changes: Any) -> RunaiClient:
        """A view with other timeouts/retries sharing this client's session and token."""
        view = RunaiClient.__new__(RunaiClient)
        view.__dict__.update(self.__dict__)
        view.options = replace(self.options, **changes)
        return view

    def __repr__(self) -> str:
        return f"RunaiClient(base_url={self.base_url!r}, client_id={self.client_id!r})"

    async def __aenter__(self) -> RunaiClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._root is self and self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    # ---- clusters -------------------------------------------------------------------------

    async def list_clusters(self, *, call_path: CallPath = "background") -> list[Cluster]:
        reply = await self._call("GET", "/api/v1/clusters", call_path=call_path, params={"verbosity": "full"})
        return [Cluster.from_api(c) for c in _as_list(reply.body)]

    async def get_cluster(self, name: str | None = None, *, call_path: CallPath = "background") -> Cluster:
        """The cluster named `name`, or the only cluster when no name is given."""
        clusters = await self.list_clusters(call_path=call_path)
        if name is not None:
            for cluster in clusters:
                if cluster.name == name:
                    return cluster
            raise RunaiNotFound(f"Run:ai has no cluster named {name!r}", method="GET", path="/api/v1/clusters")
        if len(clusters) == 1:
            return clusters[0]
        names = ", ".join(sorted(c.name for c in clusters)) or "none"
        raise RunaiError(
            f"cannot pick the Run:ai cluster: expected exactly one, found {names}",
            method="GET",
            path="/api/v1/clusters",
        )

    # ---- departments ----------------------------------------------------------------------

    async def list_departments(
        self, *, cluster_id: str | None = None, name: str | None = None, call_path: CallPath = "background"
    ) -> list[Department]:
        filters = _filters(name=name, clusterId=cluster_id)
        items = await self._paged(
            "/api/v1/org-unit/departments", "departments", call_path, {"verbosity": "verbose", **filters}
        )
        departments = [Department.from_api(d) for d in items]
        # The filter is applied here too: an exact match matters more than trusting the server's.
        return [d for d in departments if (name is None or d.name == name) and (cluster_id in (None, d.cluster_id))]

    # ---- projects -------------------------------------------------------------------------

    async def list_projects(
        self,
        *,
        cluster_id: str | None = None,
        name: str | None = None,
        department_id: str | None = None,
        call_path: CallPath = "background",
    ) -> list[Project]:
        filters = _filters(name=name, clusterId=cluster_id, parentId=department_id)
        items = await self._paged("/api/v1/org-unit/projects", "projects", call_path, filters)
        projects = [Project.from_api(p) for p in items]
        return [
            p
            for p in projects
            if (name is None or p.name == name)
            and (cluster_id in (None, p.cluster_id))
            and (department_id in (None, p.parent_id))
        ]

    async def find_project(self, name: str, *, cluster_id: str, call_path: CallPath = "background") -> Project | None:
        found = await self.list_projects(cluster_id=cluster_id, name=name, call_path=call_path)
        return found[0] if found else None

    async def get_project(self, project_id: str, *, call_path: CallPath = "background") -> Project:
        reply = await self._call("GET", f"/api/v1/org-unit/projects/{_seg(project_id)}", call_path=call_path)
        return Project.from_api(_as_dict(reply.body))

    async def create_project(
        self,
        name: str,
        *,
        cluster_id: str,
        department_id: str,
        namespace: str,
        gpu_quota: float = 0.0,
        node_pool: NodePool | None = None,
        template: Project | None = None,
        call_path: CallPath = "background",
    ) -> Project:
        """Create a project bound to `namespace` in the department `department_id`.

        `gpu_quota` deserved GPUs go on `node_pool`, by default the cluster's default node pool.
        With `template` (the project being re-created, e.g. a move rolled back), its resources
        and scheduling settings are used instead and `gpu_quota`/`node_pool` are ignored.

        Retried on connection errors and 5xx like the reads. A 409 after a retry means an earlier
        attempt may have landed: the project of that name is looked up and returned when it has
        the same namespace and department. Any other 409 raises RunaiConflict with `existing`.
        """
        body: dict[str, Any] = {
            "name": name,
            "clusterId": cluster_id,
            "parentId": department_id,
            "requestedNamespace": namespace,
        }
        if template is not None:
            for key in _COPIED_PROJECT_FIELDS:
                if template.raw.get(key) is not None:
                    body[key] = template.raw[key]
            body["resources"] = [
                {k: entry[k] for k in _RESOURCE_FIELDS if entry.get(k) is not None}
                for entry in template.raw.get("resources") or ()
                if isinstance(entry, Mapping)
            ]
        else:
            if node_pool is None:
                node_pool = await self.default_node_pool(cluster_id, call_path=call_path)
            resource: dict[str, Any] = {"gpu": {"deserved": gpu_quota}}
            if node_pool is not None:
                resource["nodePool"] = {"id": node_pool.id, "name": node_pool.name}
            body["resources"] = [resource]
        try:
            reply = await self._call(
                "POST", "/api/v1/org-unit/projects", call_path=call_path, json_body=body, expect=(201, 200)
            )
        except RunaiConflict as conflict:
            existing = await self._lookup_quietly(name, cluster_id, call_path)
            if (
                conflict.retried
                and existing is not None
                and existing.bound_to(namespace)
                and existing.parent_id == department_id
            ):
                log.info("runai project %s already created by an earlier attempt; using it", name)
                return existing
            conflict.existing = existing
            raise
        return Project.from_api(_as_dict(reply.body))

    async def delete_project(self, project_id: str, *, call_path: CallPath = "background") -> bool:
        """Delete a project: True when this call deleted it (202: Run:ai finishes asynchronously;
        204: gone), False when it was already gone (404).

        Deleting is idempotent, so a 404 is not an error: after a lost answer the resend (ours, or
        aiohttp's own resend of an idempotent request on a stale pooled connection) finds nothing.
        """
        try:
            await self._call(
                "DELETE", f"/api/v1/org-unit/projects/{_seg(project_id)}", call_path=call_path, expect=(202, 204, 200)
            )
        except RunaiNotFound:
            return False
        return True

    # ---- node pools and metrics -----------------------------------------------------------

    async def list_node_pools(self, cluster_id: str, *, call_path: CallPath = "background") -> list[NodePool]:
        items = await self._paged("/api/v1/node-pools", "nodepools", call_path, _filters(clusterId=cluster_id))
        return [n for n in (NodePool.from_api(i) for i in items) if n.cluster_id in ("", cluster_id)]

    async def default_node_pool(self, cluster_id: str, *, call_path: CallPath = "background") -> NodePool | None:
        pools = await self.list_node_pools(cluster_id, call_path=call_path)
        return next((p for p in pools if p.is_default), None)

    async def node_pool_metrics(
        self,
        cluster_id: str,
        node_pool: str,
        *,
        window_s: float = 300.0,
        call_path: CallPath = "background",
    ) -> NodePoolMetrics:
        """The latest TOTAL_GPU, ALLOCATED_GPU and UNALLOCATED_GPU samples of a node pool."""
        end = datetime.now(UTC)
        params = {
            "start": _iso(end - timedelta(seconds=window_s)),
            "end": _iso(end),
            "metricType": ",".join(_GPU_METRICS),  # array with explode: false
            "numberOfSamples": "5",
        }
        path = f"/api/v1/clusters/{_seg(cluster_id)}/nodepools/{_seg(node_pool)}/metrics"
        reply = await self._call("GET", path, call_path=call_path, params=params, expect=(200, 207))
        latest: dict[str, tuple[float, datetime | None]] = {}
        for measurement in _as_dict(reply.body).get("measurements") or ():
            kind = measurement.get("type") if isinstance(measurement, Mapping) else None
            if kind not in _GPU_METRICS:
                continue
            sample = _latest_sample(measurement.get("values") or ())
            if sample is not None:
                latest[kind] = sample
        stamps = [t for _, t in latest.values() if t is not None]
        return NodePoolMetrics(
            cluster_id=cluster_id,
            node_pool=node_pool,
            total=latest.get("TOTAL_GPU", (None, None))[0],
            allocated=latest.get("ALLOCATED_GPU", (None, None))[0],
            unallocated=latest.get("UNALLOCATED_GPU", (None, None))[0],
            sampled_at=max(stamps) if stamps else None,
            partial=reply.status == 207,
        )

    # ---- plumbing -------------------------------------------------------------------------

    async def _lookup_quietly(self, name: str, cluster_id: str, call_path: CallPath) -> Project | None:
        try:
            return await self.find_project(name, cluster_id=cluster_id, call_path=call_path)
        except RunaiError:
            return None

    async def _paged(
        self, path: str, key: str, call_path: CallPath, params: Mapping[str, str]
    ) -> list[Mapping[str, Any]]:
        items: list[Mapping[str, Any]] = []
        offset = 0
        for _ in range(_MAX_PAGES):
            reply = await self._call(
                "GET", path, call_path=call_path, params={**params, "offset": str(offset), "limit": str(_PAGE_LIMIT)}
            )
            page = _as_dict(reply.body)
            batch = [i for i in page.get(key) or () if isinstance(i, Mapping)]
            items.extend(batch)
            nxt = page.get("next")
            if not batch or not isinstance(nxt, int) or nxt <= offset:
                return items
            offset = nxt
        raise RunaiError(f"more than {_MAX_PAGES} pages from {path}", method="GET", path=path)

    async def _token(self, call_path: CallPath, deadline: float) -> str:
        cache = self._tokens
        if cache.value is not None and time.monotonic() < cache.refresh_at:
            return cache.value
        async with cache.lock:
            # Another caller may have refreshed it while this one waited for the lock.
            if cache.value is not None and time.monotonic() < cache.refresh_at:
                return cache.value
            secret = self._secret_source.read()
            cache.secrets.add(secret)
            body = {"grantType": "client_credentials", "clientID": self.client_id, "clientSecret": secret}
            try:
                reply = await self._call(
                    "POST", "/api/v1/token", call_path=call_path, json_body=body, auth=False, deadline=deadline
                )
            except RunaiError as exc:
                if exc.status in (400, 401, 403):
                    raise RunaiAuthError(
                        f"Run:ai refused the client credentials of {self.client_id!r} (HTTP {exc.status}): "
                        f"{exc}; check run_ai_client_id and the mounted client secret",
                        status=exc.status,
                        method="POST",
                        path="/api/v1/token",
                    ) from None
                raise
            data = _as_dict(reply.body)
            token = data.get("accessToken")
            if not isinstance(token, str) or not token:
                raise RunaiAuthError("Run:ai answered the token request without an accessToken", status=reply.status)
            lifetime = data.get("expiresIn")
            lifetime_s = float(lifetime) if isinstance(lifetime, int | float) and lifetime > 0 else 300.0
            # Refresh ahead of expiry; for short-lived tokens a quarter of the lifetime is the margin.
            margin = min(self.options.token_refresh_margin_s, lifetime_s / 4)
            cache.secrets.add(token)
            cache.value = token
            cache.refresh_at = time.monotonic() + lifetime_s - margin
            return token

    def _forget_token(self, token: str) -> None:
        if self._tokens.value == token:
            self._tokens.value = None

    def _scrub(self, text: str) -> str:
        for secret in self._tokens.secrets:
            # Also the JSON-escaped form: a server may echo the request body in its message.
            for form in {secret, json.dumps(secret)[1:-1]}:
                if form:
                    text = text.replace(form, "***")
        return text

    async def _call(
        self,
        method: str,
        path: str,
        *,
        call_path: CallPath,
        params: Mapping[str, str] | None = None,
        json_body: Any = None,
        expect: Sequence[int] = (200,),
        auth: bool = True,
        deadline: float | None = None,
    ) -> _Reply:
        loop = asyncio.get_running_loop()
        deadline = deadline if deadline is not None else loop.time() + self.options.deadline_s
        attempt = 0
        refreshed = False
        while True:
            headers = {"Accept": "application/json"}
            token = None
            if auth:
                token = await self._token(call_path, deadline)
                headers["Authorization"] = f"Bearer {token}"
            try:
                status, body = await self._send(method, path, params, json_body, headers, call_path)
            except _Transient as failure:
                delay = self._backoff(attempt, failure.retry_after)
                if attempt >= self.options.retries or loop.time() + delay >= deadline:
                    raise RunaiUnreachable(
                        self._scrub(
                            f"Run:ai control plane at {self.base_url} unreachable: {method} {path}: {failure.reason}"
                            + (f" (after {attempt + 1} attempts)" if attempt else "")
                        ),
                        status=failure.status,
                        method=method,
                        path=path,
                        retried=attempt > 0,
                    ) from None
                log.warning(
                    "runai %s %s failed (%s); retry %d/%d in %.2fs",
                    method,
                    path,
                    self._scrub(failure.reason),
                    attempt + 1,
                    self.options.retries,
                    delay,
                )
                attempt += 1
                await asyncio.sleep(delay)
                continue
            if status == 401 and token is not None and not refreshed:
                # Expired or revoked early: one fresh token, one more try. Not counted as a retry.
                refreshed = True
                self._forget_token(token)
                log.info("runai %s %s: 401, refreshing the token once", method, path)
                continue
            if status in expect:
                return _Reply(status, body, attempt > 0)
            raise self._error(method, path, status, body, retried=attempt > 0)

    async def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        json_body: Any,
        headers: dict[str, str],
        call_path: CallPath,
    ) -> tuple[int, Any]:
        session = self._ensure_session()
        timeout = aiohttp.ClientTimeout(
            total=self.options.timeout_s,
            connect=self.options.connect_timeout_s,
            sock_connect=self.options.connect_timeout_s,
        )
        REMOTE_CALLS.labels(target="runai", path=call_path).inc()
        try:
            async with session.request(
                method,
                self.base_url + path,
                params=params,
                json=json_body,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
            ) as resp:
                raw = await resp.read()
                status = resp.status
                retry_after = _retry_after(resp.headers.get("Retry-After"))
        except aiohttp.InvalidURL:
            RUNAI_REACHABLE.set(0)
            raise RunaiError(f"invalid Run:ai URL {self.base_url!r}", method=method, path=path) from None
        except TimeoutError:
            RUNAI_REACHABLE.set(0)
            raise _Transient(f"timed out after {self.options.timeout_s:g}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            RUNAI_REACHABLE.set(0)
            raise _Transient(f"{type(exc).__name__}: {exc}") from None
        RUNAI_REACHABLE.set(0 if status >= 500 else 1)
        body = _decode(raw)
        if status in _RETRY_STATUSES:
            raise _Transient(f"HTTP {status}{_server_message(body)}", status=status, retry_after=retry_after)
        return status, body

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        ceiling = min(self.options.backoff_max_s, self.options.backoff_s * (2.0**attempt))
        delay = ceiling / 2 + random.uniform(0, ceiling / 2)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.options.backoff_max_s))
        return delay

    def _error(self, method: str, path: str, status: int, body: Any, *, retried: bool) -> RunaiError:
        message = self._scrub(f"Run:ai {method} {path}: HTTP {status}{_server_message(body)}")
        kwargs: dict[str, Any] = {"status": status, "method": method, "path": path, "retried": retried}
        if status == 401:
            return RunaiAuthError(message + " (token refused after a refresh)", **kwargs)
        if status == 403:
            return RunaiAuthError(message + " (the service account lacks a permission for this call)", **kwargs)
        if status == 404:
            return RunaiNotFound(message, **kwargs)
        if status == 409:
            return RunaiConflict(message, **kwargs)
        return RunaiError(message, **kwargs)

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._root is not self:
            return self._root._ensure_session()
        if self._session is None or self._session.closed:
            if not self._owns_session:
                raise RuntimeError("the aiohttp session given to RunaiClient is closed")
            self._session = aiohttp.ClientSession()
        return self._session


def _filters(**fields: str | None) -> dict[str, str]:
    # filterBy is an array with explode: false: one query value, comma-separated `field==value`.
    parts = [f"{key}=={value}" for key, value in fields.items() if value is not None]
    return {"filterBy": ",".join(parts)} if parts else {}


def _seg(value: str) -> str:
    return quote(str(value), safe="")


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw[:200].decode("utf-8", "replace")


def _server_message(body: Any) -> str:
    if isinstance(body, Mapping) and isinstance(body.get("message"), str):
        return f": {body['message'][:300]}"
    return ""


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _as_list(body: Any) -> list[Mapping[str, Any]]:
    if not isinstance(body, list):
        raise RunaiError("Run:ai answered with something other than a JSON array")
    return [i for i in body if isinstance(i, Mapping)]


def _as_dict(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise RunaiError("Run:ai answered with something other than a JSON object")
    return body


def _latest_sample(values: Any) -> tuple[float, datetime | None] | None:
    best: tuple[float, datetime | None] | None = None
    for sample in values:
        if not isinstance(sample, Mapping):
            continue
        try:
            value = float(sample["value"])  # the spec sends metric values as strings
        except (KeyError, TypeError, ValueError):
            continue
        stamp = _parse_time(sample.get("timestamp"))
        # Later samples win; a sample without timestamp counts as later than what came before it.
        if best is None or stamp is None or best[1] is None or stamp >= best[1]:
            best = (value, stamp)
    return best


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
