"""What an admission decision function returns; the HTTP layer turns it into a response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Reason(StrEnum):
    """The machine reason of a refusal: the response's `status.reason` (these exact strings are the
    wire values). The shell branches on some of them (bind, look up, retry), so they are one type."""

    FORBIDDEN = "Forbidden"
    INVALID = "Invalid"
    BAD_REQUEST = "BadRequest"  # the request cannot be read
    INTERNAL_ERROR = "InternalError"  # a bug: never a traceback to the caller
    NAMESPACE_NOT_KNOWN_HERE = "NamespaceNotKnownHere"  # a pod's namespace this replica has not seen: read it
    RUNAI_PROJECT_NOT_BOUND = "RunaiProjectNotBound"  # bind now, or refuse when Run:ai is unreachable
    RUNAI_PROJECT_NOT_KNOWN_HERE = "RunaiProjectNotKnownHere"  # bound, but no record here yet: look it up
    RUNAI_PROJECT_MISSING = "RunaiProjectMissing"  # bound to a Run:ai project Run:ai no longer has
    RUNAI_BINDING_SETTLING = "RunaiBindingSettling"  # bound moments ago: Run:ai's webhook may not see it yet
    RUNAI_QUEUE_MISSING = "RunaiQueueMissing"
    RUNAI_UNREACHABLE = "RunaiUnreachable"  # binding needed Run:ai, and it did not answer
    PROJECT_MOVING = "ProjectMoving"  # a department move is under way
    OWNER_NOT_CACHED = "OwnerNotCached"  # the pod's ReplicaSet is not in the cache yet: create it again
    GPU_QUOTA_EXCEEDED = "GpuQuotaExceeded"
    GPU_QUOTA_UNPROVEN = "GpuQuotaUnproven"  # the GPU reservation could not be shown to fit


# Not frozen: a frozen dataclass sets each field through object.__setattr__, which made building
# one a tenth of a mutation's decision. Nothing changes a decision once made (dataclasses.replace
# makes another).
@dataclass(slots=True)
class Decision:
    allowed: bool
    message: str = ""  # why it was refused (kubectl shows it to the user)
    code: int = 200  # status code when refused: 403 policy refusal, 400 bad object, 422 invalid
    reason: Reason | None = None  # why it was refused (None when allowed)
    patch: tuple[dict[str, Any], ...] = ()  # RFC 6902 operations
    warnings: tuple[str, ...] = ()
    audit: Mapping[str, str] = field(default_factory=dict)  # auditAnnotations, keys without prefix
    # The refusal families admitted only because the settings put them in warn (`core.enforcement`),
    # for the shell to count.
    would_refuse: tuple[str, ...] = ()

    @classmethod
    def allow(
        cls,
        warnings: tuple[str, ...] | list[str] = (),
        audit: Mapping[str, str] | None = None,
        patch: tuple[dict[str, Any], ...] | list[dict[str, Any]] = (),
    ) -> Decision:
        return cls(True, "", 200, None, tuple(patch), tuple(warnings), dict(audit) if audit else {})

    @classmethod
    def deny(
        cls,
        message: str,
        code: int = 403,
        reason: Reason = Reason.FORBIDDEN,
        warnings: tuple[str, ...] | list[str] = (),
    ) -> Decision:
        return cls(False, message, code, reason, (), tuple(warnings), {})


# One admission endpoint: the AdmissionReview's `request` in, a decision out. The HTTP shell turns
# the decision into the response; a handler may make only the request path's counted remote calls.
AdmissionHandler = Callable[[Mapping[str, Any]], Awaitable[Decision]]
