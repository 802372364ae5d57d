"""The command line says what went wrong in one line, never with a traceback, and exits by outcome."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.support.apps import cache_app
from tests.support.https import LOOPBACK, SERVICE_HOST, StartHttpsServer, make_cert_files
from webhook.cli import EXIT_PIPE_CLOSED
from webhook.state.folder import load_into
from webhook.state.store import ClusterState

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "cluster"
REFUSED = ROOT / "examples" / "requests" / "refused-priority.json"


def run_cli(*argv: str, env: dict[str, str] | None = None, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env or dict(os.environ),
        **kw,  # type: ignore[arg-type]
    )


def one_line_error(result: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for part in parts:
        assert part in result.stderr, result.stderr


def test_serve_without_state_or_kubeconfig_says_what_to_pass(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    certs = make_cert_files(tmp_path / "certs")
    result = run_cli("serve", "--certs", str(certs.dir), "--host", LOOPBACK, "--port", "0", env=env)
    one_line_error(result, "no cluster to read", "--state DIR", "--kubeconfig FILE")


def test_serve_on_a_port_in_use_says_so(tmp_path: Path) -> None:
    certs = make_cert_files(tmp_path / "certs")
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            "serve", "--state", str(CLUSTER), "--certs", str(certs.dir), "--host", LOOPBACK, "--port", str(port)
        )
    one_line_error(result, "address already in use", "PORT=")


def test_an_unknown_log_level_lists_the_known_ones() -> None:
    result = run_cli("--log-level", "verbose", "review", str(REFUSED), "--state", str(CLUSTER))
    one_line_error(result, "invalid choice: 'VERBOSE'", "DEBUG")
    lower = run_cli("--log-level", "debug", "review", str(REFUSED), "--state", str(CLUSTER))
    assert lower.returncode == 1, lower.stderr  # accepted in any case; the request is a refusal


def test_help_shows_the_defaults() -> None:
    wide = {**os.environ, "COLUMNS": "250"}  # argparse wraps at the terminal width
    serve = run_cli("serve", "--help", env=wide)
    assert serve.returncode == 0
    assert "(default: 8443)" in serve.stdout and "(default: certs/dev)" in serve.stdout
    admin = run_cli("admin", "move-project", "--help", env=wide)
    assert "--kubeconfig" in admin.stdout and "--token" not in admin.stdout
    certs = run_cli("certs", "--help", env=wide)
    assert "(default: certs/cluster)" in certs.stdout


def test_review_reads_stdin() -> None:
    result = run_cli("review", "-", "--state", str(CLUSTER), input=REFUSED.read_text())
    assert result.returncode == 1, result.stderr
    assert "decision: REFUSED" in result.stdout and "allowed: hopsworks-low, hopsworks-normal" in result.stdout


def test_review_into_a_closed_pipe_exits_apart_from_a_refusal() -> None:
    read_end, write_end = os.pipe()
    state = ["--state", str(CLUSTER)]
    os.close(read_end)  # the reader is gone before the first byte is written, as after `| head -0`
    try:
        done = subprocess.run(
            [sys.executable, "-m", "webhook", "review", str(ROOT / "examples/requests/notebook-zone.json"), *state],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == EXIT_PIPE_CLOSED != 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


async def test_the_admin_api_of_folder_mode_says_it_needs_cluster_mode(https_server: StartHttpsServer) -> None:
    state = ClusterState("hopsworks")
    load_into(state, CLUSTER)
    from webhook.http.app import cluster_mode_only_routes
    from webhook.local_mode import folder_mode_routes

    # The routes `serve --state` has: the folder mode's own APIs, then the catch-all for the rest.
    routes = [*folder_mode_routes(state, CLUSTER, LOOPBACK), *cluster_mode_only_routes()]
    srv = await https_server(cache_app(state, routes=routes))
    async with srv.session.post(srv.url("/api/v1/admin/projects/churn/move"), json={"department": "x"}) as resp:
        assert resp.status == 404 and "needs cluster mode" in (await resp.json())["error"]
    local = {"Host": f"localhost:{srv.port}"}  # folder mode's own routes answer only a loopback Host
    async with srv.session.get(srv.url("/api/v1/projects/churn/scheduling"), headers=local) as resp:
        assert resp.status == 200  # what folder mode does serve is not shadowed by the catch-all


async def test_folder_mode_answers_only_a_loopback_host_and_sends_no_hsts(https_server: StartHttpsServer) -> None:
    # Only loopback Host names are answered: otherwise a page re-pointing its own name at 127.0.0.1
    # (DNS rebinding) could read the folder's projects through a browser on this machine.
    state = ClusterState("hopsworks")
    load_into(state, CLUSTER)
    from webhook.local_mode import folder_mode_routes

    srv = await https_server(cache_app(state, routes=folder_mode_routes(state, CLUSTER, LOOPBACK)))
    for path in ("/api/v1/projects/churn/scheduling", "/ui/", "/api/v1/admin/runai"):
        for host in ("rebound.example.com", f"rebound.example.com:{srv.port}", SERVICE_HOST, ""):
            async with srv.session.get(srv.url(path), headers={"Host": host}) as resp:
                assert resp.status == 421, (path, host)
                assert (await resp.json())["code"] == "NotLoopbackHost"
        for host in (f"localhost:{srv.port}", "127.0.0.1", f"[::1]:{srv.port}", "LOCALHOST"):
            async with srv.session.get(srv.url(path), headers={"Host": host}) as resp:
                assert resp.status == 200, (path, host, await resp.text())
                assert "Strict-Transport-Security" not in resp.headers  # per host, not port: not on localhost
