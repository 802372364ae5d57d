"""Background loops stop when told to, whatever else happens at that moment.

On Python 3.11, `asyncio.wait_for` returns the inner result when the inner wait finishes in the same
loop iteration as the cancellation of the task awaiting it, and the cancellation is lost (CPython
gh-86296, fixed in 3.12). A loop of `wait_for(event.wait(), interval)` that is poked as it is stopped
then runs on, and `cancel_and_wait` on it never returns: a hung shutdown (and a hung test teardown).
"""

from __future__ import annotations

import asyncio

from webhook.runai.directory import RunaiDirectory
from webhook.state.store import ClusterState
from webhook.tasks import cancel_and_wait, wait_for_event

HANG_S = 5.0  # each stop below takes milliseconds; a lost cancellation never ends


async def finished_within(awaitable: asyncio.Future[object] | asyncio.Task[object], seconds: float) -> bool:
    """Whether it finished in time, without cancelling it (wait_for's own cancellation is what is tested)."""
    done, _ = await asyncio.wait({awaitable}, timeout=seconds)
    return bool(done)


async def test_a_poked_directory_loop_stops_when_stopped() -> None:
    directory = RunaiDirectory(ClusterState(), lambda: None, interval_s=60)  # Run:ai off: refresh is instant
    await directory.start()
    await asyncio.sleep(0.05)  # the loop waits for the interval or a poke
    directory.poke()  # in the same step as the stop: the wait ends as it is cancelled
    stopping = asyncio.ensure_future(directory.stop())
    stopped = await finished_within(stopping, HANG_S)
    if not stopped:  # leave nothing running: a second cancel reaches the loop's next wait
        task = directory._task or next(t for t in asyncio.all_tasks() if t.get_name() == "runai-directory")
        task.cancel()
        await stopping
    assert stopped, "the directory loop lost its cancellation and ran on"


async def test_wait_for_event_never_loses_a_cancellation() -> None:
    event = asyncio.Event()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            await wait_for_event(event, 60)
            event.clear()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    event.set()
    task.cancel()
    assert await finished_within(task, HANG_S) and task.cancelled()
    assert rounds == 1


async def test_wait_for_event_tells_a_set_event_from_a_timeout() -> None:
    event = asyncio.Event()
    assert await wait_for_event(event, 0.01) is False
    event.set()
    assert await wait_for_event(event, 60) is True


async def test_cancel_and_wait_passes_on_its_callers_own_cancellation() -> None:
    """Stopping a stop (a shutdown timeout) must cancel the caller too, not return as if done."""
    gate = asyncio.Event()

    async def stubborn() -> None:  # takes a while to wind down after its cancel
        try:
            await asyncio.sleep(60)
        finally:
            await gate.wait()

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0.01)
    stopping = asyncio.create_task(cancel_and_wait(task))
    await asyncio.sleep(0.01)
    stopping.cancel()
    assert await finished_within(stopping, HANG_S) and stopping.cancelled()
    gate.set()
    await asyncio.wait({task}, timeout=HANG_S)
    assert task.cancelled()
