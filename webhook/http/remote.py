"""A remote call on the request path, or the retryable 503 that stands for it.

A handler reads the watch-fed caches; the few calls it makes out (reading a namespace the watch
has not delivered, looking up or binding a Run:ai project) are each bounded by their own adapter.
When one fails the review is refused with 503, which the apiserver, controllers and kubectl treat
as worth retrying, and never decided as if the call had not been needed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from webhook.core.decision import Decision, Reason

log = logging.getLogger(__name__)

T = TypeVar("T")


async def call_or_refuse(
    call: Awaitable[T], doing: str, refusal: Callable[[Exception], str], reason: Reason, level: int = logging.INFO
) -> T | Decision:
    """What `call` returns, or, when it raises, a 503 refusal whose message `refusal` words from the
    error (`doing` names the call in the log line)."""
    try:
        return await call
    except Exception as exc:
        log.log(level, "%s on admission failed: %s", doing, exc)
        return Decision.deny(refusal(exc), code=503, reason=reason)
