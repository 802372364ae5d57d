"""Who the guards trust, and what they read off an AdmissionReview request.

The settings guard (`settings_guard`), the namespace guard (`namespace_guard`) and the pod
update guard (`pod_updates`) take a `GuardConfig`: the server's own configuration, never read from
the ConfigMap they guard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# How many namespaces a refusal message names before it says "and N more".
MAX_LISTED_NAMESPACES = 10


@dataclass(frozen=True, slots=True)
class Identities:
    """Kubernetes users and groups, as the apiserver reports them in `userInfo`."""

    usernames: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()

    def matches(self, user_info: Mapping[str, Any] | None) -> bool:
        info = user_info or {}
        if info.get("username") in self.usernames:
            return True
        return not self.groups.isdisjoint(info.get("groups") or ())

    def __bool__(self) -> bool:
        return bool(self.usernames or self.groups)

    @classmethod
    def parse(cls, values: Iterable[str]) -> Identities:
        """From command-line/config strings: `group:NAME` is a group, anything else a username."""
        users: set[str] = set()
        groups: set[str] = set()
        for value in values:
            value = value.strip()
            if value.startswith("group:"):
                groups.add(value.removeprefix("group:"))
            elif value:
                users.add(value)
        return cls(frozenset(users), frozenset(groups))


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """Server configuration the guards need; never read from the ConfigMap they guard."""

    install_namespace: str = "hopsworks"
    # Who may change run_ai_enable: the Helm/installer identities.
    installers: Identities = field(default_factory=Identities)
    # This system's own identities (the webhook/reconciler service account): they perform moves.
    own: Identities = field(default_factory=Identities)
    # KAI's (or Run:ai's) pod grouper: it annotates every pod it groups with its PodGroup's name,
    # the one scheduling key of a pod that changes after admission (`core.pod_updates`).
    pod_groupers: Identities = field(default_factory=Identities)


def request_kind(request: Mapping[str, Any]) -> str:
    kind = (request.get("kind") or {}).get("kind")
    if kind:
        return str(kind)
    obj = request.get("object") or request.get("oldObject") or {}
    return str(obj.get("kind") or "")


def requester(request: Mapping[str, Any]) -> str:
    """The requesting user's name, for refusal messages."""
    return str((request.get("userInfo") or {}).get("username") or "(unknown user)")


def list_capped(names: Sequence[str], limit: int = MAX_LISTED_NAMESPACES) -> str:
    shown = ", ".join(names[:limit])
    rest = len(names) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown
