"""The e2e suite's cluster: the real kubectl against a real control plane, or against a given one.

Local (the default, part of `make test`): etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok built by `make peers` (tests/support/control_plane/), started once per
session, with two real nodes beside the kwok nodes (kubelet, containerd, runc: nodes.py); the
chart installed with the real `helm install` (tests/support/chart.py); its two pods run from the
image on the real nodes; the Run:ai REST stand-in and a Run:ai-like admission webhook beside them.

Given (`make e2e KUBECONFIG=...`, `make e2e-kind`): SCHEDULING_WEBHOOK_E2E_KUBECONFIG names a
cluster where the install already runs. The same tests run; those that need what only the local
control plane has (its Run:ai stand-ins, scaling the install, a broken render) skip and say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import peers
from tests.support.control_plane.cluster import ControlPlane, control_plane
from tests.support.control_plane.install import INSTALL_NS, SERVICE_ACCOUNT_USER, SETTINGS, Install, installed
from tests.support.control_plane.nodes import DEFAULT_REAL_NODES

KUBECONFIG_ENV = "SCHEDULING_WEBHOOK_E2E_KUBECONFIG"  # a cluster with the install
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")
PRIORITY_CLASSES = [("batch", 1000, "Never"), ("normal", 10000, None), ("urgent", 100000, None)]
# A ServiceAccount whose requests the apiserver's audit log keeps beside the replicas': a test that
# reads what the apiserver recorded of a request it makes (its audit annotations) makes it as this one.
AUDITED_CREATOR = ("default", "audited-creator")
AUDITED_CREATOR_USER = f"system:serviceaccount:{AUDITED_CREATOR[0]}:{AUDITED_CREATOR[1]}"
Obj = dict[str, Any]


@dataclass(frozen=True)
class Result:
    args: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"kubectl {' '.join(self.args)} -> {self.rc}\nstdout: {self.stdout}\nstderr: {self.stderr}"


@dataclass
class Cluster:
    kubeconfig: Path
    home: Path  # kubectl's discovery cache lives here, one per test
    kubectl_bin: str
    local: Install | None  # the harness's own install: None on a given cluster
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

    async def list(self, kind: str, namespace: str, *selector: str) -> list[Obj]:
        out = await self.ok("get", kind, "-n", namespace, *selector, "-o", "json")
        return list(json.loads(out)["items"])

    async def apply(self, *objects: Obj) -> str:
        return await self.ok("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))

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

    def needs_local(self, why: str) -> Install:
        if self.local is None:
            pytest.skip(f"needs the local control plane: {why}")
        return self.local

    async def eventually(self, check: Callable[[], Any], what: str, within_s: float = 30.0) -> Any:
        """Polls an async or plain check until it returns something truthy."""
        deadline = time.monotonic() + within_s
        while True:
            got = check()
            if asyncio.iscoroutine(got):
                got = await got
            if got:
                return got
            assert time.monotonic() < deadline, f"not within {within_s:.0f} s: {what}"
            await asyncio.sleep(0.2)


def apply_priority_classes(cp: ControlPlane) -> None:
    """The platform's PriorityClasses the suite's pods choose from (PRIORITY_CLASSES)."""
    for name, value, policy in PRIORITY_CLASSES:
        obj: Obj = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                    "value": value, "globalDefault": False}  # fmt: skip
        if policy:
            obj["preemptionPolicy"] = policy
        cp.apply([obj])


def _report(config: pytest.Config, line: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


@pytest.fixture(scope="session")
def real_control_plane(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    if os.environ.get(KUBECONFIG_ENV):
        pytest.skip("a given cluster is in use")
    # Not under pytest's basetemp (kept for three runs): teardown leaves no folder behind.
    dir = Path(tempfile.mkdtemp(prefix="swh-control-plane-"))
    try:
        with control_plane(
            dir, audited_users=(SERVICE_ACCOUNT_USER, AUDITED_CREATOR_USER), real_nodes=DEFAULT_REAL_NODES
        ) as cp:
            version = cp.kubectl("version").stdout.replace("\n", "; ")
            timings = ", ".join(f"{k} {v:.1f} s" for k, v in cp.timings.items())
            _report(
                pytestconfig, f"\ncontrol plane at {cp.url} (services {cp.service_cidr}): {version} ready: {timings}"
            )
            apply_priority_classes(cp)
            yield cp
    finally:
        shutil.rmtree(dir, ignore_errors=True)


@pytest.fixture(scope="session")
def local_install(real_control_plane: ControlPlane, pytestconfig: pytest.Config) -> Iterator[Install]:
    start = time.monotonic()
    with installed(real_control_plane, real_control_plane.dir / "install") as inst:
        _report(pytestconfig, f"install applied and 2 replicas Ready in {time.monotonic() - start:.1f} s")
        yield inst


@contextlib.contextmanager
def own_control_plane(prefix: str, why: str) -> Iterator[ControlPlane]:
    """A control plane with real nodes for one module, beside the session's: for tests that break
    or reinstall what the session's other tests rely on (`why` is the skip reason on a given cluster)."""
    if os.environ.get(KUBECONFIG_ENV):
        pytest.skip(f"a given cluster is in use: {why}")
    dir = Path(tempfile.mkdtemp(prefix=f"swh-{prefix}-plane-"))
    try:
        with control_plane(dir, real_nodes=DEFAULT_REAL_NODES) as cp:
            apply_priority_classes(cp)
            yield cp
    finally:
        shutil.rmtree(dir, ignore_errors=True)


def kubectl_bin() -> str:
    return str(peers.binary("kubectl"))


@pytest.fixture
async def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    home = tmp_path / "home"
    home.mkdir()
    given = os.environ.get(KUBECONFIG_ENV)
    if given:
        real = Cluster(Path(given), home, kubectl_bin(), None)
    else:
        inst: Install = request.getfixturevalue("local_install")
        inst.reset_settings()
        inst.ensure_running()
        real = Cluster(inst.cp.admin_kubeconfig, home, str(inst.cp.kubectl_bin), inst)
    try:
        yield real
    finally:
        for name in real.namespaces:
            await real.kubectl("delete", "namespace", name, "--wait=false")
        if real.local is not None:
            assert real.local.runai.violations == [], real.local.runai.violations


@contextlib.contextmanager
def broken_install(inst: Install, mutation: Callable[[list[Obj]], None]) -> Iterator[None]:
    """The webhook configurations re-applied from a deliberately broken render, for one test."""
    inst.apply_webhook_configurations(mutation)
    try:
        yield
    finally:
        inst.apply_webhook_configurations(None)
