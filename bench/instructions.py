"""`make bench-instructions`: CPU instructions per request, counted by valgrind's callgrind.

Timings on a shared 2-core machine move by 20-30% between runs; an instruction count barely moves
(about 1% here), so this is the figure to compare two versions of the code by. It is not a time:
it leaves out cache misses and the kernel, and memcpy counts more than it costs. Each server runs
under callgrind; after a warm-up the counters are zeroed, the load generator sends a fixed load
over 8 keep-alive TLS connections, and the counters are dumped. Instructions per request =
the difference between a long and a very short load, in instructions and in answers (so the load
generator's TLS handshakes cancel out), less what the server counts by the clock: it is counted
for a while without load too (`idle_per_second`) and taken off in proportion to the longer load's
extra time (`raw_per_request` keeps the figure without that). A `--state` server polls its folder
every second; under valgrind, at some 20 answers a second, that poll counted as a request's work
and made the figure depend on how busy the machine was.

  a  bare aiohttp TLS server: parse the review, answer "allowed"
  b  `scheduling-webhook serve` /mutate/pods (the bench's 9 KB pod, Kueue project)
  c  `scheduling-webhook serve` /validate/pods (GPU notebook, Run:ai project)
  b_base  with --baseline DIR: (b) served by DIR's webhook package, for before/after

Needs valgrind (`apt-get install valgrind`); takes about a minute per scenario. Exits 1 when
b/a or c/a is above the budget (`--budget`, default BUDGET: 1.15), so `make bench`
fails when a change makes a review costlier than that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.run import PYTHON, RESULTS, ROOT, free_port, post, terminate, wait_ready
from bench.workload import kueue_state, make_certs, mutate_body, runai_state, validate_body

TOTALS = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.M)
# A review may cost at most this many times what the bare aiohttp TLS server's does.
BUDGET = 1.15
GUARDED = ("b/a", "c/a")
# The short load: its 8 handshakes and a few answers. A fixed short time, not a fraction of the
# long load: on a busy machine a fraction could answer fewer requests than the short load did.
SHORT_LOAD_S = 0.2


def dump_count(pid: int, out_dir: Path) -> int:
    """Ask callgrind for a dump and read the instructions counted since the last zeroing."""
    before = set(out_dir.glob("cg.out.*"))
    subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for new in set(out_dir.glob("cg.out.*")) - before:
            found = TOTALS.search(new.read_bytes())
            if found:
                return int(found.group(1))
        time.sleep(0.1)
    raise RuntimeError(f"callgrind wrote no dump in {out_dir}")


def check_answer(key: str, port: int, ca: Path, path: str, body: bytes) -> None:
    """The count must be of the work the scenario names: an allowed review, patched for (b)."""
    if key == "a":
        return
    status, answer = asyncio.run(post(port, ca, path, body))
    response = answer.get("response") or {}
    if status != 200 or not response.get("allowed") or (key.startswith("b") and "patch" not in response):
        raise RuntimeError(f"{key}: the review is not answered as the scenario says: {status} {response}")


def loadgen(port: int, path: str, body_file: Path, ca: Path, seconds: float, warmup: float) -> dict[str, Any]:
    command = [PYTHON, "-m", "bench.loadgen", "--port", str(port), "--path", path, "--body", str(body_file)]
    command += ["--ca", str(ca), "--connections", "8", "--seconds", str(seconds), "--warmup", str(warmup)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, check=True)
    return json.loads(done.stdout)


def measure(
    key: str, server: list[str], cwd: Path, path: str, body: bytes, ca: Path, work: Path, seconds: float
) -> dict[str, Any]:
    out_dir = work / f"callgrind-{key}"
    out_dir.mkdir()
    body_file = work / f"{key}.json"
    body_file.write_bytes(body)
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_dir}/cg.out", "--dump-instr=no"]
    log = (work / f"{key}.log").open("wb")
    proc = subprocess.Popen(valgrind + server, cwd=cwd, stdout=log, stderr=log)
    log.close()
    try:
        port = int(server[server.index("--port") + 1])
        wait_ready(proc, port, ca, within=900.0)  # valgrind on a busy machine starts slowly
        check_answer(key, port, ca, path, body)
        loadgen(port, path, body_file, ca, seconds=2.0, warmup=1.0)  # imports, caches, connections
        # Two loads, each from a new generator (8 TLS handshakes): the difference of their counts
        # is requests only, the handshakes cancel out. The first is as short as it can be, so the
        # difference in answers is large even when a busy machine slows the second one down.
        counts = []
        for length in (SHORT_LOAD_S, seconds):
            subprocess.run(["callgrind_control", "--zero", str(proc.pid)], check=True, capture_output=True)
            started = time.monotonic()
            result = loadgen(port, path, body_file, ca, seconds=length, warmup=0.0)
            if (length == seconds and not result["answered"]) or result["errors"]:
                raise RuntimeError(f"{key}: {result['answered']} answered, errors {result['errors']}")
            counts.append((int(result["answered"]), dump_count(proc.pid, out_dir), time.monotonic() - started))
        # What the server does by the clock (a folder polled every second, timers) is counted
        # without load too, and taken off in proportion to the time: under valgrind a server
        # answers some 20 requests a second, so a poll each second would count as a request's.
        subprocess.run(["callgrind_control", "--zero", str(proc.pid)], check=True, capture_output=True)
        started = time.monotonic()
        time.sleep(seconds)
        idle_ir = dump_count(proc.pid, out_dir)
        idle_rate = idle_ir / (time.monotonic() - started)
    finally:
        terminate(proc, within=120)  # valgrind makes the drain slow
    (short_n, short_ir, short_s), (long_n, long_ir, long_s) = counts
    answered = long_n - short_n
    instructions = long_ir - short_ir
    by_clock = idle_rate * (long_s - short_s)
    return {
        "answered": answered,
        "instructions": instructions,
        "idle_per_second": idle_rate,
        "raw_per_request": instructions / answered,
        "per_request": (instructions - by_clock) / answered,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per scenario")
    parser.add_argument("--only", default="", help="scenarios to run, e.g. 'a,b'")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout: also count its (b)")
    parser.add_argument("--out", type=Path, default=RESULTS / "instructions.json")
    parser.add_argument("--budget", type=float, default=BUDGET, help="largest b/a and c/a allowed (exit 1 above)")
    parser.add_argument(
        "--keep", type=Path, default=None, help="copy each scenario's callgrind dumps here (for callgrind_annotate)"
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed: apt-get install valgrind", file=sys.stderr)
        return 2
    wanted = set(filter(None, args.only.split(","))) or {"a", "b", "c"}
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ir-") as tmp:
        work = Path(tmp)
        certs = make_certs(work / "certs")
        ca = certs / "ca.crt"
        kueue, runai = kueue_state(work / "state-kueue"), runai_state(work / "state-runai")

        def serve(state: Path) -> list[str]:
            host = ["--host", "127.0.0.1", "--port", str(free_port())]
            return [PYTHON, "-m", "webhook", "serve", "--state", str(state), "--certs", str(certs), *host]

        bare = [PYTHON, "-m", "bench.server", "bare", "--certs", str(certs), "--port", str(free_port())]
        scenarios = [
            ("a", bare, ROOT, "/bare", mutate_body()),
            ("b", serve(kueue), ROOT, "/mutate/pods", mutate_body()),
            ("c", serve(runai), ROOT, "/validate/pods", validate_body()),
        ]
        if args.baseline is not None:
            scenarios.append(("b_base", serve(kueue), args.baseline.resolve(), "/mutate/pods", mutate_body()))
            wanted.add("b_base")
        for key, command, cwd, path, body in scenarios:
            if key not in wanted:
                continue
            r = results[key] = measure(key, command, cwd, path, body, ca, work, args.seconds)
            if args.keep is not None:
                shutil.copytree(work / f"callgrind-{key}", args.keep / key, dirs_exist_ok=True)
            print(
                f"{key:7s} {r['per_request']:>12,.0f} instructions/request ({r['answered']} requests; "
                f"{r['raw_per_request']:,.0f} before taking off {r['idle_per_second']:,.0f}/s counted idle)"
            )
    per_request = {k: r["per_request"] for k, r in results.items()}
    ratios = {f"{k}/a": v / per_request["a"] for k, v in per_request.items() if k != "a" and "a" in per_request}
    if "b" in results and "b_base" in results:
        ratios["b/b_base"] = per_request["b"] / per_request["b_base"]
    over = []
    for name, value in ratios.items():
        verdict = ""
        if name in GUARDED:
            verdict = f"  (budget {args.budget:.2f}: {'OVER' if value > args.budget else 'ok'})"
            if value > args.budget:
                over.append(name)
        print(f"{name}: {value:.3f}{verdict}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"per_request": results, "ratios": ratios, "budget": args.budget}, indent=2) + "\n")
    print(f"wrote {args.out}")
    if over:
        print(f"over the instruction budget of {args.budget:.2f}x (a): {', '.join(over)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
