"""Console sessions: who signed in, sealed in a cookie; never the token.

Sign-in sends the pasted token to one TokenReview; the session then holds what it said (username,
uid, groups, extra), a session id, a CSRF secret and its absolute end, encrypted and authenticated
with Fernet under the console's own keys (`keys.py`, a Secret every replica mounts, so either
replica reads it). Each page is authorized by SubjectAccessReview for that principal. Whoever reads
a cookie, or the key, learns who a user is, and can hold no credential of theirs for the cluster.

Lifetimes: a cookie is good for `idle_timeout_s` after it was sealed, and is sealed again while in
use (at most once every `RENEW_AFTER_S`), so a session unused for the idle timeout is over; none
outlives `max_age_s` after sign-in, nor the expiry the token itself states (a JWT's `exp`). A
sign-out ends the session on every replica (`signouts.py`).

The cookie is `__Host-` prefixed (the browser keeps it to this host, `Path=/`, `Secure`, no
`Domain`: no other path or subdomain can set one the browser would prefer), `HttpOnly`,
`SameSite=Strict` and has no expiry (gone with the browser session). A request carrying two
session cookies is refused rather than guessing which is ours. Every form that changes something
carries the CSRF secret; `check_form` also refuses a request whose `Origin` (or `Sec-Fetch-Site`)
says it came from another site.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote

from aiohttp import web
from cryptography.fernet import InvalidToken

from webhook.console.keys import KeyRing, KeySource
from webhook.http.auth import MAX_TOKEN_BYTES, Principal

COOKIE = "__Host-scheduling-webhook-session"
# The cookie before sessions sealed principals: it held the token. Cleared wherever it shows up.
LEGACY_COOKIE, LEGACY_PATH = "scheduling_webhook_session", "/ui/"
IDLE_TIMEOUT_S = 30 * 60
MAX_SESSION_S = 8 * 3600
# A cookie in use is sealed again when older than this: the idle timeout counts from the last
# minute of use, at one Set-Cookie a minute at most.
RENEW_AFTER_S = 60
# Browsers keep 4096 bytes of name and value; a principal with hundreds of groups does not fit.
MAX_COOKIE_CHARS = 4000
# A pasted token; longer is no bearer token (as the APIs refuse it, before any review).
MAX_TOKEN_CHARS = MAX_TOKEN_BYTES
_VERSION = 2


@dataclass(frozen=True, slots=True)
class Session:
    sid: str  # random, names the session in the sign-out list
    csrf: str
    principal: Principal
    issued_at: int  # unix seconds
    ends_at: int  # absolute end
    sealed_at: int  # when this cookie was sealed: the idle timeout counts from here


class SessionError(ValueError):
    """No session can be made (400)."""


class NoSessionKeys(SessionError):
    """The server has no session key to seal with (503)."""


def token_expiry(token: str) -> int | None:
    """The `exp` a JWT states, once a TokenReview has accepted the token; None for other tokens.
    The signature is not checked here: the apiserver just did, and the value only shortens."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    return int(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


