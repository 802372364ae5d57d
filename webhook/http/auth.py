"""Who may read the GPU API: Kubernetes bearer tokens, checked as the apiserver would check them.

A caller sends `Authorization: Bearer <token>`. A TokenReview says who the token belongs to; a
SubjectAccessReview says whether that user may do what stands for "reads this project" (default:
`get pods` in the project namespace — every built-in role a project member gets, view/edit/admin,
grants it, and the GPU view is a summary of those very pods plus the project's quota) or "reads
the admin view" (default: `list namespaces` cluster-wide — the admin view lists every project
namespace — or membership of a configured group, for platform admins who are no cluster admins).

Answers are cached briefly (bounded LRU, keyed by a hash of the token, never the token itself),
so a UI polling the view does not put a TokenReview and a SubjectAccessReview on the apiserver
per request. A revoked token or a removed RoleBinding takes effect within the TTL.

Unauthenticated callers can reach all of this, so every cost is bounded: a token that is not a
well-formed bearer token is refused before any review; each review has a timeout; concurrent
requests with the same token (or the same access question) share one review, and the table of
reviews in flight is bounded. A token never seen before costs its client (the caller's address;
an IPv6 caller's /64) part of a budget (webhook.http.review_budget: 20 at once, 5 a second, 8 in
flight; past it 429);
such reviews may fill three quarters of the table at most, and their refusals are cached apart
from the good answers. So a flood of fresh random tokens neither reaches the apiserver beyond the
budget nor takes the room or the cache of tokens a TokenReview already accepted. A token stays
known good for an hour at most, never past the expiry its JWT claims, and only until a review
refuses it: from then on its reviews draw on its client's budget like any unknown token's. A 503
says only that Kubernetes could not answer, never why: the apiserver's error text goes to the log.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import aiohttp

from webhook.http.review_budget import ReviewBudget
from webhook.kube.api import KubeError
from webhook.logsafe import log_safe

V = TypeVar("V")

log = logging.getLogger(__name__)

# RFC 6750 b64token, which service account JWTs and bootstrap tokens are; anything else (non-ASCII,
# spaces, control characters) is refused before it is hashed or sent anywhere.
_BEARER_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
# A JWT of a service account with many audiences is a few KB; more is not a token.
MAX_TOKEN_BYTES = 16 * 1024
# A review is one small apiserver call; past this the apiserver is not answering, and the caller
# gets a 503 at once instead of waiting with it (the GPU API's callers poll).
REVIEW_TIMEOUT_S = 5.0
# Distinct reviews in flight at once; past it, further ones are refused with 503 rather than queued.
# A quarter is kept for tokens known good (below): a flood of new tokens gets the rest at most.
MAX_REVIEWS_IN_FLIGHT = 256
# How long a token a TokenReview accepted counts as known good (longer than any answer is cached).
KNOWN_GOOD_TTL_S = 3600.0


class AuthError(Exception):
    """The request is refused; `status` is the HTTP status, `code` a stable machine-readable reason."""

    status = 500
    code = "AuthError"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Unauthenticated(AuthError):
    status = 401
    code = "Unauthenticated"


class Forbidden(AuthError):
    status = 403
    code = "Forbidden"


class TooManyNewTokens(AuthError):
    """This client sent more tokens never seen before than its budget allows (webhook.http.review_budget)."""

    status = 429
    code = "TooManyNewTokens"


class AuthUnavailable(AuthError):
    """The apiserver could not answer the review: neither yes nor no."""

    status = 503
    code = "AuthUnavailable"


@dataclass(frozen=True, slots=True)
class Principal:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def as_sar_user(self) -> dict[str, Any]:
        return {
            "username": self.username,
            "uid": self.uid,
            "groups": list(self.groups),
            "extra": {k: list(v) for k, v in self.extra.items()},
        }


@dataclass(frozen=True, slots=True)
class AccessCheck:
    """SubjectAccessReview resource attributes (the namespace is added per request)."""

    verb: str
    resource: str
    group: str = ""
    subresource: str = ""

    def attributes(self, namespace: str | None) -> dict[str, str]:
        attrs = {"verb": self.verb, "resource": self.resource, "group": self.group}
        if self.subresource:
            attrs["subresource"] = self.subresource
        if namespace is not None:
            attrs["namespace"] = namespace
        return attrs

    def can_i(self, namespace: str | None) -> str:
        """The `kubectl auth can-i` command that asks this question, as a refusal names it."""
        what = f"{self.resource}.{self.group}" if self.group else self.resource
        words = ["kubectl auth can-i", self.verb, what]
        if self.subresource:
            words.append(f"--subresource={self.subresource}")
        words.append(f"--namespace={namespace}" if namespace else "--all-namespaces")
        return " ".join(words)


PROJECT_READER = AccessCheck("get", "pods")
ADMIN = AccessCheck("list", "namespaces")


class ReviewApi(Protocol):
    """What of `webhook.kube.api.KubeApi` this module uses (raw JSON dicts)."""

    async def token_review(self, token: str) -> dict[str, Any]: ...

    async def subject_access_review(self, user: Mapping[str, Any], attributes: Mapping[str, Any]) -> dict[str, Any]: ...


class Authorizer(Protocol):
    """What the GPU API routes need; raise AuthError subclasses to refuse."""

    async def authorize_project(self, token: str | None, namespace: str, *, client: str = "") -> Principal: ...

    async def authorize_admin(self, token: str | None, *, client: str = "") -> Principal: ...


class TtlLru(Generic[V]):
    """A small TTL cache with a size bound (least recently used entries go first)."""

    def __init__(self, max_entries: int, clock: Callable[[], float]) -> None:
        self._items: OrderedDict[Any, tuple[float, V]] = OrderedDict()
        self.max_entries = max_entries
        self._clock = clock

    def get(self, key: Any) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        if item[0] <= self._clock():
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return item[1]

    def put(self, key: Any, value: V, ttl: float) -> None:
        if ttl <= 0:
            return
        self._items[key] = (self._clock() + ttl, value)
        self._items.move_to_end(key)
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)

    def discard(self, key: Any) -> None:
        self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)


def token_expiry(token: str) -> float | None:
    """The `exp` claim (seconds since the epoch) of a JWT, read without checking its signature;
    None for a token that is no JWT or has no such claim. Read only after a TokenReview accepted
    the token (the apiserver checked the signature), and only to shorten how long it is trusted."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        exp = claims.get("exp") if isinstance(claims, dict) else None
    except (ValueError, binascii.Error):
        return None
    return float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None


