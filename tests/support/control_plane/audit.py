"""The apiserver's audit log, for the users a test wants to account for.

The apiserver writes one JSON line per finished request (`--audit-log-path`, Metadata level, only
for the users named in the policy), so a test can say what those users did and what they were
refused: RBAC's decision, the status code, and the message of a ValidatingAdmissionPolicy denial,
as the apiserver itself recorded them. The log backend writes in blocking mode: a request's line
is in the file when its response has been sent.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# The apiserver's refusal by a policy: "... ValidatingAdmissionPolicy 'p' with binding 'b' denied request: ..."
POLICY_DENIAL = re.compile(r"ValidatingAdmissionPolicy '[^']+' with binding '[^']+' denied request")


def write_policy(path: Path, users: Sequence[str]) -> Path:
    """Metadata (who, what, the answer; no bodies) for `users`, nothing for anyone else."""
    rules: list[dict[str, Any]] = [{"level": "Metadata", "users": list(users)}] if users else []
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "audit.k8s.io/v1",
                "kind": "Policy",
                "omitStages": ["RequestReceived", "ResponseStarted"],
                "rules": [*rules, {"level": "None"}],
            }
        )
    )
    return path


@dataclass(frozen=True)
class AuditEvent:
    raw: dict[str, Any]

    @property
    def user(self) -> str:
        return str(self.raw.get("user", {}).get("username", ""))

    @property
    def verb(self) -> str:
        return str(self.raw.get("verb", ""))

    @property
    def code(self) -> int:
        return int((self.raw.get("responseStatus") or {}).get("code") or 0)

    @property
    def message(self) -> str:
        return str((self.raw.get("responseStatus") or {}).get("message") or "")

    @property
    def resource(self) -> str:
        ref = self.raw.get("objectRef") or {}
        group = ref.get("apiGroup") or ""
        return f"{ref.get('resource', '')}{'.' + group if group else ''}"

    @property
    def name(self) -> str:
        return str((self.raw.get("objectRef") or {}).get("name") or "")

    @property
    def namespace(self) -> str:
        return str((self.raw.get("objectRef") or {}).get("namespace") or "")

    @property
    def rbac_denied(self) -> bool:
        return (self.raw.get("annotations") or {}).get("authorization.k8s.io/decision") == "forbid"

    @property
    def policy_denied(self) -> bool:
        return POLICY_DENIAL.search(self.message) is not None

    @property
    def is_write(self) -> bool:
        return self.verb in ("create", "update", "patch", "delete", "deletecollection")

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.verb} {self.resource} {where} -> {self.code} {self.message}".rstrip()


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        """Where the log ends now: `events(since=mark)` is what came after."""
        return self.path.stat().st_size if self.path.exists() else 0

    def events(self, since: int = 0, user: str | None = None) -> list[AuditEvent]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(since)
            data = f.read()
        # A line being written as we read is incomplete: only whole lines count.
        lines = data.split(b"\n")[:-1]
        events = [AuditEvent(json.loads(line)) for line in lines if line.strip()]
        return [e for e in events if user is None or e.user == user]


def summary(events: Iterable[AuditEvent]) -> dict[str, Any]:
    """Figures for a report: requests, writes per verb and resource, answers by code."""
    events = list(events)
    writes = Counter(f"{e.verb} {e.resource}" for e in events if e.is_write)
    codes = Counter(e.code for e in events)
    return {
        "requests": len(events),
        "writes": dict(sorted(writes.items())),
        "codes": dict(sorted(codes.items())),
        "rbac_denied": sum(e.rbac_denied for e in events),
        "policy_denied": sum(e.policy_denied for e in events),
    }
