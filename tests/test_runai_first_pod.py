"""S5 through the apiserver's admission chain: no pod of a Run:ai project is stored unless its
namespace was bound before the pod's mutating phase and the pod carries `runai/queue`.

Two replicas of the real Runtime behind one Service, the Kubernetes API emulator with the emulated
admission chain (tests/support/admission_chain.py) reading the rendered webhook configurations,
the Run:ai control-plane stand-in, and a Run:ai-like mutating webhook (`runai-mutating-webhook`,
selected by the namespace label `runai/queue`, sets `schedulerName: runai-scheduler`). A user
creates pods with the real Kubernetes client; a refused create is retried as a controller does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from tests.support.admission_chain import AdmissionChain, Services
from tests.support.cluster import namespace, priority_class, runai_settings_configmap
from tests.support.https import HttpsServer, make_cert_files, start_https_server, wait_until
from tests.support.kube_emulator import PODS, KubeEmulator, Obj
from tests.support.runai_standin import RunaiStandin
from tests.support.runai_webhook import NAMESPACE as RUNAI_NAMESPACE
from tests.support.runai_webhook import RUNAI_SCHEDULER, RunaiAdmissionStandin
from tests.support.runai_webhook import SERVICE as RUNAI_SERVICE
from tests.support.runtime import TOKEN, start_runtime
from tests.test_runai_binding import hold_lease_elsewhere  # no leader: only a pod binds
from webhook.manifests import render
from webhook.runtime import Runtime
from webhook.tls.issuing import make_ca

INSTALL_NS = "hopsworks"
SECRET = "first-pod-secret"
USER_TOKEN = "data-scientist-token"
MUTATE = "mutate-pods.scheduling.hopsworks.ai"
VALIDATE = "validate-pods.scheduling.hopsworks.ai"


@dataclass
class Platform:
    emu: KubeEmulator
    runai: RunaiStandin
    runai_admission: RunaiAdmissionStandin
    chain: AdmissionChain
    replicas: list[Runtime]
    stored_pods: list[Obj] = field(default_factory=list)  # every pod the emulator committed, as stored

    def project_pods(self, ns: str) -> list[Obj]:
        return [p for p in self.stored_pods if p["metadata"]["namespace"] == ns]


@pytest.fixture(params=[0.0, 0.3], ids=["apiserver-cache-at-once", "apiserver-cache-300ms-behind"])
async def platform(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Platform]:
    async with KubeEmulator(token=TOKEN) as emu, RunaiStandin(client_secret=SECRET) as runai:
        emu.add_service_account(TOKEN, INSTALL_NS, "scheduling-webhook")
        emu.add_user(USER_TOKEN, "alice", ["system:authenticated"])
        settings = runai_settings_configmap(
            runai,
            run_ai_project_gpu_quota=2,
            run_ai_reconcile_interval_s=3600,
        )
        for obj in (namespace(INSTALL_NS, project=False), priority_class("batch", 1000, "Never"),
                    priority_class("normal", 10000), settings):  # fmt: skip
            emu.create_object(obj)
        hold_lease_elsewhere(emu)
        emu.create_object(namespace("legacy"))  # a project from before Run:ai was turned on
        runai.add_project("vision", namespace="vision", gpu_quota=2)
        emu.create_object(namespace("vision", labels={"runai/queue": "vision"}))  # bound long ago
        secret_dir = tmp_path / "runai-secret"
        secret_dir.mkdir()
        (secret_dir / "clientSecret").write_text(SECRET)

        ca = make_ca(days=30)  # the Service's CA: both replicas' serving certificates
        replicas: list[Runtime] = []
        services = Services()
        runai_admission = RunaiAdmissionStandin()
        runai_server: HttpsServer | None = None
        chain = AdmissionChain(services, namespace_lag_s=request.param)
        platform = Platform(emu, runai, runai_admission, chain, replicas)
        emu.observers.append(
            lambda etype, rt, obj: platform.stored_pods.append(obj) if etype == "ADDED" and rt.key == PODS.key else None
        )
        try:
            ports = []
            for name in ("a", "b"):
                runtime, options, _ = await start_runtime(tmp_path / name, emu, ca=ca, runai_secret_dir=secret_dir)
                replicas.append(runtime)
                ports.append(options.port)
            services.add(INSTALL_NS, "scheduling-webhook", *ports)
            runai_dir = tmp_path / "runai-admission"
            runai_certs = make_cert_files(runai_dir, service=RUNAI_SERVICE, namespace=RUNAI_NAMESPACE)
            runai_server = await start_https_server(runai_admission.app(), tmp_path, certs=runai_certs)
            services.add(RUNAI_NAMESPACE, RUNAI_SERVICE, runai_server.port)
            chain.install(emu)
            # The rendered install's webhook configurations, unedited, and Run:ai's own.
            for obj in render({"caBundle": base64.b64encode(ca.cert_pem).decode()}):
                if obj["kind"].endswith("WebhookConfiguration"):
                    emu.put_object(obj)
            emu.put_object(RunaiAdmissionStandin.configuration(runai_certs.ca.cert_pem))
            for runtime in replicas:
                await wait_until(lambda r=runtime: r.runai.directory.reachable, within=10, what="Run:ai directory")
            yield platform
        finally:
            await chain.close()
            if runai_server is not None:
                await runai_server.close()
            for runtime in replicas:
                await runtime.shutdown()
        assert runai.violations == [], runai.violations


def pod(name: str, ns: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"hopsworks.ai/workload-type": "notebook"}},
        "spec": {"containers": [{"name": "main", "image": "registry.example/notebook:1.0"}]},
    }


async def create_as_a_controller(
    api: CoreV1Api, body: Obj, *, within_s: float = 10.0, dry_run: bool = False
) -> tuple[Obj | None, list[ApiException]]:
    """Create the pod; on a retryable refusal (503), back off and create it again, as a
    ReplicaSet controller or the platform would. Returns the stored pod and the refusals."""
    refusals: list[ApiException] = []
    deadline = time.monotonic() + within_s
    delay = 0.05
    while True:
        try:
            kwargs = {"dry_run": "All"} if dry_run else {}
            created = await api.create_namespaced_pod(body["metadata"]["namespace"], body, **kwargs)
            return api.api_client.sanitize_for_serialization(created), refusals
        except ApiException as exc:
            refusals.append(exc)
            if exc.status != 503 or time.monotonic() > deadline:
                return None, refusals
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


@pytest.fixture
async def user(platform: Platform) -> AsyncIterator[CoreV1Api]:
    async with ApiClient(platform.emu.client_config(USER_TOKEN)) as client:
        yield CoreV1Api(client)


def message(refusal: ApiException) -> str:
    """What kubectl prints: the Status message."""
    return str(json.loads(refusal.body)["message"])


def ns_labels(emu: KubeEmulator, name: str) -> dict[str, str]:
    return dict((emu.get_object("Namespace", name) or {})["metadata"].get("labels") or {})


def assert_went_through_runai(platform: Platform, stored: Obj, queue: str) -> None:
    assert stored["metadata"]["labels"].get("runai/queue") == queue, stored["metadata"]["labels"]
    assert stored["spec"]["schedulerName"] == RUNAI_SCHEDULER, "Run:ai's webhook did not see this pod"


async def test_the_first_pod_of_an_unbound_project_is_never_stored_outside_runai(
    platform: Platform, user: CoreV1Api
) -> None:
    emu = platform.emu
    assert "runai/queue" not in ns_labels(emu, "legacy")
    stored, refusals = await create_as_a_controller(user, pod("nb-1", "legacy"))
    # The first attempt binds the project in the mutating phase and is refused, with a reason.
    assert refusals, "the first pod was admitted in the same request that bound its project"
    first = refusals[0]
    assert first.status == 503
    assert message(first).startswith(
        f'admission webhook "{MUTATE}" denied the request: project namespace legacy has just been bound'
    ), message(first)
    assert "Create it again" in message(first)
    assert ns_labels(emu, "legacy")["runai/queue"] == "legacy"
    assert [p["name"] for p in platform.runai.projects.values()].count("legacy") == 1
    # Retried like a controller: admitted once the binding settled, through Run:ai's webhook.
    assert stored is not None, [r.body for r in refusals]
    assert_went_through_runai(platform, stored, "legacy")
    for later in refusals[1:]:  # held back while the binding settles, never bound twice
        assert later.status == 503 and "moments ago" in message(later), message(later)
    # Nothing was ever stored in the project without both.
    assert [p["metadata"]["name"] for p in platform.project_pods("legacy")] == ["nb-1"]
    for stored_pod in platform.project_pods("legacy"):
        assert_went_through_runai(platform, stored_pod, "legacy")
    seen = [p["metadata"]["name"] for p in platform.runai_admission.pods_seen("legacy")]
    assert seen == ["nb-1"], f"Run:ai's webhook saw {seen}"
    # Both replicas took part: the Service spreads the calls over them.
    assert len(platform.chain.calls_to(MUTATE)) >= 2


async def test_a_pod_in_a_bound_project_passes_both_webhooks_at_once(platform: Platform, user: CoreV1Api) -> None:
    stored, refusals = await create_as_a_controller(user, pod("nb-1", "vision"))
    assert refusals == [] and stored is not None
    assert_went_through_runai(platform, stored, "vision")
    # Run:ai's webhook changed the pod after ours, so ours ran again (IfNeeded) and added nothing.
    assert [(c.outcome, c.reinvoked) for c in platform.chain.calls_to(MUTATE)] == [
        ("patched", False),
        ("allowed", True),
    ]
    assert [c.outcome for c in platform.chain.calls_to(VALIDATE)] == ["allowed"]


async def test_a_dry_run_create_does_not_bind_the_project(platform: Platform, user: CoreV1Api) -> None:
    emu = platform.emu
    stored, refusals = await create_as_a_controller(user, pod("nb-1", "legacy"), dry_run=True)
    assert stored is None and len(refusals) == 1
    assert refusals[0].status == 403
    assert message(refusals[0]).startswith(f'admission webhook "{MUTATE}" denied the request: ')
    assert "not bound to a Run:ai project yet" in message(refusals[0])
    assert "runai/queue" not in ns_labels(emu, "legacy")
    assert [p for p in platform.runai.projects.values() if p["name"] == "legacy"] == []
    assert platform.project_pods("legacy") == []
    # The dry run reached the webhook as one (it declares NoneOnDryRun).
    assert [c.dry_run for c in platform.chain.calls_to(MUTATE)] == [True]
    # A dry run in a bound project shows the pod as it would be stored: through both webhooks.
    shown, refusals = await create_as_a_controller(user, pod("nb-2", "vision"), dry_run=True)
    assert refusals == [] and shown is not None
    assert_went_through_runai(platform, shown, "vision")
    assert platform.project_pods("vision") == []
