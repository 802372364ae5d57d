"""Wires the process together: caches, certificates, the app, and an orderly shutdown.

With `--state DIR` (the embedded default) the cluster is a folder of YAML and nothing remote exists:
scheduling, the settings guard and the pure quota check run on it. Against an apiserver the process
also runs the Run:ai integration (directory, Lease, binder, reconciler), the cross-replica GPU
reservations, the GPU API and the admin API.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from errno import EADDRINUSE
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from aiohttp.log import access_logger
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiClient, Configuration

from webhook.core.guard_config import GuardConfig, Identities
from webhook.http.app import (
    PROBE_MAX_CONNECTIONS,
    SERVER_KEY,
    cluster_mode_only_routes,
    create_admission_app,
    create_app,
    create_probe_app,
)
from webhook.http.handlers import ClusterParts, admission_handlers
from webhook.http.listener import (
    DEFAULT_ANSWER_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_PIPELINED,
    ConnectionLimits,
    Listener,
)
from webhook.state.folder import FolderSource, StateFolderError
from webhook.state.store import ClusterState

log = logging.getLogger(__name__)

GC_GEN0_THRESHOLD = 20_000


@dataclass(slots=True)
class ServeOptions:
    host: str = "0.0.0.0"
    port: int = 8443
    # /healthz, /readyz, /metrics on a port that never asks for a client certificate; None: none.
    probe_port: int | None = None
    # The admission webhooks on a port of their own, the only one that asks for the apiserver's
    # client certificate (`client_ca`, `client_names`); None: on `port`, beside the console and APIs.
    admission_port: int | None = None
    # The aggregated API (webhook.http.aggregated_api) on a port of its own, the only one that asks
    # for the apiserver's front-proxy client certificate; None: not served. Cluster mode only.
    aggregated_port: int | None = None
    # SO_REUSEPORT: several processes share the address, the kernel spreads connections over them
    # (a restart without a gap on one host; the test control plane's two replicas behind a Service).
    reuse_port: bool = False
    connection_limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    certs: Path = Path("certs")
    state_dir: Path | None = None
    kubeconfig: Path | None = None
    namespace: str = "hopsworks"
    client_ca: Path | None = None
    # With client_ca: the names (common name or DNS SAN) a client certificate must carry; empty: any
    # certificate of that CA.
    client_names: tuple[str, ...] = ()
    runai_secret_dir: Path | None = None
    # The console's session keys (webhook.console.keys); None: a key of this process only.
    console_keys: Path | None = None
    installers: tuple[str, ...] = ()
    pod_groupers: tuple[str, ...] = ()  # who may set a pod's pod-group-name (KAI's pod grouper)
    service_account: str = "scheduling-webhook"
    lease_name: str = "scheduling-webhook-leader"
    drain_seconds: float = 3.0  # time for endpoints to drop us before we stop accepting
    # Then, at most this long: the apiserver closes the keep-alive connections it still holds to
    # this replica (each answer now says "Connection: close"); only what is left is closed by us.
    linger_seconds: float = 15.0
    shutdown_timeout: float = 20.0  # how long in-flight requests get to finish
    # One INFO line per request costs about as much as the decision itself; the apiserver's audit
    # log already records every admission. WEBHOOK_ACCESS_LOG=1 turns it on.
    access_log: bool = False
    # The compiled admission policies (webhook.policies.writer), from the chart's
    # admissionPolicies.enabled: True, the leader writes them where the apiserver serves them;
    # False, it deletes what an enabled install wrote; None (not installed by the chart), it
    # leaves them alone.
    admission_policies: bool | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeOptions:
        return cls(
            host=args.host,
            port=args.port,
            probe_port=args.probe_port or None,
            admission_port=args.admission_port,
            aggregated_port=args.aggregated_port,
            reuse_port=args.reuse_port,
            certs=Path(args.certs),
            state_dir=Path(args.state) if args.state else None,
            kubeconfig=Path(args.kubeconfig) if args.kubeconfig else None,
            namespace=args.namespace or os.environ.get("POD_NAMESPACE", "hopsworks"),
            client_ca=Path(args.client_ca) if args.client_ca else None,
            client_names=tuple(args.client_name),
            runai_secret_dir=Path(args.runai_secret_dir) if args.runai_secret_dir else None,
            console_keys=Path(args.console_keys) if args.console_keys else None,
            installers=tuple(args.installer)
            + tuple(i.strip() for i in os.environ.get("SCHEDULING_WEBHOOK_INSTALLERS", "").split(",") if i.strip()),
            pod_groupers=tuple(args.pod_grouper)
            + tuple(i.strip() for i in os.environ.get("SCHEDULING_WEBHOOK_POD_GROUPERS", "").split(",") if i.strip()),
            service_account=os.environ.get("SERVICE_ACCOUNT_NAME") or args.service_account,
            lease_name=os.environ.get("SCHEDULING_WEBHOOK_LEASE_NAME", "scheduling-webhook-leader"),
            drain_seconds=float(os.environ.get("WEBHOOK_DRAIN_SECONDS", "3")),
            linger_seconds=float(os.environ.get("WEBHOOK_LINGER_SECONDS", "15")),
            connection_limits=ConnectionLimits(
                max_connections=int(os.environ.get("WEBHOOK_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS)),
                answer_timeout_s=float(os.environ.get("WEBHOOK_ANSWER_TIMEOUT_SECONDS", DEFAULT_ANSWER_TIMEOUT_S)),
                max_pipelined=int(os.environ.get("WEBHOOK_MAX_PIPELINED", DEFAULT_MAX_PIPELINED)),
            ),
            access_log=os.environ.get("WEBHOOK_ACCESS_LOG", "").lower() in ("1", "true", "yes"),
            admission_policies=_flag(os.environ.get("SCHEDULING_WEBHOOK_ADMISSION_POLICIES", "")),
        )

    def guard_config(self) -> GuardConfig:
        own = f"system:serviceaccount:{self.namespace}:{self.service_account}"
        return GuardConfig(
            install_namespace=self.namespace,
            installers=Identities.parse(self.installers),
            own=Identities.parse([own]),
            pod_groupers=Identities.parse(self.pod_groupers),
        )


class StartupError(RuntimeError):
    pass


def _flag(value: str) -> bool | None:
    """An environment switch: true or false; unset or empty is None."""
    if not value.strip():
        return None
    if value.strip().lower() in ("1", "true", "yes"):
        return True
    if value.strip().lower() in ("0", "false", "no"):
        return False
    raise StartupError(f"not a true or false value: {value!r}")


class Stoppable(Protocol):
    async def stop(self) -> Any: ...


def _kubeconfig_path(kubeconfig: Path | None) -> str:
    return str(kubeconfig) if kubeconfig else os.path.expanduser(os.environ.get("KUBECONFIG") or "~/.kube/config")


async def kube_api_client(kubeconfig: Path | None = None) -> ApiClient:
    """A given kubeconfig; else in a pod the ServiceAccount; else $KUBECONFIG or ~/.kube/config."""
    configuration = Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            path = _kubeconfig_path(kubeconfig)
            await config.load_kube_config(config_file=path, client_configuration=configuration)
    except config.ConfigException as exc:
        where = "in-cluster" if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") else path
        raise StartupError(
            f"no cluster to read ({where}: {exc}); pass --state DIR for a folder of YAML "
            "(e.g. examples/cluster), or --kubeconfig FILE"
        ) from None
    return ApiClient(configuration)


def tune_garbage_collector() -> None:
    """Keep collector pauses out of the admission latency tail.

    Each review allocates thousands of short-lived containers (the parsed pod), so CPython's default
    gen-0 threshold of 700 runs a collection several times per request; and the caches hold
    100,000+ long-lived objects that every full collection walks again. Freezing what start-up
    built moves it out of the collector's sight, and a larger gen-0 threshold lets a request's
    garbage die young by reference counting instead of being traced.
    """
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


class Runtime:
    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.state = ClusterState(options.namespace)
        self._stoppers: list[Stoppable] = []
        self.app: web.Application | None = None
        self.runner: web.AppRunner | None = None
        self.probe_runner: web.AppRunner | None = None
        self.admission_runner: web.AppRunner | None = None
        self.admission_port: int | None = None  # where the admission listener listens, once started
        self.aggregated_port: int | None = None  # where the aggregated API listens, once started
        self._aggregated: tuple[Any, Any] | None = None  # (GpuViews, mover) for the aggregated API
        self._listeners: list[Listener] = []
        self._apiserver_listeners: list[Listener] = []  # the apiserver's pooled connections end here
        self._runners: list[web.AppRunner] = []  # of listeners beyond the main, admission and probe ones
        self.api_client: ApiClient | None = None
        self.runai: Any = None  # RunaiIntegration, against an apiserver
        self.policies: Any = None  # PolicyWriter, when the install asks for one
        self._readiness: list[Callable[[], str | None]] = []  # besides the caches and the certificate

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            # Whatever started (watches, the API client, Run:ai) stops again, so a refused start
            # leaves no connection open behind it.
            await self.shutdown()
            raise

    async def _start(self) -> None:
        # Settings that cannot be used (G1 conflict, a value that does not parse) never stop the
        # start: the last good settings, or the defaults, serve and /readyz, /metrics and the log
        # say why, so the settings webhook is up to let the fixing edit through.
        options = self.options
        if options.client_names and options.client_ca is None:
            raise StartupError("--client-name needs --client-ca: a name is checked on a verified client certificate")
        await self._start_state()
        from webhook.tls.watcher import CertWatcher

        # The client CA guards the admission webhooks: their own port when there is one, else the
        # main port. The console, the APIs and the probes never ask for a client certificate
        # (browsers and kubelet probes have none): one watcher without the CA serves those.
        separate = options.admission_port is not None
        plain = CertWatcher(options.certs / "tls.crt", options.certs / "tls.key")
        await plain.start()
        self._stoppers.append(plain)
        guarded = plain
        if options.client_ca is not None:
            guarded = CertWatcher(plain.cert_file, plain.key_file, client_ca_file=options.client_ca)
            await guarded.start()
            self._stoppers.append(guarded)
        certs = plain if separate else guarded
        probe_certs = plain
        cluster: ClusterParts | None = None
        routes: list[web.RouteDef] = []
        if self.options.state_dir is not None:
            from webhook.local_mode import folder_mode_routes

            routes = folder_mode_routes(self.state, self.options.state_dir, self.options.host)
            routes += cluster_mode_only_routes()
        if self.api_client is not None:
            cluster, routes = await self._start_cluster_parts(self.api_client)
        handlers = admission_handlers(self.state, self.options.guard_config(), cluster)
        self.app = create_app(
            self.state,
            handlers={} if separate else handlers,
            routes=routes,
            readiness=[lambda: None if plain.ready and guarded.ready else "serving certificate", *self._readiness],
        )
        self.runner = web.AppRunner(
            self.app,
            handle_signals=False,
            shutdown_timeout=self.options.shutdown_timeout,
            keepalive_timeout=self.options.connection_limits.idle_timeout_s,
            access_log=access_logger if self.options.access_log else None,  # off unless WEBHOOK_ACCESS_LOG
        )
        await self.runner.setup()
        limits = self.options.connection_limits
        main = Listener(
            self.runner, self.options.host, self.options.port, certs.ssl_context, limits, "main",
            reuse_port=self.options.reuse_port,
            client_names=frozenset() if separate else frozenset(options.client_names),
        )  # fmt: skip
        await main.start()
        self._listeners.append(main)
        log.info("serving on https://%s:%d", self.options.host, main.port)
        admitting = main  # the listener the apiserver calls
        if options.admission_port is not None:
            self.admission_runner = web.AppRunner(
                create_admission_app(self.app, handlers),
                handle_signals=False,
                shutdown_timeout=options.shutdown_timeout,
                keepalive_timeout=limits.idle_timeout_s,
                access_log=access_logger if options.access_log else None,
            )
            await self.admission_runner.setup()
            admission = Listener(
                self.admission_runner, options.host, options.admission_port, guarded.ssl_context, limits,
                "admission", reuse_port=options.reuse_port, client_names=frozenset(options.client_names),
            )  # fmt: skip
            await admission.start()
            self._listeners.append(admission)
            self.admission_port = admission.port
            admitting = admission
            log.info(
                "admission webhooks on https://%s:%d (%s)",
                options.host,
                admission.port,
                "client certificate required" if options.client_ca else "no client certificate asked",
            )
        if options.aggregated_port is not None and self.api_client is not None and self._aggregated is not None:
            await self._start_aggregated(options.aggregated_port, plain.cert_file, plain.key_file)
        if self.api_client is not None or separate:
            self._apiserver_listeners.append(admitting)
        # Unready while the listener the apiserver calls refuses newcomers: the Service then sends
        # the apiserver to a replica that takes them (the probe port's /readyz says it too).
        self.app[SERVER_KEY].readiness.append(admitting.no_room)
        if self.options.probe_port is not None:
            self.probe_runner = web.AppRunner(
                create_probe_app(self.app), handle_signals=False, access_log=None, shutdown_timeout=1.0
            )
            await self.probe_runner.setup()
            probe_limits = replace(limits, max_connections=PROBE_MAX_CONNECTIONS)
            probes = Listener(
                self.probe_runner,
                self.options.host,
                self.options.probe_port,
                probe_certs.ssl_context,
                probe_limits,
                "probes",
                reuse_port=self.options.reuse_port,
            )
            await probes.start()
            self._listeners.append(probes)
            log.info(
                "probes and metrics on https://%s:%d (no client certificate asked)", self.options.host, probes.port
            )
        if self.options.state_dir is not None:
            # The address to open, once every listener answers: the dev certificate names localhost.
            from webhook.local_mode import is_loopback

            host = "localhost" if is_loopback(self.options.host) else self.options.host
            log.info("console on https://%s:%d/ui/", host, main.port)
        tune_garbage_collector()

    async def _start_aggregated(self, port: int, cert_file: Path, key_file: Path) -> None:
        """The aggregated API's listener: it requires the front-proxy client certificate the apiserver
        publishes the CA and names of. Without them (an apiserver with no aggregation layer, or no
        right to read them) the rest still serves: the APIService then shows as unavailable."""
        import tempfile

        from webhook.http.aggregated_api import AUTHENTICATION_CONFIGMAP, aggregated_routes, requestheader_config
        from webhook.http.app import errors_as_json
        from webhook.kube.api import KubeError, raw_call
        from webhook.tls.issuing import write_file_atomic
        from webhook.tls.watcher import CertWatcher

        assert self.api_client is not None and self._aggregated is not None
        namespace, name = AUTHENTICATION_CONFIGMAP
        try:
            core = client.CoreV1Api(self.api_client)
            found = await raw_call(core.read_namespaced_config_map, name, namespace, call_path="background")
            config = requestheader_config(found.get("data") or {})
        except (KubeError, ValueError, OSError, TimeoutError) as exc:
            log.error("aggregated API not served: cannot read %s/%s: %s", namespace, name, exc)
            return
        # The CA as a file, which the TLS context loads; private to this process.
        folder = Path(tempfile.mkdtemp(prefix="scheduling-webhook-front-proxy-"))
        ca_file = folder / "requestheader-ca.crt"
        write_file_atomic(ca_file, config.client_ca.encode(), 0o600)
        certs = CertWatcher(cert_file, key_file, client_ca_file=ca_file)
        await certs.start()
        self._stoppers.append(certs)
        views, mover = self._aggregated
        app = web.Application(client_max_size=64 * 1024, middlewares=[errors_as_json])
        app.router.add_routes(aggregated_routes(views, mover, config))
        runner = web.AppRunner(
            app,
            handle_signals=False,
            shutdown_timeout=self.options.shutdown_timeout,
            keepalive_timeout=self.options.connection_limits.idle_timeout_s,
            access_log=access_logger if self.options.access_log else None,
        )
        await runner.setup()
        self._runners.append(runner)
        listener = Listener(
            runner, self.options.host, port, certs.ssl_context, self.options.connection_limits, "aggregated",
            reuse_port=self.options.reuse_port, client_names=frozenset(config.allowed_names),
        )  # fmt: skip
        await listener.start()
        self._listeners.append(listener)
        self._apiserver_listeners.append(listener)
        self.aggregated_port = listener.port
        log.info(
            "aggregated API %s on https://%s:%d (the apiserver's front-proxy certificate required%s)",
            "scheduling.hopsworks.ai/v1",
            self.options.host,
            listener.port,
            f", named {', '.join(config.allowed_names)}" if config.allowed_names else "",
        )

    async def _start_state(self) -> None:
        if self.options.state_dir is not None:
            source = FolderSource(self.state, self.options.state_dir)
            try:
                await source.start()
            except StateFolderError as exc:
                raise StartupError(str(exc)) from None
            self._stoppers.append(source)
            return
        from webhook.state.watches import cache_watcher

        self.api_client = await kube_api_client(self.options.kubeconfig)
        watcher = cache_watcher(self.state, self.api_client, self.options.namespace)
        await watcher.start()
        self._stoppers.append(watcher)
        # No wait for the first lists: the server listens at once and /readyz says which caches
        # are still listing (a large cluster's first pod list can take minutes; see startupProbe).

    async def _start_cluster_parts(self, api_client: ApiClient) -> tuple[ClusterParts, list[web.RouteDef]]:
        from webhook.console import Console, console_routes
        from webhook.console.keys import KeyFile
        from webhook.console.session import Sessions
        from webhook.console.signouts import Signouts, signouts_watcher
        from webhook.http.admin_api import ADMIN_API_ACTION, ADMIN_API_CHECK, admin_routes, authorize_with
        from webhook.http.auth import KubeAuthorizer
        from webhook.http.gpu_api import DirectoryAdapter, GpuViews
        from webhook.http.scheduling_api import scheduling_routes
        from webhook.kube.api import KubeApi
        from webhook.quota import GpuReservations
        from webhook.runai.integration import IntegrationOptions, RunaiIntegration, client_factory
        from webhook.state.namespace_reader import NamespaceReader

        options = self.options
        kube = KubeApi(api_client, options.namespace)
        reservations = GpuReservations(self.state, kube)
        await reservations.start(api_client)
        self._stoppers.append(reservations)
        leader_work = []
        if options.admission_policies is not None:
            from webhook.policies.writer import PolicyWriter

            self.policies = PolicyWriter(self.state, kube, enabled=options.admission_policies)
            leader_work.append(self.policies.run)
        runai = await RunaiIntegration.start(
            self.state,
            api_client,
            kube,
            client_factory(options.runai_secret_dir),
            IntegrationOptions(
                install_namespace=options.namespace,
                secret_dir=options.runai_secret_dir,
                lease_name=options.lease_name,
            ),
            sweeper=reservations,
            leader_work=leader_work,
        )
        self.runai = runai
        self._stoppers.append(runai)
        mover = runai.mover

        cluster = ClusterParts(
            reservations=reservations,
            bind=runai.bind_for_admission,
            lookup=runai.lookup_project,
            runai_departments=runai.directory.department_names,
            read_namespace=NamespaceReader(self.state, kube).read,
        )
        gpu_auth = KubeAuthorizer(kube)
        admin_auth = KubeAuthorizer(kube, admin_check=ADMIN_API_CHECK, admin_action=ADMIN_API_ACTION)
        views = GpuViews(
            self.state,
            DirectoryAdapter(runai.directory, runai.client),
            lookup=runai.lookup_project,
            left_in_runai=runai.left.load,
        )
        self._aggregated = (views, mover)
        if options.console_keys is not None:
            # The Secret every replica mounts: a session sealed on one is good on the other.
            key_file = KeyFile(options.console_keys)
            await key_file.start()
            self._stoppers.append(key_file)
            sessions = Sessions(key_file.ring)
        else:
            log.warning("no --console-keys: console sessions are good on this process only")
            sessions = Sessions.ephemeral()
        signouts = Signouts(kube)
        signouts_watch = signouts_watcher(signouts, api_client, options.namespace)
        await signouts_watch.start()
        self._stoppers.append(signouts_watch)
        # Console traffic goes to a replica only once it can tell a signed-out session.
        self._readiness.append(lambda: None if signouts.ready else "console sign-outs")
        routes = [
            *views.routes(gpu_auth),
            *scheduling_routes(views, gpu_auth),
            *admin_routes(mover, authorize_with(admin_auth)),
            *console_routes(
                Console(
                    views,
                    gpu_auth,
                    sign_in=gpu_auth.authenticate,
                    actor=admin_auth,
                    mover=mover,
                    sessions=sessions,
                    signouts=signouts,
                )
            ),
        ]
        return cluster, routes

    async def _linger(self) -> None:
        """Let the apiserver close its own connections to this replica (Listener.begin_drain)."""
        started = time.monotonic()
        left = 0
        for listener in self._apiserver_listeners:
            remaining = self.options.linger_seconds - (time.monotonic() - started)
            left += await listener.wait_connections_closed(max(0.0, remaining))
        if left:
            log.info(
                "%d connection(s) still open after %.0f s of draining: closing them", left, self.options.linger_seconds
            )

    async def shutdown(self) -> None:
        """Readiness goes false first, then in-flight requests finish, then the caches stop."""
        started = time.monotonic()
        draining = self.app is not None
        if self.app is not None:
            # Said at the start and at the end: a stop takes seconds by design, and a silent one
            # cannot be told from a hung one.
            log.info(
                "draining: /readyz answers 503; still serving for %.1f s while endpoints drop this replica, "
                "then in-flight requests get up to %.0f s",
                self.options.drain_seconds,
                self.options.shutdown_timeout,
            )
            self.app[SERVER_KEY].draining = True
            for listener in self._listeners:
                listener.begin_drain()
            await asyncio.sleep(self.options.drain_seconds)
        for listener in self._listeners:
            await listener.stop()
        if draining:
            await self._linger()
        if self.probe_runner is not None:
            await self.probe_runner.cleanup()
        if self.admission_runner is not None:
            await self.admission_runner.cleanup()
        for runner in self._runners:
            await runner.cleanup()
        if self.runner is not None:
            await self.runner.cleanup()
        for part in reversed(self._stoppers):
            await part.stop()
        if self.api_client is not None:
            await self.api_client.close()
        if draining:
            log.info("drained and stopped in %.1f s", time.monotonic() - started)


def run_server(args: argparse.Namespace) -> int:
    try:
        asyncio.run(serve(ServeOptions.from_args(args)))
    except StartupError as exc:
        log.error("not starting: %s", exc)
        return 2
    except OSError as exc:
        # Listening failed (a port in use, an address not on this host): a line, not a traceback.
        hint = (
            " (another server runs there? choose --port, or PORT=... with make run)" if exc.errno == EADDRINUSE else ""
        )
        log.error("not starting: %s%s", exc.strerror or exc, hint)
        return 2
    return 0


async def serve(options: ServeOptions, stop: asyncio.Event | None = None) -> None:
    runtime = Runtime(options)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    # Before the start: a SIGTERM while it starts is a stop, with the drain, once it has started.
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    await runtime.start()
    try:
        await stop.wait()
    finally:
        await runtime.shutdown()
