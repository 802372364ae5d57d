"""Closed-loop keep-alive HTTPS load generator, run as its own process (`python -m bench.loadgen`).

N workers share an aiohttp connector limited to N connections, so each worker holds one
keep-alive TLS connection, as the kube-apiserver does towards a webhook. The client trusts only
the bench CA and verifies the Service name (resolved to 127.0.0.1 without DNS). Every worker
sends the same pre-serialised body as soon as its previous answer has been read; latency is the
time from send to the last byte of the answer. Results go to stdout as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.workload import LOOPBACK, SERVICE_HOST
from tests.support.https import StaticResolver  # the tests' harness: no DNS, no check_hostname=False


def client_context(ca_file: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_file))  # CERT_REQUIRED + check_hostname
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def session(ca_file: Path, connections: int, timeout: float = 10.0) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        ssl=client_context(ca_file),
        resolver=StaticResolver({SERVICE_HOST: LOOPBACK}),
        limit=connections,
        keepalive_timeout=60.0,
    )
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout))


def url(port: int, path: str) -> str:
    return f"https://{SERVICE_HOST}:{port}{path}"


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


async def run_load(
    port: int,
    path: str,
    body: bytes,
    ca_file: Path,
    connections: int,
    seconds: float,
    warmup: float,
    rate: float | None = None,
) -> dict[str, Any]:
    """Closed loop (each worker sends again as soon as it has its answer) or, with `rate`, open
    loop: request k is due at start + k/rate, spread round-robin over the workers, and its latency
    counts from when it was due, so a slow answer also charges the requests queued behind it
    (no coordinated omission)."""
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    errors: dict[str, int] = {}
    sample: dict[str, Any] = {}
    answered = [0]  # every answer, warm-up included: the server's CPU per request divides by this
    target = url(port, path)
    async with session(ca_file, connections) as client:
        # Open every connection (and warm both sides) before the clock starts.
        began = time.perf_counter()
        start_measuring = began + warmup
        stop = start_measuring + seconds

        async def worker(index: int) -> None:
            perf = time.perf_counter
            k = 0
            while True:
                if rate is None:
                    sent = perf()
                else:
                    sent = began + (k * connections + index) / rate
                    k += 1
                    if sent < stop and sent > perf():
                        await asyncio.sleep(sent - perf())
                if sent >= stop:
                    return
                try:
                    async with client.post(target, data=body, headers=headers) as resp:
                        data = await resp.read()
                        status = resp.status
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    continue
                done = perf()
                answered[0] += 1
                if status != 200:
                    errors[f"http {status}"] = errors.get(f"http {status}", 0) + 1
                elif not sample:
                    sample.update(json.loads(data))
                if sent >= start_measuring:
                    latencies.append(done - sent)

        cpu_began = time.process_time()
        await asyncio.gather(*(worker(i) for i in range(connections)))
        cpu = time.process_time() - cpu_began
        wall = time.perf_counter() - began
    latencies.sort()
    count = len(latencies)
    return {
        "connections": connections,
        "mode": "closed" if rate is None else f"open {rate:g}/s",
        "seconds": seconds,
        "requests": count,
        "answered": answered[0],
        "rps": count / seconds,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p90_ms": percentile(latencies, 0.90) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "p999_ms": percentile(latencies, 0.999) * 1000,
        "max_ms": (latencies[-1] * 1000) if latencies else float("nan"),
        "errors": errors,
        "loadgen_cpu": cpu / wall if wall else 0.0,  # share of one core the generator used
        "body_bytes": len(body),
        "sample": sample,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--body", type=Path, required=True, help="file with the request body")
    parser.add_argument("--ca", type=Path, required=True)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=None, help="open loop at this many requests/s")
    parser.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU")
    args = parser.parse_args(argv)
    if args.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    result = asyncio.run(
        run_load(
            args.port,
            args.path,
            args.body.read_bytes(),
            args.ca,
            args.connections,
            args.seconds,
            args.warmup,
            args.rate,
        )
    )
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
