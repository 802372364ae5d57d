"""What an admission decision function returns; the HTTP layer turns it into a response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    message: str = ""  # why it was refused (kubectl shows it to the user)
    code: int = 200  # status code when refused: 403 policy refusal, 400 bad object, 422 invalid
    reason: str = ""  # machine reason, e.g. "Forbidden", "Invalid"
    patch: tuple[dict[str, Any], ...] = ()  # RFC 6902 operations
    warnings: tuple[str, ...] = ()
    audit: Mapping[str, str] = field(default_factory=dict)  # auditAnnotations, keys without prefix

    @classmethod
    def allow(
        cls,
        warnings: tuple[str, ...] | list[str] = (),
        audit: Mapping[str, str] | None = None,
        patch: tuple[dict[str, Any], ...] | list[dict[str, Any]] = (),
    ) -> Decision:
        return cls(allowed=True, patch=tuple(patch), warnings=tuple(warnings), audit=dict(audit or {}))

    @classmethod
    def deny(
        cls,
        message: str,
        code: int = 403,
        reason: str = "Forbidden",
        warnings: tuple[str, ...] | list[str] = (),
    ) -> Decision:
        return cls(allowed=False, message=message, code=code, reason=reason, warnings=tuple(warnings))


# One admission endpoint: the AdmissionReview's `request` in, a decision out. The HTTP shell turns
# the decision into the response; a handler may make only the request path's counted remote calls.
AdmissionHandler = Callable[[Mapping[str, Any]], Awaitable[Decision]]
