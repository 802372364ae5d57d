"""Which open connection to close when a listener is at its cap, so that a new one gets in.

Every connection is in this table from accept (TLS handshake included) until it is lost, in
accept order. At the cap the listener asks `make_room()` for victims rather than refusing the
newcomer, and closes them:

1. first, connections that never completed a request (handshaking, silent, dribbling a head or a
   body), that are closing already, or whose client is not reading its answers (answer bytes
   left unacknowledged: `not_reading` in webhook.http.listener): the oldest accepted first;
2. only when there are none, connections that completed a request and are now idle or receiving
   the next one, longest since their last request began first (a batch of them, as finding them
   means reading the whole table);
3. never one with a request in flight (its whole body received, its answer not yet written):
   when every connection is in flight, the newcomer is refused.

An attacker holding many silent or slow connections therefore only ever loses its own oldest
ones to each newcomer, and a fresh client's connection, the newest, is the last to go. A
per-peer limit was the other tool; it is not used: the apiserver alone may need many connections
from one address, callers behind one SNAT or `kubectl port-forward` share an address, and an
attacker with many pods has many addresses (docs/ARCHITECTURE.md, "Connections").
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

# Tiers of `Tracked.eviction_rank`: the lower goes first.
NEVER_SERVED = 1  # or closing already, or not reading its answers
SERVED = 2


class Tracked(Protocol):
    def eviction_rank(self) -> tuple[int, float] | None:
        """(tier, when its current request began) or None while a request is in flight."""
        ...


C = TypeVar("C", bound=Tracked)


class ConnectionTable(Generic[C]):
    """Open connections, oldest accepted first; `served_batch`: how many served ones one
    `make_room()` gives up at once (it reads every entry to find the longest idle)."""

    def __init__(self, served_batch: int = 1) -> None:
        self._open: dict[C, None] = {}
        self.served_batch = max(1, served_batch)

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[C]:
        return iter(self._open)

    def add(self, connection: C) -> None:
        self._open[connection] = None

    def discard(self, connection: C) -> None:
        self._open.pop(connection, None)

    def has_room(self, cap: int) -> bool:
        """Whether a newcomer would get in: fewer than `cap` open, or one that `make_room` would
        close for it."""
        return len(self._open) < cap or any(c.eviction_rank() is not None for c in self._open)

    def make_room(self) -> list[C]:
        """The connections to close for one newcomer, already out of the table; [] when every
        connection has a request in flight."""
        served: list[tuple[float, int, C]] = []
        for index, connection in enumerate(self._open):
            rank = connection.eviction_rank()
            if rank is None:
                continue
            tier, since = rank
            if tier <= NEVER_SERVED:
                del self._open[connection]
                return [connection]
            served.append((since, index, connection))
        victims = [connection for _, _, connection in heapq.nsmallest(self.served_batch, served)]
        for connection in victims:
            del self._open[connection]
        return victims
