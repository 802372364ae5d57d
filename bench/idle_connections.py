"""Memory held by idle TLS connections, and what the connection cap does about it.

`python -m bench.idle_connections [--connections 1800] [--cap 1024]`

Starts `scheduling-webhook serve --state ...` in its own process twice: once with the cap out
of reach, once with `--cap`. Each time it opens `--connections` TLS connections that finish the
handshake and then say nothing (what an idle keep-alive client or a slow attacker holds), and
reads the server's resident memory (VmRSS) before, while they are open, and after they are
closed. It also times /readyz on the probe port while the main port is full. Prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.run import terminate, wait_ready
from bench.workload import kueue_state, make_certs
from tests.support.https import free_port

LOOPBACK = "127.0.0.1"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def open_idle(port: int, ctx: ssl.SSLContext, n: int) -> tuple[list[asyncio.StreamWriter], int]:
    """Up to `n` connections with a finished handshake; how many the server refused."""
    writers: list[asyncio.StreamWriter] = []
    refused = 0
    for start in range(0, n, 100):
        batch = await asyncio.gather(
            *(asyncio.open_connection(LOOPBACK, port, ssl=ctx) for _ in range(start, min(n, start + 100))),
            return_exceptions=True,
        )
        for item in batch:
            if isinstance(item, BaseException):
                refused += 1
            else:
                writers.append(item[1])
    return writers, refused


async def still_open(writers: list[asyncio.StreamWriter]) -> int:
    await asyncio.sleep(0.5)
    return sum(1 for w in writers if not w.transport.is_closing() and not w.is_closing())


async def probe_ms(port: int, ctx: ssl.SSLContext) -> float:
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(LOOPBACK, port, ssl=ctx)
    writer.write(b"GET /readyz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
    await writer.drain()
    status = await reader.readline()
    writer.close()
    assert b" 200 " in status, status
    return (time.perf_counter() - started) * 1000


async def measure(pid: int, port: int, probe_port: int, ca: Path, n: int) -> dict[str, float]:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False
    before = rss_kib(pid)
    started = time.monotonic()
    writers, refused = await open_idle(port, ctx, n)
    opening_s = time.monotonic() - started
    held = rss_kib(pid)
    alive = await still_open(writers)
    probe = await probe_ms(probe_port, ctx)
    for w in writers:
        w.close()
    await asyncio.sleep(2.0)
    after = rss_kib(pid)
    return {
        "before": before,
        "held": held,
        "after": after,
        "accepted": len(writers),
        "open": alive,
        "refused": refused,
        "probe_ms": probe,
        "opening_s": opening_s,
    }


def run(cap: int, n: int, work: Path, certs: Path, state: Path) -> dict[str, float]:
    port, probe_port = free_port(), free_port()
    command = [sys.executable, "-m", "webhook", "serve", "--state", str(state), "--certs", str(certs)]
    command += ["--host", LOOPBACK, "--port", str(port), "--probe-port", str(probe_port)]
    env = {**os.environ, "WEBHOOK_DRAIN_SECONDS": "0", "WEBHOOK_MAX_CONNECTIONS": str(cap)}
    with (work / f"serve-{cap}.log").open("wb") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=log)
    try:
        try:
            wait_ready(proc, port, certs / "ca.crt")
        except RuntimeError:
            sys.stderr.write((work / f"serve-{cap}.log").read_text()[-3000:])
            raise
        return asyncio.run(measure(proc.pid, port, probe_port, certs / "ca.crt", n))
    finally:
        terminate(proc, within=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1800)
    parser.add_argument("--cap", type=int, default=None, help="default: the server's own default cap")
    args = parser.parse_args(argv)
    from webhook.http.listener import DEFAULT_MAX_CONNECTIONS

    cap = args.cap or DEFAULT_MAX_CONNECTIONS
    with contextlib.suppress(ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * args.connections + 256)), hard))
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        work = Path(tmp)
        certs = make_certs(work / "certs")
        state = kueue_state(work / "state")
        rows = [
            ("no cap", run(10**6, args.connections, work, certs, state)),
            (f"cap {cap}", run(cap, args.connections, work, certs, state)),
        ]
    print(f"{args.connections} idle TLS connections (handshake done, no request), server VmRSS in MiB:")
    print("(kB/conn: RSS growth over the connections accepted; 'open': still open when all were made,")
    print(" the rest closed by the header timeout while the others were being opened)")
    head = f"{'':<10} {'before':>7} {'held':>7} {'after':>7} {'kB/conn':>8} {'accepted':>9} {'open':>6}"
    print(f"{head} {'refused':>8} {'opening s':>10} {'probe ms':>9}")
    for name, r in rows:
        per = (r["held"] - r["before"]) * 1.024 / max(1, r["accepted"])
        print(
            f"{name:<10} {r['before'] / 1024:>7.1f} {r['held'] / 1024:>7.1f} {r['after'] / 1024:>7.1f} "
            f"{per:>8.0f} {r['accepted']:>9.0f} {r['open']:>6.0f} {r['refused']:>8.0f} {r['opening_s']:>10.1f} "
            f"{r['probe_ms']:>9.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
