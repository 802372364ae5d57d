"""Console sign-in: the user's Kubernetes token, kept in an encrypted session cookie.

The cookie holds the token and a CSRF secret, encrypted and authenticated with Fernet under a key
made when the process starts (never written anywhere): it is `HttpOnly` (no script reads it),
`Secure`, `SameSite=Strict` (no other site's page sends it) and has no expiry (the browser drops it
when its session ends; the server also refuses it after `max_age_s`). A restart, or a request
that lands on another replica, asks the user to sign in again.

Every form that changes something carries the CSRF secret; `check_form` also refuses a request
whose `Origin` (or `Sec-Fetch-Site`) says it came from another site.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

from aiohttp import web
from cryptography.fernet import Fernet, InvalidToken

COOKIE = "scheduling_webhook_session"
COOKIE_PATH = "/ui/"
# A cookie is capped near 4096 bytes; encryption and base64 take the token past that beyond this.
MAX_TOKEN_CHARS = 2800


@dataclass(frozen=True, slots=True)
class Session:
    token: str
    csrf: str


class SessionError(ValueError):
    pass


class Sessions:
    def __init__(self, *, max_age_s: int = 8 * 3600, key: bytes | None = None) -> None:
        self._fernet = Fernet(key or Fernet.generate_key())
        self.max_age_s = max_age_s

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

    def issue(self, response: web.StreamResponse, token: str) -> Session:
        """Put a new session for `token` on `response` (raises SessionError for an unusable token)."""
        token = self.usable(token)
        session = Session(token=token, csrf=secrets.token_urlsafe(24))
        value = self._fernet.encrypt(f"{session.csrf}\n{session.token}".encode()).decode()
        response.set_cookie(
            COOKIE, value, path=COOKIE_PATH, secure=True, httponly=True, samesite="Strict"
        )  # no max_age: a browser-session cookie
        return session

    def read(self, request: web.Request) -> Session | None:
        value = request.cookies.get(COOKIE)
        if not value or len(value) > 4096:
            return None
        try:
            plain = self._fernet.decrypt(value.encode(), ttl=self.max_age_s).decode()
        except (InvalidToken, UnicodeDecodeError):
            return None  # another process's key, too old, or tampered with
        csrf, _, token = plain.partition("\n")
        return Session(token=token, csrf=csrf) if csrf and token else None

    @staticmethod
    def clear(response: web.StreamResponse) -> None:
        response.del_cookie(COOKIE, path=COOKIE_PATH)


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
