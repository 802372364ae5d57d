"""The real Runtime against a test's part of the real control plane (tests/support/kube_scope.py),
driven over HTTPS as the apiserver does.

runtime, options, certs = await start_runtime(tmp_path, kube_scope)   # kubeconfig, certs, a port
async with apiserver_session(certs) as session:                        # trusts the test CA only
    async with session.get(f"{base_url(options)}/readyz") as resp: ...
await runtime.shutdown()
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.https import (
    LOOPBACK,
    SERVICE_HOST,
    CertFiles,
    StaticResolver,
    client_ssl_context,
    free_port,
    make_cert_files,
    wait_until,
)
from tests.support.kube_scope import KubeScope
from webhook.core.scheduling import BINDING_SETTLE_S
from webhook.runtime import Runtime, ServeOptions
from webhook.tls.issuing import CertKey


async def start_runtime(
    tmp_path: Path,
    cluster: KubeScope,
    ca: CertKey | None = None,
    *,
    wait_ready_s: float | None = 10.0,
    **options: Any,
) -> tuple[Runtime, ServeOptions, CertFiles]:
    """`serve` with no state folder, reading the scope's real apiserver as the webhook's
    ServiceAccount (the chart's RBAC) with the scope's install namespace. `options` are
    further ServeOptions (e.g. `runai_secret_dir`, or a `kubeconfig` that goes through a proxy).
    Replicas behind one Service share `ca`. The server listens before its caches have listed; this
    waits until they have (`wait_ready_s=None`: return as soon as it listens)."""
    certs = make_cert_files(tmp_path / "certs", ca=ca)  # makes tmp_path too
    where: dict[str, Any] = {"kubeconfig": cluster.kubeconfig, "namespace": cluster.install_ns}
    serve = ServeOptions(
        host=LOOPBACK,
        port=free_port(),
        certs=certs.dir,
        drain_seconds=0.0,
        linger_seconds=0.0,
        **{**where, **options},
    )
    runtime = Runtime(serve)
    await runtime.start()
    if wait_ready_s is not None:
        for _ in range(int(wait_ready_s / 0.02)):
            if runtime.state.ready():
                break
            await asyncio.sleep(0.02)
    return runtime, serve, certs


def apiserver_session(certs: CertFiles) -> aiohttp.ClientSession:
    """A keep-alive session that trusts only the test CA and dials the Service name."""
    connector = aiohttp.TCPConnector(
        ssl=client_ssl_context(certs.ca.cert_pem), resolver=StaticResolver({SERVICE_HOST: LOOPBACK})
    )
    return aiohttp.ClientSession(connector=connector)


def base_url(options: ServeOptions) -> str:
    return f"https://{SERVICE_HOST}:{options.port}"


async def binding_settled(runtime: Runtime, namespace: str) -> None:
    """Until the runtime admits pods of a freshly bound project: its binding has been in the cache
    for BINDING_SETTLE_S (so the apiserver's own cache has it too, see webhook.http.pod_webhook)."""

    def settled() -> bool:
        info = runtime.state.namespaces.get(namespace)
        return (
            info is not None
            and info.runai_queue is not None
            and (time.time() - info.runai_queue_seen_at >= BINDING_SETTLE_S)
        )

    await wait_until(settled, within=BINDING_SETTLE_S + 5, what=f"binding of {namespace} settled")


@dataclass
class ServedRuntime:
    """A runtime started by `start_runtime`, with a client session speaking to it as the apiserver."""

    runtime: Runtime
    options: ServeOptions
    session: aiohttp.ClientSession

    async def review(self, path: str, review: dict[str, Any]) -> dict[str, Any]:
        """POST an AdmissionReview; its `response` (the HTTP status must be 200)."""
        async with self.session.post(f"{base_url(self.options)}{path}", json=review) as resp:
            assert resp.status == 200, await resp.text()
            return dict((await resp.json())["response"])

    async def get(self, path: str, token: str) -> tuple[int, dict[str, Any]]:
        async with self.session.get(
            f"{base_url(self.options)}{path}", headers={"Authorization": f"Bearer {token}"}
        ) as resp:
            return resp.status, await resp.json()