_UNAVAILABLE_ERRORS = (KubeError, aiohttp.ClientError, OSError, asyncio.TimeoutError)


class Coalescer(Generic[V]):
    """One call per key at a time: concurrent callers with the same key await the same result.

    Keys are hashes (never a token). The table holds only calls in flight, at most `max_in_flight`;
    a new key beyond that raises AuthUnavailable, so a flood of distinct tokens cannot queue work.
    """

    def __init__(self, max_in_flight: int = MAX_REVIEWS_IN_FLIGHT) -> None:
        self.max_in_flight = max_in_flight
        self._in_flight: dict[Any, asyncio.Future[V]] = {}

    def __len__(self) -> int:
        return len(self._in_flight)

    def __contains__(self, key: Any) -> bool:
        return key in self._in_flight

    async def run(self, key: Any, call: Callable[[], Awaitable[V]], when_done: Callable[[], None] | None = None) -> V:
        """`when_done` is called once the call this caller started ends (not when it joins one)."""
        pending = self._in_flight.get(key)
        if pending is None:
            if len(self._in_flight) >= self.max_in_flight:
                raise AuthUnavailable("too many authentication checks in progress; retry shortly")
            pending = asyncio.ensure_future(call())
            self._in_flight[key] = pending
            pending.add_done_callback(lambda _: self._in_flight.pop(key, None))
            # Nobody may be left to read an exception when every waiter was cancelled.
            pending.add_done_callback(lambda f: f.cancelled() or f.exception())
            if when_done is not None:
                pending.add_done_callback(lambda _: when_done())
        # shield: one caller hanging up must not cancel the review the others wait for.
        return await asyncio.shield(pending)


def token_error(token: str) -> str | None:
    """Why `token` cannot be a Kubernetes bearer token, or None."""
    if len(token) > MAX_TOKEN_BYTES:
        return f"malformed bearer token: longer than {MAX_TOKEN_BYTES} bytes"
    if not _BEARER_TOKEN.fullmatch(token):
        return "malformed bearer token: only letters, digits and -._~+/ (then =) are allowed"
    return None


