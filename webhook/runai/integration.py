"""The Run:ai integration assembled for the runtime: directory + leader election + binder + reconciler.

    integration = await RunaiIntegration.start(state, api_client, kube_api, None, IntegrationOptions(...))
    ...
    await integration.stop()

Every replica refreshes the directory (for admission's quota check) and can bind on the request
path; only the Lease holder runs the reconciler. The integration follows the settings ConfigMap:
`run_ai_enable` turned off stops every Run:ai call (the client is closed); turned on starts them;
a new `run_ai_url`, `run_ai_client_id` or `run_ai_client_secret_key` builds a new client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient

from webhook.kube.api import KubeApi
from webhook.kube.events import EventRecorder
from webhook.kube.leader import LeaderElector, LeaseTiming, default_identity
from webhook.runai.binding import Binder, BindingUnavailable, BindResult
from webhook.runai.client import ClientOptions, RunaiClient, SecretFile
from webhook.runai.departments import DepartmentMover
from webhook.runai.directory import RunaiDirectory
from webhook.runai.left import LeftProjects
from webhook.runai.reconciler import MoveRecovery, Reconciler, ReservationSweeper
from webhook.settings import ClusterSettings
from webhook.state.store import ClusterState
from webhook.tasks import cancel_and_wait

log = logging.getLogger(__name__)
# A leader's work that failed starts again after this, doubling up to the maximum.
LEADER_WORK_BACKOFF_S = 1.0
LEADER_WORK_BACKOFF_MAX_S = 60.0


async def keep_running(
    work: Callable[[], Awaitable[None]],
    backoff: float = LEADER_WORK_BACKOFF_S,
    backoff_max: float = LEADER_WORK_BACKOFF_MAX_S,
) -> None:
    """`work` until it returns: a failure is logged and `work` starts again after a backoff."""
    while True:
        try:
            await work()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "leader work %s failed; started again in %.0f s", getattr(work, "__qualname__", work), backoff
            )
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, backoff_max)


ClientFactory = Callable[[ClusterSettings], RunaiClient]
DEFAULT_SECRET_DIR = Path("/var/run/secrets/runai")


def client_factory(secret_dir: Path | str | None, options: ClientOptions | None = None) -> ClientFactory:
    """Clients reading the secret from `<secret_dir>/<run_ai_client_secret_key>` (the Secret named
    by `run_ai_client_secret_name`, mounted by the chart at `--runai-secret-dir`)."""
    directory = Path(secret_dir) if secret_dir is not None else DEFAULT_SECRET_DIR

    def build(settings: ClusterSettings) -> RunaiClient:
        secret = SecretFile(directory, settings.run_ai_client_secret_key or "clientSecret")
        return RunaiClient(settings.run_ai_url, settings.run_ai_client_id, secret, options=options)

    return build


@dataclass(frozen=True)
class IntegrationOptions:
    install_namespace: str = "hopsworks"
    secret_dir: Path | None = None  # used when no client factory is given
    lease_name: str = "scheduling-webhook-leader"
    identity: str | None = None  # leader identity; unique per process by default
    lease: LeaseTiming = field(default_factory=LeaseTiming)
    refresh_interval_s: float | None = None  # directory refresh; None: run_ai_directory_refresh_s
    cluster_name: str | None = None  # Run:ai cluster; None: `run_ai_cluster_name`, else the only one
    claim_ttl_s: float = 60.0  # a binder's recorded intent older than this is taken over
    bind_wait_s: Mapping[str, float] = field(default_factory=dict)  # by call path, see Binder
    backoff_initial_s: float = 1.0  # reconciler, Run:ai unreachable
    backoff_max_s: float = 60.0
    settings_check_s: float = 5.0  # settings are followed by ConfigMap events; this is a safety net
    client_close_grace_s: float = 30.0  # calls in flight on a replaced client may finish
    # Binding on admission, well within mutate-pods' timeoutSeconds (10 s): a bind cut short is
    # finished by the next binder, and the pod gets a refusal with a reason, not a timeout.
    request_bind_budget_s: float = 4.0
    # Looking up a project bound since the last refresh, on admission: the same 10 s, also followed
    # by the reservation write; a lookup that takes longer refuses the pod with a retryable message.
    request_lookup_timeout_s: float = 2.0


def _client_key(settings: ClusterSettings) -> tuple[str, str, str, str]:
    # The cluster name is part of it: the directory's cluster id and projects depend on it too.
    return (
        settings.run_ai_url,
        settings.run_ai_client_id,
        settings.run_ai_client_secret_key,
        settings.run_ai_cluster_name,
    )


class RunaiIntegration:
    def __init__(
        self,
        state: ClusterState,
        api_client: ApiClient,
        kube_api: KubeApi,
        runai_client_factory: ClientFactory | None,
        options: IntegrationOptions,
        *,
        sweeper: ReservationSweeper | None = None,
        mover: MoveRecovery | None = None,
        leader_work: Sequence[Callable[[], Awaitable[None]]] = (),
    ) -> None:
        """`sweeper`: deletes the GPU reservations of deleted namespaces on each reconcile pass
        (`webhook.quota.GpuReservations`). `mover`: settles department moves left half-done; by
        default a `DepartmentMover` over this integration's client and directory. `leader_work`:
        more coroutine functions run beside the reconciler while this process holds the Lease
        (each keeps going on its own failures; all are cancelled when leadership ends)."""
        self._leader_work = tuple(leader_work)
        self.state = state
        self.options = options
        self.kube = kube_api
        self._factory = runai_client_factory or client_factory(options.secret_dir)
        self._client: RunaiClient | None = None
        self._client_key: tuple[str, str, str, str] | None = None
        self._enabled = state.settings.run_ai_enable
        self._interval = state.settings.run_ai_reconcile_interval_s
        self._refresh_interval = state.settings.run_ai_directory_refresh_s
        self._closing: set[asyncio.Task[None]] = set()
        self._watch_task: asyncio.Task[None] | None = None
        self.events = EventRecorder(kube_api)
        self.directory = RunaiDirectory(
            state, self.client, interval_s=options.refresh_interval_s, cluster_name=options.cluster_name
        )
        identity = options.identity or default_identity()
        self.binder = Binder(
            state,
            kube_api,
            self.client,
            self.directory,
            identity=identity,
            events=self.events,
            claim_ttl_s=options.claim_ttl_s,
            wait_s=options.bind_wait_s,
        )
        self.mover = DepartmentMover(
            kube_api,
            self.client,
            state,
            runai_departments=self.directory.department_names,
            directory=self.directory,
            # The Lease identity: the successor that takes the Lease over knows this process gone.
            instance=identity,
            holders_gone=lambda: self.leader.predecessors,
        )
        self.left = LeftProjects(kube_api)
        self.reconciler = Reconciler(
            state,
            self.binder,
            self.directory,
            self.events,
            mover=mover or self.mover,
            sweeper=sweeper,
            left=self.left,
            backoff_initial_s=options.backoff_initial_s,
            backoff_max_s=options.backoff_max_s,
        )
        self.leader = LeaderElector(
            api_client,
            options.install_namespace,
            options.lease_name,
            identity=identity,
            timing=options.lease,
            on_started_leading=self._lead,
        )

    async def _lead(self) -> None:
        """The reconciler and the other leader work side by side: a failure of one is logged and
        leaves the rest running, and the failed one starts again after a backoff, for as long as
        this process leads (a leader whose work had ended would hold the Lease doing nothing)."""

        async with asyncio.TaskGroup() as group:
            for work in (self.reconciler.run, *self._leader_work):
                group.create_task(keep_running(work))

    @classmethod
    async def start(
        cls,
        state: ClusterState,
        api_client: ApiClient,
        kube_api: KubeApi,
        runai_client_factory: ClientFactory | None = None,
        options: IntegrationOptions | None = None,
        *,
        sweeper: ReservationSweeper | None = None,
        leader_work: Sequence[Callable[[], Awaitable[None]]] = (),
    ) -> RunaiIntegration:
        self = cls(
            state,
            api_client,
            kube_api,
            runai_client_factory,
            options or IntegrationOptions(),
            sweeper=sweeper,
            leader_work=leader_work,
        )
        state.listeners.append(self._on_cluster_event)
        await self.directory.start()
        await self.leader.start()
        self._watch_task = asyncio.create_task(self._watch_settings(), name="runai-settings")
        return self

    async def stop(self, *, release_lease: bool = True) -> None:
        """Stop calling Run:ai and leading. `release_lease=False` plays a crash (tests)."""
        with contextlib.suppress(ValueError):
            self.state.listeners.remove(self._on_cluster_event)
        task, self._watch_task = self._watch_task, None
        await cancel_and_wait(task)
        await self.leader.stop(release=release_lease)
        await self.directory.stop()
        if release_lease:
            await self.events.flush()
        else:
            self.events.cancel()
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        for task in list(self._closing):
            task.cancel()
        await asyncio.gather(*self._closing, return_exceptions=True)

    # -- the current client ---------------------------------------------------------------------
    def client(self) -> RunaiClient | None:
        """The Run:ai client for the current settings; None while `run_ai_enable` is false."""
        settings = self.state.settings
        if not settings.run_ai_enable:
            return None
        key = _client_key(settings)
        if self._client is None or self._client_key != key:
            self._retire(self._client)
            self._client = self._factory(settings)
            self._client_key = key
        return self._client

    def _retire(self, client: RunaiClient | None) -> None:
        if client is None:
            return

        async def close_later() -> None:
            try:
                await asyncio.sleep(self.options.client_close_grace_s)
            finally:
                await client.close()  # also when stop() cuts the grace short

        task = asyncio.create_task(close_later())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # -- following the settings ----------------------------------------------------------------
    def _on_cluster_event(self, event: str, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "ConfigMap":
            self._settings_changed()
        elif kind == "Namespace" and event == "apply":
            name = (obj.get("metadata") or {}).get("name")
            if isinstance(name, str):
                self.directory.follow_namespace(name)

    async def _watch_settings(self) -> None:
        while True:
            await asyncio.sleep(self.options.settings_check_s)
            self._settings_changed()

    def _settings_changed(self) -> None:
        settings = self.state.settings
        enabled = settings.run_ai_enable
        key_changed = self._client is not None and self._client_key != _client_key(settings)
        if settings.run_ai_reconcile_interval_s != self._interval:
            self._interval = settings.run_ai_reconcile_interval_s
            self.reconciler.trigger_pass()  # the next pass is due by the new interval
        if settings.run_ai_directory_refresh_s != self._refresh_interval:
            self._refresh_interval = settings.run_ai_directory_refresh_s
            self.directory.poke()  # the next wait uses the new interval
        if enabled == self._enabled and not key_changed:
            return
        self._enabled = enabled
        if not enabled or key_changed:
            # Off: no call from here on; the next call with new settings builds a new client.
            self._retire(self._client)
            self._client = None
            self._client_key = None
        log.info("Run:ai settings changed (run_ai_enable=%s); refreshing", enabled)
        if key_changed:
            self.directory.invalidate()  # its cluster id and projects came from the old client
        self.directory.poke()
        self.reconciler.trigger_pass()

    # -- for admission -------------------------------------------------------------------------
    async def bind_for_admission(self, namespace: str) -> BindResult:
        """Bind on a workload's first start (R2). Raises BindingError subclasses with a message for
        the user: BindingUnavailable when Run:ai is unreachable or too slow.

        Bounded by `request_bind_budget_s`: the apiserver gives /mutate/pods 10 s, and a timeout
        there would refuse the pod with no reason. A bind cut short leaves its recorded intent,
        which the next binder (or the leader's pass) finishes."""
        budget = self.options.request_bind_budget_s
        try:
            async with asyncio.timeout(budget):
                return await self.binder.ensure_bound(namespace, "request")
        except TimeoutError:
            raise BindingUnavailable(f"the Run:ai control plane did not answer within {budget:g} s") from None

    async def lookup_project(self, namespace: str) -> None:
        """Fetch the Run:ai project of a namespace bound since the last refresh (R2: reachable but
        unknown to this replica -> look it up; also the GPU view). Raises RunaiError, RunaiUnreachable when no answer
        came within `request_lookup_timeout_s`."""
        await self.directory.lookup(namespace, timeout_s=self.options.request_lookup_timeout_s)
