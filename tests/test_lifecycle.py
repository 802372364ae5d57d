"""The real server as a process: SIGTERM under load, certificate rotation under load, settings
edited in the state folder, starting on the defaults when Kueue and Run:ai are both on, and the
README's flow.

Each test starts `python -m webhook serve --state <copy of examples/cluster> --certs <tmp>` on
127.0.0.1 and talks to it over HTTPS as the apiserver does (the test CA only, the Service name
verified, keep-alive). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.support.https import (
    LOOPBACK,
    SERVICE_HOST,
    CertFiles,
    StaticResolver,
    client_ssl_context,
    free_port,
    make_cert_files,
    raw_request,
)
from tests.support.reviews import apply_patch, assert_valid_pod, pod_review

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "cluster"
BIN = Path(sys.executable).parent
DRAIN_SECONDS = 1.0
CERT_POLL_SECONDS = 10.0  # CertWatcher's default interval in `serve`


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    ca_pem: bytes
    state: Path
    log: Path

    def url(self, path: str) -> str:
        return f"https://{SERVICE_HOST}:{self.port}{path}"

    def session(self, limit: int = 8, force_close: bool = False) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            ssl=client_ssl_context(self.ca_pem),
            resolver=StaticResolver({SERVICE_HOST: LOOPBACK}),
            limit=limit,
            force_close=force_close,
        )
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10))

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def copy_state(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    shutil.copytree(EXAMPLES, state)
    return state


def edit_settings(state: Path, **flat: str) -> None:
    path = state / "20-settings.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["data"].update(flat)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    os.replace(tmp, path)  # as an editor or kubectl-sync would: never half a file


def start(tmp_path: Path, state: Path, certs_dir: Path, ca_pem: bytes, *command: str) -> Server:
    port = free_port()
    log = tmp_path / f"server-{port}.log"
    argv = list(command) or [sys.executable, "-m", "webhook", "serve"]
    argv += ["--state", str(state), "--certs", str(certs_dir), "--host", LOOPBACK, "--port", str(port)]
    env = {**os.environ, "WEBHOOK_DRAIN_SECONDS": str(DRAIN_SECONDS)}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    return Server(proc, port, ca_pem, state, log)


def stop(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


async def wait_ready(server: Server, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    async with server.session(limit=1) as client:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise AssertionError(f"server exited with {server.proc.returncode}:\n{server.output()}")
            with contextlib.suppress(TimeoutError, aiohttp.ClientError, OSError):
                async with client.get(server.url("/readyz")) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05)
    raise AssertionError(f"server not ready within {within}s:\n{server.output()}")


@pytest.fixture
def certs(tmp_path: Path) -> CertFiles:
    return make_cert_files(tmp_path / "certs")


@pytest.fixture
async def server(tmp_path: Path, certs: CertFiles) -> AsyncIterator[Server]:
    srv = start(tmp_path, copy_state(tmp_path), certs.dir, certs.ca.cert_pem)
    try:
        await wait_ready(srv)
        yield srv
    finally:
        stop(srv)


def review_body(uid: str, namespace: str = "churn") -> bytes:
    return json.dumps(pod_review(namespace, uid=uid)).encode()


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    response = answer["response"]
    return json.loads(base64.b64decode(response["patch"])) if "patch" in response else []


@dataclass
class Load:
    """Workers on keep-alive connections, each sending the next pod review when its answer is in."""

    server: Server
    workers: int = 8
    sent: int = 0
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    in_flight: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    max_requests: int = 20_000  # bounded even if the stop signal never comes

    def __post_init__(self) -> None:
        review_body("first")  # without ../shared this skips the test here, not inside a worker task

    async def run(self, client: aiohttp.ClientSession) -> None:
        async def worker(w: int) -> None:
            i = 0
            while not self.stop.is_set() and self.sent < self.max_requests:
                uid = f"w{w}-{i}"
                i += 1
                self.sent += 1
                self.in_flight += 1
                try:
                    async with client.post(
                        self.server.url("/mutate/pods"),
                        data=review_body(uid),
                        headers={"Content-Type": "application/json"},
                    ) as resp:
                        answer = await resp.json()
                    if resp.status != 200 or answer["response"]["uid"] != uid or not answer["response"]["allowed"]:
                        self.failures.append(f"{uid}: {resp.status} {answer}")
                    else:
                        self.ok += 1
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    self.failures.append(f"{uid}: {type(exc).__name__}: {exc}")
                finally:
                    self.in_flight -= 1

        await asyncio.gather(*(worker(w) for w in range(self.workers)))


async def test_sigterm_under_load_drains_then_exits_zero(server: Server) -> None:
    """Readiness goes false first; the load generator stops as endpoints would drop the pod; every
    request already sent is answered; the process exits 0."""
    load = Load(server)
    readiness: list[tuple[float, int | str]] = []
    in_flight_at_sigterm = 0

    async def watch_readiness(client: aiohttp.ClientSession) -> None:
        # The endpoints controller's view: /readyz on its own connection, every 20 ms.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                async with client.get(server.url("/readyz")) as resp:
                    readiness.append((time.monotonic(), resp.status))
                    if resp.status != 200:
                        body = await resp.json()
                        assert "shutting down" in body["waiting_for"], body
                        load.stop.set()  # the pod leaves the Service's endpoints
                        return
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                readiness.append((time.monotonic(), type(exc).__name__))
                load.stop.set()
                return
            await asyncio.sleep(0.02)
        load.stop.set()

    async with server.session(limit=load.workers) as client, server.session(limit=1) as probe:
        running = asyncio.gather(load.run(client), watch_readiness(probe))
        await asyncio.sleep(1.0)
        assert load.ok > 0, load.failures[:3]
        in_flight_at_sigterm = load.in_flight
        sigterm_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(running, timeout=30)

    exit_code = await asyncio.to_thread(server.proc.wait, 20)
    assert exit_code == 0, server.output()
    assert load.failures == [], load.failures[:5]
    assert load.sent == load.ok > 0
    assert in_flight_at_sigterm > 0  # requests were on the wire when the signal came
    # Readiness said "not ready" (a 503, not a refused connection) while the server still answered.
    first_not_ready = next(status for at, status in readiness if at >= sigterm_at and status != 200)
    assert first_not_ready == 503, readiness[-3:]
    # No line per request by default: it cost as much as the decision (bench); WEBHOOK_ACCESS_LOG=1 has it.
    assert "aiohttp.access" not in server.output()


@pytest.mark.slow
async def test_rotated_certificate_is_served_without_restart_or_failed_request(
    server: Server, certs: CertFiles
) -> None:
    load = Load(server, workers=4)
    old_serial = certs.serving.cert.serial_number
    rotated = certs.issue()
    ctx = client_ssl_context(certs.ca.cert_pem)
    handshakes: list[int] = []
    handshake_failures: list[str] = []
    switched = asyncio.Event()

    async def new_handshakes() -> None:
        # New connections, as a second apiserver replica opening its pool would make.
        while not load.stop.is_set():
            try:
                handshake = await raw_request(server.port, ctx, path="/healthz")
                assert handshake.status_line.startswith(b"HTTP/1.1 200"), handshake.status_line
                handshakes.append(handshake.cert.serial_number)
                if handshake.cert.serial_number == rotated.cert.serial_number:
                    switched.set()
            except (OSError, AssertionError) as exc:
                handshake_failures.append(repr(exc))
            await asyncio.sleep(0.1)

    async with server.session(limit=load.workers) as client:
        running = asyncio.gather(load.run(client), new_handshakes())
        await asyncio.sleep(0.5)
        certs.install(rotated)  # atomic renames into the certs folder, key then certificate
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(switched.wait(), timeout=CERT_POLL_SECONDS * 2 + 5)
        await asyncio.sleep(0.5)  # keep the load on across the switch
        load.stop.set()
        await asyncio.wait_for(running, timeout=30)

    assert rotated.cert.serial_number in handshakes, f"still serving the old certificate: {set(handshakes)}"
    assert handshakes[0] == old_serial
    switched = handshakes.index(rotated.cert.serial_number)
    assert set(handshakes[switched:]) == {rotated.cert.serial_number}  # no flapping back
    assert handshake_failures == [] and load.failures == [], (handshake_failures[:3], load.failures[:3])
    assert load.ok > 0 and server.proc.poll() is None  # same process, never restarted


async def test_settings_edited_in_the_state_folder_apply_without_restart(server: Server) -> None:
    async with server.session(limit=1) as client:

        async def queue_label(uid: str) -> str | None:
            async with client.post(
                server.url("/mutate/pods"), data=review_body(uid), headers={"Content-Type": "application/json"}
            ) as resp:
                answer = await resp.json()
            assert resp.status == 200 and answer["response"]["allowed"], answer
            patched = apply_patch(pod_review("churn")["request"]["object"], patch_of(answer))
            assert_valid_pod(patched)
            return (patched["metadata"].get("labels") or {}).get("kueue.x-k8s.io/queue-name")

        assert await queue_label("before") is None  # examples/cluster: Kueue off (Run:ai on)
        edit_settings(server.state, kueue_installed="true", run_ai_enable="false")
        deadline = time.monotonic() + 10
        i = 0
        while (label := await queue_label(f"after-{i}")) is None and time.monotonic() < deadline:
            i += 1
            await asyncio.sleep(0.1)
        assert label == "default"
        assert await queue_label("later") == "default"  # stays applied
    assert server.proc.poll() is None


async def test_serve_starts_on_the_defaults_when_kueue_and_runai_are_both_on(tmp_path: Path) -> None:
    # Exiting would take down the settings webhook that must let the fixing edit through, so the
    # defaults serve (neither on) and the process says why, in the log, on /readyz and on /metrics.
    state = copy_state(tmp_path)
    edit_settings(state, kueue_installed="true", run_ai_enable="true")
    certs = make_cert_files(tmp_path / "certs")
    srv = start(tmp_path, state, certs.dir, certs.ca.cert_pem)
    try:
        await wait_ready(srv)
        async with srv.session(limit=1) as client:
            async with client.get(srv.url("/readyz")) as resp:
                problems = (await resp.json())["problems"]
            async with client.get(srv.url("/metrics")) as resp:
                metrics = await resp.text()
    finally:
        stop(srv)
    assert any("kueue_installed and run_ai_enable cannot both be true" in p for p in problems), problems
    assert "webhook_settings_rejected 1.0" in metrics
    assert "kueue_installed and run_ai_enable cannot both be true" in srv.output()
    assert "Traceback" not in srv.output()
    assert srv.proc.returncode == 0


@contextlib.contextmanager
def readme_server(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    certs_dir = tmp_path / "certs"
    made = subprocess.run(
        [
            str(BIN / "scheduling-webhook"),
            "certs",
            "--out",
            str(certs_dir),
            "--hostname",
            "localhost",
            "--ip",
            LOOPBACK,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    assert {"ca.crt", "tls.crt", "tls.key"} <= {p.name for p in certs_dir.iterdir()}
    ca = certs_dir / "ca.crt"
    srv = start(tmp_path, copy_state(tmp_path), certs_dir, ca.read_bytes(), str(BIN / "scheduling-webhook"), "serve")
    try:
        yield srv, ca
    finally:
        stop(srv)


async def test_readme_flow_certs_then_serve_then_curl(tmp_path: Path) -> None:
    """`scheduling-webhook certs`, `scheduling-webhook serve`, then curl as the README shows."""
    with readme_server(tmp_path) as (srv, ca):
        review = pod_review(
            "churn", annotations={"scheduling.hopsworks.ai/affinity": "topology.kubernetes.io/zone=eu-1a"}
        )
        (tmp_path / "review.json").write_text(json.dumps(review))
        command = [
            "curl", "-s", "--fail-with-body", "--max-time", "5", "--cacert", str(ca),
            "--resolve", f"localhost:{srv.port}:127.0.0.1",
            "-H", "Content-Type: application/json", "--data", f"@{tmp_path / 'review.json'}",
            f"https://localhost:{srv.port}/mutate/pods",
        ]  # fmt: skip
        if shutil.which("curl") is None:
            pytest.skip("curl is not installed")
        deadline = time.monotonic() + 20
        while True:  # until the server listens
            done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=10)
            if done.returncode == 0 or time.monotonic() > deadline or srv.proc.poll() is not None:
                break
            await asyncio.sleep(0.1)
        assert done.returncode == 0, (done.returncode, done.stderr, srv.output())
    answer = json.loads(done.stdout)
    response = answer["response"]
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert response["uid"] == review["request"]["uid"] and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert response["auditAnnotations"] == {
        "affinity": "topology.kubernetes.io/zone=eu-1a",
        "anti-affinity": "maintenance=true",
        "priority-class": "hopsworks-normal",
        "runai-queue": "churn",
        "runai-preemptibility": "non-preemptible",  # examples/cluster: Run:ai on, churn bound
    }
    patched = apply_patch(review["request"]["object"], patch_of(answer))
    assert_valid_pod(patched)
    terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eu-1a"]} in terms["nodeSelectorTerms"][
        0
    ]["matchExpressions"]
    assert srv.proc.returncode == 0  # stopped by SIGTERM, cleanly
