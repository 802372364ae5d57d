"""How long a fresh client waits for its review while an attacker holds connections, and the
memory the server holds meanwhile.

`python -m bench.connection_attacks [--connections 1800] [--tries 20] [--kinds K,K] [--baseline DIR]`

Starts `scheduling-webhook serve --state ...` (default cap, 1,024) in its own process. An attacker,
in a process of its own, keeps `--connections` connections of one kind, dialling again one second
after the server closes one:

- `silent`: the TLS handshake done, then nothing;
- `no hello`: TCP only, the TLS handshake never started;
- `slow body`: a POST head announcing 4 MB, then one byte of body every 5 s;
- `unread`: a socket with a 4 KiB receive buffer pipelines 300 `GET /metrics` (about 15 KB of
  answer each), then never reads a byte;
- `unread 4`: the same with 4 requests, as deep as the server lets a connection pipeline
  (`WEBHOOK_MAX_PIPELINED`), so that the answers, not the pipeline, are what is held.

While each attack runs (after a warm-up), a fresh client makes `--tries` reviews one after the
other, each on a new TLS connection (`POST /mutate/pods`, Connection: close), and the bench
records how long each took, how many were answered within 1 s and how many failed (reset,
refused, or no answer within 10 s), and the server's resident memory (VmRSS, the highest of a
sample after each review). `--baseline DIR` runs the same against the webhook package
of another checkout, in the same run. Prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.idle_connections import rss_kib
from bench.run import ROOT, terminate, wait_ready
from bench.workload import kueue_state, make_certs, mutate_body
from tests.support.https import free_port

LOOPBACK = "127.0.0.1"
KINDS = ("silent", "no hello", "slow body", "unread", "unread 4")
WARM_UP_S = 8.0
TRY_TIMEOUT_S = 10.0
# What the chart's requirement counts: a review answered within this long.
PROMPT_S = 1.0
UNREAD_RCVBUF = 4096
# How many `GET /metrics` each unread attack pipelines.
UNREAD_DEPTH = {"unread": 300, "unread 4": 4}
TCP_ESTABLISHED = 1


def client_context(ca: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False
    return ctx


def slow_head(port: int) -> bytes:
    return (
        f"POST /mutate/pods HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\nContent-Type: application/json\r\n"
        "Content-Length: 4000000\r\n\r\n{"
    ).encode()


# -- the attacker (a process of its own) -------------------------------------------------------------


async def hold_unread(depth: int, port: int, ctx: ssl.SSLContext, dials: list[int]) -> None:
    """Pipeline `depth` requests on a socket with a small receive buffer and never read: the
    answers pile up on the server's side until it closes the connection."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UNREAD_RCVBUF)
    sock.setblocking(False)
    writer = None
    try:
        await asyncio.get_running_loop().sock_connect(sock, (LOOPBACK, port))
        _, writer = await asyncio.open_connection(sock=sock, ssl=ctx, server_hostname=LOOPBACK)
        dials[0] += 1
        # Stop reading below TLS too: the kernel's small receive buffer fills and stays full.
        writer.transport.pause_reading()
        inner = getattr(getattr(writer.transport, "_ssl_protocol", None), "_transport", None)
        if inner is not None:
            inner.pause_reading()
        request = f"GET /metrics HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\n\r\n".encode()
        writer.write(request * depth)
        # Held until the server closes it: its TCP state leaves ESTABLISHED (a read would drain it).
        while True:  # a poll of the kernel's state: nothing else tells this side of a close
            if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != TCP_ESTABLISHED:
                break
            await asyncio.sleep(1.0)
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
        pass
    finally:
        if writer is not None:
            writer.transport.abort()
        sock.close()


async def hold_one(kind: str, port: int, ctx: ssl.SSLContext, dials: list[int]) -> None:
    while True:
        if kind in UNREAD_DEPTH:
            await hold_unread(UNREAD_DEPTH[kind], port, ctx, dials)
            await asyncio.sleep(1.0)
            continue
        writer = None
        try:
            reader, writer = await asyncio.open_connection(LOOPBACK, port, ssl=None if kind == "no hello" else ctx)
            dials[0] += 1
            if kind == "slow body":
                writer.write(slow_head(port))
            while True:
                try:
                    if not await asyncio.wait_for(reader.read(4096), 5.0):
                        break  # closed by the server
                except TimeoutError:
                    if kind == "slow body":
                        writer.write(b" ")
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        finally:
            if writer is not None:
                writer.transport.abort()
        await asyncio.sleep(1.0)


async def attack(kind: str, port: int, ca: Path, connections: int) -> None:
    ctx = client_context(ca)
    dials = [0]
    tasks = []
    for start in range(0, connections, 100):  # in batches, as fast as the handshakes allow
        tasks += [asyncio.create_task(hold_one(kind, port, ctx, dials)) for _ in range(start, start + 100)]
        await asyncio.sleep(0.05)
    while True:
        await asyncio.sleep(1.0)
        print(f"dials {dials[0]}", flush=True)


