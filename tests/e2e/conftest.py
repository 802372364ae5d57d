"""The e2e suite's cluster: the real kubectl against either the emulated cluster or a given one.

Emulated (the default, part of `make test`): the Kubernetes API emulator over HTTPS with a token,
the apiserver's admission chain reading the webhook configurations that `kubectl apply` stored,
two replicas of the real server behind the install's Service, the Run:ai control-plane stand-in
and a Run:ai-like mutating webhook. The install is `scheduling-webhook manifests` output, applied
with kubectl unedited (tests may ask for a deliberately broken render, see `install_mutation`).

Real (`make e2e KUBECONFIG=...`, `make e2e-kind`): SCHEDULING_WEBHOOK_E2E_KUBECONFIG names a
cluster where the install already runs. The same tests run; those that need what only the emulated
cluster can do (stop the servers, a Run:ai stand-in, a broken render) skip and say so.

kubectl runs with `--validate=false` on apply: the emulator serves no OpenAPI documents (see
docs/admission-chain.md), and schema validation is not what these tests are about.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import ssl
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.support.admission_chain import AdmissionChain, Services
from tests.support.https import make_cert_files, start_https_server, wait_until
from tests.support.kube_emulator import PODS, KubeEmulator, Obj
from tests.support.kube_emulator_types import INSTALL_RESOURCES, RBAC_RESOURCES
from tests.support.runai_standin import RunaiStandin
from tests.support.runai_webhook import NAMESPACE as RUNAI_NAMESPACE
from tests.support.runai_webhook import SERVICE as RUNAI_SERVICE
from tests.support.runai_webhook import RunaiAdmissionStandin
from tests.support.runtime import TOKEN, start_runtime
from webhook.runtime import Runtime
from webhook.tls.issuing import make_ca

KUBECONFIG_ENV = "SCHEDULING_WEBHOOK_E2E_KUBECONFIG"  # a real cluster with the install
REQUIRE_ENV = "SCHEDULING_WEBHOOK_REQUIRE_KUBECTL"  # CI: a missing kubectl fails instead of skipping
INSTALL_NS = "hopsworks"
SETTINGS = "hopsworks-cluster-settings"
ADMIN_TOKEN = "e2e-admin-token"  # kubectl's user in the emulated cluster: kubernetes-admin, system:masters
RUNAI_SECRET = "e2e-runai-secret"
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")


def kubectl_path() -> str:
    found = shutil.which("kubectl")
    if found is None:
        reason = "kubectl not on PATH: the e2e suite drives the real kubectl (.ci/run installs it)"
        if os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes"):
            pytest.fail(f"{REQUIRE_ENV} is set and {reason}", pytrace=False)
        pytest.skip(reason)
    return found


@dataclass(frozen=True)
class Result:
    args: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"kubectl {' '.join(self.args)} -> {self.rc}\nstdout: {self.stdout}\nstderr: {self.stderr}"


@dataclass
class Emulated:
    """What only the emulated cluster has: its parts, to inspect and to break."""

    emu: KubeEmulator
    chain: AdmissionChain
    services: Services
    replicas: list[Runtime]
    runai: RunaiStandin
    runai_admission: RunaiAdmissionStandin
    stored_pods: list[Obj] = field(default_factory=list)  # every pod committed, as stored

    async def stop_servers(self) -> None:
        for runtime in self.replicas:
            await runtime.shutdown()
        self.replicas.clear()


@dataclass
class Cluster:
    kubeconfig: Path
    home: Path  # kubectl's discovery cache lives here, one per test
    emulated: Emulated | None
    kubectl_bin: str
    namespaces: list[str] = field(default_factory=list)  # created by the test, deleted after it

    async def kubectl(self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> Result:
        proc = await asyncio.create_subprocess_exec(
            self.kubectl_bin,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", ""), "HOME": str(self.home), "KUBECONFIG": str(self.kubeconfig),
                 **(env or {})},
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), 60)
        return Result(args, proc.returncode or 0, out.decode(), err.decode())

    async def ok(self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
        result = await self.kubectl(*args, stdin=stdin, env=env)
        assert result.rc == 0, str(result)
        return result.stdout

    async def refused(self, *args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
        result = await self.kubectl(*args, stdin=stdin, env=env)
        assert result.rc != 0, f"expected a refusal: {result}"
        return result.stderr

    async def get(self, kind: str, name: str, namespace: str | None = None) -> Obj:
        ns = ["-n", namespace] if namespace else []
        return dict(json.loads(await self.ok("get", kind, name, *ns, "-o", "json")))

    async def apply(self, *objects: Obj) -> str:
        return await self.ok("apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump_all(objects))

    async def project(self, prefix: str, **labels: str) -> str:
        """A new namespace, made a project the way an installer does: create, then label."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        await self.ok("create", "namespace", name)
        self.namespaces.append(name)
        pairs = [f"{k}={v}" for k, v in {"hopsworks.ai/project": name, **labels}.items()]
        await self.ok("label", "namespace", name, *pairs)
        return name

    async def plain_namespace(self, prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        await self.ok("create", "namespace", name)
        self.namespaces.append(name)
        return name

    async def settings(self, **data: str) -> None:
        await self.ok("patch", "configmap", SETTINGS, "-n", INSTALL_NS, "--type", "merge", "-p",
                      json.dumps({"data": data}))  # fmt: skip

    def needs_emulated(self, why: str) -> Emulated:
        if self.emulated is None:
            pytest.skip(f"needs the emulated cluster: {why}")
        return self.emulated


def render_install(ca_file: Path, mutation: Callable[[list[Obj]], None] | None) -> str:
    """`scheduling-webhook manifests` output, as a user runs it."""
    import subprocess  # a one-off, before the event loop has work

    values = ca_file.parent / "values.yaml"
    values.write_text(yaml.safe_dump({"caFile": str(ca_file)}))
    cli = Path(sys.executable).parent / "scheduling-webhook"
    text = subprocess.run([str(cli), "manifests", "--values", str(values)], check=True, capture_output=True,
                          text=True).stdout  # fmt: skip
    if mutation is None:
        return text
    objects = [o for o in yaml.safe_load_all(text) if o]
    mutation(objects)
    return yaml.safe_dump_all(objects)


def deployment_installers(deployment: Obj) -> tuple[str, ...]:
    """The installer identities the rendered Deployment gives its pods (an environment variable)."""
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        for env in container.get("env") or ():
            if env["name"] == "SCHEDULING_WEBHOOK_INSTALLERS":
                return tuple(i.strip() for i in env.get("value", "").split(",") if i.strip())
    return ()


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "emulated", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
                ],
                "users": [{"name": "admin", "user": {"token": token}}],
                "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "admin"}}],
                "current-context": "emulated",
            }
        )
    )
    return path