class Sessions:
    def __init__(
        self,
        keys: KeySource,
        *,
        idle_timeout_s: int = IDLE_TIMEOUT_S,
        max_age_s: int = MAX_SESSION_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = keys
        self.idle_timeout_s = idle_timeout_s
        self.max_age_s = max_age_s
        self.clock = clock

    @classmethod
    def ephemeral(cls, **kwargs: Any) -> Sessions:
        """Sessions under one key made for this process: good on it alone (folder mode, tests)."""
        ring = KeyRing.ephemeral()
        return cls(lambda: ring, **kwargs)

    @staticmethod
    def usable(token: str) -> str:
        """The pasted token without surrounding blanks; raises SessionError when it cannot be one."""
        token = token.strip()
        if not token:
            raise SessionError("paste a token")
        if len(token) > MAX_TOKEN_CHARS:
            raise SessionError(f"the token is longer than {MAX_TOKEN_CHARS} characters")
        if not token.isascii() or not token.isprintable() or " " in token:
            raise SessionError("a token is one line of printable characters without spaces")
        return token

    def start(self, principal: Principal, token_expires_at: int | None = None) -> Session:
        now = int(self.clock())
        ends = now + self.max_age_s
        if token_expires_at is not None:
            ends = min(ends, token_expires_at)
        if ends <= now:
            raise SessionError("the token has expired")
        return Session(secrets.token_hex(16), secrets.token_urlsafe(24), principal, now, ends, now)

    def seal(self, session: Session) -> str:
        ring = self.keys()
        if ring is None:
            raise NoSessionKeys("sign-in is off: this server has no console session key (see the README, The console)")
        p = session.principal
        plain = {
            "v": _VERSION,
            "sid": session.sid,
            "csrf": session.csrf,
            "iat": session.issued_at,
            "end": session.ends_at,
            "user": p.username,
            "uid": p.uid,
            "groups": list(p.groups),
            "extra": {k: list(v) for k, v in p.extra.items()},
        }
        data = json.dumps(plain, separators=(",", ":"), ensure_ascii=False).encode()
        value = ring.sealing(session.sealed_at).encrypt_at_time(data, session.sealed_at).decode()
        if len(COOKIE) + 1 + len(value) > MAX_COOKIE_CHARS:
            raise SessionError(
                f"who you are ({p.username!r} with {len(p.groups)} groups) does not fit in a console session "
                "cookie; sign in with an identity in fewer groups, e.g. a service account"
            )
        return value

    def open(self, value: str | None) -> Session | None:
        """The session of a cookie value, or None: not ours, tampered with, idle too long, or over."""
        ring = self.keys()
        if ring is None or not value or len(value) > MAX_COOKIE_CHARS:
            return None
        now = int(self.clock())
        try:
            token = value.encode("ascii")
            data = ring.opening().decrypt_at_time(token, self.idle_timeout_s, now)
            sealed_at = ring.opening().extract_timestamp(token)
            plain = json.loads(data)
        except (InvalidToken, UnicodeError, ValueError):
            return None
        session = _session(plain, sealed_at)
        if session is None or now >= session.ends_at or session.issued_at > now + 60:
            return None
        return session

    def renewal(self, session: Session) -> Session | None:
        """The session sealed anew when its cookie is due for it, else None."""
        now = int(self.clock())
        return replace(session, sealed_at=now) if now - session.sealed_at >= RENEW_AFTER_S else None

    def put(self, response: web.StreamResponse, session: Session) -> None:
        response.set_cookie(
            COOKIE, self.seal(session), path="/", secure=True, httponly=True, samesite="Strict"
        )  # no max_age: a browser-session cookie

    @staticmethod
    def clear(response: web.StreamResponse) -> None:
        response.del_cookie(COOKIE, path="/", secure=True, httponly=True, samesite="Strict")


def _session(plain: Any, sealed_at: int) -> Session | None:
    if not isinstance(plain, dict) or plain.get("v") != _VERSION:
        return None
    strings = ("sid", "csrf", "user", "uid")
    if not all(isinstance(plain.get(k), str) for k in strings) or not plain["sid"] or not plain["user"]:
        return None
    if not all(isinstance(plain.get(k), int) for k in ("iat", "end")):
        return None
    groups, extra = plain.get("groups"), plain.get("extra")
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups) or not isinstance(extra, dict):
        return None
    if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in extra.values()):
        return None
    principal = Principal(
        username=plain["user"], uid=plain["uid"], groups=tuple(groups), extra={k: tuple(v) for k, v in extra.items()}
    )
    return Session(plain["sid"], plain["csrf"], principal, plain["iat"], plain["end"], sealed_at)


def session_cookies(request: web.Request) -> list[str]:
    """Every value the request sends for the session cookie, across all its Cookie headers."""
    values = []
    for header in request.headers.getall("Cookie", ()):
        for part in header.split(";"):
            name, sep, value = part.strip().partition("=")
            if sep and name.strip() == COOKIE:
                values.append(value.strip())
    return values


def same_origin(request: web.Request) -> bool:
    """False when the browser says the request came from another site."""
    origin = request.headers.get("Origin")
    if origin is not None:
        return origin == f"{request.scheme}://{request.host}"
    site = request.headers.get("Sec-Fetch-Site")
    return site is None or site in ("same-origin", "none")


def check_form(request: web.Request, session: Session | None, form_csrf: str | None) -> str | None:
    """Why a state-changing form post must be refused, or None when it may go ahead."""
    if not same_origin(request):
        return "this form was sent from another site"
    if session is not None and not hmac.compare_digest(session.csrf.encode(), (form_csrf or "").encode()):
        return "the form is out of date or did not come from this console; open the page again"
    return None


# A path of the console with its query: RFC 3986 path and query characters only (no control
# characters, spaces, backslashes or fragments), so it is a header value as it stands.
_LOCAL_PATH = re.compile(r"/ui/[A-Za-z0-9\-._~!$&'()*+,;=:@%/?]*")
MAX_NEXT_CHARS = 2048


def safe_next(value: object) -> str | None:
    """`value` when it is a path inside the console to go back to after sign-in, else None."""
    if not isinstance(value, str) or len(value) > MAX_NEXT_CHARS or not _LOCAL_PATH.fullmatch(value):
        return None
    path = value.partition("?")[0]
    if "//" in path or any(unquote(segment) in (".", "..") for segment in path.split("/")):
        return None
    return value
