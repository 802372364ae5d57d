"""`make bench`: the admission server against the bare aiohttp TLS stack, same load, same machine.

Every server runs in its own process and the load generator in another (so the generator never
shares the server's event loop); all servers are started first, then the scenarios take turns,
round after round, and the medians are reported: neighbours on a shared machine then disturb
every scenario alike. `--pin` puts the servers on CPU 0 and the generator on CPU 1.

  a  bare aiohttp TLS server: parse the review, answer "allowed"          (the stack's limit)
  b  `scheduling-webhook serve` /mutate/pods: ~9 KB pod, Kueue project: affinity, anti-affinity,
     priority, queue and topology injected
  c  `scheduling-webhook serve` /validate/pods: GPU notebook in a Run:ai-bound project
  c_view  only while (c) reports that it did not check the quota (`serve --state` has no Run:ai
     integration; that runs against an apiserver): the same /validate/pods with a Run:ai view put
     into the real runtime's snapshot (the pure quota path; no reservation write)

Loads: closed loop at 32 connections (throughput; latency there is mostly queueing, 32 / rate),
open loop at --rate over the same 32 connections (latency at a stated load, counted from when
each request was due), and closed loop at 1 and 8 connections.

Prints requests/s, p50 and p99 per scenario and connection count, the ratios b/a and c/a, the
servers' `webhook_remote_calls_total{path="request"}`, and writes bench/results/latest.json.
Then runs bench.scale (10,000 namespaces, 100,000 pods) in a fresh process unless --no-scale.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.loadgen import session, url
from bench.workload import (
    KUEUE_PROJECT,
    RUNAI_DESERVED_GPUS,
    RUNAI_PROJECT,
    kueue_state,
    make_certs,
    mutate_body,
    runai_state,
    validate_body,
)
from tests.support.https import free_port  # the loadgen already uses the tests' harness

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PYTHON = sys.executable
TARGET_RATIO = 0.5
TARGET_P99_MS = 10.0
# The targets, as ratios against (a) in the same run: throughput at least 0.8x, p99 at most 1.2x.
TARGET_THROUGHPUT_VS_A = 0.8
TARGET_P99_VS_A = 1.2
REMOTE_REQUEST = re.compile(r'^webhook_remote_calls_total\{[^}]*path="request"[^}]*\}\s+([0-9.e+]+)', re.M)


@dataclass
class Scenario:
    key: str
    title: str
    path: str
    body: bytes
    command: list[str]
    port: int
    notes: list[str] = field(default_factory=list)
    remote_calls_request: float = 0.0
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # phase -> one per round
    proc: subprocess.Popen[bytes] | None = None
    cwd: Path = ROOT  # another checkout's webhook package for --baseline


@dataclass(frozen=True)
class Phase:
    name: str
    connections: int
    seconds: float
    rate: float | None = None  # None: closed loop
    rounds: int = 1


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (0 where /proc is missing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def get(port: int, ca: Path, path: str) -> tuple[int, str]:
    async with session(ca, 1, timeout=5.0) as client, client.get(url(port, path)) as resp:
        return resp.status, await resp.text()


async def post(port: int, ca: Path, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    async with session(ca, 1, timeout=5.0) as client, client.post(url(port, path), data=body, headers=headers) as resp:
        return resp.status, await resp.json()


def wait_ready(proc: subprocess.Popen[bytes], port: int, ca: Path, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        with contextlib.suppress(Exception):
            status, _ = asyncio.run(get(port, ca, "/readyz"))
            if status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"server not ready within {within}s")


def pin(cpu: int | None) -> Any:
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def describe_answer(key: str, answer: dict[str, Any]) -> list[str]:
    """What the server actually did with the request: the bench must not measure a refusal."""
    response = answer.get("response") or {}
    notes: list[str] = []
    if key.startswith("b"):
        ops = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
        paths = sorted({op["path"] for op in ops})
        notes.append(f"allowed={response.get('allowed')}, {len(ops)} patch ops: {', '.join(paths)}")
        wanted = ("/spec/affinity", "/spec/priorityClassName", "/metadata/labels/kueue.x-k8s.io~1queue-name")
        missing = [w for w in wanted if w not in paths]
        if missing:
            notes.append(f"WARNING: expected injections missing: {missing}")
    elif key.startswith("c"):
        audit = response.get("auditAnnotations") or {}
        warnings = response.get("warnings") or []
        if "gpus-left" in audit:
            notes.append(f"quota checked: allowed={response.get('allowed')}, audit {audit}")
        else:
            notes.append(f"quota NOT checked: allowed={response.get('allowed')}, warnings {warnings}")
    return notes


def start(scenario: Scenario, workdir: Path, ca: Path, pin_cpus: bool) -> None:
    env = {**os.environ, "WEBHOOK_DRAIN_SECONDS": "0"}
    log = (workdir / f"{scenario.key}.log").open("wb")
    scenario.proc = subprocess.Popen(
        scenario.command, cwd=scenario.cwd, env=env, stdout=log, stderr=log, preexec_fn=pin(0 if pin_cpus else None)
    )
    log.close()  # the child holds its own descriptor
    wait_ready(scenario.proc, scenario.port, ca)
    status, answer = asyncio.run(post(scenario.port, ca, scenario.path, scenario.body))
    if status != 200:
        raise RuntimeError(f"{scenario.key}: {scenario.path} answered {status}: {answer}")
    scenario.notes.extend(describe_answer(scenario.key, answer))


def stop(scenario: Scenario, ca: Path) -> None:
    proc = scenario.proc
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(Exception):
        _, text = asyncio.run(get(scenario.port, ca, "/metrics"))
        scenario.remote_calls_request = sum(float(v) for v in REMOTE_REQUEST.findall(text))
    terminate(proc, within=30)


def terminate(proc: subprocess.Popen[bytes], within: float) -> None:
    """SIGTERM (the server drains and exits), SIGKILL if it has not exited `within` seconds."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def load(scenario: Scenario, phase: Phase, workdir: Path, ca: Path, warmup: float, pin_cpus: bool) -> dict[str, Any]:
    assert scenario.proc is not None
    body_file = workdir / f"{scenario.key}.json"
    body_file.write_bytes(scenario.body)
    command = [PYTHON, "-m", "bench.loadgen", "--port", str(scenario.port), "--path", scenario.path]
    command += ["--body", str(body_file), "--ca", str(ca), "--connections", str(phase.connections)]
    command += ["--seconds", str(phase.seconds), "--warmup", str(warmup)]
    if phase.rate is not None:
        command += ["--rate", str(phase.rate)]
    if pin_cpus:
        command += ["--cpu", "1"]
    cpu_before, began = cpu_seconds(scenario.proc.pid), time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, check=True)
    wall = time.monotonic() - began
    result: dict[str, Any] = json.loads(done.stdout)
    result.pop("sample", None)
    # Share of one core over the generator's whole life (start-up included, so a slight underestimate).
    cpu = cpu_seconds(scenario.proc.pid) - cpu_before
    result["server_cpu"] = cpu / wall
    # CPU per answer barely moves when neighbours steal time, unlike req/s: the steadier A/B figure.
    result["server_us_per_request"] = cpu / result["answered"] * 1e6 if result["answered"] else float("nan")
    return result


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of the rounds (the rounds interleave scenarios, so a noisy neighbour hits all alike)."""
    return {
        "rounds": len(rounds),
        "rps": median([r["rps"] for r in rounds]),
        "p50_ms": median([r["p50_ms"] for r in rounds]),
        "p90_ms": median([r.get("p90_ms", float("nan")) for r in rounds]),
        "p99_ms": median([r["p99_ms"] for r in rounds]),
        # The spread shows how much a busy neighbour moved the tail while this ran.
        "p99_ms_rounds": [min(r["p99_ms"] for r in rounds), max(r["p99_ms"] for r in rounds)],
        "max_ms": max(r["max_ms"] for r in rounds),
        "errors": sum(sum(r["errors"].values()) for r in rounds),
        "requests": sum(r["requests"] for r in rounds),
        "server_cpu": median([r["server_cpu"] for r in rounds]),
        "server_us_per_request": median([r["server_us_per_request"] for r in rounds]),
        "loadgen_cpu": median([r["loadgen_cpu"] for r in rounds]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per scenario per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds at the main concurrency")
    parser.add_argument("--connections", type=int, default=32, help="the main concurrency")
    parser.add_argument("--rate", type=float, default=1000.0, help="open-loop rate at the main concurrency (0: skip)")
    parser.add_argument("--extra", default="1,8", help="more connection counts, closed loop ('' for none)")
    parser.add_argument("--extra-seconds", type=float, default=2.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--only", default="", help="scenarios to run, e.g. 'a,b'")
    parser.add_argument("--pin", action="store_true", help="pin servers to CPU 0 and the generator to CPU 1")
    parser.add_argument("--no-scale", action="store_true", help="skip bench.scale")
    parser.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    parser.add_argument(
        "--baseline", type=Path, default=None, help="another checkout: also run its (b) as b_base, interleaved (A/B)"
    )
    args = parser.parse_args(argv)
    pin_cpus = args.pin and (os.cpu_count() or 1) >= 2
    main_phase = Phase("closed", args.connections, args.seconds, None, args.rounds)
    phases = [main_phase]
    if args.rate:
        phases.append(Phase(f"open {args.rate:g}/s", args.connections, args.seconds, args.rate, args.rounds))
    phases += [Phase("closed", int(c), args.extra_seconds) for c in args.extra.split(",") if c.strip()]
    wanted = set(filter(None, args.only.split(","))) or {"a", "b", "c", "c_view"}

    scenarios: dict[str, Scenario] = {}
    loadavg_at_start = os.getloadavg()  # the neighbours move timings: say how busy they were
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        certs = make_certs(work / "certs")
        ca = certs / "ca.crt"
        kueue = kueue_state(work / "state-kueue")
        runai = runai_state(work / "state-runai")

        def serve(state: Path, port: int) -> list[str]:
            host = ["--host", "127.0.0.1", "--port", str(port)]
            return [PYTHON, "-m", "webhook", "serve", "--state", str(state), "--certs", str(certs), *host]

        def bench_server(mode: str, port: int, *more: str) -> list[str]:
            return [PYTHON, "-m", "bench.server", mode, "--certs", str(certs), "--port", str(port), *more]

        try:
            for key, title, path, body, state in (
                ("a", "bare aiohttp TLS: parse + allow", "/bare", mutate_body(), None),
                ("b", f"serve /mutate/pods ({KUEUE_PROJECT}, Kueue on)", "/mutate/pods", mutate_body(), kueue),
                (
                    "c",
                    f"serve /validate/pods (GPU notebook, {RUNAI_PROJECT})",
                    "/validate/pods",
                    validate_body(),
                    runai,
                ),
            ):
                if key in wanted:
                    port = free_port()
                    command = bench_server("bare", port) if state is None else serve(state, port)
                    scenarios[key] = Scenario(key, title, path, body, command, port)
                    start(scenarios[key], work, ca, pin_cpus)
            if args.baseline is not None:
                port = free_port()
                title = f"(b) served by the webhook package in {args.baseline}"
                base = Scenario("b_base", title, "/mutate/pods", mutate_body(), serve(kueue, port), port)
                base.cwd = args.baseline.resolve()  # `python -m webhook` imports from its working directory
                scenarios["b_base"] = base
                start(base, work, ca, pin_cpus)
            c = scenarios.get("c")
            if "c_view" in wanted and (c is None or any("NOT checked" in n for n in c.notes)):
                port = free_port()
                more = ["--state", str(runai), "--namespace", RUNAI_PROJECT, "--deserved", str(RUNAI_DESERVED_GPUS)]
                title = "real runtime + Run:ai view in the snapshot: /validate/pods quota path"
                view = Scenario(
                    "c_view", title, "/validate/pods", validate_body(), bench_server("runai-view", port, *more), port
                )
                view.notes.append(
                    "`serve --state` wires no Run:ai integration (it runs only against an apiserver, where it "
                    "also writes GPU reservations), so (c) skips the quota check; this is the same quota decision "
                    "with a Run:ai view put into the snapshot, without the reservation write"
                )
                scenarios["c_view"] = view
                start(view, work, ca, pin_cpus)
            for key, s in scenarios.items():
                print(f"{key}: {s.title}")
                for note in s.notes:
                    print(f"    {note}")
            for phase in phases:
                for round_ in range(phase.rounds):
                    for key, s in scenarios.items():
                        result = load(s, phase, work, ca, args.warmup, pin_cpus)
                        s.results.setdefault(f"{phase.name} {phase.connections}", []).append(result)
                        print(
                            f"  [{phase.name} {phase.connections} conns, round {round_ + 1}] {key:<6} {line(result)}",
                            flush=True,
                        )
        finally:
            for s in scenarios.values():
                stop(s, ca)

    report = build_report(scenarios, main_phase, pin_cpus, args.rate, loadavg_at_start)
    print_report(report)
    if not args.no_scale:
        print("\nscale: python -m bench.scale", flush=True)
        done = subprocess.run([PYTHON, "-m", "bench.scale", "--json"], cwd=ROOT, capture_output=True, text=True)
        sys.stderr.write(done.stderr)
        if done.returncode == 0:
            report["scale"] = json.loads(done.stdout)
            from bench.scale import print_report as print_scale

            print_scale(report["scale"])
        else:
            report["scale"] = {"error": done.stderr[-2000:]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


def line(r: dict[str, Any]) -> str:
    errors = sum(r["errors"].values()) if isinstance(r["errors"], dict) else r["errors"]
    return (
        f"{r['rps']:7.0f} req/s  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms  errors {errors}  "
        f"server {r['server_us_per_request']:4.0f} µs CPU/req ({r['server_cpu']:.0%} of a core), "
        f"loadgen {r['loadgen_cpu']:.0%}"
    )


def build_report(
    scenarios: dict[str, Scenario], main: Phase, pinned: bool, rate: float, loadavg_at_start: tuple[float, ...]
) -> dict[str, Any]:
    main_key = f"{main.name} {main.connections}"
    open_key = f"open {rate:g}/s {main.connections}"
    ratios: dict[str, float] = {}
    p99_ratios: dict[str, float] = {}
    a = scenarios.get("a")
    for key in ("b", "b_base", "c", "c_view"):
        s = scenarios.get(key)
        if a is None or s is None:
            continue
        # Per round, then the median: rounds ran back to back, so each ratio shares its noise.
        pairs = list(zip(a.results.get(main_key, []), s.results.get(main_key, []), strict=False))
        ratios[f"{key}/a"] = median([r["rps"] / base["rps"] for base, r in pairs if base["rps"]])
        p99_ratios[f"{key}/a"] = median([r["p99_ms"] / base["p99_ms"] for base, r in pairs if base["p99_ms"]])
    targets: dict[str, Any] = {}
    for key in ("b", "c"):
        if f"{key}/a" in ratios:
            targets[f"{key}/a >= {TARGET_THROUGHPUT_VS_A} (throughput, closed loop)"] = (
                ratios[f"{key}/a"] >= TARGET_THROUGHPUT_VS_A
            )
            targets[f"p99({key})/p99(a) <= {TARGET_P99_VS_A} (closed loop)"] = p99_ratios[f"{key}/a"] <= TARGET_P99_VS_A
    b = scenarios.get("b")
    if b is not None:
        closed = summarise(b.results[main_key])
        targets["b/a >= 0.5 (throughput, closed loop)"] = ratios.get("b/a", 0.0) >= TARGET_RATIO
        targets[f"p99(b) <= 10 ms, {main.connections} connections, closed loop (saturated)"] = (
            closed["p99_ms"] <= TARGET_P99_MS
        )
        if open_key in b.results:
            targets[f"p99(b) <= 10 ms, {main.connections} connections, open loop {rate:g} req/s"] = (
                summarise(b.results[open_key])["p99_ms"] <= TARGET_P99_MS
            )
        targets["no remote call on the request path (b)"] = b.remote_calls_request == 0.0
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_at_start": loadavg_at_start,
            "loadavg_at_end": os.getloadavg(),
        },
        "placement": "server on CPU 0, load generator on CPU 1" if pinned else "separate processes, not pinned",
        "main": main_key,
        "scenarios": {
            k: {
                "title": s.title,
                "path": s.path,
                "body_bytes": len(s.body),
                "notes": s.notes,
                "remote_calls_request": s.remote_calls_request,
                "summary": {phase: summarise(rounds) for phase, rounds in s.results.items()},
                "rounds": s.results,
            }
            for k, s in scenarios.items()
        },
        "ratios": ratios,
        "p99_ratios": p99_ratios,
        "targets": targets,
    }


def print_report(report: dict[str, Any]) -> None:
    print(f"\nmedians over rounds ({report['placement']}; {report['machine']['cpus']} CPUs)")
    print(
        f"{'scenario':<8} {'load':<18} {'req/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
        f"{'p99 rounds':>12} {'errors':>6} {'µs/req':>7} {'remote':>6}"
    )
    for key, s in report["scenarios"].items():
        for phase, r in s["summary"].items():
            low, high = r["p99_ms_rounds"]
            spread = f"{low:.1f}–{high:.1f}" if r["rounds"] > 1 else ""
            print(
                f"{key:<8} {phase + ' conns':<18} {r['rps']:>8.0f} {r['p50_ms']:>8.2f} {r['p90_ms']:>8.2f} "
                f"{r['p99_ms']:>8.2f} {spread:>12} {r['errors']:>6} {r['server_us_per_request']:>7.0f} "
                f"{s['remote_calls_request']:>6.0f}"
            )
    print('remote = webhook_remote_calls_total{path="request"} read from /metrics after the run (a: no metrics)')
    for name, value in report["ratios"].items():
        p99 = report["p99_ratios"].get(name, float("nan"))
        print(
            f"{name} ({report['main']} conns): throughput {value:.2f} (target >= {TARGET_THROUGHPUT_VS_A}), "
            f"p99 {p99:.2f} (target <= {TARGET_P99_VS_A})"
        )
    start, end = report["machine"]["loadavg_at_start"], report["machine"]["loadavg_at_end"]
    print(f"load average (1, 5, 15 min): {' '.join(f'{v:.1f}' for v in start)} at the start, "
          f"{' '.join(f'{v:.1f}' for v in end)} at the end")  # fmt: skip
    for name, ok in report["targets"].items():
        print(f"target {name}: {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    raise SystemExit(main())
