"""Console sign-in: the user's Kubernetes token, kept in an encrypted session cookie.

The cookie holds the token and a CSRF secret, encrypted and authenticated with Fernet: it is
`HttpOnly` (no script reads it), `Secure`, `SameSite=Strict` (no other site's page sends it) and
has no expiry (the browser drops it when its session ends; the server also refuses it after
`max_age_s`). The key is derived (HKDF) from the serving certificate's private key, a secret every
replica mounts and no one else has: behind the Service a browser's requests reach either replica,
and a key made per process would sign the user out on every other request. A new serving key
(rotation) ends the sessions made under the old one. Without a key file, a key is made per process.

Every form that changes something carries the CSRF secret; `check_form` also refuses a request
whose `Origin` (or `Sec-Fetch-Site`) says it came from another site.
"""

from __future__ import annotations

import base64
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

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


def shared_key(secret_file: Path) -> bytes:
    """A Fernet key every replica derives alike from a secret file they all mount (the serving
    key); one-way, and bound to this use, so the cookie key reveals nothing of the secret."""
    derived = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"scheduling-webhook console session v1"
    ).derive(secret_file.read_bytes())
    return base64.urlsafe_b64encode(derived)


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
        return self.read_value(request.cookies.get(COOKIE))

    def read_value(self, value: str | None) -> Session | None:
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
