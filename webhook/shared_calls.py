"""Concurrent identical calls, made once: the request path's on-demand lookups.

When many admission requests need the same remote answer at once (the first pods of a namespace
this replica has not seen, a Run:ai project bound moments ago), one call is made and every waiter
gets its outcome. Only calls in flight are held, and at most `limit` of them: nothing is kept
once a call ends, so no request can grow a cache by naming things.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class TooManyCalls(Exception):
    """`limit` different calls are already in flight: the caller refuses rather than queue."""


class SharedCalls(Generic[K, T]):
    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what  # for the refusal: "namespace reads", "Run:ai project lookups"
        self._in_flight: dict[K, asyncio.Future[T]] = {}

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def call(self, key: K, start: Callable[[], Awaitable[T]]) -> T:
        """The outcome of `start()` for `key`, joining the call already in flight for it."""
        task = self._in_flight.get(key)
        if task is None:
            if len(self._in_flight) >= self.limit:
                raise TooManyCalls(f"{self.limit} {self.what} are already in flight")
            task = asyncio.ensure_future(start())
            self._in_flight[key] = task

            def done(finished: asyncio.Future[T]) -> None:
                self._in_flight.pop(key, None)
                if not finished.cancelled():
                    finished.exception()  # retrieved here: every waiter may have gone away

            task.add_done_callback(done)
        # A waiter that goes away (its request timed out) must not cancel the others' call.
        return await asyncio.shield(task)
