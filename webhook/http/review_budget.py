"""How many TokenReviews of tokens not known to be good one client may cause.

Anyone who can reach the port can send a fresh random token with every request, and each one
costs the apiserver a TokenReview. A client gets a bucket: `burst` reviews at once, refilled at
`per_s`, and at most `in_flight` of them running at a time. Past either, its requests are refused
(429) without a review. Tokens known to be good do not draw on it (webhook.http.auth).

A client is its IPv4 address, or its IPv6 /64: one IPv6 host as a rule holds a whole /64 and can
send every request from another address of it (`client_key`). An IPv4-mapped IPv6 address (a
dual-stack listener's view of an IPv4 peer) is that IPv4 address; a peer name that is no address
is a client of its own.

The table of clients is bounded (least recently seen go first): an attacker with more addresses
than that only resets buckets of its own, and the table of reviews in flight stays bounded anyway.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv6Address, IPv6Network, ip_address

# A person signing in or a UI polling with one token needs one review per token lifetime; a
# client behind which many users sign in at once (kubectl port-forward) still gets 20 at once.
BURST = 20
PER_S = 5.0
IN_FLIGHT = 8
MAX_CLIENTS = 4096
# The prefix one IPv6 client is taken to hold: what a subscriber or a cloud VM is routinely given.
IPV6_CLIENT_PREFIX = 64
_HOST_BITS = (1 << (128 - IPV6_CLIENT_PREFIX)) - 1


def client_key(address: str) -> str:
    """The bucket `address` (a peer name, as aiohttp's `request.remote` gives it) draws on."""
    try:
        parsed = ip_address(address)
    except ValueError:
        return address
    if isinstance(parsed, IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(IPv6Network((int(parsed) & ~_HOST_BITS, IPV6_CLIENT_PREFIX)))
    return str(parsed)


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float
    in_flight: int = 0


class ReviewBudget:
    def __init__(
        self,
        clock: Callable[[], float],
        *,
        burst: int = BURST,
        per_s: float = PER_S,
        in_flight: int = IN_FLIGHT,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self._clock = clock
        self.burst = burst
        self.per_s = per_s
        self.in_flight = in_flight
        self.max_clients = max_clients
        self._clients: OrderedDict[str, _Bucket] = OrderedDict()

    def acquire(self, client: str) -> str | None:
        """Take one review for `client` (its address); None when granted (then `release` it with the
        same address), else why not."""
        client = client_key(client)
        now = self._clock()
        bucket = self._clients.get(client)
        if bucket is None:
            bucket = self._clients[client] = _Bucket(float(self.burst), now)
            while len(self._clients) > self.max_clients:
                self._clients.popitem(last=False)
        else:
            self._clients.move_to_end(client)
            bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.per_s)
            bucket.updated = now
        if bucket.in_flight >= self.in_flight:
            return f"{self.in_flight} checks of new tokens from this client are in progress"
        if bucket.tokens < 1.0:
            return f"more than {self.burst} new tokens from this client, at most {self.per_s:g} a second"
        bucket.tokens -= 1.0
        bucket.in_flight += 1
        return None

    def release(self, client: str) -> None:
        bucket = self._clients.get(client_key(client))
        if bucket is not None and bucket.in_flight > 0:
            bucket.in_flight -= 1

    def clients(self) -> list[str]:
        """The clients in the table (see `client_key`), least recently seen first."""
        return list(self._clients)

    def __len__(self) -> int:
        return len(self._clients)
