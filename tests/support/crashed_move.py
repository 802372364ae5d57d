"""A department move cut short by `kill -9`, on two real `scheduling-webhook serve` processes.

    async with CrashedMoveCluster(tmp_path) as cluster:
        run = await cluster.crash_a_move(kill="leader")   # or "follower"
        run.seconds, run.outcome

The Kubernetes API emulator and the spec-checked Run:ai stand-in run in this process; the two
replicas are real server processes reading them over HTTP (a kubeconfig each, the Run:ai secret
in a mounted-like folder), each its own Lease candidate. A move of a bound project to department
`ml` is asked of the replica to be killed through the admin API over HTTPS. Run:ai answers the
delete of the old project with 202 and keeps it `Deleting` for a few seconds, as it may: the
replica is killed (SIGKILL) while it waits there, with the intent recorded and its heartbeat
running. The time is taken from the kill to the moment the namespace carries no intent and its
department label is the new one (moved) or the old one (rolled back).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import aiohttp

from tests.support.cluster import namespace, priority_class, runai_admission_objects, runai_settings_configmap
from tests.support.https import LOOPBACK, SERVICE_HOST, StaticResolver, client_ssl_context, free_port, make_cert_files
from tests.support.kube_emulator import KubeEmulator
from tests.support.runai_standin import RunaiStandin
from tests.support.runtime import TOKEN, write_kubeconfig
from webhook.snapshot import DEPARTMENT_LABEL, RUNAI_MOVE_ANNOTATION, RUNAI_PROJECT_ID_LABEL, RUNAI_QUEUE_LABEL

INSTALL_NS = "hopsworks"
LEASE = "scheduling-webhook-leader"
SECRET = "crashed-move-secret"
ADMIN_TOKEN = "crash-admin-token"
# Long enough to kill the holder while it waits for Run:ai's delete; short beside the recovery.
RUNAI_DELETE_S = 4.0


@dataclass
class Replica:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"https://{SERVICE_HOST}:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass(frozen=True)
class CrashRun:
    killed: str  # "leader" or "follower"
    seconds: float  # from the kill to the move finished or rolled back
    outcome: Literal["moved", "rolled-back"]
    runai_department: str  # where the project is now
    projects_named: int  # Run:ai projects named like the namespace (1: none lost, none doubled)
    quota: list[float]  # the project's deserved GPUs per node pool now


class CrashedMoveCluster:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.emu = KubeEmulator(token=TOKEN)
        self.runai = RunaiStandin(client_secret=SECRET, delete_status=202, delete_delay_s=RUNAI_DELETE_S)
        self.replicas: list[Replica] = []
        self._certs = make_cert_files(directory / "certs")
        self._session: aiohttp.ClientSession | None = None
        self._round = 0

    async def __aenter__(self) -> CrashedMoveCluster:
        await self.emu.start()
        await self.runai.start()
        self.runai.add_department("ml")
        for obj in (namespace(INSTALL_NS, project=False), priority_class("normal", 10000), *runai_admission_objects()):
            self.emu.create_object(obj)
        self.emu.allow("webhook", "*", "*")
        self.emu.add_user(ADMIN_TOKEN, "admin")
        self.emu.allow("admin", "*", "*")
        # The reconcile pass comes every 5 minutes: a recovery within seconds is not the pass's timer.
        self.emu.put_object(
            runai_settings_configmap(
                self.runai, INSTALL_NS, run_ai_reconcile_interval_s=300, run_ai_project_gpu_quota=0
            )
        )
        secret_dir = self.directory / "runai-secret"
        secret_dir.mkdir(parents=True, exist_ok=True)
        (secret_dir / "clientSecret").write_text(SECRET)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                ssl=client_ssl_context(self._certs.ca.cert_pem), resolver=StaticResolver({SERVICE_HOST: LOOPBACK})
            ),
            timeout=aiohttp.ClientTimeout(total=60),
        )
        for name in ("replica-a", "replica-b"):
            self.replicas.append(self._start(name))
        await self._all_ready()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for replica in self.replicas:
            _stop(replica)
        if self._session is not None:
            await self._session.close()
        await self.runai.stop()
        await self.emu.stop()

    # -- the replicas --------------------------------------------------------------------------

    def _start(self, name: str) -> Replica:
        home = self.directory / name
        home.mkdir(parents=True, exist_ok=True)
        port = free_port()
        kubeconfig = write_kubeconfig(home / "kubeconfig", self.emu.url, TOKEN)
        argv = [sys.executable, "-m", "webhook", "serve", "--kubeconfig", str(kubeconfig)]
        argv += ["--certs", str(self._certs.dir), "--host", LOOPBACK, "--port", str(port)]
        argv += ["--namespace", INSTALL_NS, "--runai-secret-dir", str(self.directory / "runai-secret")]
        env = {**os.environ, "POD_NAME": name, "WEBHOOK_DRAIN_SECONDS": "0"}
        log = home / "server.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT)
        return Replica(name, proc, port, log)

    async def _all_ready(self, within_s: float = 60.0) -> None:
        assert self._session is not None
        deadline = time.monotonic() + within_s
        for replica in self.replicas:
            while True:
                if replica.proc.poll() is not None:
                    raise AssertionError(f"{replica.name} exited:\n{replica.output()}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                    async with self._session.get(f"{replica.url}/readyz") as resp:
                        if resp.status == 200:
                            break
                if time.monotonic() > deadline:
                    raise AssertionError(f"{replica.name} not ready:\n{replica.output()}")
                await asyncio.sleep(0.1)

    async def _leader(self, within_s: float = 40.0) -> Replica:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            lease = self.emu.get_object("Lease", LEASE, INSTALL_NS) or {}
            holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
            for replica in self.replicas:
                if holder.startswith(f"{replica.name}_") and replica.proc.poll() is None:
                    return replica
            await asyncio.sleep(0.1)
        raise AssertionError("no live replica holds the Lease")

    async def replace(self, replica: Replica) -> None:
        """Start the killed replica again (as its Deployment would), for the next round."""
        index = self.replicas.index(replica)
        self.replicas[index] = self._start(replica.name)
        await self._all_ready()

    # -- one crashed move ------------------------------------------------------------------------

    def _project_namespace(self) -> str:
        self._round += 1
        name = f"team-{self._round}"
        project = self.runai.add_project(name, namespace=name, gpu_quota=3)
        labels = {RUNAI_QUEUE_LABEL: name, RUNAI_PROJECT_ID_LABEL: project["id"]}
        self.emu.create_object(namespace(name, labels=labels))
        return name

    def _intent(self, name: str) -> dict[str, Any] | None:
        meta = (self.emu.get_object("Namespace", name) or {}).get("metadata") or {}
        raw = (meta.get("annotations") or {}).get(RUNAI_MOVE_ANNOTATION)
        return json.loads(raw) if raw else None

    async def crash_a_move(self, kill: Literal["leader", "follower"], *, within_s: float = 90.0) -> CrashRun:
        assert self._session is not None
        leader = await self._leader()
        victim = leader if kill == "leader" else next(r for r in self.replicas if r is not leader)
        name = self._project_namespace()
        old = self.runai.project(name)
        assert old is not None

        async def ask() -> None:
            assert self._session is not None
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with self._session.post(
                    f"{victim.url}/api/v1/admin/projects/{name}/move",
                    json={"department": "ml"},
                    headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                ) as resp:
                    await resp.read()

        asking = asyncio.create_task(ask())
        # The victim has recorded the intent and asked Run:ai to delete the old project.
        await _until(
            lambda: (self.runai.projects.get(old["id"]) or {}).get("status", {}).get("phase") == "Deleting",
            within_s=20,
            what=f"{name}'s old Run:ai project being deleted",
        )
        intent = self._intent(name)
        assert intent is not None and intent["holder"].startswith(victim.name), intent
        victim.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        victim.proc.wait()
        await asking

        def settled() -> bool:
            labels = ((self.emu.get_object("Namespace", name) or {}).get("metadata") or {}).get("labels") or {}
            return self._intent(name) is None and (labels.get(DEPARTMENT_LABEL) or "") in ("ml", "")

        await _until(settled, within_s=within_s, interval_s=0.05, what=f"the move of {name} finished or rolled back")
        seconds = time.monotonic() - killed_at
        labels = ((self.emu.get_object("Namespace", name) or {}).get("metadata") or {}).get("labels") or {}
        projects = [p for p in self.runai.projects.values() if p["name"] == name]
        now = projects[0] if projects else {}
        department = self.runai.departments.get(str(now.get("parentId")), {}).get("name", "")
        return CrashRun(
            killed=kill,
            seconds=seconds,
            outcome="moved" if labels.get(DEPARTMENT_LABEL) == "ml" else "rolled-back",
            runai_department=str(department),
            projects_named=len(projects),
            quota=[float(r["gpu"]["deserved"]) for r in now.get("resources") or []],
        )


async def _until(condition: Any, *, within_s: float, what: str, interval_s: float = 0.1) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s:g} s: {what}")
        await asyncio.sleep(interval_s)


def _stop(replica: Replica) -> None:
    if replica.proc.poll() is None:
        replica.proc.send_signal(signal.SIGTERM)
        try:
            replica.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            replica.proc.kill()
            replica.proc.wait()
