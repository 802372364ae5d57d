"""A small Python client for the GPU API and the scheduling offer.

    from webhook.client import GpuClient, get_gpu_availability

    async with GpuClient("https://scheduling-webhook.hopsworks.svc", token, ca_file="ca.crt") as api:
        gpus = await api.get_gpu_availability("churn")
        print(gpus.project, gpus.department)
        print(gpus.available_non_preemptible, gpus.available_preemptible)

        offer = await api.get_scheduling_offer("churn", kind="notebook")
        print(offer.priority_class.default, [c.name for c in offer.priority_class.choices])

    gpus = get_gpu_availability("churn", base_url=..., ca_file=...)  # synchronous, also in Jupyter
    offer = get_scheduling_offer("churn", base_url=..., ca_file=...)

Inside a pod, `token=None` reads the pod's ServiceAccount token. Refusals raise `Unauthorized`
(401), `Forbidden` (403), `NotFound` (404) or `Unavailable` (503), all `GpuApiError`s carrying the
server's reason.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import ssl
from collections.abc import Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
from pydantic import BaseModel, ValidationError

from webhook.core.admin_view import AdminDepartment, AdminProject, RunaiAdminView
from webhook.core.gpu_view import (
    DepartmentGpus,
    GpuAvailability,
    GpuWarning,
    NodePoolGpus,
    PodGpus,
    ProjectGpus,
)
from webhook.core.offer_view import SchedulingOfferView

__all__ = [
    "AdminDepartment",
    "AdminProject",
    "DepartmentGpus",
    "Forbidden",
    "GpuApiError",
    "GpuAvailability",
    "GpuClient",
    "GpuWarning",
    "NodePoolGpus",
    "NotFound",
    "PodGpus",
    "ProjectGpus",
    "RunaiAdminView",
    "SchedulingOfferView",
    "Unauthorized",
    "Unavailable",
    "get_gpu_availability",
    "get_scheduling_offer",
]

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
DEFAULT_BASE_URL = "https://scheduling-webhook.hopsworks.svc"
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class GpuApiError(Exception):
    def __init__(self, status: int, reason: str, code: str = "") -> None:
        super().__init__(f"HTTP {status}: {reason}")
        self.status = status
        self.reason = reason
        self.code = code


class Unauthorized(GpuApiError):
    """401: no token, or the Kubernetes API does not accept it."""


class Forbidden(GpuApiError):
    """403: the token's user may not read this project (or the admin view)."""


class NotFound(GpuApiError):
    """404: no project namespace of that name."""


class Unavailable(GpuApiError):
    """503: Run:ai or the Kubernetes API cannot answer now; try again later."""


_ERRORS: dict[int, type[GpuApiError]] = {401: Unauthorized, 403: Forbidden, 404: NotFound, 503: Unavailable}


def _read_token(token: str | None) -> str:
    if token:
        return token
    try:
        return SERVICE_ACCOUNT_TOKEN.read_text().strip()
    except OSError:
        raise Unauthorized(401, f"no token given and no ServiceAccount token at {SERVICE_ACCOUNT_TOKEN}") from None


class GpuClient:
    """Async client. `ca_file`: the CA that signed the server's certificate (None: system trust)."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        token: str | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        *,
        timeout_s: float = 10.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = _read_token(token)
        self._ssl = ssl.create_default_context(cafile=os.fspath(ca_file) if ca_file else None)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session = session
        self._owns_session = session is None

    def __repr__(self) -> str:  # never the token
        return f"GpuClient(base_url={self.base_url!r})"

    async def __aenter__(self) -> GpuClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def get_gpu_availability(self, namespace: str) -> GpuAvailability:
        return await self._get(f"/api/v1/projects/{quote(namespace, safe='')}/gpu", GpuAvailability)

    async def get_runai_admin_view(self) -> RunaiAdminView:
        return await self._get("/api/v1/admin/runai", RunaiAdminView)

    async def get_scheduling_offer(self, namespace: str, kind: str | None = None) -> SchedulingOfferView:
        """What workloads of the project (of `kind`, e.g. "notebook") may choose, and their defaults."""
        query = f"?kind={quote(kind, safe='')}" if kind else ""
        return await self._get(f"/api/v1/projects/{quote(namespace, safe='')}/scheduling{query}", SchedulingOfferView)

    async def _get(self, path: str, model: type[M]) -> M:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl))
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        try:
            async with self._session.get(
                self.base_url + path, headers=headers, timeout=self._timeout, ssl=self._ssl
            ) as resp:
                status = resp.status
                body: Any = await resp.json(content_type=None) if await resp.read() else None
        except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError) as exc:
            # Not worth retrying: the CA is wrong or missing, or the server's certificate is.
            raise GpuApiError(
                0, f"TLS with {self.base_url} failed (is ca_file the CA that signed it?): {exc}"
            ) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unavailable(0, f"cannot reach {self.base_url}: {type(exc).__name__}: {exc}") from None
        except ValueError:
            raise GpuApiError(status, "the server answered with something other than JSON") from None
        if status != 200:
            reason = body.get("error") if isinstance(body, dict) else None
            code = body.get("code", "") if isinstance(body, dict) else ""
            raise _ERRORS.get(status, GpuApiError)(status, str(reason or f"HTTP {status}"), str(code))
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            raise GpuApiError(status, f"unexpected answer: {exc.error_count()} field error(s)") from None


def get_gpu_availability(
    namespace: str,
    base_url: str = DEFAULT_BASE_URL,
    token: str | None = None,
    ca_file: str | os.PathLike[str] | None = None,
    *,
    timeout_s: float = 10.0,
) -> GpuAvailability:
    """Synchronous `GpuClient.get_gpu_availability`. Works inside a running event loop too (Jupyter):
    it then runs on a helper thread with its own loop."""

    async def run() -> GpuAvailability:
        async with GpuClient(base_url, token, ca_file, timeout_s=timeout_s) as client:
            return await client.get_gpu_availability(namespace)

    return _run_sync(run())


def get_scheduling_offer(
    namespace: str,
    kind: str | None = None,
    base_url: str = DEFAULT_BASE_URL,
    token: str | None = None,
    ca_file: str | os.PathLike[str] | None = None,
    *,
    timeout_s: float = 10.0,
) -> SchedulingOfferView:
    """Synchronous `GpuClient.get_scheduling_offer` (also inside a running event loop)."""

    async def run() -> SchedulingOfferView:
        async with GpuClient(base_url, token, ca_file, timeout_s=timeout_s) as client:
            return await client.get_scheduling_offer(namespace, kind)

    return _run_sync(run())


def _run_sync(work: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, work).result()
