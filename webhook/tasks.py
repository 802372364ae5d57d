"""Background tasks of the shell (watchers, refresh loops, leader election)."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (None: nothing to do) and wait until it has finished.

    A cancellation of the caller itself (e.g. a shutdown that gives up) is passed on, not taken for
    the end of `task`."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def wait_for_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `event` is set (True) or `timeout_s` has passed (False).

    For the loops that sleep until poked: on Python 3.11 `asyncio.wait_for(event.wait(), t)` loses
    a cancellation that arrives in the same step as the event (CPython gh-86296), and the loop then
    never stops. `asyncio.timeout` does not."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
