"""A department move cut short by `kill -9` on the test control plane, with the install's two replicas.

    moves = CrashedMoves(inst)          # an Install (install.py) with 2 replicas Ready
    await moves.prepare()               # Run:ai on, department `ml`, an admin's token
    run = await moves.crash_a_move("leader")   # or "follower"
    run.seconds, run.outcome
    await moves.restore()

Everything Kubernetes is real: the apiserver's Lease the replicas elect a leader with, the
namespace annotation the move records its intent in, the admin's TokenReview and
SubjectAccessReview. A project bound by the leader is moved to department `ml` through the admin
API over HTTPS, on the HTTPS port of the replica to be killed (its pod's address, dialled from the
nodes' namespace), so that replica carries the move out. Run:ai (the stand-in) answers the delete
of the old project with 202 and keeps it `Deleting` for a few seconds: the replica's container is
killed (SIGKILL) while it waits there, with its intent recorded and its heartbeat running. Its
kubelet starts it again. The time runs from the kill to the namespace carrying no intent, its
department label the new one (moved) or the old one (rolled back).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from tests.support.control_plane.install import INSTALL_NS, LEASE, SERVICE, SETTINGS, Install
from tests.support.control_plane.rest import Rest, RestError
from webhook.snapshot import DEPARTMENT_LABEL, RUNAI_MOVE_ANNOTATION, RUNAI_PROJECT_ID_LABEL, RUNAI_QUEUE_LABEL

T = TypeVar("T")
Obj = dict[str, Any]
HTTPS_PORT = 8443  # the pods' port `https`, behind the Service's 443
Kill = Literal["leader", "follower"]
DEPARTMENT = "ml"
# Long enough to kill the holder while it waits for Run:ai's delete; short beside the recovery.
RUNAI_DELETE_S = 4.0
# The pass every 5 minutes: a recovery within seconds is not the pass's timer.
SETTINGS_DATA = {"run_ai_project_gpu_quota": "2", "run_ai_reconcile_interval_s": "300",
                 "run_ai_directory_refresh_s": "1"}  # fmt: skip


@dataclass(frozen=True)
class CrashRun:
    killed: Kill
    seconds: float  # from the kill to the move finished or rolled back
    outcome: Literal["moved", "rolled-back"]
    runai_department: str  # where the project is now
    projects_named: int  # Run:ai projects named like the namespace (1: none lost, none doubled)
    quota: list[float]  # the project's deserved GPUs per node pool now


class CrashedMoves:
    def __init__(self, inst: Install) -> None:
        self.inst = inst
        cp = inst.cp
        self.rest = Rest(cp.url, cp.pki.ca_file, cp.dir / "pki/admin.crt", cp.dir / "pki/admin.key")
        self.namespaces: list[str] = []
        self._token = ""
        self._admins = f"crash-admins-{uuid.uuid4().hex[:6]}"
        self._delete_was = (inst.runai.delete_status, inst.runai.delete_delay_s)

    # -- setup and teardown ------------------------------------------------------------------------

    async def prepare(self) -> None:
        inst, runai = self.inst, self.inst.runai
        data = {"run_ai_enable": "true", "run_ai_url": inst.runai_url, "run_ai_client_id": runai.client_id,
                **SETTINGS_DATA}  # fmt: skip
        await self._kubectl("patch", "configmap", SETTINGS, "-n", INSTALL_NS, "--type", "merge", "-p",
                            json.dumps({"data": data}))  # fmt: skip
        self._in_standin(lambda: runai.department(DEPARTMENT) or runai.add_department(DEPARTMENT))

        def delete_slowly() -> None:
            runai.delete_status, runai.delete_delay_s = 202, RUNAI_DELETE_S

        self._in_standin(delete_slowly)
        # An admin of the platform: a ServiceAccount bound to cluster-admin, with a TokenRequest token.
        await self._kubectl("create", "namespace", self._admins)
        await self._kubectl("create", "serviceaccount", "platform-admin", "-n", self._admins)
        await self._kubectl("create", "clusterrolebinding", self._admins, "--clusterrole=cluster-admin",
                            f"--serviceaccount={self._admins}:platform-admin")  # fmt: skip
        self._token = (await self._kubectl("create", "token", "platform-admin", "-n", self._admins)).strip()
        await _until(lambda: inst.metric("webhook_runai_reachable") == [1.0, 1.0], 30, "Run:ai reachable on both")
        await asyncio.sleep(3)  # both replicas' directories refreshed and know `ml` (setup, not an assertion)

    async def restore(self) -> None:
        """The projects deleted (in Run:ai too, through our finalizer), the admin gone, Run:ai's
        deletes immediate again and the install's settings back."""
        runai = self.inst.runai

        def delete_at_once() -> None:
            runai.delete_status, runai.delete_delay_s = self._delete_was

        self._in_standin(delete_at_once)
        for name in self.namespaces:
            await self._kubectl("delete", "namespace", name, "--wait=false", check=False)
        with contextlib.suppress(AssertionError):  # a namespace left Terminating is not this test's finding
            await _until(lambda: not any(self._namespace(n) for n in self.namespaces), 60, "the projects deleted")
        await self._kubectl("delete", "clusterrolebinding", self._admins, "--ignore-not-found", check=False)
        await self._kubectl("delete", "namespace", self._admins, "--wait=false", check=False)
        await asyncio.to_thread(self.inst.reset_settings)

    # -- one crashed move --------------------------------------------------------------------------

    async def crash_a_move(self, kill: Kill, *, within_s: float = 90.0) -> CrashRun:
        await asyncio.to_thread(self.inst.wait_ready, 2)
        leader = await self._leader()
        victim = leader if kill == "leader" else next(p for p in self.inst.serving() if _name(p) != _name(leader))
        name = await self._bound_project()
        old = self._in_standin(lambda: self.inst.runai.project(name))
        assert old is not None, f"{name} has no Run:ai project"

        reader, writer = await self._connection_to(victim)
        body = json.dumps({"department": DEPARTMENT}).encode()
        head = (f"POST /api/v1/admin/projects/{name}/move HTTP/1.1\r\nHost: {SERVICE}.{INSTALL_NS}.svc\r\n"
                f"Authorization: Bearer {self._token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
        writer.write(head.encode() + body)
        await writer.drain()
        try:
            # The victim has recorded the intent and asked Run:ai to delete the old project.
            try:
                await _until(
                    lambda: self._in_standin(lambda: self._phase(old["id"])) == "Deleting",
                    20,
                    f"{name}'s old Run:ai project being deleted",
                    interval_s=0.05,
                )
            except AssertionError as exc:
                answer = await asyncio.wait_for(reader.read(2000), 5)
                raise AssertionError(f"{exc}; {_name(victim)} answered: {answer.decode(errors='replace')}") from None
            intent = self._intent(name)
            assert intent is not None and intent["holder"].startswith(f"{_name(victim)}_"), (_name(victim), intent)
            await asyncio.to_thread(self.inst.kill, _name(victim))
            killed_at = time.monotonic()
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()

        def settled() -> bool:
            labels = (self._namespace(name) or {}).get("labels") or {}
            return self._intent(name) is None and (labels.get(DEPARTMENT_LABEL) or "") in (DEPARTMENT, "")

        await _until(settled, within_s, f"the move of {name} finished or rolled back", interval_s=0.05)
        seconds = time.monotonic() - killed_at
        labels = (self._namespace(name) or {}).get("labels") or {}

        def now_in_runai() -> tuple[int, str, list[float]]:
            runai = self.inst.runai
            named = [p for p in runai.projects.values() if p["name"] == name]
            now = named[0] if named else {}
            department = runai.departments.get(str(now.get("parentId")), {}).get("name", "")
            return len(named), str(department), [float(r["gpu"]["deserved"]) for r in now.get("resources") or []]

        projects_named, department, quota = self._in_standin(now_in_runai)
        return CrashRun(
            killed=kill,
            seconds=seconds,
            outcome="moved" if labels.get(DEPARTMENT_LABEL) == DEPARTMENT else "rolled-back",
            runai_department=department,
            projects_named=projects_named,
            quota=quota,
        )

    # -- the parts ---------------------------------------------------------------------------------

    async def _bound_project(self) -> str:
        """A new project namespace, bound by the leader (its Run:ai project created with the quota)."""
        name = f"crash-{uuid.uuid4().hex[:6]}"
        await self._kubectl("create", "namespace", name)
        self.namespaces.append(name)
        await self._kubectl("label", "namespace", name, f"hopsworks.ai/project={name}")

        def bound() -> bool:
            labels = (self._namespace(name) or {}).get("labels") or {}
            return RUNAI_QUEUE_LABEL in labels and RUNAI_PROJECT_ID_LABEL in labels

        await _until(bound, 60, f"{name} bound to Run:ai")
        return name

    async def _leader(self, within_s: float = 40.0) -> Obj:
        def holder() -> Obj | None:
            try:
                lease = self.rest.get(f"/apis/coordination.k8s.io/v1/namespaces/{INSTALL_NS}/leases/{LEASE}")
            except RestError:
                return None
            identity = str((lease.get("spec") or {}).get("holderIdentity") or "")
            return next((p for p in self.inst.serving() if identity.startswith(f"{_name(p)}_")), None)

        await _until(lambda: holder() is not None, within_s, "a running replica holding the Lease")
        found = holder()
        assert found is not None
        return found

    async def _connection_to(self, replica: Obj) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TLS connection to the replica's own HTTPS port, opened inside the nodes' namespace."""
        assert self.inst.cp.real is not None
        ctx = ssl.create_default_context(cafile=str(self.inst.dir / "ca.crt"))
        sock = self.inst.cp.real.ns.socket()
        sock.setblocking(False)
        await asyncio.wait_for(
            asyncio.get_running_loop().sock_connect(sock, (replica["status"]["podIP"], HTTPS_PORT)), 10
        )
        return await asyncio.open_connection(sock=sock, ssl=ctx, server_hostname=f"{SERVICE}.{INSTALL_NS}.svc")

    def _namespace(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.rest.get(f"/api/v1/namespaces/{name}")["metadata"])
        except RestError as exc:
            if exc.status == 404:
                return None
            raise

    def _intent(self, name: str) -> dict[str, Any] | None:
        raw = ((self._namespace(name) or {}).get("annotations") or {}).get(RUNAI_MOVE_ANNOTATION)
        return dict(json.loads(raw)) if raw else None

    def _phase(self, project_id: str) -> str:
        return str(((self.inst.runai.projects.get(project_id) or {}).get("status") or {}).get("phase") or "")

    def _in_standin(self, fn: Callable[[], T]) -> T:
        """`fn` on the Run:ai stand-in's own loop (it serves from another thread)."""

        async def call() -> T:
            return fn()

        return self.inst.background.run(call())

    async def _kubectl(self, *args: str, check: bool = True) -> str:
        done = await asyncio.to_thread(self.inst.cp.kubectl, *args, check=check)
        return str(done.stdout)


def _name(pod: Obj) -> str:
    return str(pod["metadata"]["name"])


async def _until(condition: Callable[[], bool], within_s: float, what: str, interval_s: float = 0.1) -> None:
    deadline = time.monotonic() + within_s
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s:g} s: {what}")
        await asyncio.sleep(interval_s)
