"""How soon the other replica refuses a signed-out console session.

`python -m bench.console_signout [--rounds 30]`

Two real Runtimes (`serve` against the real control plane as the webhook's ServiceAccount, one
session key file, one sign-out ConfigMap both watch), as the Deployment's two replicas. Each round
signs in on replica a, checks the cookie on b, signs out on a, then polls b with a copy of the
cookie until b refuses it. Prints the time from a's sign-out answer to b's first refusal, and the
apiserver calls a sign-out and a page cost (the servers' own count of calls made while a request
waits, webhook_remote_calls_total{path="request"}).

    PEERS_DIR=/work/peers .venv/bin/python -m bench.console_signout [--rounds 30]
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

from tests.support.fixtures import remote_calls
from tests.support.https import SERVICE_HOST, StaticResolver, client_ssl_context
from tests.support.kube_scope import SharedCluster, running_cluster, scope_on
from tests.support.runtime import base_url, start_runtime
from webhook.console.keys import format_keys, new_key
from webhook.console.session import COOKIE
from webhook.tls.issuing import make_ca


def calls() -> float:
    return remote_calls("kubernetes", "request")


async def measure(rounds: int, shared: SharedCluster) -> None:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        async with scope_on(shared, tmp / "kube-scope") as scope:
            await scope.settings()
            churn = await scope.namespace("churn")
            _, user_token = await scope.admin_token("root")
            _, fresh_token = await scope.admin_token("fresh")  # for the calls, with empty caches
            keys = tmp / "session-keys"
            keys.write_text(format_keys([new_key(0)]))
            ca = make_ca(days=1)
            replicas = [await start_runtime(tmp / n, scope, ca=ca, console_keys=keys) for n in ("a", "b")]
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
                        lags.append(await one_round(http, a, b, churn, user_token))
                    before = calls()
                    cookie, csrf = await sign_in(http, a, fresh_token)
                    sign_in_calls = calls() - before  # the index page's SAR included
                    before = calls()
                    await page(http, b, cookie, churn)
                    first_page_calls = calls() - before
                    before = calls()
                    for _ in range(10):
                        await page(http, b, cookie, churn)
                    page_calls = (calls() - before) / 10
                    before = calls()
                    await sign_out(http, a, cookie, csrf)
                    sign_out_calls = calls() - before
            finally:
                for runtime, _, _ in replicas:
                    await runtime.shutdown()
    ms = sorted(x * 1000 for x in lags)
    print(f"sign-out seen by the other replica, {rounds} rounds: median {statistics.median(ms):.1f} ms, "
          f"p90 {ms[int(len(ms) * 0.9) - 1]:.1f} ms, max {ms[-1]:.1f} ms")  # fmt: skip
    print(f"apiserver calls: sign-in and the first page on a {sign_in_calls:.0f}, the first page on b "
          f"{first_page_calls:.0f}, then {page_calls:.1f} a page on average (10 in a row), "
          f"sign-out {sign_out_calls:.0f}")  # fmt: skip


async def ready(http: aiohttp.ClientSession, base: str) -> None:
    """Until /readyz says 200 (it waits for the sign-out list too)."""
    for _ in range(500):
        async with http.get(base + "/readyz") as resp:
            if resp.status == 200:
                return
        await asyncio.sleep(0.02)
    raise RuntimeError(f"{base} never ready")


async def sign_in(http: aiohttp.ClientSession, base: str, token: str) -> tuple[str, str]:
    async with http.post(
        base + "/ui/signin", data={"token": token}, headers={"Origin": base}, allow_redirects=False
    ) as resp:
        cookie = resp.cookies[COOKIE].value
    async with http.get(base + "/ui/", headers={"Cookie": f"{COOKIE}={cookie}"}) as resp:
        found = re.search(r'name="csrf" value="([^"]+)"', await resp.text())
    assert found is not None, (resp.status, resp.headers, (await resp.text())[:500])
    return cookie, found.group(1)


async def page(http: aiohttp.ClientSession, base: str, cookie: str, project: str) -> int:
    async with http.get(
        base + f"/ui/projects/{project}", headers={"Cookie": f"{COOKIE}={cookie}"}, allow_redirects=False
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


async def one_round(http: aiohttp.ClientSession, a: str, b: str, project: str, token: str) -> float:
    cookie, csrf = await sign_in(http, a, token)
    assert await page(http, b, cookie, project) == 200
    await sign_out(http, a, cookie, csrf)
    answered = time.perf_counter()
    while await page(http, b, cookie, project) == 200:
        assert time.perf_counter() - answered < 10, "b never refused the signed-out session"
    return time.perf_counter() - answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    rounds = parser.parse_args().rounds
    with running_cluster() as shared:
        asyncio.run(measure(rounds, shared))


if __name__ == "__main__":
    main()
