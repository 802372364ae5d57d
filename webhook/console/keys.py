"""The console's session keys: a file of their own (the Secret `scheduling-webhook-console`, mounted
by every replica), re-read while the server runs.

One key a line, `<not-before> <key>`: an RFC 3339 UTC time and 32 random bytes in URL-safe base64;
blank lines and `#` comments are skipped. Every key in the file opens a cookie; the newest key whose
not-before has passed seals new ones (the oldest one when none has). So a rotation adds a key whose
not-before lies further ahead than the kubelet takes to update every replica's mount: by the time
any replica seals with it, each one opens it, and no user is signed out by landing on the replica
that has not seen the file yet. A key can go once the key after it has sealed for longer than a
cookie lives (the idle timeout): nothing sealed with it is accepted anywhere any more.
`rotated` is that rule; `scheduling-webhook console-keys` (`keys_cli.py`) applies it to the file.

A key is used through HKDF, bound to this use, never as it stands.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import hashlib
import logging
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.fernet import Fernet, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from webhook.tasks import cancel_and_wait

log = logging.getLogger(__name__)

KEY_BYTES = 32
# A file of a handful of lines; anything bigger is not a key file.
MAX_FILE_BYTES = 64 * 1024
MAX_KEYS = 16
_INFO = b"scheduling-webhook console session v2"


class KeyFileError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class SessionKey:
    not_before: int  # unix seconds
    secret: bytes

    def line(self) -> str:
        stamp = dt.datetime.fromtimestamp(self.not_before, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"{stamp} {base64.urlsafe_b64encode(self.secret).decode()}"

    def fernet(self) -> Fernet:
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(self.secret)
        return Fernet(base64.urlsafe_b64encode(derived))


def new_key(not_before: float) -> SessionKey:
    return SessionKey(int(not_before), secrets.token_bytes(KEY_BYTES))


def parse_keys(text: str) -> list[SessionKey]:
    """The keys of a key file, oldest not-before first. Raises KeyFileError naming the line."""
    keys: list[SessionKey] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise KeyFileError(f"line {number}: expected '<not-before> <key>'")
        stamp, encoded = parts
        try:
            when = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
        except ValueError:
            raise KeyFileError(f"line {number}: not-before is not a UTC time like 2025-01-31T12:00:00Z") from None
        try:
            secret = base64.urlsafe_b64decode(encoded.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError):
            raise KeyFileError(f"line {number}: the key is not URL-safe base64") from None
        if len(secret) != KEY_BYTES:
            raise KeyFileError(f"line {number}: a key is {KEY_BYTES} bytes, this one {len(secret)}")
        keys.append(SessionKey(int(when.timestamp()), secret))
    if not keys:
        raise KeyFileError("no key in the file")
    if len(keys) > MAX_KEYS:
        raise KeyFileError(f"{len(keys)} keys; at most {MAX_KEYS}")
    if len({k.secret for k in keys}) != len(keys):
        raise KeyFileError("the same key twice")
    return sorted(keys, key=lambda k: k.not_before)


def format_keys(keys: Iterable[SessionKey]) -> str:
    lines = ["# scheduling-webhook console session keys: <not-before> <key>; see README (The console)"]
    lines += [k.line() for k in sorted(keys, key=lambda k: k.not_before)]
    return "\n".join(lines) + "\n"


def rotated(
    keys: list[SessionKey], now: float, *, activate_in_s: float, cookie_lifetime_s: float, skew_s: float = 300
) -> list[SessionKey]:
    """`keys` with a new key that seals from `now + activate_in_s` on (at once when there is no key),
    less the keys nothing valid can be sealed with any more: those followed by a key that has sealed
    for longer than a cookie lives (plus `skew_s` for the replicas' clocks)."""
    kept = [
        k
        for k in keys
        if not any(
            later.not_before > k.not_before and later.not_before + cookie_lifetime_s + skew_s <= now for later in keys
        )
    ]
    return [*kept, new_key(now + activate_in_s if keys else now)]


class KeyRing:
    """The keys of one reading of the file, ready to seal and open."""

    def __init__(self, keys: Iterable[SessionKey]) -> None:
        self.keys = tuple(sorted(keys, key=lambda k: k.not_before))
        if not self.keys:
            raise KeyFileError("no key")
        self._fernets = tuple(k.fernet() for k in self.keys)
        self._opening = MultiFernet(list(self._fernets))

    @classmethod
    def ephemeral(cls) -> KeyRing:
        """One key made for this process (no key file): its sessions are good on it alone."""
        return cls([new_key(0)])

    def sealing(self, now: float) -> Fernet:
        active = [i for i, k in enumerate(self.keys) if k.not_before <= now]
        return self._fernets[active[-1] if active else 0]

    def opening(self) -> MultiFernet:
        return self._opening


class KeyFile:
    """Follows the key file: polled every `interval_s` (its content hashed, as a Secret volume
    swaps a symlink and keeps mtimes); a file that does not parse keeps the last good keys and is
    logged once per content. `ring()` is None until a file has been read."""

    def __init__(self, path: Path, *, interval_s: float = 5.0) -> None:
        self.path = path
        self.interval_s = interval_s
        self.error: str | None = None
        self._ring: KeyRing | None = None
        self._digest: bytes | None = None
        self._task: asyncio.Task[None] | None = None

    def ring(self) -> KeyRing | None:
        return self._ring

    def reload_now(self) -> bool:
        """Read the file; True when the keys changed."""
        try:
            with self.path.open("rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            return self._failed(f"errno {exc.errno}".encode(), f"cannot read {self.path}: {exc.strerror}")
        digest = hashlib.sha256(raw).digest()
        if digest == self._digest:
            return False
        if len(raw) > MAX_FILE_BYTES:
            return self._failed(digest, f"{self.path} is larger than {MAX_FILE_BYTES} bytes")
        try:
            keys = parse_keys(raw.decode("utf-8"))
        except (KeyFileError, UnicodeDecodeError) as exc:
            return self._failed(digest, f"{self.path}: {exc}")
        self._digest, self.error = digest, None
        self._ring = KeyRing(keys)
        log.info("console session keys: %d loaded from %s", len(keys), self.path)
        return True

    def _failed(self, seen: bytes, error: str) -> bool:
        if seen != self._digest:
            log.error(
                "console session keys: %s; %s", error, "keeping the last good keys" if self._ring else "no sign-in"
            )
        self._digest, self.error = seen, error
        return False

    async def start(self) -> None:
        self.reload_now()
        if self._task is None:
            self._task = asyncio.create_task(self._poll(), name="console-session-keys")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.reload_now()


KeySource = Callable[[], KeyRing | None]
