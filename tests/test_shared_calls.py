"""SharedCalls: concurrent identical calls made once, a bound on how many are in flight, and a
waiter that gives up never cancelling the others' call."""

from __future__ import annotations

import asyncio

import pytest

from webhook.shared_calls import SharedCalls, TooManyCalls


async def test_concurrent_calls_for_one_key_share_one_call_and_its_outcome() -> None:
    calls: list[str] = []
    gate = asyncio.Event()

    async def fetch(key: str) -> str:
        calls.append(key)
        await gate.wait()
        return key.upper()

    shared: SharedCalls[str, str] = SharedCalls(4, "reads")
    waiters = [asyncio.create_task(shared.call(k, lambda k=k: fetch(k))) for k in ("a", "a", "a", "b")]
    await asyncio.sleep(0)
    assert shared.in_flight == 2
    gate.set()
    assert await asyncio.gather(*waiters) == ["A", "A", "A", "B"]
    assert calls == ["a", "b"] and shared.in_flight == 0  # nothing kept once a call ends


async def test_a_failure_reaches_every_waiter_and_the_next_call_is_new() -> None:
    attempts = 0

    async def failing() -> None:
        nonlocal attempts
        attempts += 1
        await asyncio.sleep(0.01)
        raise RuntimeError("down")

    shared: SharedCalls[str, None] = SharedCalls(4, "reads")
    results = await asyncio.gather(*(shared.call("x", failing) for _ in range(3)), return_exceptions=True)
    assert [str(r) for r in results] == ["down"] * 3 and attempts == 1
    with pytest.raises(RuntimeError):
        await shared.call("x", failing)
    assert attempts == 2


async def test_more_keys_than_the_limit_are_refused_at_once() -> None:
    gate = asyncio.Event()

    async def slow() -> None:
        await gate.wait()

    shared: SharedCalls[int, None] = SharedCalls(2, "namespace reads")
    held = [asyncio.create_task(shared.call(i, slow)) for i in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(TooManyCalls, match="2 namespace reads are already in flight"):
        await shared.call(3, slow)
    joined = asyncio.create_task(shared.call(1, slow))  # joining a call in flight is not refused
    gate.set()
    await asyncio.gather(*held, joined)


async def test_a_waiter_that_gives_up_leaves_the_call_running_for_the_others() -> None:
    gate = asyncio.Event()

    async def slow() -> str:
        await gate.wait()
        return "done"

    shared: SharedCalls[str, str] = SharedCalls(2, "reads")
    impatient = asyncio.create_task(shared.call("k", slow))
    patient = asyncio.create_task(shared.call("k", slow))
    await asyncio.sleep(0)
    impatient.cancel()
    gate.set()
    assert await patient == "done"