# -- the fresh client and the measurement ------------------------------------------------------------


async def one_review(port: int, ctx: ssl.SSLContext, body: bytes) -> float | None:
    """Milliseconds for a review on a new connection, or None when it failed."""
    started = time.perf_counter()
    writer = None
    try:
        async with asyncio.timeout(TRY_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(LOOPBACK, port, ssl=ctx)
            head = (
                f"POST /mutate/pods HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
            status = await reader.readline()
            await reader.read()  # the answer, to its end
        if b" 200 " not in status:
            return None
        return (time.perf_counter() - started) * 1000
    except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError):
        return None
    finally:
        if writer is not None:
            writer.transport.abort()


async def fresh_client(port: int, ca: Path, tries: int, pid: int) -> tuple[list[float | None], int]:
    """The reviews' times, and the server's highest VmRSS (KiB) sampled after each."""
    ctx = client_context(ca)
    body = mutate_body()
    results = []
    held = rss_kib(pid)
    for _ in range(tries):
        results.append(await one_review(port, ctx, body))
        held = max(held, rss_kib(pid))
        await asyncio.sleep(0.2)
    return results, held


def measure(
    kind: str | None, proc: subprocess.Popen[bytes], port: int, ca: Path, args: argparse.Namespace
) -> dict[str, float]:
    attacker = None
    if kind is not None:
        command = [sys.executable, "-m", "bench.connection_attacks", "--attacker", kind, "--port", str(port)]
        command += ["--ca", str(ca), "--connections", str(args.connections)]
        attacker = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        time.sleep(WARM_UP_S)
    try:
        results, held = asyncio.run(fresh_client(port, ca, args.tries, proc.pid))
    finally:
        if attacker is not None:
            attacker.kill()
            output = attacker.communicate()[0].decode().split()
    answered = [r for r in results if r is not None]
    row = {
        "held_mib": held / 1024,
        "failed": float(len(results) - len(answered)),
        "prompt": float(sum(1 for r in answered if r <= PROMPT_S * 1000)),
        "tries": float(len(results)),
        "median_ms": statistics.median(answered) if answered else float("nan"),
        "max_ms": max(answered) if answered else float("nan"),
        "dials": float(output[-1]) if attacker is not None and output else 0.0,
    }
    return row


def run_server(
    cwd: Path, work: Path, certs: Path, state: Path, args: argparse.Namespace
) -> list[tuple[str, dict[str, float]]]:
    port, probe_port = free_port(), free_port()
    command = [sys.executable, "-m", "webhook", "serve", "--state", str(state), "--certs", str(certs)]
    command += ["--host", LOOPBACK, "--port", str(port), "--probe-port", str(probe_port)]
    env = {**os.environ, "WEBHOOK_DRAIN_SECONDS": "0"}
    log_path = work / f"serve-{cwd.name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=log, cwd=cwd)
    rows = []
    try:
        wait_ready(proc, port, certs / "ca.crt")
        for kind in (None, *args.kinds):
            rows.append((kind or "no attack", measure(kind, proc, port, certs / "ca.crt", args)))
            time.sleep(2.0)  # the attacker's connections time out and go
    finally:
        terminate(proc, within=30)
    return rows


def raise_nofile(connections: int) -> None:
    with contextlib.suppress(ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * connections + 256)), hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1800)
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"comma-separated attacks among {', '.join(KINDS)} (default all)"
    )
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout, run the same way")
    parser.add_argument("--attacker", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ca", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if unknown := [k for k in args.kinds if k not in KINDS]:
        parser.error(f"unknown attack {unknown[0]!r}; choose among {', '.join(KINDS)}")
    raise_nofile(args.connections)
    if args.attacker is not None:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(attack(args.attacker, args.port, args.ca, args.connections))
        return 0
    servers = [("this checkout", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    with tempfile.TemporaryDirectory(prefix="bench-attacks-") as tmp:
        work = Path(tmp)
        certs = make_certs(work / "certs")
        state = kueue_state(work / "state")
        results = [(name, run_server(cwd, work, certs, state, args)) for name, cwd in servers]
    load = os.getloadavg()[0]
    print(f"A fresh client's reviews (new TLS connection each) while an attacker holds {args.connections}")
    print(f"connections of one kind against the default cap; load average {load:.1f} at the end.")
    print(
        f"{'server':<14} {'attack':<10} {'answered':>9} {'within 1 s':>10} {'median ms':>10} {'max ms':>8} "
        f"{'VmRSS MiB':>10} {'dials':>7}"
    )
    for name, rows in results:
        for kind, r in rows:
            answered = f"{r['tries'] - r['failed']:.0f}/{r['tries']:.0f}"
            prompt = f"{r['prompt']:.0f}/{r['tries']:.0f}"
            print(
                f"{name:<14} {kind:<10} {answered:>9} {prompt:>10} {r['median_ms']:>10.1f} {r['max_ms']:>8.1f} "
                f"{r['held_mib']:>10.1f} {r['dials']:>7.0f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
