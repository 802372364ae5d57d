"""Servers the benchmark runs in their own process (`python -m bench.server MODE ...`).

`bare`: the stack's limit: aiohttp over the product's TLS settings, one route that parses the
AdmissionReview JSON and answers "allowed" with the uid echoed. No decision, no metrics, no
access log.

`runai-view`: the real `serve` wiring (webhook.runtime.Runtime, same app, same TLS, same logging)
with a Run:ai view of the bound project put into the snapshot after start: the pure quota path
that /validate/pods takes once the Run:ai integration has refreshed its projects. Used only while
the server's own wiring has no Run:ai view (see bench.run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from aiohttp import web

from webhook.admission import dumps, loads
from webhook.tls.watcher import make_server_ssl_context


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def bare(certs: Path, host: str, port: int) -> None:
    async def allow(request: web.Request) -> web.Response:
        review = loads(await request.read())
        answer = {
            "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True},
        }
        return web.Response(body=dumps(answer), content_type="application/json")

    async def ready(_: web.Request) -> web.Response:
        return web.json_response({"ready": True})

    app = web.Application(client_max_size=4 * 1024 * 1024)
    app.router.add_post("/bare", allow)
    app.router.add_get("/readyz", ready)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    ctx = make_server_ssl_context(certs / "tls.crt", certs / "tls.key")
    await web.TCPSite(runner, host, port, ssl_context=ctx).start()
    try:
        await _wait_for_signal()
    finally:
        await runner.cleanup()


async def runai_view(certs: Path, state: Path, host: str, port: int, namespace: str, deserved: float) -> None:
    from webhook.runtime import Runtime, ServeOptions
    from webhook.snapshot import RunaiProjectInfo

    options = ServeOptions(host=host, port=port, certs=certs, state_dir=state, drain_seconds=0.0, linger_seconds=0.0)
    runtime = Runtime(options)
    await runtime.start()
    snapshot = runtime.state.snapshot()
    if snapshot.runai_projects is None:
        snapshot.runai_projects = {
            namespace: RunaiProjectInfo(id="1", name=namespace, namespace=namespace, deserved_gpus=deserved)
        }
    try:
        await _wait_for_signal()
    finally:
        await runtime.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.server")
    parser.add_argument("mode", choices=["bare", "runai-view"])
    parser.add_argument("--certs", type=Path, required=True)
    parser.add_argument("--state", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--namespace", default="vision")
    parser.add_argument("--deserved", type=float, default=8.0)
    parser.add_argument("--cpu", type=int, default=None)
    args = parser.parse_args(argv)
    # The same logging set-up as `scheduling-webhook serve` (webhook.cli), so costs compare.
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    if args.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    with contextlib.suppress(KeyboardInterrupt):
        if args.mode == "bare":
            asyncio.run(bare(args.certs, args.host, args.port))
        else:
            asyncio.run(runai_view(args.certs, args.state, args.host, args.port, args.namespace, args.deserved))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
