"""How soon the other replica refuses a signed-out console session.

`python -m bench.console_signout [--rounds 30]`

Two real Runtimes (`serve` against the Kubernetes emulator, one session key file, one sign-out
ConfigMap both watch), as the Deployment's two replicas. Each round signs in on replica a, checks
the cookie on b, signs out on a, then polls b with a copy of the cookie until b refuses it. Prints
the time from a's sign-out answer to b's first refusal, and the apiserver calls a sign-out and a
page cost.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from tests.support.cluster import namespace
from tests.support.https import SERVICE_HOST, StaticResolver, client_ssl_context
from tests.support.kube_emulator import KubeEmulator
from tests.support.runtime import TOKEN, base_url, start_runtime
from webhook.console.keys import format_keys, new_key
from webhook.console.session import COOKIE
from webhook.tls.issuing import make_ca

USER_TOKEN, FRESH_TOKEN = "bench-root-token", "bench-fresh-token"


async def measure(rounds: int) -> None:
    async with KubeEmulator(token=TOKEN) as emu:
        emu.create_object(namespace("hopsworks", project=False))
        emu.create_object(namespace("churn"))
        emu.add_user(USER_TOKEN, "root", groups=["system:masters"])
        emu.add_user(FRESH_TOKEN, "fresh", groups=["system:masters"])  # for the calls, with empty caches
        emu.allow("group:system:masters")
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            keys = tmp / "session-keys"
            keys.write_text(format_keys([new_key(0)]))
            ca = make_ca(days=1)
            replicas = [await start_runtime(tmp / n, emu, ca=ca, console_keys=keys) for n in ("a", "b")]
            connector = aiohttp.TCPConnector(
                ssl=client_ssl_context(ca.cert_pem), resolver=StaticResolver({SERVICE_HOST: "127.0.0.1"})
            )
            lags: list[float] = []
            try:
                async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as http:
                    a, b = (base_url(options) for _, options, _ in replicas)
                    for base in (a, b):
                        await ready(http, base)
                    for _ in range(rounds):
                        lags.append(await one_round(http, a, b))
                    before = len(emu.requests)
                    cookie, csrf = await sign_in(http, a, FRESH_TOKEN)
                    sign_in_calls = len(emu.requests) - before  # the index page's SAR included
                    before = len(emu.requests)
                    await page(http, b, cookie)
                    first_page_calls = len(emu.requests) - before
                    before = len(emu.requests)
                    for _ in range(10):
                        await page(http, b, cookie)
                    page_calls = (len(emu.requests) - before) / 10
                    before = len(emu.requests)
                    await sign_out(http, a, cookie, csrf)
                    sign_out_calls = len(emu.requests) - before
            finally:
                for runtime, _, _ in replicas:
                    await runtime.shutdown()
    ms = sorted(x * 1000 for x in lags)
    print(f"sign-out seen by the other replica, {rounds} rounds: median {statistics.median(ms):.1f} ms, "
          f"p90 {ms[int(len(ms) * 0.9) - 1]:.1f} ms, max {ms[-1]:.1f} ms")  # fmt: skip
    print(f"apiserver calls: sign-in and the first page on a {sign_in_calls}, the first page on b "
          f"{first_page_calls}, then {page_calls:.1f} a page on average (10 in a row), "
          f"sign-out {sign_out_calls}")  # fmt: skip


async def ready(http: aiohttp.ClientSession, base: str) -> None:
    """Until /readyz says 200 (it waits for the sign-out list too)."""
    for _ in range(500):
        async with http.get(base + "/readyz") as resp:
            if resp.status == 200:
                return
        await asyncio.sleep(0.02)
    raise RuntimeError(f"{base} never ready")


async def sign_in(http: aiohttp.ClientSession, base: str, token: str = USER_TOKEN) -> tuple[str, str]:
    async with http.post(
        base + "/ui/signin", data={"token": token}, headers={"Origin": base}, allow_redirects=False
    ) as resp:
        cookie = resp.cookies[COOKIE].value
    async with http.get(base + "/ui/", headers={"Cookie": f"{COOKIE}={cookie}"}) as resp:
        found = re.search(r'name="csrf" value="([^"]+)"', await resp.text())
    assert found is not None, (resp.status, resp.headers, (await resp.text())[:500])
    return cookie, found.group(1)


async def page(http: aiohttp.ClientSession, base: str, cookie: str) -> int:
    async with http.get(
        base + "/ui/projects/churn", headers={"Cookie": f"{COOKIE}={cookie}"}, allow_redirects=False
    ) as resp:
        await resp.read()
        return resp.status


async def sign_out(http: aiohttp.ClientSession, base: str, cookie: str, csrf: str) -> None:
    async with http.post(
        base + "/ui/signout",
        data={"csrf": csrf},
        headers={"Origin": base, "Cookie": f"{COOKIE}={cookie}"},
        allow_redirects=False,
    ) as resp:
        assert resp.status == 303, resp.status


async def one_round(http: aiohttp.ClientSession, a: str, b: str) -> float:
    cookie, csrf = await sign_in(http, a)
    assert await page(http, b, cookie) == 200
    await sign_out(http, a, cookie, csrf)
    answered = time.perf_counter()
    while await page(http, b, cookie) == 200:
        assert time.perf_counter() - answered < 10, "b never refused the signed-out session"
    return time.perf_counter() - answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    asyncio.run(measure(parser.parse_args().rounds))


if __name__ == "__main__":
    main()