@pytest.fixture
def install_mutation() -> Callable[[list[Obj]], None] | None:
    """Overridden by tests that apply a deliberately broken render."""
    return None


@pytest.fixture
async def cluster(tmp_path: Path, install_mutation: Callable[[list[Obj]], None] | None) -> AsyncIterator[Cluster]:
    kubectl = kubectl_path()
    home = tmp_path / "home"
    home.mkdir()
    given = os.environ.get(KUBECONFIG_ENV)
    if given:
        if install_mutation is not None:
            pytest.skip("needs the emulated cluster: applies a deliberately broken install")
        real = Cluster(Path(given), home, None, kubectl)
        try:
            yield real
        finally:
            for name in real.namespaces:
                await real.kubectl("delete", "namespace", name, "--wait=false")
        return
    async with emulated_cluster(tmp_path, home, kubectl, install_mutation) as emulated:
        yield emulated


@contextlib.asynccontextmanager
async def emulated_cluster(
    tmp_path: Path, home: Path, kubectl: str, install_mutation: Callable[[list[Obj]], None] | None
) -> AsyncIterator[Cluster]:
    api_certs = make_cert_files(tmp_path / "apiserver")  # valid for 127.0.0.1
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(api_certs.cert_file, api_certs.key_file)
    ca = make_ca(days=30)  # the Service's CA: both replicas' serving certificates, and the caBundle
    ca_file = tmp_path / "service-ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    secret_dir = tmp_path / "runai-secret"
    secret_dir.mkdir()
    (secret_dir / "clientSecret").write_text(RUNAI_SECRET)
    async with KubeEmulator(token=TOKEN, ssl_context=tls) as emu, RunaiStandin(client_secret=RUNAI_SECRET) as runai:
        for rt in (*INSTALL_RESOURCES, *RBAC_RESOURCES):
            emu.add_resource(rt)
        emu.add_service_account(TOKEN, INSTALL_NS, "scheduling-webhook")
        emu.add_user(ADMIN_TOKEN, "kubernetes-admin", ["system:masters", "system:authenticated"])
        for name in SYSTEM_NAMESPACES:
            emu.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        services = Services()
        chain = AdmissionChain(services)
        chain.install(emu)
        runai_admission = RunaiAdmissionStandin()
        emulated = Emulated(emu, chain, services, [], runai, runai_admission)
        emu.observers.append(
            lambda etype, rt, obj: emulated.stored_pods.append(obj) if etype == "ADDED" and rt.key == PODS.key else None
        )
        cluster = Cluster(write_kubeconfig(tmp_path / "kubeconfig", emu.https_url, api_certs.ca_file, ADMIN_TOKEN),
                          home, emulated, kubectl)  # fmt: skip
        runai_server = None
        try:
            # The user's install: rendered, applied with kubectl. The Deployment's pods are the two
            # replicas started below, behind the Service the webhook configurations name.
            await cluster.ok("apply", "--validate=false", "-f", "-", stdin=render_install(ca_file, install_mutation))
            installers = deployment_installers(await cluster.get("deployment", "scheduling-webhook", INSTALL_NS))
            ports = []
            for name in ("a", "b"):
                runtime, options, _ = await start_runtime(
                    tmp_path / name, emu, ca=ca, runai_secret_dir=secret_dir, installers=installers
                )
                emulated.replicas.append(runtime)
                ports.append(options.port)
            services.add(INSTALL_NS, "scheduling-webhook", *ports)
            # Run:ai's own admission webhook, installed by Run:ai (not part of our install).
            runai_certs = make_cert_files(
                tmp_path / "runai-admission", service=RUNAI_SERVICE, namespace=RUNAI_NAMESPACE
            )
            runai_server = await start_https_server(runai_admission.app(), tmp_path, certs=runai_certs)
            services.add(RUNAI_NAMESPACE, RUNAI_SERVICE, runai_server.port)
            await cluster.apply(RunaiAdmissionStandin.configuration(runai_certs.ca.cert_pem))
            for runtime in emulated.replicas:
                await wait_until(runtime.state.ready, within=10, what="replica ready")
            yield cluster
        finally:
            await chain.close()
            if runai_server is not None:
                await runai_server.close()
            await emulated.stop_servers()
        assert runai.violations == [], runai.violations