class KubeAuthorizer:
    """TokenReview + SubjectAccessReview with a short cache. `kube` is usually a `KubeApi`."""

    def __init__(
        self,
        kube: ReviewApi,
        *,
        project_check: AccessCheck = PROJECT_READER,
        admin_check: AccessCheck | None = ADMIN,
        admin_groups: Iterable[str] = (),
        admin_action: str = "read the Run:ai admin view",
        ttl_s: float = 30.0,
        negative_ttl_s: float = 5.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        review_timeout_s: float = REVIEW_TIMEOUT_S,
        max_in_flight: int = MAX_REVIEWS_IN_FLIGHT,
        reserved_for_known_good: int | None = None,
        known_good_ttl_s: float = KNOWN_GOOD_TTL_S,
        budget: ReviewBudget | None = None,
    ) -> None:
        self.kube = kube
        self.project_check = project_check
        self.admin_check = admin_check  # None: only `admin_groups` make an admin
        self.admin_groups = frozenset(admin_groups)
        self.admin_action = admin_action  # what a refusal says the caller may not do
        self.ttl_s = ttl_s
        # Refusals are cached for less time: a RoleBinding just added should work soon.
        self.negative_ttl_s = min(negative_ttl_s, ttl_s)
        # Answers of TokenReviews, good and bad apart: a flood of junk tokens evicts only junk.
        self._principals: TtlLru[Principal] = TtlLru(max_entries, clock)
        self._refusals: TtlLru[str] = TtlLru(max_entries, clock)
        # Tokens a TokenReview said were good, kept long after their answer expired: their next
        # review draws on room junk cannot take, and on no client's budget.
        self._known_good: TtlLru[bool] = TtlLru(max_entries, clock)
        self.known_good_ttl_s = known_good_ttl_s
        self._wall_clock = wall_clock  # JWT expiries are wall-clock times
        self._access: TtlLru[tuple[bool, str]] = TtlLru(max_entries, clock)
        self.review_timeout_s = review_timeout_s
        self._token_reviews: Coalescer[Principal | str] = Coalescer(max_in_flight)
        reserved = max_in_flight // 4 if reserved_for_known_good is None else reserved_for_known_good
        self._new_token_limit = max(1, max_in_flight - reserved)
        self._budget = budget or ReviewBudget(clock)
        self._access_reviews: Coalescer[tuple[bool, str]] = Coalescer(max_in_flight)

    async def authenticate(self, token: str | None, *, client: str = "") -> Principal:
        """Who `token` belongs to; `client` (the caller's address) pays for reviews of tokens not
        known to be good."""
        if not token:
            raise Unauthenticated("missing bearer token: send 'Authorization: Bearer <Kubernetes token>'")
        malformed = token_error(token)
        if malformed:
            raise Unauthenticated(malformed)
        key = hashlib.sha256(token.encode()).hexdigest()
        principal = self._principals.get(key)
        if principal is not None:
            return principal
        refusal = self._refusals.get(key)
        if refusal is None:
            result = await self._token_review(key, token, client)
            if isinstance(result, Principal):
                return result
            refusal = result
        raise Unauthenticated(refusal)

    async def _token_review(self, key: str, token: str, client: str) -> Principal | str:
        def review() -> Awaitable[Principal | str]:
            return self._review_token(key, token)

        if key in self._token_reviews or self._known_good.get(key):
            return await self._token_reviews.run(key, review)
        if len(self._token_reviews) >= self._new_token_limit:
            raise AuthUnavailable("too many authentication checks in progress; retry shortly")
        over = self._budget.acquire(client)
        if over is not None:
            raise TooManyNewTokens(f"too many new bearer tokens: {over}; retry shortly")
        return await self._token_reviews.run(key, review, when_done=lambda: self._budget.release(client))

    async def authorize_project(self, token: str | None, namespace: str, *, client: str = "") -> Principal:
        return await self.authorize_project_for(await self.authenticate(token, client=client), namespace)

    async def authorize_admin(self, token: str | None, *, client: str = "") -> Principal:
        return await self.authorize_admin_for(await self.authenticate(token, client=client))

    # A principal reviewed earlier (the console's session holds one, never the token): asked by
    # SubjectAccessReview with its username, uid, groups and extra, as the apiserver authorizes a
    # request that impersonates exactly that user.
    async def authorize_project_for(self, principal: Principal | None, namespace: str) -> Principal:
        if principal is None:
            raise Unauthenticated("not signed in")
        allowed, reason = await self._allowed(principal, self.project_check, namespace)
        if not allowed:
            raise Forbidden(
                f"user {principal.username!r} may not read the GPU view of project {namespace}: "
                f"`{self.project_check.can_i(namespace)}` must say yes for them{_because(reason)}"
            )
        return principal

    async def authorize_admin_for(self, principal: Principal | None) -> Principal:
        if principal is None:
            raise Unauthenticated("not signed in")
        if self.admin_groups.intersection(principal.groups):
            return principal
        reason = ""
        if self.admin_check is not None:
            allowed, reason = await self._allowed(principal, self.admin_check, None)
            if allowed:
                return principal
        needs = (
            [f"`{self.admin_check.can_i(None)}` must say yes for them{_because(reason)}"] if self.admin_check else []
        )
        needs += [f"they must be in group {g}" for g in sorted(self.admin_groups)]
        needed = ", or ".join(needs) or "only an administrator may"
        raise Forbidden(f"user {principal.username!r} may not {self.admin_action}: {needed}")

    async def _review_token(self, key: str, token: str) -> Principal | str:
        try:
            async with asyncio.timeout(self.review_timeout_s):
                review = await self.kube.token_review(token)
        except _UNAVAILABLE_ERRORS as exc:
            log.warning("TokenReview failed: %s", log_safe(f"{type(exc).__name__}: {exc}", 300))
            raise AuthUnavailable("cannot check the bearer token now: the Kubernetes API did not answer") from None
        result = self._principal(review)
        if isinstance(result, Principal):
            # Neither the answer nor the known-good mark outlives the token itself.
            expiry = token_expiry(token)
            left = float("inf") if expiry is None else expiry - self._wall_clock()
            self._principals.put(key, result, min(self.ttl_s, left))
            self._known_good.put(key, True, min(self.known_good_ttl_s, left))
        else:
            # Revoked or expired since it was accepted: no longer spared the client's budget.
            self._known_good.discard(key)
            self._refusals.put(key, result, self.negative_ttl_s)
        return result

    @staticmethod
    def _principal(review: Mapping[str, Any]) -> Principal | str:
        status = review.get("status") or {}
        user = status.get("user") or {}
        if not status.get("authenticated") or not user.get("username"):
            return f"invalid bearer token{_because(status.get('error') or '')}"
        extra = user.get("extra") or {}
        return Principal(
            username=str(user["username"]),
            uid=str(user.get("uid") or ""),
            groups=tuple(str(g) for g in user.get("groups") or ()),
            extra={str(k): tuple(str(x) for x in v or ()) for k, v in extra.items()},
        )

    async def _allowed(self, principal: Principal, check: AccessCheck, namespace: str | None) -> tuple[bool, str]:
        attributes = check.attributes(namespace)
        key = (
            principal.username,
            principal.uid,
            principal.groups,
            json.dumps(principal.extra, sort_keys=True),
            tuple(sorted(attributes.items())),
        )
        cached = self._access.get(key)
        if cached is not None:
            return cached
        digest = hashlib.sha256(repr(key).encode(errors="backslashreplace")).hexdigest()
        return await self._access_reviews.run(digest, lambda: self._review_access(key, principal, attributes))

    async def _review_access(self, key: Any, principal: Principal, attributes: Mapping[str, str]) -> tuple[bool, str]:
        try:
            async with asyncio.timeout(self.review_timeout_s):
                review = await self.kube.subject_access_review(principal.as_sar_user(), attributes)
        except _UNAVAILABLE_ERRORS as exc:
            log.warning("SubjectAccessReview failed: %s", log_safe(f"{type(exc).__name__}: {exc}", 300))
            raise AuthUnavailable("cannot check access now: the Kubernetes API did not answer") from None
        status = review.get("status") or {}
        # `denied` wins over `allowed`, as in the apiserver's authorizer chain.
        allowed = bool(status.get("allowed")) and not status.get("denied")
        result = (allowed, str(status.get("reason") or status.get("evaluationError") or ""))
        self._access.put(key, result, self.ttl_s if allowed else self.negative_ttl_s)
        return result


def _because(reason: str) -> str:
    return f" ({reason})" if reason else ""


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None
