"""Sign-outs, kept in the cluster so that every replica refuses a signed-out session.

A sign-out writes one entry into the ConfigMap `scheduling-webhook-console-signouts` in the install
namespace (a JSON merge patch: no read first and no conflict between replicas), and every replica
watches that one ConfigMap: a page checks the session against the watched copy, nothing remote.
The replica that signed the session out knows it at once; the others as soon as their watch
delivers the write (milliseconds; tests/test_console_sessions.py measures it).

Entries (ConfigMap keys and values):
- `s.<session id>`: `<until> <user>`, that session is over; kept until the session's own absolute
  end (`until`), after which no replica would accept it anyway, so the entry is pruned by the next
  write. Until then it holds even for a replica whose watch was cut off for hours.
- `u.<user>`: `<until> <before>`, every session of that user signed in before `before` (unix
  seconds) is over. A user who signs out more than `PER_USER_ENTRIES` live sessions gets this one
  entry (and one for the session signing out) instead of one per session: the list stays bounded
  by the number of users, whatever a user does. Their other sessions then end too.
`<user>` is a digest of username and uid, so the ConfigMap names nobody.

Until the first list of the ConfigMap has arrived `ready` is False and the console serves no
session (a replica that has not read the sign-outs cannot tell a signed-out session).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from kubernetes_asyncio.client import ApiClient, CoreV1Api

from webhook.console.session import MAX_SESSION_S, Session
from webhook.http.auth import Principal
from webhook.kube.api import KubeConflict, KubeError, KubeNotFound
from webhook.kube.watch import HeldListing, KubeWatcher, Listing, ResourceWatch

log = logging.getLogger(__name__)

SIGNOUTS_CONFIGMAP = "scheduling-webhook-console-signouts"
WATCH_NAME = f"ConfigMap/{SIGNOUTS_CONFIGMAP}"
PER_USER_ENTRIES = 16
_SESSION, _USER = "s.", "u."
# Unix seconds, read strictly: whoever else writes the ConfigMap must not make a list fail.
_SECONDS = re.compile(r"[0-9]{1,12}")


@dataclass(frozen=True, slots=True)
class Entry:
    until: int
    user: str = ""  # s.: whose session
    before: int = 0  # u.: sessions issued before this are over


def user_digest(principal: Principal) -> str:
    return hashlib.sha256(f"{principal.username}\n{principal.uid}".encode()).hexdigest()[:32]


def parse_entries(data: Mapping[str, Any]) -> dict[str, Entry]:
    """The entries of the ConfigMap's data; a value that does not read is skipped (and pruned)."""
    entries: dict[str, Entry] = {}
    for key, value in data.items():
        parts = value.split() if isinstance(value, str) else []
        if len(parts) != 2 or not _SECONDS.fullmatch(parts[0]):
            continue
        if key.startswith(_SESSION):
            entries[key] = Entry(until=int(parts[0]), user=parts[1])
        elif key.startswith(_USER) and _SECONDS.fullmatch(parts[1]):
            entries[key] = Entry(until=int(parts[0]), before=int(parts[1]))
    return entries


def is_signed_out(entries: Mapping[str, Entry], session: Session, now: float) -> bool:
    own = entries.get(_SESSION + session.sid)
    if own is not None and own.until > now:
        return True
    user = entries.get(_USER + user_digest(session.principal))
    return user is not None and user.until > now and session.issued_at < user.before


def signout_patch(data: Mapping[str, Any], session: Session, now: float) -> dict[str, str | None]:
    """The merge patch of `data.` that signs `session` out and prunes what has run out."""
    entries = parse_entries(data)
    patch: dict[str, str | None] = {k: None for k in data if k not in entries or entries[k].until <= now}
    user = user_digest(session.principal)
    live = [k for k, e in entries.items() if k.startswith(_SESSION) and e.user == user and e.until > now]
    if len(live) < PER_USER_ENTRIES:
        patch[_SESSION + session.sid] = f"{session.ends_at} {user}"
        return patch
    # Every session of this user signed in before this second ends (none lasts past now +
    # MAX_SESSION_S), and this one; a sign-in in this very second, after this sign-out, does not.
    patch.update({k: None for k in live})
    patch[_USER + user] = f"{int(now) + MAX_SESSION_S} {int(now)}"
    patch[_SESSION + session.sid] = f"{session.ends_at} {user}"
    return patch


