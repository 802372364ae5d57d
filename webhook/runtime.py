"""Wires the process together: caches, certificates, the app, and an orderly shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.log import access_logger
from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, Configuration

from webhook.app import SERVER_KEY, ServeOptions, StartupError, create_app, default_handlers
from webhook.state.folder import FolderSource, StateFolderError
from webhook.state.store import ClusterState

log = logging.getLogger(__name__)


def _kubeconfig_path(kubeconfig: Path | None) -> str:
    return str(kubeconfig) if kubeconfig else os.path.expanduser(os.environ.get("KUBECONFIG", "~/.kube/config"))


async def kube_api_client(kubeconfig: Path | None = None) -> ApiClient:
    """A given kubeconfig; else in a pod the ServiceAccount; else $KUBECONFIG or ~/.kube/config."""
    configuration = Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        await config.load_kube_config(config_file=_kubeconfig_path(kubeconfig), client_configuration=configuration)
    return ApiClient(configuration)


class Runtime:
    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.state = ClusterState(options.namespace)
        self._stoppers: list[Any] = []
        self.app: web.Application | None = None
        self.runner: web.AppRunner | None = None
        self.api_client: ApiClient | None = None

    async def start(self) -> None:
        await self._start_state()
        if self.state.settings_conflict:
            raise StartupError(self.state.settings_conflict)
        from webhook.tls import CertWatcher

        certs = CertWatcher(
            self.options.certs / "tls.crt",
            self.options.certs / "tls.key",
            client_ca_file=self.options.client_ca,
        )
        await certs.start()
        self._stoppers.append(certs)
        self.app = create_app(
            self.state,
            handlers=default_handlers(self.state, self.options.guard_config()),
            readiness=[lambda: None if certs.ready else "serving certificate"],
        )
        self.runner = web.AppRunner(
            self.app,
            handle_signals=False,
            shutdown_timeout=self.options.shutdown_timeout,
            access_log=access_logger if self.options.access_log else None,
        )
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.options.host, self.options.port, ssl_context=certs.ssl_context)
        await site.start()
        log.info("serving on https://%s:%d", self.options.host, self.options.port)

    async def _start_state(self) -> None:
        if self.options.state_dir is not None:
            source = FolderSource(self.state, self.options.state_dir)
            try:
                await source.start()
            except StateFolderError as exc:
                raise StartupError(str(exc)) from None
            self._stoppers.append(source)
            return
        from webhook.state.kube import KubeWatcher

        self.api_client = await kube_api_client(self.options.kubeconfig)
        watcher = KubeWatcher(self.state, self.api_client, self.options.namespace)
        await watcher.start()
        self._stoppers.append(watcher)
        # The G1 check below needs the settings; the apiserver is local, so this is quick.
        await watcher.wait_synced(within_s=60)

    async def shutdown(self) -> None:
        """Readiness goes false first, then in-flight requests finish, then the caches stop."""
        if self.app is not None:
            self.app[SERVER_KEY].draining = True
            await asyncio.sleep(self.options.drain_seconds)
        if self.runner is not None:
            await self.runner.cleanup()
        for part in reversed(self._stoppers):
            await part.stop()
        if self.api_client is not None:
            await self.api_client.close()