class ConfigMapWriter(Protocol):
    """What of `webhook.kube.api.KubeApi` the sign-out needs."""

    async def patch_configmap(self, name: str, patch: Mapping[str, Any], *, call_path: Any = ...) -> Any: ...

    async def create_configmap(self, body: Mapping[str, Any], *, call_path: Any = ...) -> Any: ...


class SignoutError(Exception):
    """The sign-out could not be written to the cluster."""


class Signouts:
    """The watched sign-out list (a watch `Sink`) and the writer of new entries."""

    def __init__(self, kube: ConfigMapWriter, *, clock: Callable[[], float] = time.time) -> None:
        self.kube = kube
        self.clock = clock
        self.synced: dict[str, bool] = {}
        self._data: dict[str, Any] = {}
        self._entries: dict[str, Entry] = {}
        # Written here and not yet seen back from the watch: a watch event older than our write
        # must not make this replica forget a sign-out it has just answered.
        self._written: dict[str, Entry] = {}

    @property
    def ready(self) -> bool:
        return self.synced.get(WATCH_NAME, False)

    def signed_out(self, session: Session) -> bool:
        now = self.clock()
        return is_signed_out(self._entries, session, now) or is_signed_out(self._written, session, now)

    async def sign_out(self, session: Session) -> None:
        now = self.clock()
        patch = signout_patch(self._data, session, now)
        try:
            try:
                await self.kube.patch_configmap(SIGNOUTS_CONFIGMAP, {"data": patch}, call_path="request")
            except KubeNotFound:
                body = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": SIGNOUTS_CONFIGMAP,
                        "labels": {"app.kubernetes.io/name": "scheduling-webhook"},
                    },
                    "data": {k: v for k, v in patch.items() if v is not None},
                }
                try:
                    await self.kube.create_configmap(body, call_path="request")
                except KubeConflict:  # another replica created it meanwhile
                    await self.kube.patch_configmap(SIGNOUTS_CONFIGMAP, {"data": patch}, call_path="request")
        except (KubeError, OSError, TimeoutError) as exc:
            log.warning("console sign-out not recorded: %s", exc)
            raise SignoutError(str(exc)) from None
        for key, value in patch.items():
            if value is None:
                self._data.pop(key, None)
            else:
                self._data[key] = value
        added = parse_entries({k: v for k, v in patch.items() if v is not None})
        self._written.update(added)
        self._entries.update(added)
        log.info("console: %s signed out (session %s…)", session.principal.username, session.sid[:8])

    # -- the watch's Sink ------------------------------------------------------------------------
    def apply(self, obj: Mapping[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") != SIGNOUTS_CONFIGMAP:
            return
        data = obj.get("data")
        self._data = dict(data) if isinstance(data, dict) else {}
        self._entries = parse_entries(self._data)
        now = self.clock()
        self._written = {k: e for k, e in self._written.items() if k not in self._entries and e.until > now}

    def delete(self, obj: Mapping[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") == SIGNOUTS_CONFIGMAP:
            self._data, self._entries = {}, {}

    def replace_all(self, kind: str, objects: Sequence[Mapping[str, Any]]) -> None:
        self._data, self._entries = {}, {}
        for obj in objects:
            self.apply(obj)

    def listing(self, kind: str) -> Listing:
        return HeldListing(self, kind)


def signouts_watcher(signouts: Signouts, api: ApiClient, namespace: str) -> KubeWatcher:
    """The watch of the one sign-out ConfigMap that feeds `signouts`, ready to start."""
    watch = ResourceWatch(
        "ConfigMap",
        partial(CoreV1Api(api).list_namespaced_config_map, namespace),
        name=WATCH_NAME,
        field_selector=f"metadata.name={SIGNOUTS_CONFIGMAP}",
    )
    return KubeWatcher(signouts, [watch])
